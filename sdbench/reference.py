"""Pure-PyTorch definitions of every operation: the definition of correctness.

Written the idiomatic eager way on purpose: these are also the `torch_eager` peers that every kernel's
speedup is quoted against. Device-agnostic (CPU or CUDA tensors).

Output naming, shared by every implementation of an operation:
- verify:      accepted_lengths int64 [B], has_mismatch bool [B], next_tokens [B] (token dtype)
- pack:        packed_kv [N, kv_dim] (N >= sum k_i; rows past sum k_i are unspecified), packed_offsets
               int64 [B] (exclusive prefix sum of accepted_lengths)
- verify_pack: the union of both.
"""

from __future__ import annotations

import torch


def verify(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Greedy verification: accept draft tokens up to the first disagreement with the target.

    k_i = index of the first position where draft != target (γ when none); the next token is the
    target's token at k_i, which is the bonus token at γ when everything was accepted.
    """
    gamma = draft_tokens.shape[1]
    mismatch = draft_tokens != target_tokens[:, :gamma]
    has_mismatch = mismatch.any(dim=1)
    # argmax returns the first maximal index, i.e. the first mismatch (0 when there is none).
    first_mismatch = mismatch.to(torch.uint8).argmax(dim=1)
    accepted_lengths = torch.where(has_mismatch, first_mismatch, torch.full_like(first_mismatch, gamma))
    next_tokens = target_tokens.gather(1, accepted_lengths[:, None]).squeeze(1)
    return {"accepted_lengths": accepted_lengths, "has_mismatch": has_mismatch, "next_tokens": next_tokens}


def packed_offsets(accepted_lengths: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum: where sequence i's accepted rows start in the packed KV."""
    return torch.cumsum(accepted_lengths, dim=0) - accepted_lengths


def pack(draft_kv: torch.Tensor, accepted_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """Compact the accepted KV rows of every sequence into one [sum k_i, kv_dim] tensor.

    The mask-and-gather form `draft_kv[mask]`: its output shape depends on the data, so it syncs.
    """
    gamma = draft_kv.shape[1]
    positions = torch.arange(gamma, device=draft_kv.device)
    mask = positions[None, :] < accepted_lengths[:, None]
    return {"packed_kv": draft_kv[mask], "packed_offsets": packed_offsets(accepted_lengths)}


def verify_pack(
    draft_tokens: torch.Tensor, target_tokens: torch.Tensor, draft_kv: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Verify, then pack the accepted KV: the two-step pipeline every fused kernel must equal."""
    verified = verify(draft_tokens, target_tokens)
    return {**verified, **pack(draft_kv, verified["accepted_lengths"])}
