"""pack in PyTorch: the eager reference `draft_kv[mask]` as the `torch_eager` peer."""

from __future__ import annotations

from sdbench.ops.backends import ANY_DEVICE, needs_kv
from sdbench.ops.pack.reference import pack
from sdbench.ops.workload import VerifyWorkload
from sdbench.registry import Implementation, register


def _prepare_eager(w: VerifyWorkload):
    return lambda: pack(w.draft_kv, w.accepted_lengths)


register(Implementation(
    op="pack", name="torch_eager", backend="torch", devices=ANY_DEVICE, peer=True, sync=True,
    description="eager PyTorch draft_kv[mask] (data-dependent shape: syncs)",
    prepare=_prepare_eager, supports=needs_kv,
))
