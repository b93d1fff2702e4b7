"""pack in CUDA: the published packer (host sync, csrc/pack.cu) and the sync-free whole-GPU packer `pack_cuda`,
which launches csrc/pack.cu's drivers for small B and the single-pass scan kernel (`pack_scan`) above."""

from __future__ import annotations

from sdbench.ops.backends import cuda_ops, cuda_probe, needs_kv
from sdbench.ops.pack.outputs import given_length_outputs
from sdbench.ops.pack.reference import length_errors
from sdbench.ops.workload import VerifyConfig, VerifyWorkload
from sdbench.registry import BufferedRun, Implementation, Outputs, register

# pack_cuda: csrc/pack.cu up to this B (its replicated driver: every block scans all B lengths, then copies its
# share; no look-back), the single-pass scan kernel (pack_scan's) above it, and pack.cu's cooperative driver (two
# grid barriers) again past the scan's SCAN_MAX_BATCH. Before this rule pack.cu ran at every B. Measured on the
# H100 (session 30, gpu view, cold and warm L2, γ = 8 and 32, kv 128 and 1024; docs/results/nvidia-h100-80gb-hbm3/
# scale-pack/bound.txt): pack.cu was faster at 41 of 42 states with B <= 128 (scan / pack.cu 1.01-1.20, the other
# 0.99), mixed at 256 (0.89-1.04); in the scale-kv grid's two-step
# pipelines the scan kernel won 2/3 of the configs at B = 256 and 1024 and all at 4096. The bound is higher than
# `fused`'s 16 because pack.cu's replicated block only loads and scans the lengths, where fused.cu's re-verifies
# every sequence (docs/perf-notes.md, "Session 30").
PACK_REPLICATED_MAX_BATCH = 128


def pack_kernel(cfg: VerifyConfig) -> str:
    """The kernel `pack_cuda` launches for this shape: "pack_cuda" (csrc/pack.cu's drivers) or "pack_scan"."""
    from sdbench.ops.pack.scan_impls import SCAN_MAX_BATCH

    return "pack_scan" if PACK_REPLICATED_MAX_BATCH < cfg.batch_size <= SCAN_MAX_BATCH else "pack_cuda"


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
    """`pack_cuda`: the kernel for this shape (pack_kernel), chosen from shapes alone."""
    if pack_kernel(w.config) == "pack_scan":
        from sdbench.ops.pack.scan_impls import prepare_pack_scan

        return prepare_pack_scan(w, out)
    op = cuda_ops().pack_flagged
    out = given_length_outputs(w, out)
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
    description=f"sync-free, any B: csrc/pack.cu's replicated driver for B <= {PACK_REPLICATED_MAX_BATCH} (every block "
                "scans the lengths, then copies its share of the accepted bytes in 16-byte vectors), the single-pass "
                "scan kernel above, pack.cu's cooperative driver past the scan's batch limit",
))
