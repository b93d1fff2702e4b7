"""The definition of ragged greedy verification (eager PyTorch; syncs for its boolean mask)."""

from __future__ import annotations

import torch


def draft_positions(cu_num_draft_tokens: torch.Tensor, total: int):
    """(starts [B], lengths [B], request [T], local [T]): each request's first draft and γ_i, and for each of
    the T flattened drafts its request and its position inside that request.

    Sync-free (every shape from `total`, never from the offsets' values) and memory-safe on any offsets:
    they are clamped to [0, T] and made non-decreasing (a no-op on valid offsets, the only ones the
    references define), and each draft's request is a binary search over them, so every index derived
    from these lies inside the layout even when the offsets are garbage."""
    cu = cu_num_draft_tokens.to(torch.int64).clamp(0, total).cummax(0).values
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    lengths = cu - starts
    positions = torch.arange(total, device=cu.device)
    request = torch.searchsorted(cu, positions, right=True).clamp(max=cu.shape[0] - 1)  # cu[r-1] <= t < cu[r]
    return starts, lengths, request, positions - starts[request]


def verify_ragged(draft_tokens: torch.Tensor, target_tokens: torch.Tensor,
                  cu_num_draft_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """k_i = first position where request i's draft and target disagree (γ_i when none), for every i."""
    batch = cu_num_draft_tokens.shape[0]
    device = draft_tokens.device
    starts, lengths, request, local = draft_positions(cu_num_draft_tokens, draft_tokens.shape[0])
    mismatch = draft_tokens != target_tokens[torch.arange(draft_tokens.shape[0], device=device) + request]
    first = lengths.clone()
    first.scatter_reduce_(0, request[mismatch], local[mismatch], reduce="amin", include_self=True)
    next_tokens = target_tokens[starts + torch.arange(batch, device=device) + first]
    return {"accepted_lengths": first, "has_mismatch": first < lengths, "next_tokens": next_tokens}
