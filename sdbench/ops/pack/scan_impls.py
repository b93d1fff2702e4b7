"""pack in one single-pass launch (csrc/verify_pack_scan.cu): decoupled look-back, no grid barrier.

The kernel keeps its look-back flags and launch epoch in a `scan_state`, zeroed once and reused by every
call in stream order (graph replays advance the epoch on the GPU): one state per stream
(`stream_scan_state`), since launches on one stream never overlap. Beside the epoch, each launch leaves a bit
saying whether it accepted under half its rows; in a grid of several waves the next launch on the state then
takes its tiles in pairs (docs/perf-notes.md, "Session 45"). The bit moves only the grouping, never an output,
so launches of different workloads may share a state.
"""

from __future__ import annotations

import torch

from sdbench.ops.backends import cuda_ops, cuda_probe, needs_kv
from sdbench.ops.pack.outputs import given_length_outputs
from sdbench.ops.workload import VerifyConfig, VerifyWorkload
from sdbench.registry import BufferedRun, Implementation, Outputs, register

# Mirrors csrc/verify_pack_scan.cu: 1 + kScanMaxGroups status words, kScanMaxGroups * kScanMaxTileSeqs.
SCAN_MAX_GROUPS = 65536
SCAN_STATE_ELEMS = 1 + SCAN_MAX_GROUPS
SCAN_MAX_BATCH = SCAN_MAX_GROUPS * 1024


def scan_state(device: torch.device | str) -> torch.Tensor:
    """A fresh single-pass state: zeroed once here, never reset afterwards (the epoch lives in it)."""
    return torch.zeros(SCAN_STATE_ELEMS, dtype=torch.int64, device=device)


_STREAM_STATES: dict[tuple[int, int], torch.Tensor] = {}


def stream_scan_state(device: torch.device | str) -> torch.Tensor:
    """The state of the stream current on device when a run is prepared, made (and zeroed, one fill) on
    its first use there.

    Every single-pass launch on one stream shares it: they run in stream order, which is all the epoch
    needs, and a per-call state would cost a 513 KiB fill per call. Prepared during a CUDA-graph capture
    (an engine capturing `sdbench.verify_pack`), a run gets a state of its own that is not kept: its fill
    is recorded into that graph, not run now, so the memory is not zero until the graph replays, and a
    later call on the capture stream's handle must not see it. Runs prepared on one stream and replayed
    in graphs must not overlap one another (replay those graphs on one stream).
    """
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing():
        return scan_state(torch.device("cuda", index))
    key = (index, torch.cuda.current_stream(index).cuda_stream)
    state = _STREAM_STATES.get(key)
    if state is None:
        state = _STREAM_STATES[key] = scan_state(torch.device("cuda", index))
    return state


def scan_supports(cfg: VerifyConfig) -> str | None:
    if cfg.batch_size > SCAN_MAX_BATCH:
        return f"single-pass scan: needs B <= {SCAN_MAX_BATCH} ({SCAN_MAX_GROUPS} groups of 1024 sequences)"
    return needs_kv(cfg)


def prepare_pack_scan(w: VerifyWorkload, out: Outputs | None = None) -> BufferedRun:
    op = cuda_ops().pack_scan
    out = given_length_outputs(w, out)
    args = (w.draft_kv, w.accepted_lengths, out["packed_kv"], out["packed_offsets"], out["error_flags"],
            stream_scan_state(w.device))
    return BufferedRun(lambda: op(*args), out)


register(Implementation(
    op="pack", name="pack_scan", backend="cuda", probe=cuda_probe, launches=1, writes_into=True, supports=scan_supports,
    prepare=prepare_pack_scan,
    description="single pass: tiles of sequences or row chunks, decoupled look-back with epoch flags, 16-byte copy",
))
