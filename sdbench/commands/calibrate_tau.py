"""calibrate-tau: the accepted-KV-bytes threshold τ between a small-work and a large-work implementation.

The published study's fused single-block kernel wins while the KV to copy is small (one launch, no
second kernel) and loses once one SM has to move megabytes; the two-step ballot + `draft_kv[mask]`
pays more launches but copies with the whole GPU. Dispatcher rule: bytes < τ -> small, else large.

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

import numpy as np

from sdbench.errors import SdbenchError
from sdbench.measure import results
from sdbench.thresholds import Profile, best_threshold, format_bytes

DEFAULT_SMALL = "fused_single_block"
DEFAULT_LARGE = "ballot+pack_torch"


@dataclass
class PairPoint:
    """One config measured with both implementations."""

    config: tuple
    kv_bytes: float  # accepted_kv_bytes of the workload
    small_us: float  # median of the small-work implementation
    large_us: float
    small_samples: np.ndarray = field(default_factory=lambda: np.empty(0))
    large_samples: np.ndarray = field(default_factory=lambda: np.empty(0))


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


def _bootstrap_medians(samples: np.ndarray, median: float, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    if samples.size < 2:
        return np.full(n_boot, median)
    picks = rng.integers(0, samples.size, size=(n_boot, samples.size))
    return np.median(samples[picks], axis=1)


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


def _pooled(rows: list[dict]) -> tuple[np.ndarray, float]:
    samples = np.concatenate([np.asarray(row.get("samples_us") or [], dtype=float) for row in rows])
    if samples.size:
        return samples, float(np.median(samples))
    return samples, float(np.median([row["median_us"] for row in rows]))


def make_profile(fit: TauFit, rows: list[dict], *, view: str, copy_bandwidth_gbps: float | None = None,
                 copy_bandwidth_source: str = "", sdbench_version: str = "") -> Profile:
    """The profile for the GPU the rows were measured on."""
    used = [row for row in rows if row["op"] == "verify_pack" and row["view"] == view and row["status"] == "ok"
            and row["impl"] in (fit.small, fit.large)]
    first = used[0] if used else rows[0]
    floors = [row["launch_floor_us"] for row in used if row.get("launch_floor_us") is not None]
    if copy_bandwidth_gbps is None:
        achieved = [row["achieved_gbps"] for row in rows if row.get("achieved_gbps") is not None and row["status"] == "ok"]
        copy_bandwidth_gbps = max(achieved) if achieved else 0.0
        copy_bandwidth_source = "max achieved in the results (no copy measured)" if achieved else "unknown"
    return Profile(
        gpu_name=first.get("gpu_name") or "unknown GPU", gpu_cc=first.get("gpu_cc") or "",
        gpu_sms=int(first.get("gpu_sms") or 0), driver=first.get("driver") or "",
        tau_bytes=fit.tau_bytes, tau_low_bytes=fit.low_bytes, tau_high_bytes=fit.high_bytes,
        small_impl=fit.small, large_impl=fit.large, view=view,
        launch_floor_us=float(np.median(floors)) if floors else 0.0,
        copy_bandwidth_gbps=float(copy_bandwidth_gbps), copy_bandwidth_source=copy_bandwidth_source,
        configs=len(fit.points), misclassified=fit.misclassified,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        sdbench_version=sdbench_version,
        source_run_ids=sorted({str(row["run_id"]) for row in used if row.get("run_id")}),
        note=fit.message(),
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


# --- the command ----------------------------------------------------------------------------------
# The mini-sweep calibrate-tau runs when given no results: both sides of the published crossover
# (~15 MB at b=32, γ=128, α=0.9, kv_dim=2048) down to a few KB, within the single-block kernel's B ≤ 32.


@dataclass
class Calibration:
    fit: TauFit
    profile: Profile
    path: object  # Path of the written profile, None with write=False
    swept: object  # Path the mini-sweep wrote, None when results were given


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


def calibrate(paths, *, small: str = DEFAULT_SMALL, large: str = DEFAULT_LARGE, view: str = "wall",
              gpu_name: str | None = None, profiles_dir=None, write: bool = True, seed: int = 0, n_boot: int = 200,
              swept=None) -> Calibration:
    """Fit τ from verify_pack results and write the GPU's profile (swept: the folder a mini-sweep wrote,
    when the caller ran one, recorded in the result). It reads results; it never measures."""
    import sdbench
    from sdbench import thresholds

    if view not in ("wall", "graph", "gpu", "cpu"):
        raise SdbenchError(f"--view must be wall, graph, gpu or cpu, got {view!r}")
    if not paths:
        raise SdbenchError("no results given: pass verify_pack sweep results (or let the CLI run the mini-sweep)")
    rows = _rows_for_gpu(results.read_checked_rows(paths), gpu_name)
    points = pair_points(rows, small, large, view)
    if not points:
        present = sorted({row["impl"] for row in rows if row["op"] == "verify_pack" and row["status"] == "ok"})
        views = sorted({row["view"] for row in rows})
        raise SdbenchError(
            f"no config has both {small} and {large} timed in the {view} view; these results hold verify_pack "
            f"implementations {', '.join(present) or 'none'} and views {', '.join(views)} "
            "(name the pair with --small/--large, or omit RESULTS to run the mini-sweep on this GPU)")
    fit = fit_tau(points, small, large, n_boot=n_boot, seed=seed)
    bandwidth, source = None, ""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.get_device_name() == rows[0].get("gpu_name"):
            bandwidth, source = measure_copy_bandwidth_gbps(), "cuda events: 256 MiB device-to-device copy"
    except RuntimeError:
        bandwidth = None
    profile = make_profile(fit, rows, view=view, copy_bandwidth_gbps=bandwidth, copy_bandwidth_source=source,
                           sdbench_version=sdbench.__version__)
    path = thresholds.write_profile(profile, profiles_dir) if write else None
    if write:
        from sdbench import dispatch

        dispatch.reset()  # the next auto decision reads the new profile
    return Calibration(fit, profile, path, swept)
