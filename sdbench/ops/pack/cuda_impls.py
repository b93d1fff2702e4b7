"""pack in CUDA (csrc/pack.cu): the published packer (host sync) and the sync-free whole-GPU packer."""

from __future__ import annotations

import torch

from sdbench.ops.backends import cuda_ops, cuda_probe, needs_kv
from sdbench.ops.workload import VerifyWorkload
from sdbench.registry import BufferedRun, Implementation, Outputs, register


def pack_outputs(w: VerifyWorkload) -> Outputs:
    """packed_kv sized for the worst case (every draft row accepted), so no launch needs a sync."""
    batch, gamma, kv_dim = w.draft_kv.shape
    return {
        "packed_kv": torch.empty((batch * gamma, kv_dim), dtype=w.draft_kv.dtype, device=w.device),
        "packed_offsets": torch.empty(batch, dtype=torch.int64, device=w.device),
    }


def _prepare_pack_naive(w: VerifyWorkload):
    op = cuda_ops().pack_naive

    def run() -> Outputs:
        packed_kv, packed_offsets = op(w.draft_kv, w.accepted_lengths)
        return {"packed_kv": packed_kv, "packed_offsets": packed_offsets}

    return run


def _prepare_pack(w: VerifyWorkload, out: Outputs | None = None) -> BufferedRun:
    op = cuda_ops().pack
    out = out if out is not None else pack_outputs(w)
    args = (w.draft_kv, w.accepted_lengths, out["packed_kv"], out["packed_offsets"])
    return BufferedRun(lambda: op(*args), out)


register(Implementation(
    op="pack", name="pack_cuda_naive", backend="cuda", probe=cuda_probe, sync=True, supports=needs_kv,
    prepare=_prepare_pack_naive,
    description="published packer: host cumsum + .item() sync, one 256-thread block per sequence, 2-byte copies",
))
register(Implementation(
    op="pack", name="pack_cuda", backend="cuda", probe=cuda_probe, launches=1, supports=needs_kv, prepare=_prepare_pack,
    writes_into=True,
    description="sync-free: device-side scan, whole-GPU grid over the accepted bytes, 16-byte vectors",
))
