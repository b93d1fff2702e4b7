"""verify_ragged in PyTorch: the eager reference as the `torch_eager` peer."""

from __future__ import annotations

from sdbench.ops.backends import ANY_DEVICE
from sdbench.ops.verify_ragged.reference import verify_ragged
from sdbench.ops.verify_ragged.workload import RaggedVerifyWorkload
from sdbench.registry import Implementation, register


def _prepare_eager(w: RaggedVerifyWorkload):
    return lambda: verify_ragged(w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens)


register(Implementation(
    op="verify_ragged", name="torch_eager", backend="torch", devices=ANY_DEVICE, peer=True, sync=True,
    description="eager PyTorch: searchsorted of each draft's request, compare, scatter_reduce amin (syncs for its mask)",
    prepare=_prepare_eager,
))
