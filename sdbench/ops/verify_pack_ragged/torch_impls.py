"""verify_pack_ragged in PyTorch: the eager reference as the `torch_eager` peer."""

from __future__ import annotations

from sdbench.ops.backends import ANY_DEVICE, needs_kv
from sdbench.ops.verify_pack_ragged.reference import verify_pack_ragged
from sdbench.ops.verify_ragged.workload import RaggedVerifyWorkload
from sdbench.registry import Implementation, register


def _prepare_eager(w: RaggedVerifyWorkload):
    return lambda: verify_pack_ragged(w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens, w.draft_kv)


register(Implementation(
    op="verify_pack_ragged", name="torch_eager", backend="torch", devices=ANY_DEVICE, peer=True, sync=True,
    description="eager PyTorch: ragged verify, then draft_kv[mask] (syncs for its shapes)",
    prepare=_prepare_eager, supports=needs_kv,
))
