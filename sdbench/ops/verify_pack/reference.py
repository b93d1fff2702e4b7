"""The definition of verify-and-pack: greedy verification, then packing of the accepted KV rows.

Outputs: the union of verify's and pack's (sdbench.ops.verify.reference, sdbench.ops.pack.reference).
"""

from __future__ import annotations

import torch

from sdbench.ops.pack.reference import pack
from sdbench.ops.verify.reference import verify


def verify_pack(
    draft_tokens: torch.Tensor, target_tokens: torch.Tensor, draft_kv: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Verify, then pack the accepted KV: the two-step pipeline every fused kernel must equal."""
    verified = verify(draft_tokens, target_tokens)
    packed = pack(draft_kv, verified["accepted_lengths"])
    del packed["error_flags"]  # verified lengths are always in [0, γ]: nothing to flag
    return {**verified, **packed}
