"""verify_pack in one single-pass launch (csrc/verify_pack_scan.cu), and the two-step pipeline built
from the ballot kernel and the single-pass packer.

`fused_scan`: each block verifies its tile's sequences, publishes their sum, loads its accepted KV and
looks back for its offset (decoupled look-back; flags carry a launch epoch kept on the GPU, so no
reset launch and no host counter). Design and predictions: docs/perf-notes.md ("Single-pass scan").
"""

from __future__ import annotations

import torch

from sdbench.ops.backends import cuda_ops, cuda_probe
from sdbench.ops.pack.outputs import pack_outputs
from sdbench.ops.pack.scan_impls import scan_supports, stream_scan_state
from sdbench.ops.verify.cuda_impls import verify_args, verify_outputs
from sdbench.ops.workload import VerifyWorkload
from sdbench.registry import BufferedRun, Implementation, Outputs, register


def prepare_fused_scan(w: VerifyWorkload, out: Outputs | None = None, **tiling: int) -> BufferedRun:
    """tiling: the kernel's tile-rule keywords (tile_waves, tile_max_bytes, tile_min_bytes,
    look_back_groups, fixed_chunks, late_load_bytes, scan_mode, pairs; none: its defaults), which
    sdbench.commands.scan_tiles varies."""
    op = cuda_ops().fused_scan
    out = out if out is not None else {**verify_outputs(w), **pack_outputs(w, error_flags=False)}
    args = (w.draft_tokens, w.target_tokens, w.draft_kv, out["accepted_lengths"], out["has_mismatch"],
            out["next_tokens"], out["packed_kv"], out["packed_offsets"], stream_scan_state(w.device))
    return BufferedRun(lambda: op(*args, **tiling), out)


def _prepare_ballot_pack_scan(w: VerifyWorkload, out: Outputs | None = None) -> BufferedRun:
    ops = cuda_ops()
    ballot, pack_op = ops.verify_ballot, ops.pack_scan
    out = out if out is not None else {**verify_outputs(w), **pack_outputs(w, error_flags=False)}
    ballot_args = verify_args(w, out)
    # verified lengths are in [0, γ]: pack_scan's flags are scratch, not an output
    flags = torch.empty(w.config.batch_size, dtype=torch.int32, device=w.device)
    pack_args = (w.draft_kv, out["accepted_lengths"], out["packed_kv"], out["packed_offsets"], flags,
                 stream_scan_state(w.device))

    def launch() -> None:
        ballot(*ballot_args)
        pack_op(*pack_args)

    return BufferedRun(launch, out)


register(Implementation(
    op="verify_pack", name="fused_scan", backend="cuda", probe=cuda_probe, sync=False, launches=1, writes_into=True,
    supports=scan_supports, prepare=prepare_fused_scan,
    description="verify + pack in one single-pass launch: per-tile ballots, decoupled look-back, no reset, no sync",
))
register(Implementation(
    op="verify_pack", name="ballot+pack_scan", backend="cuda", probe=cuda_probe, sync=False, launches=2,
    writes_into=True,
    supports=scan_supports, prepare=_prepare_ballot_pack_scan,
    description="ballot kernel, then the single-pass pack_scan kernel: two launches, no host sync",
))
