"""verify_ragged in CUDA (csrc/verify_ragged.cu): one warp per request, ballot per 32-position chunk."""

from __future__ import annotations

from sdbench.ops.backends import cuda_ops, cuda_probe
from sdbench.ops.verify_ragged.workload import RaggedVerifyWorkload, ragged_outputs
from sdbench.registry import BufferedRun, Implementation, register


def _prepare_ballot(w: RaggedVerifyWorkload, out: dict | None = None) -> BufferedRun:
    op = cuda_ops().verify_ragged_ballot
    out = out if out is not None else ragged_outputs(w)
    args = (w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens, out["accepted_lengths"], out["has_mismatch"],
            out["next_tokens"])
    return BufferedRun(lambda: op(*args), out)


register(Implementation(
    op="verify_ragged", name="ballot", backend="cuda", probe=cuda_probe, launches=1, prepare=_prepare_ballot,
    writes_into=True,
    description="one warp per request over the flattened layout: __ballot_sync + __ffs per 32 positions",
))
