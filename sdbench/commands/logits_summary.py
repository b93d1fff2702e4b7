"""Issue #18's bars over a logits grid (`logits_bench`'s CSV), and one γ's table in markdown: what the logits
README quotes, from the rows alone.

    python -m sdbench.commands.logits_summary docs/results/nvidia-h100-80gb-hbm3/logits/grid-token.csv --gamma 8

Bars, in GPU time: `fused_logits` lowest of every design at every (b, γ, V, dtype, L2) state; within
BAR_SCALE × floor + BAR_SLACK_US where the floor (every logits row read once at the run's copy ceiling) is at
least BAR_MIN_FLOOR_US; and its speedup over softmax + FlashInfer at b = 32, V = 128256 (the issue asks ≥ 2×).
A state where a design has no time (its row's `reason` says why) is listed, not counted as a win or a loss.
--copy-tbps recomputes every floor from its row's bytes at one ceiling (TB/s), so grids whose runs measured different
ceilings are held to one bar; by default each row's floor is its own run's, and the report lists the runs' ceilings
and says when they differ by more than CEILING_SPREAD_WARN.
Reads with the standard library's csv: the GPU host, where the grid is written, has no polars.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field

OURS = "fused_logits"
PEER = "vllm_v2_style"  # the other from-logits design: the one whose margin the summary quotes
FLASHINFER = "softmax_flashinfer"
BAR_SCALE, BAR_SLACK_US, BAR_MIN_FLOOR_US = 1.3, 3.0, 5.0  # issue #18: ≤ 1.3 × floor + 3 µs where floor ≥ 5 µs
SPEEDUP_POINT = (32, 128256)  # (b, V) of the ≥ 2× bar
# Runs whose own copy ceilings differ by more than this hold their rows to different floors: the report says so.
CEILING_SPREAD_WARN = 0.03
DTYPE_SHORT = {"bfloat16": "bf16", "float32": "fp32"}
TABLE_DESIGNS = (OURS, PEER, "softmax_fused_prob", FLASHINFER, "torch_eager")
TABLE_HEADS = ("`fused_logits`", "`vllm_v2_style`", "softmax + `fused`", "softmax + FlashInfer", "torch eager")

State = tuple[int, int, int, str, str]  # (b, γ, V, dtype, L2)


def bar_us(floor_us: float) -> float:
    return BAR_SCALE * floor_us + BAR_SLACK_US


def floor_of(row: dict[str, str], copy_tbps: float | None = None) -> float:
    """The row's floor in µs: its own run's, or (copy_tbps) its bytes (`floor_bytes`) read at that ceiling."""
    if copy_tbps is None:
        return float(row["floor_us"])
    return float(row["floor_bytes"]) / (copy_tbps * 1e6)


@dataclass
class Summary:
    states: int = 0
    lowest: int = 0
    losses: list[tuple[State, float, str, float]] = field(default_factory=list)  # (state, ours, best other, its µs)
    untimed: list[tuple[State, str]] = field(default_factory=list)  # (state, design with no time)
    barred: int = 0  # states whose floor is at least BAR_MIN_FLOOR_US
    within_bar: int = 0
    by_batch: dict[int, list[int]] = field(default_factory=dict)  # b: [within, barred]
    misses: list[tuple[State, float, float]] = field(default_factory=list)  # (state, ours, floor)
    closest: tuple[State, float, str, float] | None = None  # the smallest winning margin
    flashinfer_speedups: list[float] = field(default_factory=list)  # at SPEEDUP_POINT
    peer_ratios: list[float] = field(default_factory=list)  # the peer's time / ours
    states_by_ceiling_tbps: dict[float, int] = field(default_factory=dict)  # our rows' own runs' ceilings
    fixed_tbps: float | None = None  # --copy-tbps: every floor at this ceiling, not its run's own


def read_rows(paths: list[str]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in paths:
        with open(path, newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def by_state(rows: list[dict[str, str]]) -> dict[State, dict[str, dict[str, str]]]:
    """{state: {design: row}}; a later row of a (state, design) replaces an earlier one, so a re-run's file passed
    after the grid's replaces its states."""
    states: dict[State, dict[str, dict[str, str]]] = defaultdict(dict)
    for row in rows:
        state = (int(row["batch"]), int(row["gamma"]), int(row["vocab"]), row["dtype"], row["l2"])
        states[state][row["design"]] = row
    return dict(states)


def _us(row: dict[str, str] | None) -> float | None:
    return float(row["gpu_us"]) if row and row.get("gpu_us") else None


def summarize(rows: list[dict[str, str]], copy_tbps: float | None = None) -> Summary:
    out = Summary(fixed_tbps=copy_tbps)
    for state, designs in sorted(by_state(rows).items()):
        ours = _us(designs.get(OURS))
        if ours is None:
            out.untimed.append((state, OURS))
            continue
        out.states += 1
        others = {name: _us(row) for name, row in designs.items() if name != OURS}
        out.untimed += [(state, name) for name, us in others.items() if us is None]
        timed = {name: us for name, us in others.items() if us is not None}
        if timed:
            best = min(timed, key=timed.__getitem__)
            if ours <= timed[best]:
                out.lowest += 1
                if out.closest is None or timed[best] / ours < out.closest[3] / out.closest[1]:
                    out.closest = (state, ours, best, timed[best])
            else:
                out.losses.append((state, ours, best, timed[best]))
        floor = floor_of(designs[OURS], copy_tbps)
        if designs[OURS].get("copy_tbps"):
            ceiling = float(designs[OURS]["copy_tbps"])
            out.states_by_ceiling_tbps[ceiling] = out.states_by_ceiling_tbps.get(ceiling, 0) + 1
        if floor >= BAR_MIN_FLOOR_US:
            out.barred += 1
            counts = out.by_batch.setdefault(state[0], [0, 0])
            counts[1] += 1
            if ours <= bar_us(floor):
                out.within_bar += 1
                counts[0] += 1
            else:
                out.misses.append((state, ours, floor))
        if (state[0], state[2]) == SPEEDUP_POINT and timed.get(FLASHINFER):
            out.flashinfer_speedups.append(timed[FLASHINFER] / ours)
        if timed.get(PEER):
            out.peer_ratios.append(timed[PEER] / ours)
    return out


def _state(state: State) -> str:
    b, gamma, vocab, dtype, l2 = state
    return f"b={b} γ={gamma} V={vocab} {DTYPE_SHORT.get(dtype, dtype)} {l2}"


def ceilings_line(summary: Summary) -> str | None:
    """The runs' own copy ceilings and how many states each floors; a warning where they spread more than
    CEILING_SPREAD_WARN and each row keeps its own (no --copy-tbps)."""
    ceilings = summary.states_by_ceiling_tbps
    if not ceilings:
        return None
    listed = ", ".join(f"{tbps:g} TB/s ({count})" for tbps, count in sorted(ceilings.items()))
    line = f"runs' copy ceilings (states): {listed}"
    spread = max(ceilings) / min(ceilings) - 1
    if spread > CEILING_SPREAD_WARN and summary.fixed_tbps is None:
        line += (f"; they differ by {spread:.1%}, so these rows' floors do too: "
                 "pass --copy-tbps to hold every row to one ceiling")
    return line


def report(summary: Summary) -> str:
    s = summary
    lines = [f"lowest: {s.lowest} of {s.states}"]
    lines += [f"  loss: {_state(st)}: {ours:.2f} µs against {best}'s {us:.2f}" for st, ours, best, us in s.losses]
    if s.closest:
        st, ours, best, us = s.closest
        lines.append(f"  closest win: {_state(st)}: {ours:.2f} µs against {best}'s {us:.2f} ({us / ours - 1:.1%})")
    lines += [f"  no time: {_state(st)}: {name}" for st, name in s.untimed]
    batches = ", ".join(f"b={b}: {within} of {barred}" for b, (within, barred) in sorted(s.by_batch.items()))
    lines.append(f"≤ {BAR_SCALE} × floor + {BAR_SLACK_US:g} µs (floor ≥ {BAR_MIN_FLOOR_US:g} µs): "
                 f"{s.within_bar} of {s.barred} ({batches})")
    lines += [f"  miss: {_state(st)}: {ours:.2f} µs, floor {floor:.2f}, {ours / bar_us(floor):.3f}× the bar"
              for st, ours, floor in s.misses]
    ceilings = ceilings_line(s)
    if ceilings:
        lines.append(ceilings)
    if s.flashinfer_speedups:
        lines.append(f"over softmax + FlashInfer at b={SPEEDUP_POINT[0]}, V={SPEEDUP_POINT[1]}: "
                     f"{min(s.flashinfer_speedups):.1f}-{max(s.flashinfer_speedups):.1f}×")
    if s.peer_ratios:
        lines.append(f"{PEER} / ours: median {statistics.median(s.peer_ratios):.2f}× "
                     f"({min(s.peer_ratios):.2f}-{max(s.peer_ratios):.2f}×)")
    return "\n".join(lines)


def _number(us: float) -> str:
    """Three significant figures, thousands separated (the README's tables)."""
    if us >= 1000:
        return f"{us:,.0f}"
    return f"{us:.0f}" if us >= 100 else f"{us:.1f}" if us >= 10 else f"{us:.2f}"


def gamma_table(rows: list[dict[str, str]], gamma: int, copy_tbps: float | None = None) -> str:
    """One γ's states in markdown: floor, each design's GPU µs (ours bold), ours ÷ the bar where it applies."""
    heads = ("b", "V", "dtype", "L2", "floor", *TABLE_HEADS, "÷ bar")
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    order = {"bfloat16": 0, "float32": 1, "cold": 0, "warm": 1}
    states = sorted((s for s in by_state(rows).items() if s[0][1] == gamma),
                    key=lambda item: (item[0][0], item[0][2], order.get(item[0][3], 2), order.get(item[0][4], 2)))
    for (b, _, vocab, dtype, l2), designs in states:
        if OURS not in designs:
            continue
        floor = floor_of(designs[OURS], copy_tbps)
        times = [_us(designs.get(name)) for name in TABLE_DESIGNS]
        cells = ["—" if us is None else _number(us) for us in times]
        cells[0] = f"**{cells[0]}**"
        over = f"{times[0] / bar_us(floor):.2f}" if floor >= BAR_MIN_FLOOR_US and times[0] is not None else "—"
        lines.append("| " + " | ".join([str(b), str(vocab), DTYPE_SHORT.get(dtype, dtype), l2, _number(floor),
                                        *cells, over]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", help="logits_bench CSVs; a later file's rows replace an earlier one's states")
    parser.add_argument("--gamma", type=int, default=None, help="also print this γ's table in markdown")
    parser.add_argument("--copy-tbps", type=float, default=None,
                        help="every floor from its row's bytes at this copy ceiling (TB/s), not its run's own")
    args = parser.parse_args(argv)
    if args.copy_tbps is not None and not args.copy_tbps > 0:
        parser.error(f"--copy-tbps must be a positive number of TB/s, got {args.copy_tbps}")
    rows = read_rows(args.csv)
    if args.copy_tbps is not None:
        print(f"floors at {args.copy_tbps:g} TB/s (every row's floor_bytes), not each run's own ceiling")
    print(report(summarize(rows, args.copy_tbps)))
    if args.gamma is not None:
        print()
        print(gamma_table(rows, args.gamma, args.copy_tbps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
