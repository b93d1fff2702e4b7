"""prob_verify_ragged in PyTorch: the `torch_eager` peer, vectorised over the flattened layout (what an
engine writes in eager PyTorch; sync-free: every shape comes from the inputs' shapes, never from the
offsets' values). The per-request loop in reference.py is the definition; parity compares the two.

Supplied randomness: the workload's uniforms and noise. Fast: fresh ones from PyTorch's default generator
before each call, as prob_verify's torch_eager and vLLM V1 draw them.
"""

from __future__ import annotations

import torch

from sdbench.ops.backends import ANY_DEVICE
from sdbench.ops.input_contract import TOKEN_OUT_OF_RANGE
from sdbench.ops.prob_verify.common import draw_torch_randomness
from sdbench.ops.prob_verify.reference import prob_race
from sdbench.ops.prob_verify.workload import decode_probs
from sdbench.ops.prob_verify_ragged.workload import RaggedProbWorkload
from sdbench.ops.verify_ragged.reference import draft_positions
from sdbench.registry import Implementation, register


def prob_verify_ragged_eager(draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                             cu_num_draft_tokens: torch.Tensor, uniforms: torch.Tensor,
                             exponential_noise: torch.Tensor, *, logprobs: bool = False) -> dict[str, torch.Tensor]:
    """Every draft's accept test at once, the first rejection per request by scatter-min, one race per request."""
    total, batch, vocab = draft_tokens.shape[0], cu_num_draft_tokens.shape[0], target_probs.shape[1]
    device = draft_tokens.device
    starts, lengths, request, local = draft_positions(cu_num_draft_tokens, total)
    requests = torch.arange(batch, device=device)
    in_range = (draft_tokens >= 0) & (draft_tokens < vocab)
    tokens = draft_tokens.long().clamp(0, vocab - 1)  # gathered, then zeroed where out of range (p = q = 0)
    zero = torch.zeros((), device=device)
    target_at_draft = torch.where(in_range, decode_probs(target_probs[torch.arange(total, device=device) + request,
                                                                      tokens], logprobs), zero)
    draft_at_draft = torch.where(in_range, decode_probs(draft_probs[torch.arange(total, device=device), tokens],
                                                        logprobs), zero)
    rejected = ~(uniforms.float() * draft_at_draft < target_at_draft)
    accepted_lengths = lengths.clone().scatter_reduce_(0, request, torch.where(rejected, local, lengths[request]),
                                                       reduce="amin", include_self=True)
    bad = torch.zeros(batch, dtype=torch.int32, device=device).scatter_reduce_(
        0, request, (~in_range).to(torch.int32), reduce="amax", include_self=True)

    has_draft = accepted_lengths < lengths
    target_row = decode_probs(target_probs[starts + requests + accepted_lengths], logprobs)
    if total:
        draft_row = decode_probs(draft_probs[(starts + torch.minimum(accepted_lengths, lengths - 1)).clamp(0, total - 1)],
                                 logprobs)
        draft_row = torch.where(has_draft[:, None], draft_row, torch.zeros_like(draft_row))
    else:  # no request drafted: every race is a bonus draw
        draft_row = torch.zeros((batch, vocab), device=device)
    next_tokens = prob_race(target_row, draft_row, exponential_noise.float()).to(draft_tokens.dtype)

    # output slots: request i's γ_i + 1 at [cu[i-1] + i, cu[i] + i + 1), a ragged layout of its own
    _, _, slot_request, slot_local = draft_positions(cu_num_draft_tokens + requests + 1, total + batch)
    k = accepted_lengths[slot_request]
    drafts = torch.cat([draft_tokens, draft_tokens.new_zeros(1)])[(starts[slot_request] + slot_local).clamp(max=total)]
    output_tokens = torch.where(slot_local < k, drafts,
                                torch.where(slot_local == k, next_tokens[slot_request], torch.full_like(drafts, -1)))
    return {"accepted_lengths": accepted_lengths, "next_tokens": next_tokens, "output_tokens": output_tokens,
            "error_flags": bad * TOKEN_OUT_OF_RANGE}


def _prepare_eager(w: RaggedProbWorkload):
    logprobs = w.config.logprobs
    uniforms, noise = w.uniforms, w.exponential_noise
    if w.randomness == "fast":
        uniforms, noise = torch.empty_like(w.uniforms), torch.empty_like(w.exponential_noise)

    def run():
        if w.randomness == "fast":
            draw_torch_randomness(uniforms, noise)
        return prob_verify_ragged_eager(w.draft_tokens, w.target_probs, w.draft_probs, w.cu_num_draft_tokens,
                                        uniforms, noise, logprobs=logprobs)

    return run


register(Implementation(
    op="prob_verify_ragged", name="torch_eager", backend="torch", devices=ANY_DEVICE, peer=True,
    description="eager PyTorch over the flattened layout: every accept test, scatter-min of rejections, one race per request",
    prepare=_prepare_eager,
))
