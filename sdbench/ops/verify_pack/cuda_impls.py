"""verify_pack in CUDA (csrc/fused.cu and the two-step pipelines built from verify's and pack's kernels)."""

from __future__ import annotations

import torch

from sdbench.ops.backends import cuda_ops, cuda_probe, needs_kv
from sdbench.ops.pack.cuda_impls import PACK_REPLICATED_MAX_BATCH
from sdbench.ops.pack.outputs import pack_outputs
from sdbench.ops.verify.cuda_impls import verify_args, verify_outputs
from sdbench.ops.workload import VerifyConfig, VerifyWorkload
from sdbench.registry import BufferedRun, Implementation, Outputs, register

SINGLE_BLOCK_MAX_BATCH = 32  # fused_single_block: one warp per sequence, one block of 32 warps
# fused: csrc/fused.cu up to this B — its replicated driver (every block re-verifies all B sequences, then
# copies its share: no look-back, one round trip shorter), or its cooperative driver when the tokens pass
# 160 KiB (γ > ~640 with int64 tokens) — the single-pass scan kernel above it (the fused_scan kernel), and
# fused.cu's cooperative driver again past the scan's SCAN_MAX_BATCH. Measured on the H200's scale-kv
# grid (warm L2, GPU time): the replicated driver won 58 of 64 configs at b <= 8, the scan 157 of 158
# from b = 256 up, and b = 32 split 14 / 16 (2 ties) (docs/perf-notes.md, "Tiles of one wave").
FUSED_REPLICATED_MAX_BATCH = 16
# ...except tiny work, which `fused` hands to the single-block kernel (fused_single_block): B <= 8, γ <= 32 and
# at most 8 KiB of KV per sequence (γ · row bytes), where the replicated driver runs one or two blocks. On the
# H100's scale-kv grid (2026-11-27, before this routing) the single block was faster at all 80 config-states up
# to 4 KiB a sequence (gpu and graph views, warm and cold L2: median 0.69x / 0.77x of the replicated driver,
# worst 0.86x / 0.90x; about 1 µs less), and at 8 KiB a sequence it won 27 of 32, the rest ties of 1.00-1.03x
# (cold L2, b = 8). A second H100 run (session 20: γ = 32, kv_dim 128, b = 1 and 8) agreed: 0.74-0.86x warm,
# 0.82-1.03x cold. From 8 to 16 KiB it wins about half (worst 1.75x), past that almost never (one warp copies a
# sequence); at b = 32 it wins only below ~2 KiB a sequence, by 0.83-0.94x, which this rule leaves to the
# replicated driver. Why the replicated block costs ~1 µs more is not yet known (docs/perf-notes.md,
# "Session 19"). The bounds are the grid's measured points, not a fit.
TINY_MAX_BATCH = 8
TINY_MAX_GAMMA = 32
TINY_MAX_SEQUENCE_BYTES = 8192


def one_launch_kernel(cfg: VerifyConfig) -> str:
    """The kernel `fused` launches for this shape: fused_single_block, fused (fused.cu's drivers) or fused_scan."""
    from sdbench.ops.pack.scan_impls import SCAN_MAX_BATCH

    batch = cfg.batch_size
    if batch <= TINY_MAX_BATCH and cfg.gamma <= TINY_MAX_GAMMA and cfg.kv_bytes // batch <= TINY_MAX_SEQUENCE_BYTES:
        return "fused_single_block"
    if FUSED_REPLICATED_MAX_BATCH < batch <= SCAN_MAX_BATCH:
        return "fused_scan"
    return "fused"


def _single_block_supports(cfg: VerifyConfig) -> str | None:
    if cfg.batch_size > SINGLE_BLOCK_MAX_BATCH:
        return f"one block of 32 warps: needs B <= {SINGLE_BLOCK_MAX_BATCH}"
    return needs_kv(cfg)


def _prepare_fused(op_name: str):
    def prepare(w: VerifyWorkload, out: Outputs | None = None) -> BufferedRun:
        op = getattr(cuda_ops(), op_name)
        out = out if out is not None else {**verify_outputs(w), **pack_outputs(w, error_flags=False)}
        args = (w.draft_tokens, w.target_tokens, w.draft_kv, out["accepted_lengths"], out["has_mismatch"],
                out["next_tokens"], out["packed_kv"], out["packed_offsets"])
        return BufferedRun(lambda: op(*args), out)

    return prepare


def _prepare_one_launch(w: VerifyWorkload, out: Outputs | None = None) -> BufferedRun:
    """`fused`: the one-launch kernel for this shape (one_launch_kernel), chosen from shapes alone."""
    from sdbench.ops.verify_pack.scan_impls import prepare_fused_scan

    kernel = one_launch_kernel(w.config)
    if kernel == "fused_scan":
        return prepare_fused_scan(w, out)
    return _prepare_fused(kernel)(w, out)


def _prepare_ballot_pack_torch(w: VerifyWorkload) -> BufferedRun:
    """ballot, then the eager mask-and-gather: draft_kv[mask] allocates and syncs for its shape."""
    ballot = cuda_ops().verify_ballot
    out = {**verify_outputs(w), "packed_offsets": torch.empty(w.config.batch_size, dtype=torch.int64,
                                                              device=w.device)}
    ballot_args = verify_args(w, out)
    positions = torch.arange(w.config.gamma, device=w.device)
    accepted_lengths, packed_offsets = out["accepted_lengths"], out["packed_offsets"]

    def launch() -> None:
        ballot(*ballot_args)
        torch.cumsum(accepted_lengths, 0, out=packed_offsets)
        packed_offsets.sub_(accepted_lengths)
        out["packed_kv"] = w.draft_kv[positions[None, :] < accepted_lengths[:, None]]

    return BufferedRun(launch, out)


def _prepare_ballot_pack_cuda(w: VerifyWorkload, out: Outputs | None = None) -> BufferedRun:
    ops = cuda_ops()
    ballot, pack_op = ops.verify_ballot, ops.pack
    out = out if out is not None else {**verify_outputs(w), **pack_outputs(w, error_flags=False)}
    ballot_args = verify_args(w, out)
    pack_args = (w.draft_kv, out["accepted_lengths"], out["packed_kv"], out["packed_offsets"])

    def launch() -> None:
        ballot(*ballot_args)
        pack_op(*pack_args)

    return BufferedRun(launch, out)


def _cuda(**fields) -> Implementation:
    return register(Implementation(op="verify_pack", backend="cuda", probe=cuda_probe, **fields))


_cuda(name="fused_single_block", launches=1, writes_into=True, supports=_single_block_supports, prepare=_prepare_fused("fused_single_block"),
      description="published fused kernel: one block, warp i verifies and copies sequence i (B <= 32)")
_cuda(name="fused", launches=1, writes_into=True, supports=needs_kv, prepare=_prepare_one_launch,
      description="verify + pack in one launch, any B and kv_dim, no host sync: one block for tiny work "
                  f"(B <= {TINY_MAX_BATCH}, γ <= {TINY_MAX_GAMMA}, <= {TINY_MAX_SEQUENCE_BYTES} B of KV a sequence), "
                  f"else the whole GPU: fused.cu's drivers for B <= {FUSED_REPLICATED_MAX_BATCH}, the single-pass scan "
                  "kernel above")
_cuda(name="ballot+pack_torch", sync=True, supports=needs_kv, prepare=_prepare_ballot_pack_torch,
      description="ballot kernel, then eager draft_kv[mask] (data-dependent shape: syncs)")
_cuda(name="ballot+pack_cuda", launches=2, writes_into=True, supports=needs_kv, prepare=_prepare_ballot_pack_cuda,
      description=f"ballot kernel, then csrc/pack.cu's packer at any B (the kernel pack_cuda launches up to B = "
                  f"{PACK_REPLICATED_MAX_BATCH}): two launches, no host sync")
