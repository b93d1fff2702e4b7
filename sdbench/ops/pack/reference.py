"""The definition of KV packing, in eager PyTorch (device-agnostic).

Outputs: packed_kv [N, kv_dim] (N >= sum k_i; rows past sum k_i are unspecified), packed_offsets
int64 [B] (exclusive prefix sum of accepted_lengths).
"""

from __future__ import annotations

import torch


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
