"""verify_pack_ragged in Triton, in three launches and no sync: the block verify of verify_ragged, the
inclusive prefix sum of k_i (torch.cumsum into a buffer), and a pack kernel that copies every accepted row
and writes the exclusive offsets. One launch needs every request's offset, a scan across programs: not
done here (the padded op's fused_scan shows how; a ragged one is issue #16's next step)."""

from __future__ import annotations

import torch

from sdbench.ops.backends import needs_kv, triton_probe
from sdbench.ops.verify_ragged.workload import RaggedVerifyWorkload, ragged_outputs
from sdbench.registry import BufferedRun, Implementation, register

try:
    import triton
    import triton.language as tl

    from sdbench.ops.verify_ragged.triton_impls import BLOCK_MAX, _ragged_block_kernel, _request_range
except ImportError:  # triton is optional: triton_probe says why this cannot run
    triton = None

KV_BLOCK = 256  # columns per step of a row copy
# Programs per request in the copy: γ_max up to this, each copying every P-th accepted row. The public API
# passes T, an upper bound on γ_max from the shapes alone (reading the offsets would sync): the grid must
# not grow with it.
ROW_PROGRAMS_MAX = 128

if triton is not None:

    @triton.jit
    def _ragged_pack_kernel(kv_ptr, packed_ptr, cu_ptr, accepted_ptr, inclusive_ptr, offsets_ptr, total, kv_dim,
                            capacity, programs, KV_BLOCK: tl.constexpr):
        """Grid (B, P): program (i, r) copies rows r, r + P, ... < k_i of request i's draft KV to packed rows
        offset_i + r, ... (k_i clamped to the request's range; one row each when P = γ_max); program (i, 0)
        writes offset_i.
        Bad offsets (decreasing cu) can make requests' ranges overlap, so Σ k_i can pass the buffer's
        `capacity` rows: such rows are not written (the outputs are then unspecified, never out of bounds)."""
        request = tl.program_id(0).to(tl.int64)
        row = tl.program_id(1).to(tl.int64)
        start, end = _request_range(cu_ptr, request, total)
        accepted = tl.load(accepted_ptr + request)
        offset = tl.load(inclusive_ptr + request) - accepted
        accepted = tl.minimum(tl.maximum(accepted, 0), end - start)
        if row == 0:
            tl.store(offsets_ptr + request, offset)
        for copied in range(row, accepted, programs):
            if offset + copied < capacity:
                source = kv_ptr + (start + copied) * kv_dim
                target = packed_ptr + (offset + copied) * kv_dim
                for column in range(0, kv_dim, KV_BLOCK):
                    columns = column + tl.arange(0, KV_BLOCK)
                    keep = columns < kv_dim
                    tl.store(target + columns, tl.load(source + columns, mask=keep), mask=keep)


def _prepare_two_step(w: RaggedVerifyWorkload, out: dict | None = None) -> BufferedRun:
    batch, total = w.cu_num_draft_tokens.shape[0], w.draft_tokens.shape[0]
    kv_dim = w.draft_kv.shape[1]
    if out is None:
        out = ragged_outputs(w)
        out["packed_kv"] = torch.empty((max(total, 1), kv_dim), dtype=w.draft_kv.dtype, device=w.device)
        out["packed_offsets"] = torch.empty(batch, dtype=torch.int64, device=w.device)
    inclusive = torch.empty(batch, dtype=torch.int64, device=w.device)
    row_programs = min(max(w.config.gamma, 1), ROW_PROGRAMS_MAX)
    width = triton.next_power_of_2(min(max(w.config.gamma, 1), BLOCK_MAX))
    verify_args = (w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens, out["accepted_lengths"],
                   out["has_mismatch"].view(torch.uint8), out["next_tokens"], total)
    pack_args = (w.draft_kv, out["packed_kv"], w.cu_num_draft_tokens, out["accepted_lengths"], inclusive,
                 out["packed_offsets"], total, kv_dim, out["packed_kv"].shape[0], row_programs)

    def run() -> None:
        _ragged_block_kernel[(batch,)](*verify_args, BLOCK=width, num_warps=1)
        torch.cumsum(out["accepted_lengths"], 0, out=inclusive)
        _ragged_pack_kernel[(batch, row_programs)](*pack_args, KV_BLOCK=KV_BLOCK, num_warps=4)

    return BufferedRun(run, out)


register(Implementation(
    op="verify_pack_ragged", name="block_triton+pack_triton", backend="triton", devices=("cuda", "cpu"), launches=3,
    prepare=_prepare_two_step, probe=triton_probe, supports=needs_kv, writes_into=True,
    description="Triton block verify, torch.cumsum of k_i, Triton row copy per (request, row): three launches, no sync",
))
