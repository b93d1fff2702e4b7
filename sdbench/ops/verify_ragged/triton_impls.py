"""verify_ragged in Triton: the serial one-program-per-request scan (the design vLLM ships for its
flattened layout, written here) and a one-program-per-request vector compare."""

from __future__ import annotations

import torch

from sdbench.ops.backends import triton_probe
from sdbench.ops.verify_ragged.workload import RaggedVerifyWorkload, ragged_outputs
from sdbench.registry import BufferedRun, Implementation, register

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is optional: triton_probe says why this cannot run
    triton = None

if triton is not None:

    @triton.jit
    def _request_range(cu_ptr, request, total):
        """[start, end) of the request's drafts, clamped to [0, total] with start <= end (bad offsets
        never read out of bounds)."""
        end = tl.load(cu_ptr + request)
        start = tl.load(cu_ptr + request - 1, mask=request > 0, other=0)
        start = tl.minimum(tl.maximum(start, 0), total)
        end = tl.minimum(tl.maximum(end, start), total)
        return start, end

    @triton.jit
    def _ragged_serial_kernel(draft_ptr, target_ptr, cu_ptr, accepted_ptr, mismatch_ptr, next_ptr, total):
        """Grid (B,): one program per request, a scalar scan to the first mismatch (k_i + 1 dependent
        load pairs), as a serving engine's Triton rejection sampler does for greedy requests."""
        request = tl.program_id(0).to(tl.int64)
        start, end = _request_range(cu_ptr, request, total)
        length = end - start
        target_row = target_ptr + start + request
        position = start * 0
        rejected = 0
        while (position < length) & (rejected == 0):
            if tl.load(draft_ptr + start + position) == tl.load(target_row + position):
                position += 1
            else:
                rejected = 1
        tl.store(accepted_ptr + request, position)
        tl.store(mismatch_ptr + request, (position < length).to(tl.uint8))
        tl.store(next_ptr + request, tl.load(target_row + position))

    @triton.jit
    def _ragged_block_kernel(draft_ptr, target_ptr, cu_ptr, accepted_ptr, mismatch_ptr, next_ptr, total,
                             BLOCK: tl.constexpr):
        """Grid (B,): one program per request, BLOCK positions compared at once per step (one step when
        BLOCK >= γ_max); the first mismatch is a min-reduction over the mismatching positions."""
        request = tl.program_id(0).to(tl.int64)
        start, end = _request_range(cu_ptr, request, total)
        length = end - start
        target_row = target_ptr + start + request
        offsets = tl.arange(0, BLOCK).to(tl.int64)
        first = length
        for base in range(0, length, BLOCK):
            position = base + offsets
            valid = position < length
            draft = tl.load(draft_ptr + start + position, mask=valid, other=0)
            target = tl.load(target_row + position, mask=valid, other=0)
            first = tl.minimum(first, tl.min(tl.where(valid & (draft != target), position, length), axis=0))
        tl.store(accepted_ptr + request, first)
        tl.store(mismatch_ptr + request, (first < length).to(tl.uint8))
        tl.store(next_ptr + request, tl.load(target_row + first))


# block_triton's vector width: next_pow2(γ_max) up to this (wider γ loops). The public API passes T, an upper
# bound on γ_max from the shapes alone (reading the offsets would sync), so the width must not follow it up.
BLOCK_MAX = 1024


def _prepare(block: bool):
    def prepare(w: RaggedVerifyWorkload, out: dict | None = None) -> BufferedRun:
        out = out if out is not None else ragged_outputs(w)
        batch, total = w.cu_num_draft_tokens.shape[0], w.draft_tokens.shape[0]
        args = (w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens, out["accepted_lengths"],
                out["has_mismatch"].view(torch.uint8), out["next_tokens"], total)
        if block:
            width = triton.next_power_of_2(min(max(w.config.gamma, 1), BLOCK_MAX))
            launch = lambda: _ragged_block_kernel[(batch,)](*args, BLOCK=width, num_warps=1)  # noqa: E731
        else:
            launch = lambda: _ragged_serial_kernel[(batch,)](*args, num_warps=1)  # noqa: E731
        return BufferedRun(launch, out)

    return prepare


register(Implementation(
    op="verify_ragged", name="serial_triton", backend="triton", devices=("cuda", "cpu"), peer=True, launches=1,
    prepare=_prepare(block=False), probe=triton_probe, writes_into=True,
    description="Triton, one program per request over the flattened layout: serial scan to the first mismatch",
))
register(Implementation(
    op="verify_ragged", name="block_triton", backend="triton", devices=("cuda", "cpu"), launches=1,
    prepare=_prepare(block=True), probe=triton_probe, writes_into=True,
    description="Triton, one program per request: next_pow2(γ_max) positions compared at once, min-reduced",
))
