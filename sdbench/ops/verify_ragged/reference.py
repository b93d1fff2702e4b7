"""The definition of ragged greedy verification (eager PyTorch; syncs for repeat_interleave)."""

from __future__ import annotations

import torch


def draft_positions(cu_num_draft_tokens: torch.Tensor, total: int):
    """(starts [B], lengths [B], request [T], local [T]): each request's first draft and γ_i, and for each of
    the T flattened drafts its request and its position inside that request. Sync-free: the total is
    given, so repeat_interleave need not read the lengths for its shape (valid offsets only)."""
    cu = cu_num_draft_tokens.to(torch.int64)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    lengths = cu - starts
    request = torch.repeat_interleave(torch.arange(cu.shape[0], device=cu.device), lengths, output_size=total)
    local = torch.arange(total, device=cu.device) - starts[request]
    return starts, lengths, request, local


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
