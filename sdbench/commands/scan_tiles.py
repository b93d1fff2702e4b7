"""GPU time of the single-pass verify-and-pack kernel (`fused_scan`) by tile rule, beside the other
verify_pack paths (issue #17).

    python -m sdbench.commands.scan_tiles --points 1024:32:0.9:1024,256:4:0.3:128 \
        --variants default,w1,w1+t1024 --out tiles.json

A point is batch:γ:α:kv_dim (fp16 KV, int64 tokens, binomial lengths: the scale-kv grid's workload). A
variant is `fused_scan` with '+'-joined changes to its tile rule (csrc/verify_pack_scan.cu, tile_shape):
`w<N>` (aim at N waves of resident blocks; default 1), `t<KiB>` (tiles of at most KiB of worst-case KV;
default 256), `m<KiB>` (tiles of at least KiB, so tiny work takes few blocks; default 8), `g<N>` (at most
N sequence groups where such tiles allow; default 4096), `f1` (a sequence's chunk blocks copy fixed byte
ranges of its slab, the rule before the accepted bytes were split evenly over them), `l<KiB>` (in a grid of
one wave of resident blocks or less, chunks of a sequence of at least KiB of worst-case KV load their first
copy round after the look-back, not during it; default 64; l65536 keeps the loads of every chunk up to 64 MiB
during the look-back), `b1` (tiles of at most 32 sequences scan their lengths in shared memory and find a unit's
source in a shift table or a search, as before session 33, not in every warp's registers), `p1` (tiles never in
pairs) and `p2` (tiles always in pairs where the shape allows; by default a grid of several waves of tiles at the cap
takes them in pairs when the launch before on the same state accepted under half its rows); `default` changes
nothing. Each point also times --peers (default: fused, ballot+pack_cuda, ballot+pack_scan) and the launch floor (an
empty kernel) in the same rotation, so every line reads against the others of its run; each row names the GPU
(`gpu_uuid`). Times: the median over --iters calls, per L2 state and view (--views: `gpu`, CUPTI GPU time, the
default; `graph`, a CUDA-graph replay's; `wall`), each row's `<view>_us`.

--placements N builds each point's workload N times in one process (the same data, each copy in fresh memory, all
alive) and times every name on every copy in the same rotation: where the buffers land moved `fused` by up to 1.3 µs
cold and 1.7 warm at 8 KB rows on an H200 (docs/results/nvidia-h200/scale-kv/experiments/placement/), which one copy
cannot tell from a variant's effect. A row's `<view>_us` is then the median over the copies of each copy's median,
`<view>_spread_us` the copies' [min, max], and `<view>_by_copy_us` every copy's median ("fused#2": copy 2).
N copies take N times the workload's memory (each name's outputs included): a point where fewer fit is timed on as
many as fit, its row's `placements` saying how many, and a point where not one fits is skipped; a line says which.
--out is rewritten after every point, so a run stopped part way (a device call's time limit) keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import TypeVar

import torch

from sdbench import registry
from sdbench.commands.sweep import parse_points as parse_sweep_points
from sdbench.measure import environment, timing
from sdbench.ops import make_workload
from sdbench.ops.launch_floor import launch_floor
from sdbench.ops.verify_pack.reference import verify_pack
from sdbench.ops.verify_pack.scan_impls import prepare_fused_scan
from sdbench.ops.workload import VerifyConfig

PEERS = ("fused", "ballot+pack_cuda", "ballot+pack_scan")
T = TypeVar("T")


def tiling(variant: str) -> dict[str, int]:
    """fused_scan's tile-rule keyword arguments for a variant's '+'-joined changes."""
    changes: dict[str, int] = {}
    for part in variant.split("+"):
        if part in ("default", ""):
            continue
        kind, digits = part[0], part[1:]
        bad_flag = (kind in "fb" and digits != "1") or (kind == "p" and digits not in ("1", "2"))
        if kind not in "wtgmflbp" or not digits.isdigit() or not 1 <= int(digits) <= 65536 or bad_flag:
            raise ValueError(f"unknown variant part {part!r}: w<waves>, t<KiB>, m<KiB>, g<groups>, l<KiB> "
                             "(1..65536), f1, b1, p1, p2 or default")
        value = int(digits)
        if kind == "w":
            changes["tile_waves"] = value
        elif kind == "t":
            changes["tile_max_bytes"] = value * 1024
        elif kind == "m":
            changes["tile_min_bytes"] = value * 1024
        elif kind == "f":
            changes["fixed_chunks"] = value
        elif kind == "l":
            changes["late_load_bytes"] = value * 1024
        elif kind == "b":
            changes["scan_mode"] = value
        elif kind == "p":
            changes["pairs"] = value
        else:
            changes["look_back_groups"] = value
    return changes


PLACEMENT = "#"  # a timed name's copy of the workload: "fused#2" (names carry no copy with --placements 1)


def placement_tag(copy: int, placements: int) -> str:
    return f"{PLACEMENT}{copy}" if placements > 1 else ""


def over_placements(medians: dict[str, float]) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Per-copy medians ({"fused#0": …, "fused#1": …, "launch floor": …}) as (median over the copies, (min, max)
    over them) per name, in first-seen order; a name with no copy tag (the launch floor, or every name with one
    placement) is its own median and spread."""
    by_name: dict[str, list[float]] = {}
    for key, value in medians.items():
        name, _, copy = key.rpartition(PLACEMENT)
        by_name.setdefault(name if name and copy.isdigit() else key, []).append(value)
    return ({name: statistics.median(values) for name, values in by_name.items()},
            {name: (min(values), max(values)) for name, values in by_name.items()})


def copies_that_fit(wanted: int, build: Callable[[], T], reserve_bytes: int = 0) -> list[T]:
    """Up to `wanted` results of build(), all alive at once, stopping at the first that runs out of GPU memory. Empty
    when not even one fits. reserve_bytes stay allocated while the copies are built and are freed after, so what runs
    next (the checks, the L2 flush, graph capture, the profiler) has at least that much room."""
    built: list[T] = []
    try:
        reserve = torch.empty(reserve_bytes, dtype=torch.uint8, device="cuda") if reserve_bytes else None
    except torch.cuda.OutOfMemoryError:
        return built
    ran_out = False
    for _ in range(wanted):
        try:
            built.append(build())
        except torch.cuda.OutOfMemoryError:
            ran_out = True  # the failed copy's buffers live on in the traceback until the handler is left
            break
    if reserve is not None or ran_out:
        del reserve
        torch.cuda.empty_cache()  # outside the handler, so the failed copy's buffers go back to the driver too
    return built


def parse_points(text: str) -> list[VerifyConfig]:
    """batch:γ:α:kv_dim,... as configs; the syntax and its errors are `sweep --points`'."""
    return [VerifyConfig(batch_size=batch, gamma=gamma, alpha=alpha, kv_dim=kv_dim)
            for batch, gamma, alpha, kv_dim in parse_sweep_points(text)]


# Room kept free while a point's copies are built, beyond the checks' own need (torch.equal's temporary of the packed
# rows) and the cold-L2 flush buffer: graph capture, the profiler's buffers and kernel modules loaded at first launch.
COPY_HEADROOM_BYTES = 512 * 2**20


def time_point(cfg: VerifyConfig, args, views: tuple[str, ...], peers, changes: dict[str, dict[str, int]],
               floor) -> list[dict]:
    """One point's rows (one per L2 state), every name timed on as many of --placements copies as fit; none when the
    point does not fit once. A function of its own, so every buffer of the point is freed when it returns."""
    point = f"{cfg.batch_size}:{cfg.gamma}:{cfg.alpha:g}:{cfg.kv_dim}"
    variants = list(changes)
    # The reference first, on a workload of its own freed before the copies are built: the copies then have the
    # memory, and hold the same data (a workload is a function of its config and seed).
    try:
        reference = make_workload("verify_pack", cfg, "cuda")
        expected = verify_pack(reference.draft_tokens, reference.target_tokens, reference.draft_kv)
    except torch.cuda.OutOfMemoryError:
        print(f"{point}: the workload does not fit this GPU's memory: skipped", flush=True)
        return []
    total = int(expected["accepted_lengths"].sum())
    accepted_bytes = total * cfg.kv_dim * reference.draft_kv.element_size()
    del reference
    torch.cuda.empty_cache()

    def one_copy():
        """A copy of the point's workload with every name prepared on it (each name's outputs allocated)."""
        workload = make_workload("verify_pack", cfg, "cuda")
        return ({peer.name: peer.prepare(workload) for peer in peers},
                {f"fused_scan[{variant}]": prepare_fused_scan(workload, **changes[variant]) for variant in variants})

    l2_bytes = getattr(torch.cuda.get_device_properties("cuda"), "L2_cache_size", 0) or 64 * 2**20
    reserve = total * cfg.kv_dim + 2 * l2_bytes + COPY_HEADROOM_BYTES  # torch.equal's bool temporary: a byte an element
    # every copy stays alive until the point is done, so each lands in memory of its own
    copies = copies_that_fit(args.placements, one_copy, reserve)
    if len(copies) < args.placements:
        print(f"{point}: {len(copies)} of {args.placements} copies of the workload fit this GPU's memory"
              + (": timed on those" if copies else ": skipped"), flush=True)
    if not copies:
        return []
    placements = len(copies)
    runs = {}
    for copy, (peer_runs, variant_runs) in enumerate(copies):
        tag = placement_tag(copy, placements)
        runs.update({f"{name}{tag}": run for name, run in peer_runs.items()})
        if copy == 0 and floor.run is not None:  # (the rotation's order with one copy is the tool's as before)
            runs["launch floor"] = floor.run
        for name, run in variant_runs.items():
            out = run()  # checked on every copy: the copies hold the same data, in other memory
            for key in ("accepted_lengths", "has_mismatch", "next_tokens", "packed_offsets"):
                assert torch.equal(out[key], expected[key]), f"{name}: {key} differs from the reference"
            assert torch.equal(out["packed_kv"][:total], expected["packed_kv"][:total]), f"{name}: packed_kv"
            runs[f"{name}{tag}"] = run
    del expected  # the reference's packed rows are the size of the accepted KV
    rows = []
    for l2 in args.l2.split(","):
        options = timing.TimingOptions(warmup=5, iters=args.iters, gpu_iters=args.iters, cold_l2=l2 == "cold",
                                       views=views)
        result = timing.measure(runs, "cuda", options)
        row = {"batch": cfg.batch_size, "gamma": cfg.gamma, "alpha": cfg.alpha, "kv_dim": cfg.kv_dim, "l2": l2,
               "accepted_kv_bytes": accepted_bytes, "placements": placements,
               "gpu_uuid": environment.gpu_uuid(torch.cuda.current_device())}  # calls on two machines: one GPU or two
        for view in views:
            medians = {name: by_view[view].stats.median_us for name, by_view in result.items()
                       if by_view[view].stats is not None}
            row[f"{view}_us"], spreads = over_placements(medians)
            if placements > 1:
                row[f"{view}_spread_us"] = spreads
                row[f"{view}_by_copy_us"] = medians
            cells = "  ".join(f"{name} {value:.2f}" + (f" [{spreads[name][0]:.2f}-{spreads[name][1]:.2f}]"
                                                         if placements > 1 and name in spreads else "")
                              for name, value in row[f"{view}_us"].items())
            print(f"b={cfg.batch_size} γ={cfg.gamma} α={cfg.alpha:g} kv={cfg.kv_dim} {l2} {view} "
                  f"{accepted_bytes / 1e6:.2f} MB: {cells}", flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", required=True, help="batch:γ:α:kv_dim,...")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--l2", default="cold,warm")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--views", default="gpu", help="timing views, of wall,graph,gpu (default: gpu)")
    parser.add_argument("--placements", type=int, default=1,
                        help="copies of each point's workload in fresh memory, every name timed on each (default 1)")
    parser.add_argument("--out", default=None, help="JSON file of the rows")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    views = tuple(args.views.split(","))
    if not set(views) <= set(timing.CUDA_VIEWS):
        parser.error(f"--views takes some of {','.join(timing.CUDA_VIEWS)}, got {args.views!r}")
    if args.placements < 1:
        parser.error(f"--placements takes a count of at least 1, got {args.placements}")
    changes = {variant: tiling(variant) for variant in variants}  # bad variants fail before any GPU work
    peers = [registry.get("verify_pack", name) for name in args.peers.split(",") if name]
    floor = launch_floor("cuda")  # an empty kernel, timed in every rotation: the floor of the same run
    rows: list[dict] = []
    if args.out:  # rewritten after every point: a run stopped part way keeps what it finished
        with open(args.out, "w") as handle:
            json.dump(rows, handle)
    for cfg in parse_points(args.points):
        rows += time_point(cfg, args, views, peers, changes, floor)
        torch.cuda.empty_cache()  # every buffer of the point died with time_point's frame
        if args.out:
            with open(args.out, "w") as handle:
                json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
