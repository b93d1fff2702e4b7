"""The definition of KV packing, in eager PyTorch (device-agnostic).

Outputs: packed_kv [N, kv_dim] (N >= sum k_i; rows past sum k_i are unspecified), packed_offsets
int64 [B] (exclusive prefix sum of the accepted lengths), error_flags int32 [B].

Bad lengths (sdbench.ops.input_contract): an accepted length outside [0, γ] is clamped to [0, γ]
(for the offsets and the copy alike: no kernel reads past its sequence's γ rows or writes before
the packed buffer) and sets LENGTH_OUT_OF_RANGE in error_flags[b].
"""

from __future__ import annotations

import torch

from sdbench.ops.input_contract import LENGTH_OUT_OF_RANGE


def clamped_lengths(accepted_lengths: torch.Tensor, gamma: int) -> torch.Tensor:
    return accepted_lengths.clamp(0, gamma)


def length_errors(accepted_lengths: torch.Tensor, gamma: int) -> torch.Tensor:
    """error_flags int32 [B]: LENGTH_OUT_OF_RANGE where an accepted length is outside [0, γ]."""
    bad = (accepted_lengths < 0) | (accepted_lengths > gamma)
    return bad.to(torch.int32) * LENGTH_OUT_OF_RANGE


def packed_offsets(accepted_lengths: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum: where sequence i's accepted rows start in the packed KV (lengths clamped first)."""
    return torch.cumsum(accepted_lengths, dim=0) - accepted_lengths


def pack(draft_kv: torch.Tensor, accepted_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """Compact the accepted KV rows of every sequence into one [sum k_i, kv_dim] tensor.

    The mask-and-gather form `draft_kv[mask]`: its output shape depends on the data, so it syncs.
    """
    gamma = draft_kv.shape[1]
    lengths = clamped_lengths(accepted_lengths, gamma)
    positions = torch.arange(gamma, device=draft_kv.device)
    mask = positions[None, :] < lengths[:, None]
    return {
        "packed_kv": draft_kv[mask],
        "packed_offsets": packed_offsets(lengths),
        "error_flags": length_errors(accepted_lengths, gamma),
    }
