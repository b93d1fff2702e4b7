"""The definition of ragged probabilistic verification: the padded definition (prob_verify.reference),
request by request on each request's slice of the flattened layout. A plain loop: it reads the offsets
to the host (a sync per call), which a definition may.

γ_i = 0 has no padded counterpart (the padded op needs γ >= 1): such a request only draws its bonus
token, the race over p at its one target row with q := 0 (the padded rule at k = γ).
"""

from __future__ import annotations

import torch

from sdbench.ops.prob_verify.reference import prob_race, prob_verify
from sdbench.ops.prob_verify.workload import decode_probs


def prob_verify_ragged(draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                       cu_num_draft_tokens: torch.Tensor, uniforms: torch.Tensor, exponential_noise: torch.Tensor,
                       *, logprobs: bool = False) -> dict[str, torch.Tensor]:
    """Layout and outputs in sdbench/ops/prob_verify_ragged/__init__.py; valid offsets only."""
    ends = cu_num_draft_tokens.tolist()
    starts = [0] + ends[:-1]
    per_request = [verify_request(draft_tokens, target_probs, draft_probs, uniforms, exponential_noise, request,
                                  start, end, logprobs=logprobs)
                   for request, (start, end) in enumerate(zip(starts, ends, strict=True))]
    return {name: torch.cat([one[name].flatten() for one in per_request]) for name in per_request[0]}


def verify_request(draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                   uniforms: torch.Tensor, exponential_noise: torch.Tensor, request: int, start: int, end: int,
                   *, logprobs: bool = False) -> dict[str, torch.Tensor]:
    """Request `request`, whose drafts are [start, end) of the flattened layout (target rows shifted by
    one per earlier request): the padded definition on its slice, outputs with a batch of one."""
    rows = slice(start + request, end + request + 1)  # its γ_i + 1 target rows, the last its bonus row
    noise = exponential_noise[request:request + 1]
    if end > start:
        return prob_verify(draft_tokens[None, start:end], target_probs[None, rows], draft_probs[None, start:end],
                           uniforms[None, start:end], noise, logprobs=logprobs)
    target_row = decode_probs(target_probs[rows], logprobs)
    token = prob_race(target_row, torch.zeros_like(target_row), noise).to(draft_tokens.dtype)
    return {"accepted_lengths": token.new_zeros(1, dtype=torch.int64), "next_tokens": token,
            "output_tokens": token[None], "error_flags": token.new_zeros(1, dtype=torch.int32)}
