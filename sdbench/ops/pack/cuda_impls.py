"""pack in CUDA (csrc/pack.cu): the published packer (host sync) and the sync-free whole-GPU packer."""

from __future__ import annotations

import torch

from sdbench.ops.backends import cuda_ops, cuda_probe, needs_kv
from sdbench.ops.pack.reference import length_errors
from sdbench.ops.workload import VerifyWorkload
from sdbench.registry import BufferedRun, Implementation, Outputs, register


def pack_outputs(w: VerifyWorkload, error_flags: bool = True) -> Outputs:
    """packed_kv sized for the worst case (every draft row accepted), so no launch needs a sync;
    error_flags only where lengths are given (verify_pack's verified lengths cannot be bad)."""
    batch, gamma, kv_dim = w.draft_kv.shape
    out = {
        "packed_kv": torch.empty((batch * gamma, kv_dim), dtype=w.draft_kv.dtype, device=w.device),
        "packed_offsets": torch.empty(batch, dtype=torch.int64, device=w.device),
        "error_flags": torch.empty(batch, dtype=torch.int32, device=w.device),
    }
    if not error_flags:
        del out["error_flags"]
    return out


def _prepare_pack_naive(w: VerifyWorkload):
    op = cuda_ops().pack_naive
    gamma = w.draft_kv.shape[1]

    def run() -> Outputs:
        packed_kv, packed_offsets = op(w.draft_kv, w.accepted_lengths)  # clamps the lengths it packs
        # the published packer has no flags: computed beside it (it syncs anyway)
        return {"packed_kv": packed_kv, "packed_offsets": packed_offsets,
                "error_flags": length_errors(w.accepted_lengths, gamma)}

    return run


def _prepare_pack(w: VerifyWorkload, out: Outputs | None = None) -> BufferedRun:
    op = cuda_ops().pack_flagged
    out = dict(out) if out is not None else pack_outputs(w)
    if "error_flags" not in out:  # the API's buffers: the flag is added to what the call returns
        out["error_flags"] = torch.empty(w.draft_kv.shape[0], dtype=torch.int32, device=w.device)
    args = (w.draft_kv, w.accepted_lengths, out["packed_kv"], out["packed_offsets"], out["error_flags"])
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
