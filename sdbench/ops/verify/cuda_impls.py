"""verify in CUDA (csrc/verify.cu through torch.ops.sdbench): the naive and warp-ballot kernels.

Importing this module builds nothing: the extension is built on the first probe or prepare, by
sdbench.ext. Each prepare binds the op itself (no wrapper call) so the timed closure is one
dispatcher call.
"""

from __future__ import annotations

import torch

from sdbench.ops.backends import cuda_ops, cuda_probe
from sdbench.ops.workload import VerifyWorkload
from sdbench.registry import BufferedRun, Implementation, Outputs, register


def verify_outputs(w: VerifyWorkload) -> Outputs:
    """accepted_lengths, has_mismatch, next_tokens for w's batch (every greedy kernel writes these)."""
    batch, device = w.config.batch_size, w.device
    return {
        "accepted_lengths": torch.empty(batch, dtype=torch.int64, device=device),
        "has_mismatch": torch.empty(batch, dtype=torch.bool, device=device),
        "next_tokens": torch.empty(batch, dtype=w.target_tokens.dtype, device=device),
    }


def verify_args(w: VerifyWorkload, out: Outputs) -> tuple:
    return (w.draft_tokens, w.target_tokens, out["accepted_lengths"], out["has_mismatch"], out["next_tokens"])


def _prepare_verify(op_name: str):
    def prepare(w: VerifyWorkload, out: Outputs | None = None) -> BufferedRun:
        op = getattr(cuda_ops(), op_name)
        out = out if out is not None else verify_outputs(w)
        args = verify_args(w, out)
        return BufferedRun(lambda: op(*args), out)

    return prepare


register(Implementation(
    op="verify", name="naive", backend="cuda", probe=cuda_probe, launches=1, writes_into=True,
    prepare=_prepare_verify("verify_naive"),
    description="one thread per sequence, serial scan to the first mismatch (divergent baseline)",
))
register(Implementation(
    op="verify", name="ballot", backend="cuda", probe=cuda_probe, launches=1, writes_into=True,
    prepare=_prepare_verify("verify_ballot"),
    description="one warp per sequence, __ballot_sync + __ffs per 32-position chunk, flat in alpha",
))
