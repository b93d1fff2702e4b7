"""The definition of ragged verify-and-pack: ragged verification, then the accepted KV rows compacted
(eager PyTorch; the mask-and-gather syncs for its shape)."""

from __future__ import annotations

import torch

from sdbench.ops.pack.reference import packed_offsets
from sdbench.ops.verify_ragged.reference import draft_positions, verify_ragged


def verify_pack_ragged(draft_tokens: torch.Tensor, target_tokens: torch.Tensor, cu_num_draft_tokens: torch.Tensor,
                       draft_kv: torch.Tensor) -> dict[str, torch.Tensor]:
    """Verify every request, then keep row r of request i's draft KV where r < k_i, in request order."""
    verified = verify_ragged(draft_tokens, target_tokens, cu_num_draft_tokens)
    _, _, request, local = draft_positions(cu_num_draft_tokens, draft_kv.shape[0])
    accepted = verified["accepted_lengths"]
    return {**verified, "packed_kv": draft_kv[local < accepted[request]], "packed_offsets": packed_offsets(accepted)}
