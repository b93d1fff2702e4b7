"""Seeded ragged prob_verify inputs, cut from the padded prob_verify workload.

The padded workload (sdbench.ops.prob_verify.workload) gives p [B, γ_max + 1, V], q [B, γ_max, V], drafts
drawn from q and the randomness; request i keeps its first γ_i drafts (and their q rows and uniforms) and
its first γ_i + 1 target rows, laid end to end (sdbench.ops.verify_ragged.workload.flatten). Its last kept
target row is its bonus row. γ_i follows the config's `draft_lengths` (verify_ragged's
draw_draft_lengths: uniform, full, bimodal), unless given. The race noise stays one row per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sdbench.ops.prob_verify.workload import ProbWorkload, RandomizedInputs, make_prob_workload
from sdbench.ops.verify_ragged.workload import draw_draft_lengths, flatten
from sdbench.ops.workload import VerifyConfig


@dataclass
class RaggedProbWorkload(RandomizedInputs):
    """Inputs of one ragged probabilistic verification step; randomness modes as ProbWorkload's."""

    config: VerifyConfig  # gamma is γ_max (an upper bound on every γ_i)
    draft_tokens: torch.Tensor  # [T] token dtype
    target_probs: torch.Tensor  # p [T + B, V] prob dtype; log-probs when config.logprobs
    draft_probs: torch.Tensor  # q [T, V]
    cu_num_draft_tokens: torch.Tensor  # [B] int64, inclusive
    draft_lengths: torch.Tensor  # [B] int64, γ_i
    uniforms: torch.Tensor  # [T] float32: accept draft t iff u·q < p
    exponential_noise: torch.Tensor  # [B, V] float32 > 0: request i's residual / bonus race
    randomness: str = "supplied"
    offset: int = 0  # fast mode: the Philox offset


def make_ragged_prob_workload(cfg: VerifyConfig, device: str | torch.device = "cpu",
                              draft_lengths: torch.Tensor | None = None) -> RaggedProbWorkload:
    """The padded prob workload of cfg (γ = γ_max) with request i cut to γ_i drafts."""
    lengths = draw_draft_lengths(cfg) if draft_lengths is None else draft_lengths
    return cut_to_lengths(make_prob_workload(cfg, device), lengths)


def cut_to_lengths(padded: ProbWorkload, draft_lengths: torch.Tensor) -> RaggedProbWorkload:
    """padded's inputs with sequence i cut to its first draft_lengths[i] drafts (0..γ), laid end to end
    (syncs: inputs only); its randomness mode and offset kept."""
    gamma = padded.draft_tokens.shape[1]
    lengths = draft_lengths.to(torch.int64).to(padded.device)
    draft_tokens, target_probs, cu = flatten(padded.draft_tokens, padded.target_probs, lengths)
    kept = torch.arange(gamma, device=lengths.device)[None, :] < lengths[:, None]
    return RaggedProbWorkload(
        config=padded.config, draft_tokens=draft_tokens, target_probs=target_probs,
        draft_probs=padded.draft_probs[kept], cu_num_draft_tokens=cu, draft_lengths=lengths,
        uniforms=padded.uniforms[kept], exponential_noise=padded.exponential_noise,
        randomness=padded.randomness, offset=padded.offset,
    )


def ragged_prob_outputs(w: RaggedProbWorkload, error_flags: bool = True) -> dict[str, torch.Tensor]:
    """The output buffers; error_flags for sdbench's kernels, not for peers that do not check their input."""
    batch, device, token_dtype = w.cu_num_draft_tokens.shape[0], w.device, w.draft_tokens.dtype
    outputs = {
        "accepted_lengths": torch.empty(batch, dtype=torch.int64, device=device),
        "next_tokens": torch.empty(batch, dtype=token_dtype, device=device),
        "output_tokens": torch.empty(w.target_probs.shape[0], dtype=token_dtype, device=device),
    }
    if error_flags:
        outputs["error_flags"] = torch.empty(batch, dtype=torch.int32, device=device)
    return outputs
