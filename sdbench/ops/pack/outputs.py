"""The output buffers of the CUDA packers and of the verify_pack kernels' pack half (one home for both)."""

from __future__ import annotations

import torch

from sdbench.ops.workload import VerifyWorkload
from sdbench.registry import Outputs


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


def given_length_outputs(w: VerifyWorkload, out: Outputs | None) -> Outputs:
    """A packer of given lengths writes error flags: the caller's buffers (the API's hold packed_kv and
    packed_offsets only; the flags are added to what the call returns), else pack_outputs."""
    out = dict(out) if out is not None else pack_outputs(w)
    if "error_flags" not in out:
        out["error_flags"] = torch.empty(w.draft_kv.shape[0], dtype=torch.int32, device=w.device)
    return out
