"""`sdbench sweep`: every config of a grid, parity-checked, timed interleaved, one parquet part each.

    spec = build_spec("quick", device="cuda", out_dir=Path("results/quick"))
    summary = run_sweep(spec)

Per config: build the workload once; for every implementation check parity (a failure is a `failed`
row and is not timed; one that cannot run here is an `unavailable` row with the reason); time the rest
round-robin together with the launch floor in every view; write the rows as one part file. Inputs are
seeded by the config alone (never by its position in the grid), so `--shard` and `--resume` measure
exactly what a single full run would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from sdbench import parity, registry
from sdbench.errors import SdbenchError, closest, writable_folder
from sdbench.measure import environment as envinfo
from sdbench.measure import results, timing
from sdbench.ops import backends, make_workload
from sdbench.ops.launch_floor import (
    HOST_STATE_TOLERANCE,
    LaunchFloor,
    config_host_slowed,
    host_slowed,
    host_state_differs,
    launch_floor,
    lowest_wall_floors,
    path_floor,
)
from sdbench.ops.workload import DEFAULT_VOCAB_SIZE, KV_DTYPES, VerifyConfig
from sdbench.registry import Implementation

SWEEP_DISTRIBUTIONS = ("binomial", "geometric", "fixed", "trace", "trace-rounds", "trace-rounds-sorted")
KV_OPS = ("pack", "verify_pack", "verify_pack_ragged")
RAGGED_OPS = ("verify_ragged", "verify_pack_ragged", "prob_verify_ragged")
PROB_OPS = ("prob_verify", "prob_verify_ragged")  # probabilities over a vocabulary, timed with fast randomness
DEFAULT_KV_DIMS = (128, 512, 1024, 2048)

SWEEP_WARMUP_CALLS = 500  # empty launches before the first config (~10 ms)

# The published sweeps. Options given explicitly override a preset's values.
PRESETS: dict[str, dict[str, Any]] = {
    "main": {"op": "verify", "batch_sizes": (1, 4, 16, 32), "gammas": (8, 64, 128), "alphas": (0.3, 0.6, 0.9)},
    "gamma-sensitivity": {"op": "verify", "batch_sizes": (32,), "gammas": (4, 8, 16, 32, 64, 128), "alphas": (0.3, 0.9)},
    "fused": {
        "op": "verify_pack", "batch_sizes": (4, 32), "gammas": (8, 128), "alphas": (0.3, 0.9),
        "kv_dims": DEFAULT_KV_DIMS,
    },
    "quick": {"op": "verify", "batch_sizes": (1, 32), "gammas": (8, 128), "alphas": (0.3, 0.9)},
    "scale": {
        "op": "verify", "batch_sizes": (1, 32, 256, 1024, 4096), "gammas": (8, 128, 256, 1024), "alphas": (0.3, 0.9),
    },
    # [scale branch, issue #17] verify_pack from one sequence to 65,536 (run once plain, once --cold-l2);
    # points whose draft KV does not fit beside its outputs become `error` rows, the rest run.
    "scale-kv": {
        "op": "verify_pack", "batch_sizes": (1, 8, 32, 256, 1024, 4096, 16384, 65536), "gammas": (4, 8, 32, 128),
        "alphas": (0.3, 0.9), "kv_dims": (64, 128, 1024, 4096),
    },
    # [scale branch, issue #17] pack alone over scale-kv's grid: "pack_cuda likewise near the copy floor at every
    # scale" (the report's pack roofline table)
    "scale-pack": {
        "op": "pack", "batch_sizes": (1, 8, 32, 256, 1024, 4096, 16384, 65536), "gammas": (4, 8, 32, 128),
        "alphas": (0.3, 0.9), "kv_dims": (64, 128, 1024, 4096),
    },
}


@dataclass(frozen=True)
class SweepSpec:
    """Everything one `sdbench sweep` invocation measures. Defaults: the published main grid."""

    op: str = "verify"
    batch_sizes: tuple[int, ...] = (1, 4, 16, 32)
    gammas: tuple[int, ...] = (8, 64, 128)
    alphas: tuple[float, ...] = (0.3, 0.6, 0.9)
    kv_dims: tuple[int, ...] = ()  # () = the op's default: none for verify / prob ops, DEFAULT_KV_DIMS for KV ops
    # (b, γ, α, kv_dim) configs in place of the b × γ × α × kv_dim grid, e.g. a grid's near-bar configs swept again
    points: tuple[tuple[int, int, float, int], ...] = ()
    vocab_sizes: tuple[int, ...] = (DEFAULT_VOCAB_SIZE,)
    token_dtypes: tuple[str, ...] = ("int64",)
    kv_dtypes: tuple[str, ...] = ("float16",)  # KV ops
    prob_dtypes: tuple[str, ...] = ("float32",)  # PROB_OPS
    impls: tuple[str, ...] = ()  # () = every registered implementation of op
    dist: str = "binomial"
    fixed_length: int | None = None  # dist "fixed": every k_i
    draft_lengths: str = "uniform"  # RAGGED_OPS: the distribution of γ_i
    trace_path: str | None = None  # dist "trace": a file of observed accepted lengths
    device: str = "cuda"
    warmup: int = 20
    iters: int = 200
    gpu_iters: int = 50  # iterations profiled for the gpu view
    max_noise: float = 0.01  # wall / graph: sample past iters until the median's relative SE is under this...
    max_time: float = 0.5  # ...or this many seconds per view and config were spent (0: exactly iters samples)
    min_time: float = 0.0  # sample at least this many seconds per view and config, noisy or not (<= max_time)
    views: tuple[str, ...] = ()  # () = every view of the device; e.g. ("gpu", "graph") skips the host's wall view
    # wall: a config whose floor is this far above the sweep's lowest of its path is measured again at the end
    host_tolerance: float = HOST_STATE_TOLERANCE
    # copies of each config's workload in fresh memory, every implementation timed on each: where the buffers land
    # moved the scan kernel's copy by up to 9% on an H200 (docs/results/nvidia-h200/scale-kv/experiments/placement/)
    placements: int = 1
    cold_l2: bool = False
    shard_index: int = 0
    shard_count: int = 1
    resume: bool = False
    out_dir: Path = Path("results")
    run_id: str | None = None  # None: a fresh id per invocation
    seed: int = 0


def build_spec(preset: str | None = None, **options: Any) -> SweepSpec:
    """A spec from a preset (or the defaults), with every option that is not None applied on top."""
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise SdbenchError(
                f"unknown preset {preset!r}{closest(preset, list(PRESETS))}; choose one of {', '.join(PRESETS)}"
            )
        values.update(PRESETS[preset])
    for name, value in options.items():
        if value is None:
            continue
        values[name] = tuple(value) if isinstance(value, list) else value
    fields = {f.name for f in dataclasses.fields(SweepSpec)}
    unknown = set(values) - fields
    if unknown:
        raise TypeError(f"unknown sweep options {sorted(unknown)}")
    return SweepSpec(**values)


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n) with 0 <= i < n."""
    head, slash, tail = text.partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        raise SdbenchError(f"--shard: {text!r} is not i/n (e.g. 0/4 for the first of four shards)") from None
    if not slash or count < 1 or not 0 <= index < count:
        raise SdbenchError(f"--shard: {text!r} needs 0 <= i < n (shards are numbered from 0, e.g. 0/4 ... 3/4)")
    return index, count


# --- the grid ----------------------------------------------------------------------------------
def _unique(values) -> tuple:
    return tuple(dict.fromkeys(values))


def parse_points(text: str) -> tuple[tuple[int, int, float, int], ...]:
    """'1024:32:0.3:64,8:4:0.9' -> ((1024, 32, 0.3, 64), (8, 4, 0.9, 0)): b:γ:α[:kv_dim], kv_dim 0 when left out (ops
    that move no KV); a clear SdbenchError naming the bad point otherwise (configs validate the values themselves)."""
    points = []
    for word in text.split(","):
        parts = word.strip().split(":")
        try:
            if len(parts) not in (3, 4):
                raise ValueError
            batch, gamma, alpha = int(parts[0]), int(parts[1]), float(parts[2])
            kv_dim = int(parts[3]) if len(parts) == 4 else 0
        except ValueError:
            raise SdbenchError(f"--points: {word.strip()!r} is not b:γ:α or b:γ:α:kv_dim (e.g. 1024:32:0.3:64)") from None
        points.append((batch, gamma, alpha, kv_dim))
    return tuple(points)


def kv_dims_of(spec: SweepSpec) -> tuple[int, ...]:
    if spec.points:
        return _unique(point[3] for point in spec.points)
    if spec.kv_dims:
        return _unique(spec.kv_dims)
    return DEFAULT_KV_DIMS if spec.op in KV_OPS else (0,)


def validate(spec: SweepSpec) -> None:
    """Raise SdbenchError naming the bad value and the fix (configs validate B, γ, α themselves)."""
    if spec.op not in registry.OPERATIONS:
        raise SdbenchError(
            f"unknown operation {spec.op!r}{closest(spec.op, list(registry.OPERATIONS))}; "
            f"choose one of {', '.join(registry.OPERATIONS)}"
        )
    if spec.dist not in SWEEP_DISTRIBUTIONS:
        raise SdbenchError(f"--dist: {spec.dist!r} is not one of {', '.join(SWEEP_DISTRIBUTIONS)}")
    if spec.dist == "fixed" and spec.fixed_length is None:
        raise SdbenchError("--dist fixed needs --fixed-length K (every sequence accepts K draft tokens)")
    if spec.dist.startswith("trace") and spec.trace_path is None:
        raise SdbenchError(f"--dist {spec.dist} needs --trace PATH (a file of observed accepted lengths)")
    for option, values in (("--b", spec.batch_sizes), ("--gamma", spec.gammas), ("--alpha", spec.alphas)):
        if not values:
            raise SdbenchError(f"{option}: needs at least one value")
    option = "--points" if spec.points else "--kv-dim"
    if spec.op in KV_OPS and any(kv_dim < 1 for kv_dim in kv_dims_of(spec)):
        raise SdbenchError(f"{option}: {spec.op} moves draft KV, so every kv_dim must be >= 1")
    if spec.op not in KV_OPS and any(kv_dim != 0 for kv_dim in kv_dims_of(spec)):
        raise SdbenchError(f"{option}: {spec.op} moves no KV; use --op verify_pack or --op pack to sweep kv_dim")
    if spec.warmup < 0:
        raise SdbenchError(f"--warmup must be >= 0, got {spec.warmup}")
    if spec.iters < 1:
        raise SdbenchError(f"--iters must be >= 1, got {spec.iters}")
    if not 0 < spec.max_noise < 1:
        raise SdbenchError(f"--max-noise must be in (0, 1), e.g. 0.01 for 1%, got {spec.max_noise}")
    if spec.max_time < 0:
        raise SdbenchError(f"--max-time must be >= 0 seconds, got {spec.max_time}")
    if not 0 <= spec.min_time <= spec.max_time:
        raise SdbenchError(f"--min-time must be in [0, --max-time={spec.max_time:g}] seconds, got {spec.min_time:g}")
    if spec.views:
        native = timing.views_for(spec.device)
        unknown = [view for view in spec.views if view not in native]
        if unknown:
            raise SdbenchError(f"--views: {', '.join(unknown)} cannot be measured on {spec.device}; "
                               f"choose from {', '.join(native)}")
    if not spec.host_tolerance > 0:
        raise SdbenchError(f"--host-tolerance must be > 0, e.g. 0.15 for 15%, got {spec.host_tolerance:g}")
    if spec.placements < 1:
        raise SdbenchError(f"--placements must be >= 1 (copies of each config's workload), got {spec.placements}")
    if spec.gpu_iters < 1:
        raise SdbenchError(f"gpu_iters must be >= 1, got {spec.gpu_iters}")
    if not 0 <= spec.shard_index < spec.shard_count:
        raise SdbenchError(f"--shard: needs 0 <= i < n, got {spec.shard_index}/{spec.shard_count}")
    backends.validate_device(spec.device)
    writable_folder(spec.out_dir)
    registry.select(spec.op, list(spec.impls))  # unknown names raise with a suggestion
    grid(spec)  # every config validates its own values


def grid(spec: SweepSpec) -> list[VerifyConfig]:
    """Every config of the spec, in a fixed order (the order --shard partitions)."""
    kv_dims = kv_dims_of(spec)
    value_dtypes = spec.prob_dtypes if spec.op in PROB_OPS else spec.kv_dtypes
    if spec.op not in KV_OPS and spec.op not in PROB_OPS:
        value_dtypes = value_dtypes[:1]  # verify has no KV: its dtype would only multiply the grid
    if spec.points:  # the given configs, in their order, for every vocabulary and dtype
        points = ((vocab, kv_dim, token_dtype, value_dtype, batch, gamma, alpha)
                  for vocab, token_dtype, value_dtype in itertools.product(
                      _unique(spec.vocab_sizes), _unique(spec.token_dtypes), _unique(value_dtypes))
                  for batch, gamma, alpha, kv_dim in _unique(spec.points))
    else:
        points = itertools.product(
            _unique(spec.vocab_sizes), kv_dims, _unique(spec.token_dtypes), _unique(value_dtypes),
            _unique(spec.batch_sizes), _unique(spec.gammas), _unique(spec.alphas),
        )
    configs = []
    for vocab, kv_dim, token_dtype, value_dtype, batch, gamma, alpha in points:
        dtype_field = {"prob_dtype": value_dtype} if spec.op in PROB_OPS else {"kv_dtype": value_dtype}
        configs.append(VerifyConfig(
            batch_size=batch, gamma=gamma, alpha=float(alpha), kv_dim=kv_dim, dist=spec.dist, vocab_size=vocab,
            token_dtype=token_dtype, seed=spec.seed, fixed_length=spec.fixed_length, trace_path=spec.trace_path,
            draft_lengths=spec.draft_lengths, **dtype_field,
        ))
    return configs


def shard(configs: list[VerifyConfig], index: int, count: int) -> list[VerifyConfig]:
    """Every count-th config starting at index: the shards 0..count-1 partition the grid exactly."""
    return configs[index::count]


def config_columns(op: str, device: str, cfg: VerifyConfig, options: timing.TimingOptions,
                   host_tolerance: float = HOST_STATE_TOLERANCE, placements: int = 1) -> dict[str, Any]:
    """The results columns of results.CONFIG_COLUMNS for cfg measured with options (and the sweep's host-state
    tolerance and placements), plus the device (recorded by type: cuda, cpu). The machine's gpu_name is added by
    the environment record."""
    return {
        "op": op, "device": torch.device(device).type, "batch_size": cfg.batch_size, "gamma": cfg.gamma, "alpha": cfg.alpha,
        "kv_dim": cfg.kv_dim, "vocab_size": cfg.vocab_size, "dist": cfg.dist,
        "fixed_length": cfg.fixed_length if cfg.dist == "fixed" else None,
        "draft_lengths": cfg.draft_lengths if op in RAGGED_OPS else None,
        "trace_sha256": results.trace_sha256(cfg.trace_path) if cfg.dist.startswith("trace") else None,
        "token_dtype": cfg.token_dtype, "kv_dtype": cfg.prob_dtype if op in PROB_OPS else cfg.kv_dtype,
        "seed": cfg.seed, "warmup": options.warmup, "iters": options.iters, "cold_l2": options.cold_l2,
        "settings": (f"warmup={options.warmup} iters={options.iters} gpu_iters={options.gpu_iters} "
                     f"max_noise={options.max_noise:g} max_time={options.max_time_s:g}"
                     # only when set: results written before --min-time keep their config key
                     + (f" min_time={options.min_time_s:g}" if options.min_time_s else "")
                     # only when a subset: a config measured in fewer views is not the full one
                     + (f" views={','.join(options.views)}" if options.views else "")
                     + (f" host_tolerance={host_tolerance:g}" if host_tolerance != HOST_STATE_TOLERANCE else "")
                     + (f" placements={placements}" if placements > 1 else "")),
    }


def label(op: str, cfg: VerifyConfig) -> str:
    text = f"{op} b={cfg.batch_size} γ={cfg.gamma} α={cfg.alpha:g}"
    if cfg.kv_dim:
        text += f" kv_dim={cfg.kv_dim}"
    if op in PROB_OPS:
        text += f" V={cfg.vocab_size} {cfg.prob_dtype}"
    if op in RAGGED_OPS:
        text += f" γ_i {cfg.draft_lengths}"
    return text


# --- progress and summary ----------------------------------------------------------------------
@dataclass(frozen=True)
class SweepProgress:
    done: int  # configs finished by this invocation
    total: int  # configs this invocation measures (its shard, less those resumed)
    current: str | None  # the config being measured; None between configs


@dataclass
class SweepSummary:
    run_id: str
    out_dir: Path
    device: str
    views: tuple[str, ...]
    grid_size: int  # configs in the whole grid
    shard_size: int  # configs in this shard
    skipped: int = 0  # already present (--resume)
    measured: int = 0
    interrupted: bool = False
    parts: list[Path] = field(default_factory=list)
    medians_us: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (impl, view) -> per config
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)  # impl -> status -> configs
    timed_rows: int = 0  # ok rows of implementations (the launch floor not counted)
    failed_rows: int = 0  # rows that failed parity or raised
    reasons: dict[str, list[str]] = field(default_factory=dict)  # why rows were not timed -> implementations
    host_remeasured: int = 0  # configs whose wall view was measured again at the end (slow host state)
    host_kept: int = 0  # ...of which the second measurement, in a faster host state, was kept
    host_slowed_configs: int = 0  # configs whose wall rows stayed slowed beyond the tolerance: flagged noisy

    @property
    def remaining(self) -> int:
        return self.shard_size - self.skipped - self.measured

    @property
    def impls(self) -> list[str]:
        return list(self.statuses)

    def median_of_medians(self, impl: str, view: str) -> float | None:
        values = self.medians_us.get((impl, view))
        return timing.percentile(values, 50.0) if values else None

    def recount(self, rows_of_configs: list[list[dict[str, Any]]]) -> None:
        """Count every config's rows afresh (after the host-state check replaced some wall rows)."""
        self.medians_us, self.statuses, self.reasons = {}, {}, {}
        self.timed_rows = self.failed_rows = 0
        for rows in rows_of_configs:
            self.add(rows)

    def add(self, rows: list[dict[str, Any]]) -> None:
        """One config's rows. It counts once per implementation and status, however many copies of its workload
        (--placements) it was timed on, and gives each (implementation, view) one median: its copies' median."""
        seen: dict[str, set[str]] = {}
        medians: dict[tuple[str, str], list[float]] = {}
        for row in rows:
            statuses = seen.setdefault(row["impl"], set())
            if row["view"] == self.views[0]:  # count configs, not rows or views
                statuses.add(row["status"])
            if row["status"] == "ok":
                medians.setdefault((row["impl"], row["view"]), []).append(row["median_us"])
            if row["impl"] == timing.LAUNCH_FLOOR:
                continue
            if row["status"] == "ok":
                self.timed_rows += 1
                continue
            self.failed_rows += row["status"] in ("failed", "error")
            names = self.reasons.setdefault(f"{row['status']}: {row['reason'] or 'no reason given'}", [])
            if row["impl"] not in names:
                names.append(row["impl"])
        for impl, statuses in seen.items():
            counts = self.statuses.setdefault(impl, {})
            for status in sorted(statuses):
                counts[status] = counts.get(status, 0) + 1
        for key, values in medians.items():
            self.medians_us.setdefault(key, []).append(timing.percentile(values, 50.0))


# --- running -----------------------------------------------------------------------------------
def check_op_available(op: str) -> None:
    """A clean error when op has no implementations or cannot build workloads yet (the prob ops)."""
    if not registry.implementations(op):
        raise SdbenchError(f"no implementations of {op!r} are registered yet; nothing to sweep")
    if op in PROB_OPS:
        try:
            make_workload(op, VerifyConfig(batch_size=1, gamma=1, vocab_size=8), "cpu")
        except SdbenchError as err:
            raise SdbenchError(f"{op} cannot be swept here yet: {err}") from None


def run_sweep(spec: SweepSpec, progress: Callable[[SweepProgress], None] | None = None) -> SweepSummary:
    """Measure every config of spec's shard (less those already written, with resume) into spec.out_dir.

    Ctrl-C (KeyboardInterrupt) stops after the config in flight is abandoned; every finished part is
    kept and the summary says `interrupted`. Raises SdbenchError for bad specs before measuring anything.
    """
    validate(spec)
    check_op_available(spec.op)
    impls = list({impl.key: impl for impl in registry.select(spec.op, list(spec.impls))}.values())  # no repeats
    device = str(torch.device(spec.device))
    configs = grid(spec)
    mine = shard(configs, spec.shard_index, spec.shard_count)
    options = timing.TimingOptions(warmup=spec.warmup, iters=spec.iters, gpu_iters=spec.gpu_iters, cold_l2=spec.cold_l2,
                                   max_noise=spec.max_noise, max_time_s=spec.max_time,
                                   min_time_s=spec.min_time, views=spec.views or None)
    done = results.done_configs(spec.out_dir) if spec.resume else set()
    machine = {"gpu_name": envinfo.collect(device).get("gpu_name")}
    todo = [cfg for cfg in mine if results.config_key(
        {**config_columns(spec.op, device, cfg, options, spec.host_tolerance, spec.placements), **machine}) not in done]
    summary = SweepSummary(
        run_id=spec.run_id or results.new_run_id(), out_dir=Path(spec.out_dir), device=device,
        views=timing.views_for(device, options), grid_size=len(configs), shard_size=len(mine), skipped=len(mine) - len(todo),
    )
    notify = progress or (lambda _: None)
    # Events and graphs use the current device's stream: make the sweep's device current.
    on_device = torch.cuda.device(torch.device(device)) if device.startswith("cuda") else contextlib.nullcontext()
    try:
        with on_device:
            floor = launch_floor(device)
            if floor.run is not None and todo:
                # The first config of a sweep used to pay the warm-up of clocks, driver and caches (its floor
                # moved 2×): spend it here, on the launch path itself, before anything is recorded.
                timing.measure({timing.LAUNCH_FLOOR: floor.run}, device,
                               timing.TimingOptions(warmup=SWEEP_WARMUP_CALLS, iters=1, views=("wall", "graph")))
            notify(SweepProgress(0, len(todo), None))
            measured: list[MeasuredConfig] = []
            for cfg in todo:
                notify(SweepProgress(summary.measured, len(todo), label(spec.op, cfg)))
                key_values = {**config_columns(spec.op, device, cfg, options, spec.host_tolerance, spec.placements),
                              **machine}
                with results.config_claim(spec.out_dir, key_values, spec.resume) as claimed:
                    if not claimed:  # another sweep into this folder is measuring it, or has
                        summary.skipped += 1
                        continue
                    rows = measure_config(spec.op, cfg, impls, device, options, floor, summary.run_id,
                                          spec.host_tolerance, spec.placements)
                    part = results.write_part(spec.out_dir, results.part_name(summary.run_id, rows[0]), rows)
                    summary.parts.append(part)
                measured.append(MeasuredConfig(cfg, rows, part))
                summary.add(rows)
                summary.measured += 1
                notify(SweepProgress(summary.measured, len(todo), None))
            if measured and "wall" in timing.views_for(device, options):
                def announce(cfg: VerifyConfig) -> None:
                    notify(SweepProgress(summary.measured, len(todo), f"{label(spec.op, cfg)}: wall again (slow host)"))

                remeasure = _wall_remeasure(spec.op, impls, device, options, floor, summary.run_id, spec.host_tolerance,
                                            spec.placements)
                settle_host_state(measured, spec.host_tolerance, remeasure, summary, announce)
    except KeyboardInterrupt:
        summary.interrupted = True
    return summary


# --- the host-state check of the wall view --------------------------------------------------------------
@dataclass
class MeasuredConfig:
    """A config this invocation measured: its rows as written, and the part file that holds them."""

    cfg: VerifyConfig
    rows: list[dict[str, Any]]
    part: Path


def settle_host_state(measured: list[MeasuredConfig], tolerance: float,
                      remeasure_wall: Callable[[VerifyConfig], list[dict[str, Any]]], summary: SweepSummary,
                      announce: Callable[[VerifyConfig], None] = lambda cfg: None) -> None:
    """After the sweep's configs: the wall view of every config measured in a slow host state, measured again.

    A path's wall floor probes the host's state when its config ran (sdbench.ops.launch_floor). A config whose
    floor of any path is more than `tolerance` above the lowest wall floor of that path in this invocation (not
    in parts an earlier --resume or another --shard wrote: each invocation is its own baseline) has its
    wall view measured once more (every callable in rotation, floors included: `remeasure_wall`), and the new
    wall rows replace the old ones if they were measured in a faster state. A retry can lower a path's lowest
    floor, so the check repeats over the configs not yet retried; each is retried at most once. Then every wall
    row records `host_slowed` (its floor over the sweep's lowest of its path), and an ok row still beyond the
    tolerance is `noisy`: it will not repeat against its floor in a run made in the other state. Every part is
    rewritten in place (same name, same config key: --resume still counts it once). It helps only if the host
    returns to its fast state before the sweep ends; a sweep in one state is left as it was measured.
    """
    retried: set[int] = set()
    while True:
        lowest = lowest_wall_floors(row for config in measured for row in config.rows)
        slow = [index for index, config in enumerate(measured) if index not in retried
                and _slowed_beyond(config_host_slowed(config.rows, lowest), tolerance)]
        if not slow:
            break
        for index in slow:
            retried.add(index)
            config = measured[index]
            announce(config.cfg)
            again = {_row_key(row): row for row in remeasure_wall(config.cfg)}
            if _faster_state(config.rows, again, lowest):
                config.rows = [again.get(_row_key(row), row) for row in config.rows]
                summary.host_kept += 1
    summary.host_remeasured = len(retried)
    for config in measured:
        summary.host_slowed_configs += _flag_host_state(config.rows, lowest, tolerance)
        results.write_part(config.part.parent, config.part.name, config.rows)
    summary.recount([config.rows for config in measured])


def _row_key(row: dict[str, Any]) -> tuple:
    """A row within its config: implementation, view and the workload's copy (--placements)."""
    return row["impl"], row["view"], row.get("placement")


def _slowed_beyond(slowed: float | None, tolerance: float) -> bool:
    return slowed is not None and host_state_differs(slowed, 1.0, tolerance)


def _faster_state(rows: list[dict[str, Any]], again: dict[tuple, dict[str, Any]],
                  lowest: dict[str, float]) -> bool:
    """Whether the second wall measurement ran in a faster host state than the first (its floors lower) and
    timed every row the first did (a row that raised the second time keeps its first measurement)."""
    before, after = config_host_slowed(rows, lowest), config_host_slowed(again.values(), lowest)
    lost = any(row["view"] == "wall" and row["status"] == "ok"
               and again.get(_row_key(row), {}).get("status") != "ok" for row in rows)
    return before is not None and after is not None and after < before and not lost


def _flag_host_state(rows: list[dict[str, Any]], lowest: dict[str, float], tolerance: float) -> bool:
    """Record host_slowed on every wall row with a floor; an ok row beyond the tolerance is noisy. True when
    any was."""
    slowed = False
    for row in rows:
        ratio = host_slowed(row, lowest)
        if ratio is None:
            continue
        row["host_slowed"] = ratio
        if row["status"] == "ok" and _slowed_beyond(ratio, tolerance):
            row["noisy"] = slowed = True
    return slowed


def _wall_remeasure(op, impls, device, options: timing.TimingOptions, floor: LaunchFloor, run_id: str,
                    host_tolerance: float, placements: int = 1) -> Callable[[VerifyConfig], list[dict[str, Any]]]:
    """The second measurement of a config's wall view: measure_config itself, with the wall view alone. Its
    rows keep the sweep's config columns: they replace rows of the same config, and a `views=wall` in their
    settings would have made them a second config in the results (the quick preset read back 10 configs, not 8)."""
    wall_only = dataclasses.replace(options, views=("wall",))

    def remeasure(cfg: VerifyConfig) -> list[dict[str, Any]]:
        rows = measure_config(op, cfg, impls, device, wall_only, floor, run_id, host_tolerance, placements)
        columns = config_columns(op, device, cfg, options, host_tolerance, placements)
        return [{**row, **columns} for row in rows]

    return remeasure


def measure_config(
    op: str, cfg: VerifyConfig, impls: list[Implementation], device: str, options: timing.TimingOptions,
    floor: LaunchFloor, run_id: str, host_tolerance: float = HOST_STATE_TOLERANCE, placements: int = 1,
) -> list[dict[str, Any]]:
    """Every row of one config: parity, then interleaved timing of what passed, plus the launch floor, in
    every view of options. With placements > 1, all of that once for each of that many copies of the workload
    (the same inputs, each in fresh memory: every copy stays alive until the config is done), each row carrying
    its copy's index in `placement`; the rows share the config key, so the report, compare and calibrate-tau pool
    them as repeats. A copy that cannot be built (out of memory, say) gets `error` rows, and no later copy is tried."""
    views = timing.views_for(device, options)
    base = {
        "run_id": run_id, "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **envinfo.collect(device), **config_columns(op, device, cfg, options, host_tolerance, placements),
    }
    rows: list[dict[str, Any]] = []
    alive = []  # every copy so far, inputs and prepared runs (their outputs): freed, they would hand the next their memory
    for placement in range(placements):
        tagged = {**base, "placement": placement} if placements > 1 else base
        try:
            workload = make_workload(op, cfg, device)
            timed_workload = timing_workload(op, workload)
        except Exception as err:
            copy = f"copy {placement} of {placements}: " if placements > 1 else ""
            reason = f"{copy}building the workload raised {type(err).__name__}: {err}"
            rows.extend(_row(tagged, impl, view, "error", reason) for impl in impls for view in views)
            break
        copy_rows, runs = _measure_copy(tagged, impls, device, options, floor, cfg, op, workload, timed_workload, views)
        alive.append((workload, timed_workload, runs))
        rows.extend(copy_rows)
    return rows


def _measure_copy(base, impls: list[Implementation], device: str, options: timing.TimingOptions, floor: LaunchFloor,
                  cfg: VerifyConfig, op: str, workload, timed_workload,
                  views) -> tuple[list[dict[str, Any]], dict[str, Callable[[], object]]]:
    """measure_config's rows on one copy of the workload, and the prepared runs (which hold the copy's outputs)."""
    rows_of: dict[str, list[dict[str, Any]]] = {}  # impl name -> its rows, kept in registry order
    runs: dict[str, Callable[[], object]] = {}
    not_capturable: dict[str, str] = {}
    notes: dict[str, str] = {}  # said on the ok rows of an implementation timed without a parity check
    for impl in impls:
        status, reason, run = _ready(impl, workload, timed_workload, device)
        if status != "ok":
            rows_of[impl.name] = [_row(base, impl, view, status, reason) for view in views]
            continue
        runs[impl.name] = run
        if reason is not None:
            notes[impl.name] = reason
        if impl.capture_refusal:
            not_capturable[impl.name] = impl.capture_refusal

    callables = dict(runs)
    if floor.run is not None:
        callables[timing.LAUNCH_FLOOR] = floor.run
    # each timed implementation's own launch path gets its empty launch beside the custom-op floor
    path_of = {impl.name: impl.path for impl in impls if impl.name in runs}
    for path in sorted(set(path_of.values()) - {"custom_op"}):
        extra = _path_floor(path, device)
        if extra.run is not None:
            callables[f"{timing.LAUNCH_FLOOR}:{path}"] = extra.run
    try:
        timings = timing.measure(callables, device, options, not_capturable=not_capturable) if callables else {}
    except Exception as err:  # a sticky device error: every view of every timed callable is lost
        failed = timing.ViewResult(status="error", reason=f"timing raised {type(err).__name__}: {err}")
        timings = {name: {view: failed for view in views} for name in callables}

    workload_columns = _workload_columns(op, cfg, workload, timed_workload, runs)
    floor_names = [name for name in callables if name.startswith(timing.LAUNCH_FLOOR)]
    for impl in impls:
        if impl.name in runs:
            rows_of[impl.name] = [
                _timed_row(base, impl, view, timings[impl.name][view], workload_columns, options.max_noise)
                for view in views
            ]
            for row in rows_of[impl.name]:
                if row["status"] == "ok" and impl.name in notes:
                    row["reason"] = notes[impl.name]
    rows = [row for impl in impls for row in rows_of[impl.name]]
    rows.extend(_floor_rows(base, floor, views, timings.get(timing.LAUNCH_FLOOR), options.max_noise))
    gpu_iters = min(options.iters, options.gpu_iters)
    for row in rows:
        view = row["view"]
        launch_path, own = _own_floor(timings, path_of.get(row["impl"], "custom_op"), view)
        if row["impl"] != timing.LAUNCH_FLOOR:
            _flag_floor_drift(row, own)
        measured = [median for name in floor_names if (median := _median(timings.get(name), view)) is not None]
        row.update(
            mean_accepted_length=workload_columns["mean_accepted_length"],
            accepted_kv_bytes=workload_columns["accepted_kv_bytes"],
            launch_floor_us=own.stats.median_us if own is not None and own.stats is not None else None,
            launch_path=launch_path,
            launch_floor_min_us=min(measured) if measured else None,
            iters=gpu_iters if view == "gpu" else options.iters,
        )
    return rows, runs


def _own_floor(timings: timing.Timings, path: str, view: str) -> tuple[str, timing.ViewResult | None]:
    """(launch path, its floor's result) a row of that path is read against in view: the empty launch of its
    own path where that was measured, else the custom op's (the one floor every config times)."""
    own = (timings.get(f"{timing.LAUNCH_FLOOR}:{path}") or {}).get(view)
    if own is not None and own.stats is not None:
        return path, own
    return "custom_op", (timings.get(timing.LAUNCH_FLOOR) or {}).get(view)


_PATH_FLOORS: dict[tuple[str, str], LaunchFloor] = {}


def _path_floor(path: str, device: str) -> LaunchFloor:
    """The empty launch of a path, built once per sweep process and device (a Triton one compiles)."""
    key = (path, str(device))
    if key not in _PATH_FLOORS:
        _PATH_FLOORS[key] = path_floor(path, device)
    return _PATH_FLOORS[key]


def _median(view_results, view: str) -> float | None:
    if view_results is None or view not in view_results or view_results[view].stats is None:
        return None
    return view_results[view].stats.median_us


def timing_workload(op: str, workload):
    """What is timed: the parity workload itself, except the prob ops, timed with fast randomness.

    Parity needs supplied randomness (every implementation reads the same uniforms and noise); a serving
    engine draws its own, so prob_verify and prob_verify_ragged are timed in the workload's `fast` mode
    (in-kernel Philox).
    """
    if op in PROB_OPS and hasattr(workload, "with_randomness"):
        return workload.with_randomness("fast")
    return workload


def _ready(impl: Implementation, workload, timed_workload, device: str) -> tuple[str, str | None, Callable | None]:
    """(status, reason, prepared run): unavailable here, failed parity, error preparing, or ok.

    An ok prob_verify implementation that cannot take supplied randomness (it raises SdbenchError when
    prepared for parity, e.g. FlashInfer's own Philox) is timed unchecked, with the reason as a note.
    """
    reason = impl.unavailable_reason(device, workload.config)
    if reason is not None:
        return "unavailable", reason, None
    note = None
    try:
        failure = parity.check(impl, workload)
    except SdbenchError as err:
        if impl.op not in PROB_OPS:
            return "failed", f"parity: raised SdbenchError: {err}", None
        failure, note = None, f"parity not checked (no supplied randomness): {err}"
    except torch.cuda.OutOfMemoryError as err:
        # The check's reference and poisoned outputs did not fit beside the workload: this device's limit, not
        # a wrong answer, so `error` (a `failed` row says the implementation disagreed with the reference).
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return "error", f"parity check ran out of device memory (not a wrong answer): {err}", None
    except Exception as err:  # a crashing kernel fails parity; it does not stop the sweep
        failure = f"raised {type(err).__name__}: {err}"
    if failure is not None:
        return "failed", f"parity: {failure}", None
    try:
        return "ok", note, impl.prepare(timed_workload)
    except Exception as err:
        return "error", f"prepare raised {type(err).__name__}: {err}", None


def _workload_columns(op: str, cfg: VerifyConfig, workload, timed_workload, runs: dict[str, Callable]) -> dict[str, Any]:
    """Realised mean k_i, accepted KV bytes and the bytes the op must move."""
    lengths = getattr(workload, "accepted_lengths", None)
    if lengths is None:  # workloads without an oracle of lengths (the prob ops): ask an implementation
        for run in runs.values():
            try:
                lengths = run().get("accepted_lengths")
            except Exception:
                lengths = None
            if lengths is not None:
                break
    mean_accepted = float(lengths.double().mean()) if lengths is not None else None
    accepted_kv_bytes = 0
    if cfg.kv_dim > 0 and lengths is not None:
        element_bytes = torch.empty((), dtype=KV_DTYPES[cfg.kv_dtype]).element_size()
        accepted_kv_bytes = int(lengths.sum()) * cfg.kv_dim * element_bytes
    if op in KV_OPS:
        bytes_moved = 2 * accepted_kv_bytes  # each accepted row read once and written once
    elif op in PROB_OPS:
        bytes_moved = _prob_bytes(cfg, getattr(timed_workload, "randomness", "fast"),
                                  getattr(workload, "draft_lengths", None))
    else:
        bytes_moved = None
    return {"mean_accepted_length": mean_accepted, "accepted_kv_bytes": accepted_kv_bytes, "bytes_moved": bytes_moved}


def _prob_bytes(cfg: VerifyConfig, randomness: str, draft_lengths: torch.Tensor | None) -> int:
    """The prob ops' roofline bytes (sdbench.ops.prob_verify.workload.prob_bytes; ragged: the realised γ_i)."""
    from sdbench.ops.prob_verify.workload import prob_bytes

    lengths = None if draft_lengths is None else draft_lengths.tolist()
    return int(prob_bytes(cfg, randomness=randomness, draft_lengths=lengths))


def _row(base: dict[str, Any], impl: Implementation, view: str, status: str, reason: str | None) -> dict[str, Any]:
    return {
        **base, "impl": impl.name, "backend": impl.backend, "is_peer": impl.peer, "syncs": impl.sync,
        "view": view, "status": status, "reason": reason, "samples_us": [],
    }


def _with_stats(row: dict[str, Any], result: timing.ViewResult, max_noise: float) -> dict[str, Any]:
    stats = result.stats
    if stats is not None:
        noise = timing.median_noise(result.samples_us)
        row.update(dataclasses.asdict(stats), samples_us=list(result.samples_us), noise=noise,
                   noisy=noise is None or noise > max_noise)
        if row["view"] == "graph":
            row["calls_per_sample"] = result.calls_per_sample
    return row


def _timed_row(base, impl: Implementation, view: str, result: timing.ViewResult, workload_columns,
               max_noise: float) -> dict[str, Any]:
    row = _with_stats(_row(base, impl, view, result.status, result.reason), result, max_noise)
    bytes_moved = workload_columns["bytes_moved"]
    row["bytes_moved"] = bytes_moved
    if bytes_moved is not None and row.get("median_us"):
        row["achieved_gbps"] = bytes_moved / (row["median_us"] * 1e3)
    return row


def _flag_floor_drift(row: dict[str, Any], floor: timing.ViewResult | None) -> None:
    """Record how far the row's ratio to its own floor moved within the run (wall and graph, the views
    read against a floor sampled beside them); beyond timing.MAX_FLOOR_DRIFT the row is noisy, whatever
    its median's standard error: it will not repeat against its floor in another run."""
    if row["status"] != "ok" or row["view"] not in ("wall", "graph") or floor is None or floor.status != "ok":
        return
    drift = timing.floor_drift(row["samples_us"], floor.samples_us)
    row["floor_drift"] = drift
    if drift is not None and drift > timing.MAX_FLOOR_DRIFT:
        row["noisy"] = True


def _floor_rows(base, floor: LaunchFloor, views, floor_timings, max_noise: float) -> list[dict[str, Any]]:
    rows = []
    for view in views:
        row = {
            **base, "impl": timing.LAUNCH_FLOOR, "backend": floor.backend, "is_peer": False, "syncs": False,
            "view": view, "samples_us": [],
        }
        if floor.run is None or floor_timings is None:
            row.update(status="unavailable", reason=floor.reason)
        else:
            result = floor_timings[view]
            row.update(status=result.status, reason=result.reason if result.status != "ok" else floor.reason)
            _with_stats(row, result, max_noise)
        rows.append(row)
    return rows


# --- calibrate-tau's mini-sweep (the CLI chains it before the fit) ------------------------------------
# The study's pair: both sides of the published crossover (~15 MB at b=32, γ=128, α=0.9, kv_dim=2048) down
# to a few KB, within the single-block kernel's B <= 32. The per-size race's candidates take any B: the same
# grid plus larger batches, up to ~240 MB of accepted KV (b=512: 268 MB of draft KV).
CALIBRATION_GRID = {"batch_sizes": (1, 4, 16, 32), "gammas": (8, 32, 128), "alphas": (0.3, 0.6, 0.9),
                    "kv_dims": (128, 512, 2048)}
RACE_GRID = {**CALIBRATION_GRID, "batch_sizes": (1, 4, 16, 32, 128, 512)}


def run_calibration_sweep(out_dir, impls, device: str = "cuda", progress=None, grid=None) -> Path:
    """calibrate-tau's mini-sweep: impls over grid (default CALIBRATION_GRID) into out_dir/<run id>;
    returns that folder."""
    if not torch.cuda.is_available():
        raise SdbenchError("no results given and no CUDA device here to measure on: pass verify_pack sweep results "
                           "(e.g. from `sdbench sweep --preset fused` on the GPU) or run calibrate-tau on the GPU")
    run_id = results.new_run_id()
    folder = Path(out_dir) / run_id  # a fresh folder: never mixes in an older run, or another GPU's
    spec = build_spec(None, op="verify_pack", impls=tuple(impls), device=device, out_dir=folder, run_id=run_id,
                      **(grid or CALIBRATION_GRID))
    summary = run_sweep(spec, progress=progress)
    if summary.interrupted:
        raise SdbenchError(f"the calibration sweep was interrupted; its finished configs are in {folder} "
                           "(pass that folder to calibrate-tau to fit on them)")
    return folder
