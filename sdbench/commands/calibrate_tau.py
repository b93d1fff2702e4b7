"""calibrate-tau: which verify_pack implementation wins at each size of accepted KV, as a dispatcher rule.

Per-size race (the default; `fit_segments`): over the candidates (`fused`, `fused_scan` and the sync-free
two-step pipelines `ballot+pack_cuda`, `ballot+pack_scan`: those the results hold), on every config where
all were measured, sorted by accepted KV bytes, each config's winner is the lowest median. The rule is the
fewest segments [low, high) -> impl whose loss stays within `tolerance` of the best any byte rule can do.
A config's loss is log(t_impl / t_fastest), 0 where the two medians are within noise (log ratio within
1.96 combined standard errors: from each config's samples, else the `noise` column), so noise never buys
a segment and one winner everywhere is one segment. The loss is a geometric mean over configs, not total
latency: the grid spans µs to ms, and a sum would let the largest configs alone decide the rule (both are
reported). Cuts sit where log(t_left / t_right) crosses zero, as for τ below. The race also reports `fused`
against the best sync-free two-step at every config: is one launch ever worse than two?

Two-implementation τ (`--small/--large`, `fit_tau`): the published study's fused single-block kernel wins
while the KV to copy is small (one launch, no second kernel) and loses once one SM has to move megabytes;
the two-step ballot + `draft_kv[mask]` pays more launches but copies with the whole GPU. Dispatcher rule:
bytes < τ -> small, else large.

Fit (`fit_tau`): over every config where both implementations were measured, choose the step rule
(one cut between two neighbouring measured byte values) with the lowest total median latency
(= expected latency over the measured grid; fewer misclassified configs break ties), then place τ
inside that gap where log(t_small / t_large) crosses zero, interpolated linearly in log-bytes. The
confidence band re-runs the fit on bootstrap resamples of each config's `samples_us`. When the best
rule is "always small" the answer is τ = ∞ ("always large": τ = 0): never a made-up crossover.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sdbench import thresholds
from sdbench.errors import SdbenchError
from sdbench.measure import copies, results
from sdbench.thresholds import Profile, best_threshold, crossing_bytes, fewest_segments, format_bytes

DEFAULT_SMALL = "fused_single_block"
DEFAULT_LARGE = "ballot+pack_torch"
DEFAULT_CANDIDATES = ("fused", "fused_scan", "ballot+pack_cuda", "ballot+pack_scan")
MERGE_TOLERANCE = 0.01  # a rule may cost 1% (geometric mean over configs) above the best byte rule
TIE_Z = 1.96  # medians whose log ratio is within this many combined standard errors are a tie
FUSED = "fused"
FUSED_PARITY = 1.03  # "fused is as fast as two steps": within 3% of the best sync-free two-step


@dataclass
class PairPoint:
    """One config measured with both implementations."""

    config: tuple
    kv_bytes: float  # accepted_kv_bytes of the workload
    small_us: float  # median of the small-work implementation
    large_us: float
    # the samples behind each median, one array a copy of the workload (sweep --placements), else one pooled array
    small_samples: list[np.ndarray] = field(default_factory=list)
    large_samples: list[np.ndarray] = field(default_factory=list)


@dataclass
class TauFit:
    small: str
    large: str
    tau_bytes: float
    low_bytes: float  # confidence band (bootstrap percentiles)
    high_bytes: float
    confidence: float
    points: list[PairPoint]
    misclassified: int
    expected_latency_us: float  # mean over configs of the rule's chosen median
    small_wins: int  # configs where small was faster

    @property
    def crossover(self) -> bool:
        return 0 < self.tau_bytes < math.inf

    @property
    def impls(self) -> tuple[str, ...]:
        return (self.small, self.large)

    def profile_fields(self) -> dict:
        """The τ rule's keys of the profile."""
        return dict(tau_bytes=self.tau_bytes, tau_low_bytes=self.low_bytes, tau_high_bytes=self.high_bytes,
                    small_impl=self.small, large_impl=self.large, configs=len(self.points),
                    misclassified=self.misclassified, note=self.message())

    @property
    def min_bytes(self) -> float:
        return min(point.kv_bytes for point in self.points)

    @property
    def max_bytes(self) -> float:
        return max(point.kv_bytes for point in self.points)

    def message(self) -> str:
        n = len(self.points)
        measured = f"{format_bytes(self.min_bytes)} to {format_bytes(self.max_bytes)}"
        if math.isinf(self.tau_bytes):
            lost = f"; it lost at {n - self.small_wins} of {n} configs, within the rule's cost" if self.small_wins < n else ""
            return (f"no crossover in measured range; τ = ∞: {self.small} is the better choice at every measured "
                    f"size ({measured}, {n} configs{lost})")
        if self.tau_bytes <= 0:
            lost = f"; it lost at {self.small_wins} of {n} configs, within the rule's cost" if self.small_wins else ""
            return (f"no crossover in measured range; τ = 0: {self.large} is the better choice at every measured "
                    f"size ({measured}, {n} configs{lost})")
        return (f"crossover at τ = {format_bytes(self.tau_bytes)} of accepted KV "
                f"({self.confidence:.0%} band {format_bytes(self.low_bytes)} to {format_bytes(self.high_bytes)}); "
                f"{self.misclassified} of {n} configs misclassified")


# --- the fit --------------------------------------------------------------------------------------
def _percentile_sorted(values: np.ndarray, q: float) -> float:
    """Percentile by rank (inf-safe: never interpolates between ∞ and a number)."""
    ordered = np.sort(values)
    index = min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))
    return float(ordered[index])


def _bootstrap_medians(samples: list[np.ndarray], median: float, n_boot: int,
                       rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of a median from its samples (`_pooled`'s: one array, or one a copy)."""
    if not samples or (len(samples) == 1 and samples[0].size < 2):
        return np.full(n_boot, median)
    return copies.bootstrap_medians(samples, n_boot, rng)


def fit_tau(points: list[PairPoint], small: str = DEFAULT_SMALL, large: str = DEFAULT_LARGE, *,
            n_boot: int = 200, confidence: float = 0.95, seed: int = 0) -> TauFit:
    if not points:
        raise SdbenchError(f"no config has both {small} and {large} measured: nothing to calibrate")
    kv_bytes = np.array([point.kv_bytes for point in points], dtype=float)
    small_us = np.array([point.small_us for point in points], dtype=float)
    large_us = np.array([point.large_us for point in points], dtype=float)
    tau_bytes, misclassified = best_threshold(kv_bytes, small_us, large_us)
    chosen = np.where(kv_bytes < tau_bytes, small_us, large_us)

    rng = np.random.default_rng(seed)
    small_boot = np.stack([_bootstrap_medians(p.small_samples, p.small_us, n_boot, rng) for p in points], axis=1)
    large_boot = np.stack([_bootstrap_medians(p.large_samples, p.large_us, n_boot, rng) for p in points], axis=1)
    taus = np.array([best_threshold(kv_bytes, small_boot[b], large_boot[b])[0] for b in range(n_boot)])
    tail = (1.0 - confidence) / 2
    return TauFit(
        small=small, large=large, tau_bytes=tau_bytes,
        low_bytes=_percentile_sorted(taus, tail), high_bytes=_percentile_sorted(taus, 1.0 - tail),
        confidence=confidence, points=points, misclassified=misclassified,
        expected_latency_us=float(chosen.mean()), small_wins=int((small_us < large_us).sum()),
    )


# --- the per-size race --------------------------------------------------------------------------------
@dataclass
class RacePoint:
    """One config measured with every raced implementation."""

    config: tuple
    kv_bytes: float
    median_us: dict[str, float]
    noise: dict[str, float]  # relative standard error of each median (0 where unknown)

    @property
    def fastest(self) -> str:
        return min(self.median_us, key=self.median_us.__getitem__)

    def ratio(self, impl: str) -> float:
        """impl's median over the fastest's (1 for the fastest)."""
        return self.median_us[impl] / self.median_us[self.fastest]

    def tied(self, impl: str) -> bool:
        """impl's median is within noise of the fastest's."""
        spread = math.hypot(self.noise[impl], self.noise[self.fastest])
        return math.log(self.ratio(impl)) <= TIE_Z * spread


@dataclass
class Segment:
    impl: str
    low_bytes: float  # the rule's bounds: accepted KV in [low_bytes, high_bytes) -> impl
    high_bytes: float
    points: list[RacePoint]  # the measured configs inside

    @property
    def wins(self) -> int:
        """Configs where impl is the fastest by median."""
        return sum(point.fastest == self.impl for point in self.points)

    @property
    def ties(self) -> int:
        """Configs where impl is not the fastest but within noise of it."""
        return sum(point.fastest != self.impl and point.tied(self.impl) for point in self.points)

    @property
    def worst(self) -> RacePoint:
        """The config where impl loses most against the per-config best."""
        return max(self.points, key=lambda point: point.ratio(self.impl))


@dataclass
class RaceFit:
    impls: tuple[str, ...]
    segments: list[Segment]
    points: list[RacePoint]  # sorted by accepted KV bytes
    tolerance: float
    best_rule_loss: float  # geometric-mean loss of the finest byte rule (the floor any rule can reach)
    loss_by_count: list[float] = field(default_factory=list)  # beyond noise, geometric mean: <= 1, 2, ... segments
    dropped: int = 0  # configs where some candidate has no ok row
    absent: tuple[str, ...] = ()  # default candidates these results do not hold

    def rule_impl(self, point: RacePoint) -> str:
        return next(segment.impl for segment in self.segments if point.kv_bytes < segment.high_bytes)

    @property
    def misclassified(self) -> int:
        return sum(self.rule_impl(point) != point.fastest for point in self.points)

    @property
    def within_noise(self) -> int:
        """Of the misclassified, those where the rule's pick is within noise of the fastest."""
        return sum(self.rule_impl(point) != point.fastest and point.tied(self.rule_impl(point)) for point in self.points)

    @property
    def geomean_loss(self) -> float:
        """The rule's cost: geometric mean over configs of t_rule / t_fastest, minus 1."""
        return math.exp(float(np.mean([math.log(point.ratio(self.rule_impl(point))) for point in self.points]))) - 1

    @property
    def total_loss(self) -> float:
        """The rule's cost in total latency over the measured configs (dominated by the largest), minus 1."""
        chosen = sum(point.median_us[self.rule_impl(point)] for point in self.points)
        return chosen / sum(point.median_us[point.fastest] for point in self.points) - 1

    def message(self) -> str:
        n = len(self.points)
        measured = f"{format_bytes(self.points[0].kv_bytes)} to {format_bytes(self.points[-1].kv_bytes)}"
        if len(self.segments) == 1:
            head = (f"no crossover in measured range: {self.segments[0].impl} is the better choice at every "
                    f"measured size ({measured}, {n} configs, {len(self.impls)} raced)")
        else:
            parts = [f"{segment.impl} below {format_bytes(segment.high_bytes)}" for segment in self.segments[:-1]]
            head = (f"{len(self.segments)} segments over {measured} ({n} configs, {len(self.impls)} raced): "
                    f"{', '.join(parts)}, {self.segments[-1].impl} above")
        worst_segment = max(self.segments, key=lambda segment: segment.worst.ratio(segment.impl))
        worst = worst_segment.worst
        message = (f"{head}; the rule costs {self.geomean_loss:+.1%} (geometric mean) and {self.total_loss:+.1%} "
                   f"(total latency) over the per-config best, worst {worst.ratio(worst_segment.impl):.2f}x "
                   f"({worst_segment.impl} at {format_bytes(worst.kv_bytes)}); {self.misclassified} of {n} configs "
                   f"misclassified ({self.within_noise} within noise)")
        impls = [segment.impl for segment in self.segments]
        returning = sorted({impl for impl in impls if impls.count(impl) > 1})
        if returning:
            # A byte rule can only zigzag when the winner follows another axis (batch size, say) whose
            # configs interleave along accepted KV bytes.
            message += (f". {', '.join(returning)} hold{'s' if len(returning) == 1 else ''} several segments: the "
                        "winners interleave along accepted KV, so they depend on more than its bytes here (compare "
                        "the configs); a larger --tolerance buys fewer segments")
        return message

    def profile_fields(self) -> dict:
        """The per-size rule's keys of the profile."""
        return dict(segment_upper_bytes=[segment.high_bytes for segment in self.segments],
                    segment_impls=[segment.impl for segment in self.segments], candidates=list(self.impls),
                    configs=len(self.points), misclassified=self.misclassified, note=self.message())


def fit_segments(points: list[RacePoint], impls: tuple[str, ...], *, tolerance: float = MERGE_TOLERANCE) -> RaceFit:
    """The fewest-segment per-size rule within tolerance of the best byte rule (module docstring)."""
    if not points:
        raise SdbenchError(f"no config has all of {', '.join(impls)} measured: nothing to calibrate")
    points = sorted(points, key=lambda point: point.kv_bytes)
    kv_bytes = np.array([point.kv_bytes for point in points])
    distinct, group = np.unique(kv_bytes, return_inverse=True)
    log_ratio = np.array([[math.log(point.ratio(impl)) for impl in impls] for point in points])
    loss = np.where([[point.tied(impl) for impl in impls] for point in points], 0.0, log_ratio)
    group_loss, group_log_ratio = np.zeros((len(distinct), len(impls))), np.zeros((len(distinct), len(impls)))
    np.add.at(group_loss, group, loss)
    np.add.at(group_log_ratio, group, log_ratio)
    budget = float(group_loss.min(axis=1).sum()) + len(points) * math.log1p(tolerance)
    plan, least_loss = fewest_segments(group_loss, group_log_ratio, budget)
    counts = np.bincount(group, minlength=len(distinct))
    cuts = [0.0]
    for (_, boundary, left), (_, _, right) in zip(plan, plan[1:], strict=False):
        # mean log(t_left / t_right) on both sides of the boundary: the cut is where it crosses zero
        below, above = boundary - 1, boundary
        d_below = (group_log_ratio[below, left] - group_log_ratio[below, right]) / counts[below]
        d_above = (group_log_ratio[above, left] - group_log_ratio[above, right]) / counts[above]
        cut = crossing_bytes(distinct[below], distinct[above], d_below, d_above)
        cuts.append(min(max(cut, math.nextafter(float(distinct[below]), math.inf)), float(distinct[above])))
    cuts.append(math.inf)
    segments = [Segment(impls[impl], cuts[index], cuts[index + 1],
                        [point for point, at in zip(points, group, strict=True) if start <= at < end])
                for index, (start, end, impl) in enumerate(plan)]
    best_rule_loss = math.exp(float(group_log_ratio.min(axis=1).sum()) / len(points)) - 1
    loss_by_count = [math.expm1(float(value) / len(points)) for value in least_loss]
    return RaceFit(tuple(impls), segments, points, tolerance, best_rule_loss, loss_by_count)


def race_points(rows: list[dict], impls: tuple[str, ...], view: str) -> tuple[list[RacePoint], int]:
    """(configs of op verify_pack where every impl has an ok row in view, configs where some did not).
    Repeated runs of one config pool their samples."""
    from sdbench.measure.timing import median_noise

    by_config: dict[tuple, dict[str, list]] = {}
    kv_bytes: dict[tuple, float] = {}
    for row in rows:
        if row["op"] != "verify_pack" or row["view"] != view or row["status"] != "ok" or row["impl"] not in impls:
            continue
        if row.get("median_us") is None:
            continue
        config = results.config_key(row, machine=False)
        by_config.setdefault(config, {impl: [] for impl in impls})[row["impl"]].append(row)
        kv_bytes[config] = float(row["accepted_kv_bytes"])
    points, dropped = [], 0
    for config, entry in sorted(by_config.items(), key=lambda item: kv_bytes[item[0]]):
        if not all(entry.values()):
            dropped += 1
            continue
        medians, noise = {}, {}
        for impl in impls:
            samples, medians[impl] = _pooled(entry[impl])
            from_rows = [row["noise"] for row in entry[impl] if row.get("noise") is not None]
            # copies of the workload: the error of their medians' median, their spread included
            noise[impl] = median_noise(samples[0]) if len(samples) == 1 else copies.relative_error(samples)
            if noise[impl] is None:  # fewer than 8 samples: the rows' own noise, else none known
                noise[impl] = float(np.median(from_rows)) if from_rows else 0.0
        points.append(RacePoint(config, kv_bytes[config], medians, noise))
    return points, dropped


# --- fused against the best sync-free two-step -------------------------------------------------------
def sync_free_two_steps(impls) -> list[str]:
    """The two-step pipelines (a `+` in the registry name) among impls that never sync the host."""
    from sdbench import registry

    two_steps = []
    for name in impls:
        try:
            entry = registry.get("verify_pack", name)
        except ValueError:
            continue
        if "+" in name and not entry.sync:
            two_steps.append(name)
    return two_steps


@dataclass
class FusedVsTwoStep:
    """`fused` against the best sync-free two-step at every config: (point, best two-step, fused / it)."""

    rows: list[tuple[RacePoint, str, float]]
    parity: float = FUSED_PARITY

    @property
    def within(self) -> int:
        return sum(ratio <= self.parity for _, _, ratio in self.rows)

    @property
    def worst(self) -> tuple[RacePoint, str, float]:
        return max(self.rows, key=lambda row: row[2])

    def message(self) -> str:
        point, two_step, ratio = self.worst
        return (f"{FUSED} ≤ {self.parity:g} × the best sync-free two-step at {self.within} of {len(self.rows)} "
                f"configs; worst {ratio:.2f}x against {two_step} at {format_bytes(point.kv_bytes)} "
                f"(b, γ, α, kv_dim = {', '.join(str(value) for value in point.config[1:5])})")


def fused_vs_two_step(points: list[RacePoint], impls) -> FusedVsTwoStep | None:
    """None unless fused and at least one sync-free two-step were raced."""
    two_steps = sync_free_two_steps(impls)
    if FUSED not in impls or not two_steps or not points:
        return None
    rows = []
    for point in points:
        best = min(two_steps, key=point.median_us.__getitem__)
        rows.append((point, best, point.median_us[FUSED] / point.median_us[best]))
    return FusedVsTwoStep(rows)


# --- from results -------------------------------------------------------------------------------
def pair_points(rows: list[dict], small: str, large: str, view: str) -> list[PairPoint]:
    """Configs of op verify_pack where both implementations have an ok row in view.

    rows: dicts with the results-schema columns. Repeated runs of one config pool their samples.
    """
    by_config: dict[tuple, dict[str, list]] = {}
    kv_bytes: dict[tuple, float] = {}
    for row in rows:
        if row["op"] != "verify_pack" or row["view"] != view or row["status"] != "ok" or row["impl"] not in (small, large):
            continue
        if row.get("median_us") is None:
            continue
        config = results.config_key(row, machine=False)
        entry = by_config.setdefault(config, {small: [], large: []})
        entry[row["impl"]].append(row)
        kv_bytes[config] = float(row["accepted_kv_bytes"])
    points = []
    for config, entry in sorted(by_config.items(), key=lambda item: kv_bytes[item[0]]):
        if not entry[small] or not entry[large]:
            continue
        small_samples, small_us = _pooled(entry[small])
        large_samples, large_us = _pooled(entry[large])
        points.append(PairPoint(config, kv_bytes[config], small_us, large_us, small_samples, large_samples))
    return points


def _pooled(rows: list[dict]) -> tuple[list[np.ndarray], float]:
    """(the samples, the median) of one implementation's rows at a config. Repeated runs pool their samples into one
    array. Rows that are copies of the workload (sweep --placements) stay one array a copy, and the median is
    their medians' (sdbench.measure.copies): each copy counts once."""
    parts = [np.asarray(row.get("samples_us") or [row["median_us"]], dtype=float) for row in rows]
    if any(row.get("placement") is not None for row in rows):
        return parts, copies.median_of_copies(parts)
    samples = np.concatenate([np.asarray(row.get("samples_us") or [], dtype=float) for row in rows])
    if samples.size:
        return [samples], float(np.median(samples))
    return [samples], float(np.median([row["median_us"] for row in rows]))


def make_profile(fit: TauFit | RaceFit, rows: list[dict], *, view: str, copy_bandwidth_gbps: float | None = None,
                 copy_bandwidth_source: str = "", sdbench_version: str = "") -> Profile:
    """The profile for the GPU the rows were measured on (a τ rule or a per-size rule, from the fit)."""
    used = [row for row in rows if row["op"] == "verify_pack" and row["view"] == view and row["status"] == "ok"
            and row["impl"] in fit.impls]
    first = used[0] if used else rows[0]
    # The floor of a launch with nothing flushed: a cold-L2 row's floor carries the flush's aftermath (~3 µs in the
    # graph view on an H200 against ~0.7 warm), and a median over both states flips between them with the row count.
    timed = [row for row in used if row.get("launch_floor_us") is not None]
    floors = [row["launch_floor_us"] for row in timed if not row.get("cold_l2")] or [
        row["launch_floor_us"] for row in timed]
    if copy_bandwidth_gbps is None:
        achieved = [row["achieved_gbps"] for row in rows if row.get("achieved_gbps") is not None and row["status"] == "ok"]
        copy_bandwidth_gbps = max(achieved) if achieved else 0.0
        copy_bandwidth_source = "max achieved in the results (no copy measured)" if achieved else "unknown"
    return Profile(
        gpu_name=first.get("gpu_name") or "unknown GPU", gpu_cc=first.get("gpu_cc") or "",
        gpu_sms=int(first.get("gpu_sms") or 0), driver=first.get("driver") or "", view=view,
        launch_floor_us=float(np.median(floors)) if floors else 0.0,
        copy_bandwidth_gbps=float(copy_bandwidth_gbps), copy_bandwidth_source=copy_bandwidth_source,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        sdbench_version=sdbench_version,
        source_run_ids=sorted({str(row["run_id"]) for row in used if row.get("run_id")}),
        **fit.profile_fields(),
    )


def measure_copy_bandwidth_gbps(device="cuda", n_bytes: int = 256 * 2**20, iters: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, GB/s) with CUDA events."""
    import torch

    source = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times_ms = []
    for _ in range(iters):
        start.record()
        target.copy_(source)
        stop.record()
        stop.synchronize()
        times_ms.append(start.elapsed_time(stop))
    return 2 * n_bytes / (float(np.median(times_ms)) * 1e-3) / 1e9


COPY_CEILING_RUNS = 3


def copy_ceiling_gbps(device="cuda", n_bytes: int = 256 * 2**20, runs: int = COPY_CEILING_RUNS) -> float:
    """The copy ceiling every floor reads: the best of `runs` medians of `measure_copy_bandwidth_gbps`, since a
    ceiling is the most the device does, and one slow run would make every floor too high and its bar too lenient
    (perf-notes, "Session 29")."""
    return max(measure_copy_bandwidth_gbps(device, n_bytes=n_bytes) for _ in range(runs))


# --- the command ----------------------------------------------------------------------------------
@dataclass
class Calibration:
    fit: TauFit | RaceFit  # RaceFit: the per-size race; TauFit: --small/--large
    profile: Profile
    path: object  # Path of the written profile, None with write=False
    swept: object  # Path the mini-sweep wrote, None when results were given
    fused: FusedVsTwoStep | None = None  # the race's fused against the best sync-free two-step
    superseded: int = 0  # configs timed on one copy and again on several: only the copies' rows were read


def _rows_for_gpu(rows: list[dict], gpu_name: str | None) -> list[dict]:
    gpus = sorted({row.get("gpu_name") for row in rows if row.get("gpu_name")})
    if gpu_name is not None:
        chosen = [row for row in rows if row.get("gpu_name") == gpu_name]
        if not chosen:
            raise SdbenchError(f"--gpu {gpu_name!r} is not in these results; they hold {', '.join(gpus) or 'CPU rows only'}")
        return chosen
    if not gpus:
        raise SdbenchError("these results hold CPU rows only: τ is a GPU property; calibrate from a CUDA sweep")
    if len(gpus) > 1:
        raise SdbenchError(f"these results hold several GPUs ({', '.join(gpus)}): choose one with --gpu NAME")
    return [row for row in rows if row.get("gpu_name") == gpus[0]]


def calibrate(paths, *, impls=None, small: str | None = None, large: str | None = None, view: str = "wall",
              gpu_name: str | None = None, profiles_dir=None, write: bool = True, seed: int = 0, n_boot: int = 200,
              tolerance: float = MERGE_TOLERANCE, swept=None, copy_gbps: float | None = None) -> Calibration:
    """Fit the dispatcher rule from verify_pack results and write the GPU's profile: the per-size race over
    impls (default DEFAULT_CANDIDATES), or τ between small and large when either is given (the other then
    defaults to the study's). swept: the folder a mini-sweep wrote, when the caller ran one, recorded in the
    result. It reads results; it measures only the copy ceiling, on a GPU of the results' kind.

    copy_gbps: the copy ceiling measured on the results' GPU elsewhere (offline calibration). Without it and
    without that GPU here, the replaced profile's measured ceiling is kept when it may be, else the results'
    best achieved bandwidth stands in; warm-L2 rows can beat a DRAM copy, so that stand-in can sit well above
    the real ceiling (and the report's floors with it)."""
    import sdbench

    if view not in ("wall", "graph", "gpu", "cpu"):
        raise SdbenchError(f"--view must be wall, graph, gpu or cpu, got {view!r}")
    pair = small is not None or large is not None
    if pair and impls:
        raise SdbenchError("give either --impls (the per-size race) or --small/--large (one τ between two), not both")
    if not 0 <= tolerance < 1:
        raise SdbenchError(f"--tolerance must be in [0, 1) (e.g. 0.01: the rule may cost 1% over the best), got {tolerance}")
    if copy_gbps is not None and not (math.isfinite(copy_gbps) and copy_gbps > 0):
        raise SdbenchError(f"--copy-gbps must be a positive bandwidth in GB/s (bytes read + written), got {copy_gbps}")
    if not paths:
        raise SdbenchError("no results given: pass verify_pack sweep results (or let the CLI run the mini-sweep)")
    rows = _rows_for_gpu(results.read_checked_rows(paths), gpu_name)
    rows, superseded = results.without_superseded(rows)
    fused = None
    if pair:
        fit = _fit_pair(rows, small or DEFAULT_SMALL, large or DEFAULT_LARGE, view, n_boot, seed)
    else:
        fit = _fit_race(rows, impls, view, tolerance)
        fused = fused_vs_two_step(fit.points, fit.impls)
    if copy_gbps is not None:
        bandwidth, source = copy_gbps, f"{GIVEN_COPY} ({datetime.date.today().isoformat()})"
    else:
        bandwidth, source = _copy_measured_here(rows[0].get("gpu_name"))
    if bandwidth is None:
        bandwidth, source = _measured_bandwidth_of_the_replaced_profile(rows, profiles_dir)
    profile = make_profile(fit, rows, view=view, copy_bandwidth_gbps=bandwidth, copy_bandwidth_source=source,
                           sdbench_version=sdbench.__version__)
    path = thresholds.write_profile(profile, profiles_dir) if write else None
    if write:
        from sdbench import dispatch

        dispatch.reset()  # the next auto decision reads the new profile
    return Calibration(fit, profile, path, swept, fused, superseded)


def _copy_measured_here(gpu_name: str | None) -> tuple[float | None, str]:
    """The copy ceiling measured now, on this machine's GPU when it is the results' kind; (None, "") otherwise."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.get_device_name() == gpu_name:
            return copy_ceiling_gbps(), f"cuda events: 256 MiB device-to-device copy, best of {COPY_CEILING_RUNS}"
    except RuntimeError:
        pass
    return None, ""


KEPT = "kept from the profile this one replaced"
GIVEN = "given with --copy-gbps"
GIVEN_COPY = f"{GIVEN}: a device-to-device copy measured on that GPU elsewhere"
# Sources of a ceiling that was measured (here with CUDA events, or on the GPU and given), not inferred from results.
# A given one is known by its stem: a committed profile's source may be reworded to say which copy it was.
MEASURED_SOURCES = ("cuda events", GIVEN)
# A measured ceiling below the results' best achieved bandwidth is normal: warm-L2 rows, and cold rows whose writes
# the L2 absorbs, beat a DRAM copy (H100: 3378 GB/s achieved against 2828 measured, cold rows at 107%). Only one
# this far under the data is taken for a wrong value and not kept.
IMPLAUSIBLE_CEILING_FRACTION = 0.5


def copy_ceiling_is_measured(source: str) -> bool:
    """Whether a profile's copy_bandwidth_source names a measured ceiling (not the results' best achieved)."""
    return source.startswith(MEASURED_SOURCES)


def _measured_bandwidth_of_the_replaced_profile(rows: list[dict], directory) -> tuple[float | None, str]:
    """Offline (no GPU of the results' kind here), the measured copy bandwidth of the profile being replaced:
    recalibrating from results must not swap a measured ceiling for the results' best achieved bandwidth,
    which the report's roofline would then read as the floor's ceiling. Kept only when it was measured (CUDA
    events here, or given with --copy-gbps), for the same GPU name, and is at least
    IMPLAUSIBLE_CEILING_FRACTION of what the results achieved; (None, "") otherwise."""
    gpu_name = rows[0].get("gpu_name") or ""
    folder = thresholds.profiles_dir() if directory is None else Path(directory)
    path = folder / f"{thresholds.gpu_slug(gpu_name)}.toml"
    if not gpu_name or not path.is_file():
        return None, ""
    try:
        old = thresholds.read_profile(path)
    except (SdbenchError, ValueError):
        return None, ""
    achieved = max((row.get("achieved_gbps") or 0.0 for row in rows if row.get("status") == "ok"), default=0.0)
    if (old.gpu_name != gpu_name or not copy_ceiling_is_measured(old.copy_bandwidth_source)
            or old.copy_bandwidth_gbps < IMPLAUSIBLE_CEILING_FRACTION * achieved):
        return None, ""
    source = old.copy_bandwidth_source
    return old.copy_bandwidth_gbps, source if KEPT in source else f"{source}; {KEPT} (dated {old.date})"


def _present(rows: list[dict], view: str) -> tuple[list[str], list[str]]:
    """(verify_pack implementations with an ok row in view, every view in the rows), for error messages."""
    present = sorted({row["impl"] for row in rows if row["op"] == "verify_pack" and row["status"] == "ok"
                      and row["view"] == view and row["impl"] != "launch_floor"})
    return present, sorted({row["view"] for row in rows})


def _fit_pair(rows: list[dict], small: str, large: str, view: str, n_boot: int, seed: int) -> TauFit:
    points = pair_points(rows, small, large, view)
    if not points:
        present, views = _present(rows, view)
        raise SdbenchError(
            f"no config has both {small} and {large} timed in the {view} view; these results hold verify_pack "
            f"implementations {', '.join(present) or 'none'} and views {', '.join(views)} "
            "(name the pair with --small/--large, or omit RESULTS to run the mini-sweep on this GPU)")
    return fit_tau(points, small, large, n_boot=n_boot, seed=seed)


def _fit_race(rows: list[dict], impls, view: str, tolerance: float) -> RaceFit:
    present, views = _present(rows, view)
    held = (f"these results hold verify_pack implementations {', '.join(present) or 'none'} in the {view} view "
            f"(views: {', '.join(views)})")
    if impls:
        impls = tuple(dict.fromkeys(impls))
        missing = [impl for impl in impls if impl not in present]
        if missing:
            raise SdbenchError(f"--impls {', '.join(missing)} not measured: {held}")
        absent = ()
    else:  # the default race: whichever of the candidates these results hold
        impls = tuple(impl for impl in DEFAULT_CANDIDATES if impl in present)
        absent = tuple(impl for impl in DEFAULT_CANDIDATES if impl not in present)
    if len(impls) < 2:
        raise SdbenchError(f"the per-size race needs two or more of {', '.join(impls or DEFAULT_CANDIDATES)} measured: "
                           f"{held} (name others with --impls, a pair with --small/--large, or omit RESULTS to run the "
                           "mini-sweep on this GPU)")
    points, dropped = race_points(rows, impls, view)
    if not points:
        raise SdbenchError(f"no config has all of {', '.join(impls)} timed in the {view} view ({dropped} configs have "
                           "some of them): race fewer with --impls")
    fit = fit_segments(points, impls, tolerance=tolerance)
    fit.dropped, fit.absent = dropped, absent
    return fit
