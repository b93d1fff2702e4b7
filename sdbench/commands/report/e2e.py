"""The end-to-end section of `sdbench report`: what a decode step spends per verification implementation
(from `sdbench e2e` parquet, docs/e2e.md), and the observed accepted lengths against the two models the
sweeps draw from (from `sdbench e2e --trace-out`).

Acceptance fits, both with the trace's mean accepted length m over draft length γ:
- binomial: k ~ Binomial(γ, m / γ) — every draft token accepted independently, rejections do not stop
  the count (the sweep's `--dist binomial`);
- geometric: k = min(first rejection, γ) with each token accepted with probability a, a solved from
  E[k] = a (1 − a^γ) / (1 − a) = m (the sweep's `--dist geometric`; what greedy verification produces
  when acceptances are independent across positions).
Distance: total variation, ½ Σ_k |observed − model|; χ² over k with expected count ≥ 5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from sdbench.commands.report import ReportTable, format_us, require_polars
from sdbench.errors import SdbenchError

E2E_COLUMNS = ("method", "verify_impl", "batch_size", "gamma", "step_us")  # what marks an e2e parquet file


def is_e2e_file(path: str | Path) -> bool:
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except (OSError, ValueError):
        return False
    return all(name in names for name in E2E_COLUMNS)


def split_paths(paths: Sequence[str | Path]) -> tuple[list[str], list[str]]:
    """(sweep paths, e2e files): folders contribute their e2e parquet files to the second list and stay in
    the first only if they also hold sweep files."""
    sweep, e2e = [], []
    for given in paths:
        path = Path(given)
        files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
        found = [str(file) for file in files if file.suffix == ".parquet" and is_e2e_file(file)]
        e2e.extend(found)
        if not path.is_dir() and not found:
            sweep.append(str(given))
        elif path.is_dir() and len(found) < len(files):
            sweep.append(str(given))
    return sweep, e2e


def read_e2e(files: Sequence[str | Path]):
    pl = require_polars()
    if not files:
        raise SdbenchError("no e2e parquet files given")
    return pl.concat([pl.read_parquet(file) for file in files], how="diagonal_relaxed")


def _number(value, digits: int = 2) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def step_table(frame) -> ReportTable:
    """Per (b, γ, T) and implementation: throughput against the target alone, and where a step's time goes."""
    pl = require_polars()
    table = ReportTable(
        "End to end: a decode step per verification implementation (µs per round; speedup over the target alone)",
        ["config", "method", "verify impl", "tokens/s", "speedup", "mean k", "draft", "target", "verify",
         "bookkeeping", "verify share", "= target"])
    keys = ["batch_size", "gamma", "temperature"]
    for config, group in frame.sort(keys).group_by(keys, maintain_order=True):
        batch, gamma, temperature = config
        alone = group.filter(pl.col("method") == "target_only")["tokens_per_s"]
        base = float(alone.median()) if alone.len() else None
        label = f"b={batch} γ={gamma} T={temperature:g}"

        order = {"target_only": 0, "speculative": 1, "hf_assisted": 2}
        rows = sorted(group.iter_rows(named=True), key=lambda row: (order.get(row["method"], 3), row["verify_impl"] or "",
                                                                   bool(row.get("sort_by_acceptance"))))
        for row in rows:
            step = row.get("step_us")
            share = row["verify_us"] / step if step and row.get("verify_us") is not None and not math.isnan(step) else None
            speedup = row["tokens_per_s"] / base if base and row.get("tokens_per_s") else None
            same = row.get("matches_target")
            table.rows.append([
                label + (" sorted" if row.get("sort_by_acceptance") else ""), row["method"], row["verify_impl"] or "—", _number(row.get("tokens_per_s"), 0),
                f"{speedup:.2f}×" if speedup is not None else "—", _number(row.get("mean_accepted_length")),
                format_us(row.get("draft_us")), format_us(row.get("target_us")), format_us(row.get("verify_us")),
                format_us(row.get("bookkeeping_us")), f"{share:.1%}" if share is not None else "—",
                "—" if same is None else ("yes" if same else "NO"),
            ])
    table.notes.append("µs columns: mean per round over the run (CUDA events around each phase); verify share = "
                       "verify / step; '= target': the greedy output equals the target model's own greedy decode; "
                       "'sorted': --sort-by-acceptance (sequences ordered by their acceptance EMA before verification)")
    return table


# --- accepted lengths -------------------------------------------------------------------------------------
def read_lengths(path: str | Path) -> list[int]:
    """Every k in a trace file (one line per round, integers separated by spaces or commas)."""
    file = Path(path)
    if not file.is_file():
        raise SdbenchError(f"trace file {str(file)!r} does not exist")
    try:
        lengths = [int(word) for word in file.read_text().replace(",", " ").split()]
    except ValueError as err:
        raise SdbenchError(f"trace file {str(file)!r} holds a non-integer: {err}") from None
    if not lengths or min(lengths) < 0:
        raise SdbenchError(f"trace file {str(file)!r} holds no lengths or a negative one")
    return lengths


def binomial_pmf(gamma: int, p: float) -> list[float]:
    return [math.comb(gamma, k) * p ** k * (1 - p) ** (gamma - k) for k in range(gamma + 1)]


def geometric_mean_length(a: float, gamma: int) -> float:
    """E[min(first rejection, γ)] with per-token acceptance a."""
    return float(gamma) if a >= 1.0 else a * (1 - a ** gamma) / (1 - a)


def geometric_pmf(gamma: int, a: float) -> list[float]:
    return [(1 - a) * a ** k for k in range(gamma)] + [a ** gamma]


def fit_geometric(mean: float, gamma: int) -> float:
    """The per-token acceptance a whose truncated geometric has this mean (bisection: the mean rises with a)."""
    if mean <= 0:
        return 0.0
    if mean >= gamma:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if geometric_mean_length(middle, gamma) < mean else (low, middle)
    return (low + high) / 2


def fit_distances(lengths: Sequence[int], pmf: Sequence[float]) -> tuple[float, float, int]:
    """(total variation, χ², degrees of freedom) of the observed lengths against a model pmf."""
    n = len(lengths)
    counts = [0] * len(pmf)
    for k in lengths:
        counts[k] += 1
    tv = 0.5 * sum(abs(count / n - p) for count, p in zip(counts, pmf, strict=True))
    cells = [(count, n * p) for count, p in zip(counts, pmf, strict=True) if n * p >= 5]
    chi2 = sum((count - expected) ** 2 / expected for count, expected in cells)
    return tv, chi2, max(len(cells) - 2, 0)  # one parameter fitted


def acceptance_table(lengths: Sequence[int], gamma: int, source: str) -> ReportTable:
    if max(lengths) > gamma:
        raise SdbenchError(f"{source} holds k = {max(lengths)} > γ = {gamma}; pass the e2e run's γ with --trace-gamma")
    n = len(lengths)
    mean = sum(lengths) / n
    binomial = binomial_pmf(gamma, mean / gamma)
    a = fit_geometric(mean, gamma)
    geometric = geometric_pmf(gamma, a)
    table = ReportTable(f"Accepted lengths observed end to end ({source}: {n} sequence-rounds, γ = {gamma}, "
                        f"mean k = {mean:.2f}) against the sweep's models",
                        ["k", "observed", "binomial", "geometric"])
    for k in range(gamma + 1):
        observed = sum(1 for length in lengths if length == k) / n
        table.rows.append([str(k), f"{observed:.3f}", f"{binomial[k]:.3f}", f"{geometric[k]:.3f}"])
    tv_b, chi_b, dof_b = fit_distances(lengths, binomial)
    tv_g, chi_g, dof_g = fit_distances(lengths, geometric)
    better = "geometric" if tv_g < tv_b else "binomial"
    table.notes.append(f"binomial(γ, p = {mean / gamma:.3f}): total variation {tv_b:.3f}, χ² {chi_b:.1f} on {dof_b} dof; "
                       f"geometric (a = {a:.3f}): total variation {tv_g:.3f}, χ² {chi_g:.1f} on {dof_g} dof; "
                       f"closer: {better} (sweep with --dist {better}, or --dist trace --trace {source})")
    return table
