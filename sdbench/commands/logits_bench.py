"""The from-logits benchmark driver run on the GPU host: every design at every grid point, cold and warm
L2, GPU time against the logits read floor, and the expected accepted length per rule.

    python -m sdbench.commands.logits_bench --out logits.csv            # the issue's 72 points
    python -m sdbench.commands.logits_bench --quick --out quick.csv     # b=32, γ=8, V=128256
    python -m sdbench.commands.logits_bench --quick --rule block --out block.csv
    python -m sdbench.commands.logits_bench --lengths-only --out lengths.csv    # expected lengths, no timing

Timing is sdbench.measure.timing (gpu view: CUPTI device time per call; the graph and wall views with
--views). Designs are timed in fast randomness (in-kernel Philox; FlashInfer draws its own), as an
engine runs them. The bandwidth for the floor's time is the device-to-device copy ceiling measured at the
start of the run (a 1 GiB copy, bytes read + written per second; every row carries it as `copy_tbps`), or
--tbps to fix it. The launch floor of the same run: an empty Triton kernel through the designs' own launch path
(`launch_floor.path_floor("triton_bound")`), timed in every point's session beside them; every row carries it
per view as `<view>_launch_floor_us` (empty, with `launch_floor_reason`, where it could not launch).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import json
import sys
from collections.abc import Iterable

import torch

from sdbench import registry
from sdbench.commands.logits_summary import bar_us
from sdbench.measure import environment
from sdbench.ops.prob_verify_logits.reference import expected_accepted_lengths
from sdbench.ops.prob_verify_logits.workload import (
    LogitsConfig,
    benchmark_grid,
    design_bytes,
    logits_read_floor_bytes,
    make_logits_workload,
)

DESIGNS = ("fused_logits", "vllm_v2_style", "softmax_fused_prob", "softmax_flashinfer", "torch_eager")
BYTES_DESIGN = {"fused_logits": "fused_logits", "vllm_v2_style": "vllm_v2_style"}  # the rest: softmax_then_prob
# Each row says where and with what code it was measured (the sweep's parquet carries every environment column).
PROVENANCE = ("gpu_name", "gpu_uuid", "driver", "torch_version", "triton_version", "git_sha", "sm_clock_mhz")
BATCHED_FIELDS = ("draft_tokens", "target_logits", "draft_logits", "target_temperature", "draft_temperature",
                  "uniforms", "exponential_noise")
# Requests per chunk of the expectations: each costs (2γ+1)·V·draws float64 values of p, q, gathers and
# [draws, V] mass temporaries; a chunk holds at most this many.
RULE_CHUNK_LOGITS = 2**27
EXPECTED_SAMPLES = 512  # draft sequences per point behind each expected length: 512 draws per request at b = 1
_LENGTHS: dict[LogitsConfig, dict[str, float]] = {}  # one computation per point, shared by its cold and warm rows


def _expected_lengths(cfg: LogitsConfig, workload) -> dict[str, float]:
    """Expected accepted drafts per sequence under each rule (reference.expected_accepted_lengths: fresh
    drafts, exact over the uniforms), over batch chunks of at most RULE_CHUNK_LOGITS logits, so every point
    of the grid gets both columns; ⌈EXPECTED_SAMPLES / B⌉ draws per request."""
    if cfg not in _LENGTHS:
        draws = -(-EXPECTED_SAMPLES // cfg.batch_size)
        rows = max(1, RULE_CHUNK_LOGITS // ((2 * cfg.gamma + 1) * cfg.vocab_size * draws))
        generator = torch.Generator(device=workload.device).manual_seed(cfg.seed)
        totals = {"token": 0.0, "block": 0.0}
        for start in range(0, cfg.batch_size, rows):
            part = slice(start, min(start + rows, cfg.batch_size))
            size = part.stop - part.start
            chunk = dataclasses.replace(workload, config=dataclasses.replace(cfg, batch_size=size),
                                        **{name: getattr(workload, name)[part] for name in BATCHED_FIELDS})
            for rule, mean in expected_accepted_lengths(chunk, draws, generator).items():
                totals[rule] += mean * size
        _LENGTHS[cfg] = {rule: total / cfg.batch_size for rule, total in totals.items()}
    return _LENGTHS[cfg]



def time_point(cfg: LogitsConfig, names: Iterable[str], cold_l2: bool, tbps: float, views=("gpu",),
               device: str = "cuda", gpu_iters: int = 20, means: bool = True) -> list[dict]:
    """One row per design at cfg: median time per view, the floor and the ratio the issue asks for."""
    from sdbench.measure.timing import LAUNCH_FLOOR, TimingOptions, measure
    from sdbench.ops.launch_floor import path_floor

    workload = make_logits_workload(cfg, device).with_randomness("fast")
    floor_bytes = logits_read_floor_bytes(cfg)
    floor_us = floor_bytes / (tbps * 1e12) * 1e6
    options = TimingOptions(warmup=5, iters=30, gpu_iters=gpu_iters, cold_l2=cold_l2, views=views)
    impls, reasons = {}, {}
    for name in names:
        impl = registry.get("prob_verify_logits", name)
        reason = impl.unavailable_reason(device, cfg)
        if reason is None:
            impls[name] = impl
        else:
            reasons[name] = reason
    # an empty kernel through the designs' launch path, interleaved with them: the launch floor of the same run
    floor = path_floor("triton_bound", device)
    floor_runs = {} if floor.run is None else {LAUNCH_FLOOR: floor.run}
    try:  # every design prepared at once: measure() interleaves their calls
        runs = {name: impl.prepare(workload) for name, impl in impls.items()}
        timings = measure({**runs, **floor_runs}, device, options)
    except torch.OutOfMemoryError:
        timings = {}
    if floor_runs and LAUNCH_FLOOR not in timings:  # (the designs did not fit together: the floor alone)
        timings.update(measure(floor_runs, device, options))
    floor_timing = timings.pop(LAUNCH_FLOOR, {})
    # Designs whose buffers did not fit beside the others' (b = 512, V = 128256, fp32 on an 80 GB card), or
    # that ran out of memory while timed: again one at a time, each with only the inputs beside it.
    alone = [name for name in impls if name not in timings or _out_of_memory(timings[name])]
    runs = None
    _release(device)
    for name in alone:
        try:
            timings[name] = measure({name: impls[name].prepare(workload)}, device, options)[name]
        except torch.OutOfMemoryError:
            timings.pop(name, None)
            reasons[name] = "out of memory: its buffers beside the inputs do not fit this GPU"
        _release(device)
    for name, views_timed in timings.items():  # a view with no number says why, under its name
        missing = [f"{view}: {result.reason}" for view, result in views_timed.items()
                   if result.stats is None and result.reason]
        if missing:
            reasons[name] = "; ".join(missing)
    rows = []
    for name in [*timings, *(name for name in reasons if name not in timings)]:
        row = {"design": name, "rule": cfg.rule, "batch": cfg.batch_size, "gamma": cfg.gamma, "vocab": cfg.vocab_size,
               "dtype": cfg.logits_dtype, "l2": "cold" if cold_l2 else "warm", "floor_bytes": floor_bytes,
               "copy_tbps": round(tbps, 3), "floor_us": round(floor_us, 2), "reason": reasons.get(name, ""),
               "timed_alone": name in alone}  # not interleaved with the other designs: they did not fit beside it
        moved = design_bytes(cfg, BYTES_DESIGN.get(name, "softmax_then_prob"))
        row.update(read_bytes=moved["read"], written_bytes=moved["written"],
                   read_bytes_per_row=moved["read"] // (cfg.batch_size * (2 * cfg.gamma + 1)))
        for view, result in timings.get(name, {}).items():
            stats = result.stats
            row[f"{view}_us"] = round(stats.median_us, 2) if stats else ""
            floor_stats = floor_timing[view].stats if view in floor_timing else None
            row[f"{view}_launch_floor_us"] = round(floor_stats.median_us, 2) if floor_stats else ""
            if view in ("gpu", "cpu") and stats:
                row["vs_floor_plus_3us"] = round(stats.median_us / bar_us(floor_us), 3)
        row["launch_floor_reason"] = floor.reason or next(
            (f"{view}: {result.reason}" for view, result in floor_timing.items() if result.stats is None), "")
        rows.append(row)
    where = {name: value for name, value in environment.collect(device).items() if name in PROVENANCE}
    for row in rows:
        row.update(where)
    if means:
        lengths = _expected_lengths(cfg, workload)
        for row in rows:
            row.update(expected_length_token=round(lengths["token"], 4),
                       expected_length_block=round(lengths["block"], 4))
    del workload, runs
    _release(device)
    return rows


def copy_ceiling_tbps(device: str = "cuda") -> float:
    """The logits floors' bandwidth: a 1 GiB device-to-device copy, bytes read + written, TB/s (the best of
    `calibrate_tau.COPY_CEILING_RUNS` runs, measured now)."""
    from sdbench.commands.calibrate_tau import copy_ceiling_gbps

    return copy_ceiling_gbps(device, n_bytes=2**30) / 1000


def _out_of_memory(views_timed) -> bool:
    """A view that ran out of device memory: the design raised it (error), or the profiler session did (unavailable)."""
    return any("OutOfMemoryError" in (result.reason or "") for result in views_timed.values())


def _release(device: str) -> None:
    """Give the designs' buffers back to the device. A design that raised leaves its tensors in reference
    cycles (the exception's frames) that only the collector frees. Without it, on the H100 at b = 512,
    γ = 16, V = 151936 bf16, the probability peers ran out of memory when prepared alone, where the same
    point in fp32 (larger inputs) had fit all five designs at once."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="b=32, γ=8, V=128256 only (both dtypes)")
    parser.add_argument("--designs", default=",".join(DESIGNS))
    parser.add_argument("--tbps", type=float, default=None,
                        help="bandwidth of the floor, TB/s (default: the copy ceiling measured at the start)")
    parser.add_argument("--gpu-iters", type=int, default=20, help="CUPTI-timed calls per design and point")
    parser.add_argument("--no-means", action="store_true", help="skip the expected accepted length per rule")
    parser.add_argument("--lengths-only", action="store_true",
                        help="only the expected accepted length per rule at each point (no timing)")
    parser.add_argument("--views", default="gpu", help="comma list of gpu, graph, wall")
    parser.add_argument("--rule", default="token", choices=("token", "block"),
                        help="acceptance rule timed (block: fused_logits and torch_eager; the peers give their reason)")
    parser.add_argument("--b", default=None, help="comma list: only these batch sizes of the grid")
    parser.add_argument("--gamma", default=None, help="comma list: only these γ of the grid")
    parser.add_argument("--vocab", default=None, help="comma list: only these vocabulary sizes of the grid")
    args = parser.parse_args(argv)

    def keep(value: int, chosen: str | None) -> bool:
        return chosen is None or value in {int(word) for word in chosen.split(",")}

    grid = [cfg for cfg in benchmark_grid(rule=args.rule)
            if (not args.quick or (cfg.batch_size, cfg.gamma, cfg.vocab_size) == (32, 8, 128256))
            and keep(cfg.batch_size, args.b) and keep(cfg.gamma, args.gamma) and keep(cfg.vocab_size, args.vocab)]
    if args.lengths_only:
        return _write_lengths(grid, args.out)
    if args.tbps is None:
        args.tbps = copy_ceiling_tbps()
        print(f"copy ceiling: {args.tbps:.2f} TB/s (1 GiB device-to-device copy, read + write)", file=sys.stderr)
    rows = []
    with open(args.out + ".jsonl", "w") as progress:  # row by row, so a run cut short keeps what it measured
        for cfg in grid:
            for cold in (True, False):
                point = time_point(cfg, args.designs.split(","), cold, args.tbps, tuple(args.views.split(",")),
                                   gpu_iters=args.gpu_iters, means=not args.no_means)
                rows.extend(point)
                progress.writelines(json.dumps(row) + "\n" for row in point)
                progress.flush()
                print(point[0], file=sys.stderr)
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return 0


def _write_lengths(grid: list[LogitsConfig], out: str, device: str = "cuda") -> int:
    rows = []
    for cfg in grid:
        lengths = _expected_lengths(cfg, make_logits_workload(cfg, device))
        rows.append(dict(batch=cfg.batch_size, gamma=cfg.gamma, vocab=cfg.vocab_size, dtype=cfg.logits_dtype,
                         draws_per_request=-(-EXPECTED_SAMPLES // cfg.batch_size),
                         expected_length_token=round(lengths["token"], 4),
                         expected_length_block=round(lengths["block"], 4)))
        print(rows[-1], file=sys.stderr)
        if device == "cuda":
            torch.cuda.empty_cache()
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
