"""PNG plots for `sdbench report --out`, drawn with matplotlib's Agg backend (no display needed).

Each plot function takes the report and returns a figure, or raises `Skip` saying what data it lacks;
`write_plots` saves what it can and returns a note for each plot it skipped. Every plot carries axis
labels with units and the GPU name in its title.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sdbench.commands.report import Cell, Report
from sdbench.thresholds import format_bytes

MAX_PANELS = 4
MAX_HEATMAPS = 8


class Skip(Exception):
    """The plot's data is absent: the message says what is missing."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "-", text).strip("-")


def _most_common(values: list):
    return max(set(values), key=values.count)


def _spread(values: list, limit: int = MAX_PANELS) -> list:
    """At most `limit` values, evenly picked from the sorted list (ends kept)."""
    values = sorted(set(values))
    if len(values) <= limit:
        return values
    picks = np.linspace(0, len(values) - 1, limit).round().astype(int)
    return [values[i] for i in sorted(set(picks))]


def _shown(report: Report, op: str) -> list[Cell]:
    return [cell for cell in report.cells if cell.get("op") == op and report.shown(cell)
            and cell.median(report.primary_view) is not None]


def _fix_kv(cells: list[Cell]) -> tuple[list[Cell], str]:
    """KV ops: keep the widest kv_dim (the regime where the copy matters)."""
    kv_dims = {cell.get("kv_dim") for cell in cells}
    if len(kv_dims) <= 1:
        return cells, ""
    widest = max(kv_dims)
    return [cell for cell in cells if cell.get("kv_dim") == widest], f", kv_dim={widest}"


def _panels(plt, count: int, width: float = 4.2, height: float = 3.4, sharey: bool = True):
    fig, axes = plt.subplots(1, count, figsize=(width * count + 0.6, height + 0.8), squeeze=False, sharey=sharey,
                             layout="constrained")
    return fig, list(axes[0])


def _plain_log_ticks(axis, which: str = "y") -> None:
    """Log axis ticks as plain numbers (20, 50, 100), not 2×10^1."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    target = axis.yaxis if which == "y" else axis.xaxis
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())


def latency_vs_gamma(report: Report, op: str):
    plt = _pyplot()
    cells, kv_note = _fix_kv(_shown(report, op))
    gammas = sorted({cell.get("gamma") for cell in cells})
    if len(gammas) < 2:
        raise Skip(f"latency vs γ ({op}): needs at least two γ values, have {gammas or 'none'}")
    batch = _most_common([cell.get("batch_size") for cell in cells])
    cells = [cell for cell in cells if cell.get("batch_size") == batch]
    alphas = _spread([cell.get("alpha") for cell in cells])
    fig, axes = _panels(plt, len(alphas))
    for axis, alpha in zip(axes, alphas, strict=True):
        _plot_impl_curves(axis, [c for c in cells if c.get("alpha") == alpha], "gamma", report.primary_view)
        axis.set(xscale="log", yscale="log", title=f"α = {alpha:g}", xlabel="γ (draft tokens per sequence)")
        axis.set_xticks(gammas, [str(g) for g in gammas])
        _plain_log_ticks(axis)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"median {report.primary_view} latency (µs)")
    axes[-1].legend(fontsize="small")
    fig.suptitle(f"{op}: latency vs γ per α (b={batch}{kv_note}) — {report.gpu_label}")
    return fig


def _plot_impl_curves(axis, cells, x_key: str, view: str) -> None:
    """One line per implementation: its median in view against the config value x_key."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for cell in cells:
        series[cell.impl].append((cell.get(x_key), cell.median(view)))
    for name, points in sorted(series.items()):
        points.sort()
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)


def latency_vs_alpha(report: Report, op: str):
    plt = _pyplot()
    cells, kv_note = _fix_kv(_shown(report, op))
    if len({cell.get("alpha") for cell in cells}) < 2:
        raise Skip(f"latency vs α ({op}): needs at least two α values")
    gamma = max(cell.get("gamma") for cell in cells)
    cells = [cell for cell in cells if cell.get("gamma") == gamma]
    batches = _spread([cell.get("batch_size") for cell in cells])
    fig, axes = _panels(plt, len(batches))
    for axis, batch in zip(axes, batches, strict=True):
        _plot_impl_curves(axis, [c for c in cells if c.get("batch_size") == batch], "alpha", report.primary_view)
        axis.set(yscale="log", title=f"b = {batch}", xlabel="α (acceptance rate)")
        _plain_log_ticks(axis)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"median {report.primary_view} latency (µs)")
    axes[-1].legend(fontsize="small")
    fig.suptitle(f"{op}: latency vs α at γ={gamma}{kv_note} — {report.gpu_label}")
    return fig


def speedup_heatmap(report: Report, op: str, impl: str):
    plt = _pyplot()
    view = report.primary_view
    cells, kv_note = _fix_kv([cell for cell in report.cells if cell.get("op") == op and cell.median(view)])
    base = {cell.config: cell.median(view) for cell in cells if cell.impl == report.baseline}
    mine = [cell for cell in cells if cell.impl == impl and cell.config in base]
    if not mine:
        raise Skip(f"speedup heatmap ({op}/{impl}): no config shared with the baseline {report.baseline}")
    batches = _spread([cell.get("batch_size") for cell in mine])
    alphas = sorted({cell.get("alpha") for cell in mine})
    gammas = sorted({cell.get("gamma") for cell in mine})
    fig, axes = _panels(plt, len(batches), width=max(3.2, 0.9 * len(alphas) + 1.6), sharey=False)
    values = [base[cell.config] / cell.median(view) for cell in mine]
    low, high = min(values), max(values)
    for axis, batch in zip(axes, batches, strict=True):
        grid = np.full((len(gammas), len(alphas)), np.nan)
        for cell in mine:
            if cell.get("batch_size") == batch:
                grid[gammas.index(cell.get("gamma")), alphas.index(cell.get("alpha"))] = base[cell.config] / cell.median(view)
        image = axis.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=low, vmax=high)
        for (row, col), value in np.ndenumerate(grid):
            if not math.isnan(value):
                axis.text(col, row, f"{value:.2g}×", ha="center", va="center", fontsize=8, color="w")
        axis.set_xticks(range(len(alphas)), [f"{a:g}" for a in alphas])
        axis.set_yticks(range(len(gammas)), [str(g) for g in gammas])
        axis.set(title=f"b = {batch}", xlabel="α (acceptance rate)", ylabel="γ (draft tokens per sequence)")
    fig.colorbar(image, ax=axes, label=f"speedup vs {report.baseline} ({view} view, ×)")
    fig.suptitle(f"{op}: {impl} speedup over {report.baseline}{kv_note} — {report.gpu_label}")
    return fig


def fused_vs_two_step(report: Report):
    from sdbench.thresholds import best_threshold

    plt = _pyplot()
    view = report.primary_view
    cells = [cell for cell in report.cells if cell.get("op") == "verify_pack" and cell.median(view)]
    names = sorted({cell.impl for cell in cells})
    fused = [name for name in names if name.startswith("fused")]
    two_step = [name for name in names if not name.startswith("fused")]
    if not fused or not two_step:
        raise Skip("fused vs two-step: needs verify_pack rows of a fused kernel and a two-step pipeline "
                   f"(have: {', '.join(names) or 'none'})")
    fig, axis = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    for name in names:
        points = sorted((cell.kv_bytes, cell.median(view)) for cell in cells if cell.impl == name and cell.kv_bytes > 0)
        if points:
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o" if name in fused else "s",
                      linestyle="none", alpha=0.75, label=name)
    by_config: dict[tuple, dict[str, float]] = defaultdict(dict)
    for cell in cells:
        by_config[cell.config][cell.impl] = cell.median(view)
    first = fused[0]
    triples = [(next(c for c in cells if c.config == config).kv_bytes, times[first], min(times[n] for n in two_step if n in times))
               for config, times in by_config.items() if first in times and any(n in times for n in two_step)]
    if triples:
        tau, _ = best_threshold(np.array([t[0] for t in triples]), np.array([t[1] for t in triples]),
                                np.array([t[2] for t in triples]))
        if 0 < tau < math.inf:
            axis.axvline(tau, color="k", linestyle="--", label=f"τ ≈ {format_bytes(tau)} ({first} vs best two-step)")
        else:
            axis.plot([], [], " ", label=f"no crossover in measured range (τ = {'∞' if tau else '0'})")
    axis.set(xscale="log", yscale="log", xlabel="accepted KV bytes (B · k · kv_dim · elem size, bytes)",
             ylabel=f"median {view} latency (µs)",
             title=f"fused vs two-step verify-and-pack — {report.gpu_label}")
    _plain_log_ticks(axis)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    return fig


def bandwidth(report: Report):
    plt = _pyplot()
    view = "gpu" if "gpu" in report.views else report.primary_view
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for cell in report.cells:
        stat = cell.views.get(view)
        if report.shown(cell) and stat is not None and stat.achieved_gbps and cell.kv_bytes > 0:
            series[f"{cell.get('op')}/{cell.impl}"].append((cell.kv_bytes, stat.achieved_gbps))
    if not series:
        raise Skip("achieved bandwidth: no rows with achieved_gbps (KV ops) in these results")
    fig, axis = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    for name, points in sorted(series.items()):
        points.sort()
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", linestyle="none", alpha=0.75, label=name)
    if report.ceiling_gbps:
        axis.axhline(report.ceiling_gbps, color="k", linestyle="--",
                     label=f"copy ceiling {report.ceiling_gbps:.0f} GB/s ({report.ceiling_source})")
    axis.set(xscale="log", xlabel="accepted KV bytes (bytes)", ylabel=f"achieved bandwidth, {view} view (GB/s)",
             title=f"achieved bandwidth vs the copy ceiling — {report.gpu_label}")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    return fig


def planned_plots(report: Report) -> list[tuple[str, str, Callable]]:
    """(file name, title, draw) for every plot this report could have."""
    ops = [op for op in ("verify", "pack", "verify_pack", "prob_verify") if _shown(report, op)]
    plans = []
    for op in ops:
        plans.append((f"latency_vs_gamma_{op}.png", f"{op}: latency vs γ per α", lambda op=op: latency_vs_gamma(report, op)))
        plans.append((f"latency_vs_alpha_{op}.png", f"{op}: latency vs α at large γ", lambda op=op: latency_vs_alpha(report, op)))
    heatmaps = [(op, name) for op in ops for name in sorted({cell.impl for cell in _shown(report, op)})
                if name != report.baseline]
    for op, name in heatmaps[:MAX_HEATMAPS]:
        plans.append((f"speedup_{op}_{_slug(name)}.png", f"{op}: {name} speedup over {report.baseline}",
                      lambda op=op, name=name: speedup_heatmap(report, op, name)))
    plans.append(("fused_vs_two_step.png", "fused vs two-step against accepted KV bytes", lambda: fused_vs_two_step(report)))
    plans.append(("bandwidth.png", "achieved bandwidth vs the copy ceiling", lambda: bandwidth(report)))
    return plans


def write_plots(report: Report, out: Path) -> tuple[list[tuple[Path, str]], list[str]]:
    """Save every plot that has data; a note for each that does not (and for heatmaps left out)."""
    plt = _pyplot()
    written, notes = [], []
    ops = [op for op in ("verify", "pack", "verify_pack", "prob_verify") if _shown(report, op)]
    total_heatmaps = sum(len({c.impl for c in _shown(report, op)} - {report.baseline}) for op in ops)
    if total_heatmaps > MAX_HEATMAPS:
        notes.append(f"{total_heatmaps - MAX_HEATMAPS} speedup heatmaps left out (narrow with --impl)")
    if report.baseline not in {cell.impl for cell in report.cells}:
        notes.append(f"no speedup heatmaps: the baseline {report.baseline} is not in these results")
    for name, title, draw in planned_plots(report):
        try:
            fig = draw()
        except Skip as skipped:
            notes.append(f"skipped {name}: {skipped}")
            continue
        path = out / name
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append((path, title))
    return written, notes
