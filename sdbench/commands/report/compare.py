"""`sdbench report --compare A B`: per-config ratio B / A of medians, with bootstrap confidence intervals.

Configs are matched on everything that defines the work plus implementation and view (not the GPU or
the run), so A and B may be two builds on one GPU or one build on two GPUs. The interval resamples
each side's `samples_us` (seeded) and takes the ratio of the resampled medians. A side timed on several copies of
its workload (sweep --placements) is the median of its copies' medians, resampled copy by copy and within each;
then every row of either side counts as a copy, and a side of one copy borrows the other's spread between copies. A change is flagged
only when it is both real (the interval excludes 1) and large enough to matter (|ratio − 1| > threshold).
Every row gets one verdict, nvbench-style: SLOWER, FASTER, SAME (inside the threshold band, or a real but
tiny change) or NOISY (the interval is too wide to tell, a sweep flagged the row noisy, or — wall rows — its
own launch floor moved beyond the host-state tolerance between A and B: the two runs met the host in different
states, and neither the row nor its ratio to the floor compares), with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sdbench.commands.report import (
    ReportTable,
    Where,
    apply_where,
    drop_superseded,
    format_us,
    gpu_uuids,
    gpu_words,
    require_polars,
    scan,
)
from sdbench.errors import SdbenchError
from sdbench.measure import copies, results, timing
from sdbench.ops.launch_floor import HOST_STATE_TOLERANCE, HOST_STATE_VIEW, host_state_differs

# Runs are matched across machines and timing settings: the config key without its machine columns and
# without `settings` (the same workload, however many samples each run took), per implementation and view.
MATCH_KEYS = (*(column for column in results.CONFIG_COLUMNS if column != "settings"), "impl", "view")
VERDICTS = ("SLOWER", "FASTER", "NOISY", "SAME")  # in table order


@dataclass
class Comparison:
    key: tuple  # values of MATCH_KEYS
    a_us: float
    b_us: float
    low: float  # confidence interval on the ratio b / a
    high: float
    verdict: str  # one of VERDICTS
    why: str

    @property
    def ratio(self) -> float:
        return self.b_us / self.a_us

    def get(self, name: str):
        return self.key[MATCH_KEYS.index(name)]


@dataclass
class Samples:
    """One side of a comparison: pooled samples per (config, impl, view) and what else a match must agree on."""

    pooled: dict[tuple, np.ndarray]
    noisy: dict[tuple, str]  # keys any of whose rows the sweep flagged noisy -> why
    graph_methods: dict[tuple, set[bool]]  # graph keys: True where timed inside the graph (schema v3), False before
    paths: dict[tuple, set]  # each key's launch paths (null before launch_path existed: the custom-op floor)
    floors_us: dict[tuple, list[float]]  # wall keys: the launch floor of each pooled row (its own path's)
    rows: dict[tuple, list[np.ndarray]] = field(default_factory=dict)  # each key's rows' samples, one array a row
    copies: set[tuple] = field(default_factory=set)  # keys with rows that are copies of a workload (sweep --placements)
    gpus: list[str] = field(default_factory=list)  # the physical GPUs (gpu_uuid) of the side's timed rows
    unrecorded_gpu_rows: int = 0  # its timed rows that name no GPU (files from before the column)


def load_samples(paths: list[str | Path], wheres: list[Where], against_floor: bool = False) -> Samples:
    """Pooled samples of every timed (config, impl, view) (the stored median stands in where none were kept).
    against_floor: each row's samples divided by the median of its own launch path's floor in the same run
    (rows without a floor are left out)."""
    pl = require_polars()
    # A key timed on one copy and again on copies is the copies' (a side matches without settings, so both would pool).
    frame, _ = drop_superseded(apply_where(scan(paths), wheres), key_of=lambda row: tuple(row[name] for name in MATCH_KEYS))
    gpus, unrecorded = gpu_uuids(frame)
    names = frame.collect_schema().names()
    for name, dtype in (("noisy", pl.Boolean), ("calls_per_sample", pl.Int32), ("launch_path", pl.String),
                        ("floor_drift", pl.Float64), ("host_slowed", pl.Float64), ("placement", pl.Int32)):
        if name not in names:  # results from before the column existed
            frame = frame.with_columns(pl.lit(None, dtype=dtype).alias(name))
    frame = frame.filter((pl.col("status") == "ok") & (pl.col("impl") != "launch_floor") & pl.col("median_us").is_not_null())
    if against_floor:
        frame = frame.filter(pl.col("launch_floor_us") > 0)
    table = frame.select(*MATCH_KEYS, "samples_us", "median_us", "noisy", "calls_per_sample", "launch_floor_us",
                         "launch_path", "floor_drift", "host_slowed", "placement").collect()
    pooled: dict[tuple, list[np.ndarray]] = {}
    with_copies: set[tuple] = set()
    side = Samples({}, {}, {}, {}, {})
    for row in table.iter_rows(named=True):
        key = tuple(row[name] for name in MATCH_KEYS)
        samples = np.asarray(row["samples_us"] or [row["median_us"]], dtype=float)
        pooled.setdefault(key, []).append(samples / row["launch_floor_us"] if against_floor else samples)
        if row["placement"] is not None:
            with_copies.add(key)
        if row["noisy"]:
            side.noisy.setdefault(key, noisy_reason(row))
        if row["view"] == HOST_STATE_VIEW and row["launch_floor_us"]:
            side.floors_us.setdefault(key, []).append(row["launch_floor_us"])
        if row["view"] == "graph":
            side.graph_methods.setdefault(key, set()).add(row["calls_per_sample"] is not None)
        side.paths.setdefault(key, set()).add(row["launch_path"] or "custom_op")
    side.pooled = {key: np.concatenate(parts) for key, parts in pooled.items()}
    side.rows, side.copies, side.gpus, side.unrecorded_gpu_rows = pooled, with_copies, gpus, unrecorded
    return side


def _host_tolerance(row: dict) -> float:
    """The host-state tolerance the row's sweep ran with (in `settings` only when not the default)."""
    for word in str(row.get("settings") or "").split():
        if word.startswith("host_tolerance="):
            return float(word.split("=", 1)[1])
    return HOST_STATE_TOLERANCE


def noisy_reason(row: dict) -> str:
    """Why a sweep flagged a row noisy, from the columns that record it."""
    if row.get("host_slowed") and host_state_differs(row["host_slowed"], 1.0, _host_tolerance(row)):
        return f"measured in a slow host state: launch floor {row['host_slowed']:.2f}× its sweep's lowest"
    if row.get("floor_drift") and row["floor_drift"] > timing.MAX_FLOOR_DRIFT:
        return f"its ratio to its floor drifted {row['floor_drift']:.0%} within the run"
    return "median noise above its --max-noise"


def host_state_moved(a_floors_us: list[float] | None, b_floors_us: list[float] | None,
                     tolerance: float = HOST_STATE_TOLERANCE) -> str | None:
    """Why a wall pair does not compare when its own launch floor (the median of each side's pooled rows') moved
    beyond the host-state tolerance between A and B; None when it did not, or a side has no floor."""
    if not a_floors_us or not b_floors_us:
        return None
    a_us, b_us = float(np.median(a_floors_us)), float(np.median(b_floors_us))
    if not host_state_differs(a_us, b_us, tolerance):
        return None
    return f"launch floor moved {b_us / a_us - 1:+.0%} ({a_us:.1f} → {b_us:.1f} µs): host state differs between runs"


def bootstrap_ratio(a: list[np.ndarray], b: list[np.ndarray], rng: np.random.Generator, n_boot: int,
                    confidence: float) -> tuple[float, float]:
    """Percentile interval of B's resampled median over A's, each side one array of pooled samples or one array a
    copy of its workload (sdbench.measure.copies: one array is the plain one-level bootstrap; several are resampled
    copy by copy and within each, and a side of one copy beside several borrows their spread). A is drawn first."""
    a_medians = copies.bootstrap_medians_borrowing(a, b, n_boot, rng)
    ratios = copies.bootstrap_medians_borrowing(b, a, n_boot, rng) / a_medians
    tail = (1.0 - confidence) / 2 * 100
    return float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))


def judge(ratio: float, low: float, high: float, threshold: float, noisy: str | None = None) -> tuple[str, str]:
    """nvbench-style robust verdict on B / A from its bootstrap interval [low, high].

    FASTER / SLOWER: the interval excludes 1 and the change exceeds the threshold. SAME: the interval lies
    inside 1 ± threshold, or the change is real but under the threshold. NOISY: neither can be said — the
    interval is wider than the threshold band and straddles it, or `noisy` says why the pair does not compare
    (a run flagged the row noisy, or the host's state differed between the runs).
    """
    real = low > 1.0 or high < 1.0
    large = abs(ratio - 1.0) > threshold
    if noisy:
        return "NOISY", noisy
    if real and large:
        return ("SLOWER", "B slower beyond noise") if ratio > 1 else ("FASTER", "B faster beyond noise")
    if 1.0 - threshold <= low and high <= 1.0 + threshold:
        return "SAME", "interval within the threshold band"
    if real:
        return "SAME", f"significant but under the {threshold:.0%} threshold"
    return "NOISY", f"interval {low:.3f}–{high:.3f} is wider than ±{threshold:.0%}: cannot tell"


def compare_runs(results: list[str | Path], wheres: list[Where] | None = None, *, threshold: float = 0.05,
                 seed: int = 0, against_floor: bool = False,
                 host_tolerance: float | None = None) -> tuple[list[Comparison], list[str]]:
    """`report --compare A B`: exactly two results (files or folders), validated here (host_tolerance None:
    HOST_STATE_TOLERANCE, the sweep's default)."""
    host_tolerance = HOST_STATE_TOLERANCE if host_tolerance is None else host_tolerance
    if len(results) != 2:
        raise SdbenchError(f"--compare takes exactly two results (A B), got {len(results)}")
    if not 0 <= threshold < 1:
        raise SdbenchError(f"--threshold must be in [0, 1), got {threshold}")
    if not host_tolerance > 0:
        raise SdbenchError(f"--host-tolerance must be > 0, e.g. 0.15 for 15%, got {host_tolerance:g}")
    return compare([results[0]], [results[1]], wheres, threshold=threshold, seed=seed, against_floor=against_floor,
                   host_tolerance=host_tolerance)


def compare(a_paths: list[str | Path], b_paths: list[str | Path], wheres: list[Where] | None = None, *,
            threshold: float = 0.05, n_boot: int = 1000, confidence: float = 0.95,
            seed: int = 0, against_floor: bool = False,
            host_tolerance: float = HOST_STATE_TOLERANCE) -> tuple[list[Comparison], list[str]]:
    """(one Comparison per config measured in both, notes on what did not match). against_floor compares
    each row as a multiple of its own launch floor in its own run: what repeats on a host whose launch
    cost drifts within one state between sessions (a_us / b_us are then ×floor, not µs). A wall pair whose own
    floor moved beyond host_tolerance between A and B is NOISY either way: the host was in another state, and
    rows do not move by the floor's factor across states."""
    a_side = load_samples(a_paths, wheres or [], against_floor)
    b_side = load_samples(b_paths, wheres or [], against_floor)
    a, b = a_side.pooled, b_side.pooled
    both = set(a) & set(b)
    # Graph rows written before schema v3 timed one replay with the graph's launch latency in it; later ones
    # time the operation inside the graph. The two never match: a 10x "FASTER" would be the method's.
    mixed_graph = {key for key in both if len(a_side.graph_methods.get(key, set()) | b_side.graph_methods.get(key, set())) > 1}
    # Against the floor, both sides must divide by the same launch path's floor.
    mixed_path = {key for key in both - mixed_graph
                  if against_floor and len(a_side.paths.get(key, set()) | b_side.paths.get(key, set())) > 1}
    left_out = mixed_graph | mixed_path
    shared = sorted(both - left_out, key=lambda key: tuple(str(value) for value in key))
    if not shared:
        raise SdbenchError("A and B share no timed (config, impl, view): nothing to compare "
                           "(check that both ran the same preset, or narrow both with --where)")
    rng = np.random.default_rng(seed)
    results = []
    for key in shared:
        # copies of a workload on either side: every row of both a copy, counting once; else each side's pooled runs
        with_copies = key in a_side.copies or key in b_side.copies
        a_parts, b_parts = (a_side.rows[key], b_side.rows[key]) if with_copies else ([a[key]], [b[key]])
        a_us, b_us = copies.median_of_copies(a_parts), copies.median_of_copies(b_parts)
        low, high = bootstrap_ratio(a_parts, b_parts, rng, n_boot, confidence)
        why_not = (host_state_moved(a_side.floors_us.get(key), b_side.floors_us.get(key), host_tolerance)
                   or _flagged(a_side, b_side, key))
        verdict, why = judge(b_us / a_us, low, high, threshold, why_not)
        results.append(Comparison(key, a_us, b_us, low, high, verdict, why))
    notes = []
    if a_side.gpus and b_side.gpus and (a_side.gpus != b_side.gpus or a_side.unrecorded_gpu_rows
                                        or b_side.unrecorded_gpu_rows):
        notes.append(f"A ran on {gpu_words(a_side.gpus, a_side.unrecorded_gpu_rows)} and B on "
                     f"{gpu_words(b_side.gpus, b_side.unrecorded_gpu_rows)} (gpu_uuid): two GPUs of one model may "
                     "differ, so a verdict may be the GPU's, not the change's")
    if mixed_graph:
        notes.append(f"{len(mixed_graph)} graph rows left out: timed before results schema v3 (one replay, launch "
                     "latency included) on one side or in one pooled run, inside the graph (calls_per_sample) in another")
    if mixed_path:
        notes.append(f"{len(mixed_path)} rows left out: A and B read them against different launch paths' floors")
    if len(a) > len(shared) + len(left_out):
        notes.append(f"{len(a) - len(shared) - len(left_out)} (config, impl, view) only in A")
    if len(b) > len(shared) + len(left_out):
        notes.append(f"{len(b) - len(shared) - len(left_out)} (config, impl, view) only in B")
    return results, notes


def _flagged(a_side: Samples, b_side: Samples, key: tuple) -> str | None:
    for name, side in (("A", a_side), ("B", b_side)):
        if key in side.noisy:
            return f"run {name} flagged this row noisy ({side.noisy[key]})"
    return None


def compare_table(results: list[Comparison], notes: list[str], a_label: str, b_label: str,
                  threshold: float, confidence: float = 0.95, against_floor: bool = False) -> ReportTable:
    order = {verdict: index for index, verdict in enumerate(VERDICTS)}
    ranked = sorted(results, key=lambda r: (order[r.verdict], -abs(np.log(r.ratio))))
    counts = {verdict: sum(r.verdict == verdict for r in results) for verdict in order}
    table = ReportTable(
        f"B / A per config: A = {a_label}, B = {b_label} ({counts['SLOWER']} SLOWER, {counts['FASTER']} FASTER, "
        f"{counts['NOISY']} NOISY, {counts['SAME']} SAME of {len(results)}; FASTER/SLOWER when the "
        f"{confidence:.0%} bootstrap interval excludes 1 and |B/A − 1| > {threshold:.0%})",
        ["op", "config", "impl", "view", *(("A ×fl", "B ×fl") if against_floor else ("A µs", "B µs")), "B / A",
         f"{confidence:.0%} interval", "verdict"],
    )
    if against_floor:
        table.title += "; each row as a multiple of its own launch floor in its own run"
    for r in ranked:
        config = f"b={r.get('batch_size')} γ={r.get('gamma')} α={r.get('alpha'):g}" + (
            f" kv={r.get('kv_dim')}" if r.get("kv_dim") else "")
        verdict = f"{r.verdict} ({r.why})" if r.verdict in ("SAME", "NOISY") else r.verdict
        a_value, b_value = (f"{r.a_us:.3f}", f"{r.b_us:.3f}") if against_floor else (format_us(r.a_us), format_us(r.b_us))
        table.rows.append([r.get("op"), config, r.get("impl"), r.get("view"), a_value, b_value,
                           f"{r.ratio:.3f}", f"{r.low:.3f}–{r.high:.3f}", verdict])
    table.notes.extend(notes)
    return table
