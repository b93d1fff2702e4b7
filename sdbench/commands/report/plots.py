"""PNG plots for `sdbench report --out`, drawn with matplotlib's Agg backend (no display needed).

Each plot function takes the report and returns a figure, or raises `Skip` saying what data it lacks;
`write_plots` saves what it can and returns a note for each plot it skipped. Every plot carries axis
labels with units and the GPU name in its title; every config key a plot does not draw gets one panel per
value (titled with it), log axes are used only over a decade or more and always carry labelled ticks, and
a title says when its points pool several runs.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sdbench.commands.report import Cell, Report, fused_and_two_step
from sdbench.thresholds import format_bytes

MAX_HEATMAPS = 8
PANEL_COLUMNS = 4
# Config keys a panel can be split on, in title order; op, device and GPU are one per report section.
PANEL_KEYS = ("batch_size", "gamma", "alpha", "kv_dim", "vocab_size", "dist", "token_dtype", "kv_dtype", "cold_l2")
PANEL_LABELS = {"batch_size": "b", "gamma": "γ", "alpha": "α", "kv_dim": "kv_dim", "vocab_size": "vocab"}


class Skip(Exception):
    """The plot's data is absent: the message says what is missing."""


def _pyplot():
    """matplotlib's pyplot on the Agg backend (report machines have no display)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _slug(text: str) -> str:
    """An implementation name as a file-name part."""
    return re.sub(r"[^A-Za-z0-9_]+", "-", text).strip("-")


def _shown(report: Report, op: str) -> list[Cell]:
    """The op's cells that --impl shows and that have a primary-view median."""
    return [cell for cell in report.cells if cell.get("op") == op and report.shown(cell)
            and cell.median(report.primary_view) is not None]


def _value_text(key: str, value) -> str:
    """'b=32', 'α=0.9', 'vocab=128256': a panel title's part."""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{PANEL_LABELS.get(key, key)}={text}"


def panels_of(cells: list[Cell], drawn: tuple[str, ...]) -> list[tuple[str, list[Cell]]]:
    """One (title, cells) per combination of every config key the plot does not draw that varies here:
    a plot never picks one batch or vocabulary silently, and every panel names what it holds."""
    keys = [key for key in PANEL_KEYS if key not in drawn and len({cell.get(key) for cell in cells}) > 1]
    groups: dict[tuple, list[Cell]] = defaultdict(list)
    for cell in cells:
        groups[tuple(cell.get(key) for key in keys)].append(cell)
    order = sorted(groups, key=lambda values: tuple((value is None, str(value) if not isinstance(value, (int, float))
                                                     else value) for value in values))
    return [(", ".join(_value_text(key, value) for key, value in zip(keys, values, strict=True)) or "all configs",
             groups[values]) for values in order]


def _panels(plt, count: int, width: float = 4.2, height: float = 3.4, sharey: bool = True):
    """A grid of count panels, PANEL_COLUMNS wide; unused slots are hidden."""
    columns = min(count, PANEL_COLUMNS)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns + 0.6, height * rows + 0.8), squeeze=False,
                             sharey=sharey, layout="constrained")
    flat = list(axes.flat)
    for spare in flat[count:]:
        spare.set_visible(False)
    return fig, flat[:count]


MAX_DECADES_AT_125 = 4  # readable_axis: a log axis labels 1, 2 and 5 of each decade up to this span


def readable_axis(axis, values: list[float], which: str = "y") -> None:
    """Log scale with labelled ticks where the data spans a decade or more, else linear: a log axis over
    less than a decade has no labelled major tick (the plots used to show one "100", or none). Labels at 1, 2
    and 5 of each decade up to MAX_DECADES_AT_125 decades; past that only at powers of ten (bytes from 256 B
    to 4 GB put 24 labels on top of each other)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    positive = [value for value in values if value and value > 0]
    if not positive or max(positive) / min(positive) < 10:
        (axis.set_yscale if which == "y" else axis.set_xscale)("linear")
        return
    (axis.set_yscale if which == "y" else axis.set_xscale)("log")
    target = axis.yaxis if which == "y" else axis.xaxis
    wide = max(positive) / min(positive) > 10**MAX_DECADES_AT_125
    target.set_major_locator(LogLocator(base=10, subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())


def _pooled(report: Report) -> str:
    """Said in every title where cells pool several runs (each point is the median of the runs' medians)."""
    return f"; median of {len(report.run_ids)} pooled runs" if len(report.run_ids) > 1 else ""


def _latency_plot(report: Report, op: str, x_key: str, x_label: str, x_log: bool, what: str):
    """Latency against one config key, one line per implementation, one panel per value of the others."""
    from matplotlib.ticker import NullFormatter

    plt = _pyplot()
    cells = _shown(report, op)
    xs = sorted({cell.get(x_key) for cell in cells})
    if len(xs) < 2:
        raise Skip(f"latency vs {what} ({op}): needs at least two {what} values, have {xs or 'none'}")
    panels = panels_of(cells, (x_key,))
    fig, axes = _panels(plt, len(panels))
    view = report.primary_view
    for axis, (title, members) in zip(axes, panels, strict=True):
        _plot_impl_curves(axis, members, x_key, view)
        axis.set(title=title, xlabel=x_label)
        if x_log:
            axis.set_xscale("log")
            axis.set_xticks(xs, [str(x) for x in xs])
            axis.xaxis.set_minor_formatter(NullFormatter())
        axis.grid(True, which="both", alpha=0.3)
    for axis in axes:
        readable_axis(axis, [cell.median(view) for cell in cells])
        axis.set_ylabel(f"median {view} latency (µs)")
    axes[-1].legend(fontsize="small")
    fig.suptitle(f"{op}: latency vs {what}, one panel per config — {report.gpu_label}{_pooled(report)}")
    return fig


def latency_vs_gamma(report: Report, op: str):
    """Latency against γ (log x), one panel per batch / α / kv_dim / ... combination."""
    return _latency_plot(report, op, "gamma", "γ (draft tokens per sequence)", True, "γ")


def _plot_impl_curves(axis, cells, x_key: str, view: str) -> None:
    """One line per implementation: its median in view against the config value x_key."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for cell in cells:
        series[cell.impl].append((cell.get(x_key), cell.median(view)))
    for name, points in sorted(series.items()):
        points.sort()
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)


def latency_vs_alpha(report: Report, op: str):
    """Latency against α, one panel per batch / γ / kv_dim / ... combination."""
    return _latency_plot(report, op, "alpha", "α (acceptance rate)", False, "α")


def speedup_heatmap(report: Report, op: str, impl: str):
    """Speedup over the baseline on a γ × α grid, one panel per batch / kv_dim / vocabulary / ... combination."""
    plt = _pyplot()
    view = report.primary_view
    cells = [cell for cell in report.cells if cell.get("op") == op and cell.median(view)]
    base = {cell.config: cell.median(view) for cell in cells if cell.impl == report.baseline}
    mine = [cell for cell in cells if cell.impl == impl and cell.config in base]
    if not mine:
        raise Skip(f"speedup heatmap ({op}/{impl}): no config shared with the baseline {report.baseline}")
    alphas = sorted({cell.get("alpha") for cell in mine})
    gammas = sorted({cell.get("gamma") for cell in mine})
    panels = panels_of(mine, ("gamma", "alpha"))
    fig, axes = _panels(plt, len(panels), width=max(3.2, 0.9 * len(alphas) + 1.6), sharey=False)
    values = [base[cell.config] / cell.median(view) for cell in mine]
    low, high = min(values), max(values)
    for axis, (title, members) in zip(axes, panels, strict=True):
        grid = np.full((len(gammas), len(alphas)), np.nan)
        for cell in members:  # one cell per (γ, α) in a panel: every other key is fixed by the panel
            grid[gammas.index(cell.get("gamma")), alphas.index(cell.get("alpha"))] = base[cell.config] / cell.median(view)
        image = axis.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=low, vmax=high)
        for (row, col), value in np.ndenumerate(grid):
            if not math.isnan(value):
                axis.text(col, row, f"{value:.2g}×", ha="center", va="center", fontsize=8, color="w")
        axis.set_xticks(range(len(alphas)), [f"{a:g}" for a in alphas])
        axis.set_yticks(range(len(gammas)), [str(g) for g in gammas])
        axis.set(title=title, xlabel="α (acceptance rate)", ylabel="γ (draft tokens per sequence)")
    fig.colorbar(image, ax=axes, label=f"speedup vs {report.baseline} ({view} view, ×)")
    fig.suptitle(f"{op}: {impl} speedup over {report.baseline} — {report.gpu_label}{_pooled(report)}")
    return fig


def fused_vs_two_step(report: Report):
    """Every verify_pack time against accepted KV bytes, with the fitted crossover τ."""
    from sdbench.thresholds import best_threshold

    plt = _pyplot()
    view = report.primary_view
    cells = [cell for cell in report.cells if cell.get("op") == "verify_pack" and cell.median(view)]
    names = sorted({cell.impl for cell in cells})
    fused, two_step = fused_and_two_step(names)
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
    axis.set(xlabel="accepted KV bytes (B · k · kv_dim · elem size, bytes)", ylabel=f"median {view} latency (µs)",
             title=f"fused vs two-step verify-and-pack — {report.gpu_label}{_pooled(report)}")
    readable_axis(axis, [cell.kv_bytes for cell in cells], "x")
    readable_axis(axis, [cell.median(view) for cell in cells])
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    return fig


def bandwidth(report: Report):
    """Achieved bandwidth of the KV ops against accepted KV bytes, beside the copy ceiling."""
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
    axis.set(xlabel="accepted KV bytes (bytes)", ylabel=f"achieved bandwidth, {view} view (GB/s)",
             title=f"achieved bandwidth vs the copy ceiling — {report.gpu_label}{_pooled(report)}")
    readable_axis(axis, [point[0] for points in series.values() for point in points], "x")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    return fig


def planned_plots(report: Report) -> list[tuple[str, str, Callable]]:
    """(file name, title, draw) for every plot this report could have."""
    ops = [op for op in ("verify", "pack", "verify_pack", "prob_verify") if _shown(report, op)]
    plans = []
    for op in ops:
        plans.append((f"latency_vs_gamma_{op}.png", f"{op}: latency vs γ per α", lambda op=op: latency_vs_gamma(report, op)))
        plans.append((f"latency_vs_alpha_{op}.png", f"{op}: latency vs α per config", lambda op=op: latency_vs_alpha(report, op)))
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
