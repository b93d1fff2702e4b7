"""verify_pack in PyTorch: eager verify, then draft_kv[mask], as the `torch_eager` peer."""

from __future__ import annotations

from sdbench.ops.backends import ANY_DEVICE, needs_kv
from sdbench.ops.verify_pack.reference import verify_pack
from sdbench.ops.workload import VerifyWorkload
from sdbench.registry import Implementation, register


def _prepare_eager(w: VerifyWorkload):
    return lambda: verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv)


register(Implementation(
    op="verify_pack", name="torch_eager", backend="torch", devices=ANY_DEVICE, peer=True, sync=True,
    description="eager verify, then draft_kv[mask]",
    prepare=_prepare_eager, supports=needs_kv,
))
