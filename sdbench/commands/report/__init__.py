"""`sdbench report`: parquet results -> the tables (and, with --out, plots and HTML) a user came for.

Reading: files and folders are resolved and checked with pyarrow (cheap: schema and one column), then
scanned lazily with polars, filtered by `--where`, and aggregated to one median per
(config, implementation, view). polars is imported only here, so `import sdbench` works without it
(the GPU host has none); sdbench.measure.results holds the one pyarrow reader calibrate-tau uses.

Every table is a `ReportTable`, rendered three ways (rich, markdown, HTML). Tables show only what the
data holds and say what is missing (a CPU run has `cpu` views and torch implementations only).
"""

from __future__ import annotations

import html
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sdbench.errors import SdbenchError, closest
from sdbench.measure import results
from sdbench.thresholds import format_bytes

# A cell is one config (results' one config key) on one machine; rows of it from several runs pool.
CONFIG_KEYS = results.CONFIG_COLUMNS + results.MACHINE_COLUMNS
VIEWS = ("wall", "graph", "gpu", "cpu")
PRIMARY_VIEW_ORDER = ("wall", "cpu", "graph", "gpu")  # what a user waits for, first
OP_ORDER = ("verify", "pack", "verify_pack", "prob_verify")
LAUNCH_BOUND_RATIO = 3.0  # wall ≥ 3× gpu time: the launch, not the kernel, is what the user waits for
BANDWIDTH_BOUND_FRACTION = 0.6  # achieved ≥ 60% of the copy ceiling
DIVERGENCE_SPREAD = 0.5  # GPU time grows ≥ 50% across the measured α range


def require_polars():
    try:
        import polars
    except ModuleNotFoundError:
        raise SdbenchError("polars is needed for reports: pip install polars") from None
    return polars


# --- files ---------------------------------------------------------------------------------------
def scan(paths: list[str | Path]):
    """A polars LazyFrame over every file (columns missing from a file read as null)."""
    pl = require_polars()
    files = results.resolve_files(paths)
    for path in files:
        results.check_file(path)
    frames = [pl.scan_parquet(path) for path in files]
    frame = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
    # older files: every schema column they lack reads as a typed null (so --where on it matches nothing, not an error)
    present = set(frame.collect_schema().names())
    schema = pl.from_arrow(results.SCHEMA.empty_table()).schema
    missing = [name for name in results.COLUMNS if name not in present]
    return frame.with_columns(pl.lit(None, dtype=schema[name]).alias(name) for name in missing) if missing else frame


# --- --where ----------------------------------------------------------------------------------------
WHERE_ALIASES = {"b": "batch_size", "batch": "batch_size", "kv": "kv_dim"}  # the CLI's option names
_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|!=|==|=|<|>)\s*(.*?)\s*$")


@dataclass(frozen=True)
class Where:
    column: str
    operator: str  # =, !=, <, >, <=, >=
    value: str  # as written; `=`/`!=` accept a comma list

    def __str__(self) -> str:
        return f"{self.column}{self.operator}{self.value}"


def parse_where(text: str) -> Where:
    match = _WHERE.match(text)
    if not match or not match.group(3):
        raise SdbenchError(f"--where {text!r}: expected COLUMN OP VALUE with OP one of = != < > <= >= (e.g. gamma=128)")
    column, operator, value = match.groups()
    return Where(WHERE_ALIASES.get(column, column), "=" if operator == "==" else operator, value)


def _typed(where: Where, dtype, word: str):
    pl = require_polars()
    if dtype == pl.Boolean:
        if word.lower() not in ("true", "false", "1", "0"):
            raise SdbenchError(f"--where {where}: {where.column} is true/false, got {word!r}")
        return word.lower() in ("true", "1")
    if dtype.is_integer():
        try:
            return int(word)
        except ValueError:
            raise SdbenchError(f"--where {where}: {where.column} is an integer, got {word!r}") from None
    if dtype.is_numeric():
        try:
            return float(word)
        except ValueError:
            raise SdbenchError(f"--where {where}: {where.column} is a number, got {word!r}") from None
    return word


def apply_where(frame, wheres: list[Where]):
    pl = require_polars()
    schema = frame.collect_schema()
    for where in wheres:
        if where.column not in schema:
            raise SdbenchError(
                f"--where {where}: no column {where.column!r}{closest(where.column, list(schema))}; "
                "columns are listed in docs/results-schema.md"
            )
        dtype = schema[where.column]
        column = pl.col(where.column)
        if where.operator in ("=", "!="):
            values = [_typed(where, dtype, word.strip()) for word in where.value.split(",")]
            test = column.is_in(values)
            frame = frame.filter(test if where.operator == "=" else ~test)
            continue
        if not (dtype.is_numeric() or dtype == pl.String):
            raise SdbenchError(f"--where {where}: {where.operator} needs a numeric column; use = or !=")
        value = _typed(where, dtype, where.value)
        test = {"<": column < value, ">": column > value, "<=": column <= value, ">=": column >= value}[where.operator]
        frame = frame.filter(test)
    return frame


# --- tables -----------------------------------------------------------------------------------------
@dataclass
class ReportTable:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the table does not show, and why

    def rich(self, max_rows: int | None = None):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title=self.title, title_justify="left")
        for index, name in enumerate(self.columns):
            table.add_column(name, justify="left" if index < 3 else "right")
        shown = self.rows if max_rows is None else self.rows[:max_rows]
        for row in shown:
            table.add_row(*row)
        if max_rows is not None and len(self.rows) > max_rows:
            table.caption = f"{len(self.rows) - max_rows} more rows: narrow with --where, or see report.md (--out)"
        if not self.rows:
            table = Text(self.title, style="italic")
        return Group(table, *(Text(f"  {note}", style="dim") for note in self.notes))

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        if self.rows:
            lines.append("| " + " | ".join(self.columns) + " |")
            lines.append("|" + "|".join("---" for _ in self.columns) + "|")
            lines.extend("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in self.rows)
            lines.append("")
        lines.extend(f"> {note}" for note in self.notes)
        return "\n".join(lines).rstrip() + "\n"

    def html(self) -> str:
        parts = [f"<h3>{html.escape(self.title)}</h3>"]
        if self.rows:
            head = "".join(f"<th>{html.escape(name)}</th>" for name in self.columns)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                           for row in self.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        parts.extend(f"<p class='note'>{html.escape(note)}</p>" for note in self.notes)
        return "\n".join(parts)


def format_us(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_ratio(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    if value >= 100:
        return f"{value:.0f}×"
    return f"{value:.2f}×" if value >= 0.1 else f"{value:.2g}×"


# --- aggregated data ---------------------------------------------------------------------------------
@dataclass
class ViewStat:
    median_us: float
    launch_floor_us: float | None
    achieved_gbps: float | None
    by_copy: dict[int, float] = field(default_factory=dict)  # sweep --placements: each copy's median (empty without)


@dataclass
class Cell:
    """One (config, implementation): its median per view."""

    config: tuple  # values of CONFIG_KEYS
    impl: str
    backend: str
    is_peer: bool
    kv_bytes: float
    views: dict[str, ViewStat] = field(default_factory=dict)

    def get(self, key: str):
        return self.config[CONFIG_KEYS.index(key)]

    def median(self, view: str) -> float | None:
        stat = self.views.get(view)
        return stat.median_us if stat else None


def aggregate(frame) -> tuple[list[Cell], list[str]]:
    """Cells of ok rows, and the notes of rows that were not timed (`failure_notes`)."""
    pl = require_polars()
    ok = frame.filter((pl.col("status") == "ok") & (pl.col("impl") != "launch_floor") & pl.col("median_us").is_not_null())
    keys = [*CONFIG_KEYS, "impl", "view"]
    table = ok.group_by(keys).agg(
        pl.col("backend").first(), pl.col("is_peer").first(), pl.col("median_us").median(),
        pl.col("launch_floor_us").median(), pl.col("achieved_gbps").median(), pl.col("accepted_kv_bytes").median(),
    ).collect()
    cells: dict[tuple, Cell] = {}
    for row in table.iter_rows(named=True):
        config = tuple(row[key] for key in CONFIG_KEYS)
        cell = cells.get((config, row["impl"]))
        if cell is None:
            cell = cells[(config, row["impl"])] = Cell(config, row["impl"], row["backend"] or "", bool(row["is_peer"]),
                                                         float(row["accepted_kv_bytes"] or 0))
        cell.views[row["view"]] = ViewStat(row["median_us"], row["launch_floor_us"], row["achieved_gbps"])
    if "placement" in frame.collect_schema().names():
        by_copy = ok.filter(pl.col("placement").is_not_null()).group_by([*keys, "placement"]).agg(
            pl.col("median_us").median()).collect()
        for row in by_copy.iter_rows(named=True):
            stat = cells[(tuple(row[key] for key in CONFIG_KEYS), row["impl"])].views[row["view"]]
            stat.by_copy[row["placement"]] = row["median_us"]
    return sorted(cells.values(), key=_cell_order), failure_notes(frame)


FAILED_CONFIGS_NAMED = 4  # a failure at this many configs or fewer names them
REASON_CHARS = 160  # a longer reason is cut at a sentence's end (a CUDA out-of-memory message runs to ~600)


def failure_notes(frame) -> list[str]:
    """One line for each (op, status, reason) and the configs it struck, naming every implementation it struck
    there (not one line each: four implementations that could not build one workload are one failure), the
    configs themselves when there are few, and the reason cut to its first sentences (the whole of it is in the
    results' `reason` column). The launch floor is left out: it is unavailable wherever nothing launches (CPU),
    and the latency table says so once."""
    pl = require_polars()
    failed = frame.filter((pl.col("status") != "ok") & (pl.col("impl") != "launch_floor")).select(
        "impl", "status", "reason", *CONFIG_KEYS).unique().collect()  # (op is a config key)
    struck: dict[tuple, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for row in failed.iter_rows(named=True):
        struck[(row["op"], row["status"], row["reason"] or "no reason given")][row["impl"]].add(
            tuple(row[key] for key in CONFIG_KEYS))
    notes = []
    for (op, status, reason), by_impl in sorted(struck.items()):
        by_configs: dict[frozenset, list[str]] = defaultdict(list)
        for impl, configs in sorted(by_impl.items()):
            by_configs[frozenset(configs)].append(impl)
        for configs, impls in by_configs.items():
            named = ""
            if len(configs) <= FAILED_CONFIGS_NAMED:
                keyed = [dict(zip(CONFIG_KEYS, config, strict=True)) for config in configs]
                also = _differing_keys(keyed)
                named = ": " + "; ".join(sorted(_config_words(config, also) for config in keyed))
            notes.append(f"{op}/{', '.join(impls)}: {status} at {len(configs)} config{'s' * (len(configs) > 1)}"
                         f"{named} ({_short_reason(reason)})")
    return notes


WORDED_KEYS = ("batch_size", "gamma", "alpha", "kv_dim", "cold_l2")  # what _config_words always says


def _config_words(config: dict, also: tuple[str, ...] = ()) -> str:
    """b, γ, α, kv and the L2 state of a config (a dict of CONFIG_KEYS), then `also`'s keys as key=value: the ones
    that tell apart configs these five do not."""
    alpha = config.get("alpha")
    parts = [f"b={config.get('batch_size')}", f"γ={config.get('gamma')}",
             f"α={alpha:g}" if isinstance(alpha, (int, float)) else f"α={alpha}"]
    if config.get("kv_dim"):
        parts.append(f"kv={config['kv_dim']}")
    if config.get("cold_l2") is not None:
        parts.append("cold L2" if config["cold_l2"] else "warm L2")
    parts.extend(f"{key}={config.get(key)}" for key in also)
    return " ".join(parts)


def _differing_keys(configs: list[dict]) -> tuple[str, ...]:
    """The config keys beyond WORDED_KEYS whose values differ among configs (in CONFIG_KEYS order)."""
    return tuple(key for key in CONFIG_KEYS if key not in WORDED_KEYS and key != "op"
                 and len({config.get(key) for config in configs}) > 1)


def _short_reason(reason: str) -> str:
    if len(reason) <= REASON_CHARS:
        return reason
    end = reason.rfind(". ", 0, REASON_CHARS)
    return (reason[:end + 1] if end > 0 else reason[:REASON_CHARS]) + " …"


def _cell_order(cell: Cell):
    op = cell.get("op")
    return (OP_ORDER.index(op) if op in OP_ORDER else len(OP_ORDER), tuple(
        (value is None, str(value) if not isinstance(value, (int, float)) else value)
        for value in cell.config[1:]), cell.impl)


# --- the report ----------------------------------------------------------------------------------------
@dataclass
class Report:
    cells: list[Cell]
    views: list[str]  # present, in VIEWS order
    primary_view: str
    baseline: str
    shown_impls: set[str] | None
    gpu_label: str
    ceiling_gbps: float | None
    ceiling_source: str
    tables: list[ReportTable] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)  # more than one: the cells pool several runs

    def shown(self, cell: Cell) -> bool:
        return self.shown_impls is None or cell.impl in self.shown_impls


def build_report(paths: list[str | Path], wheres: list[Where] | None = None, impls: list[str] | None = None,
                 baseline: str = "torch_eager", view: str | None = None, ceiling_gbps: float | None = None) -> Report:
    frame, superseded = drop_superseded(apply_where(scan(paths), wheres or []))
    cells, skipped_notes = aggregate(frame)
    if not cells:
        raise SdbenchError(_empty_message(paths, wheres or []))
    known_impls = sorted({cell.impl for cell in cells})
    for name in impls or []:
        if name not in known_impls:
            raise SdbenchError(f"--impl {name!r} is not in these results{closest(name, known_impls)}; "
                               f"they hold {', '.join(known_impls)}")
    views = [name for name in VIEWS if any(name in cell.views for cell in cells)]
    if view is not None and view not in views:
        raise SdbenchError(f"--view {view!r} is not in these results; they hold views {', '.join(views)}")
    primary = view or next(name for name in PRIMARY_VIEW_ORDER if name in views)
    report = Report(cells=cells, views=views, primary_view=primary, baseline=baseline,
                    shown_impls=set(impls) if impls else None, gpu_label=_gpu_label(frame),
                    ceiling_gbps=None, ceiling_source="", sources=[str(path) for path in paths])
    report.ceiling_gbps, report.ceiling_source = _ceiling(report, ceiling_gbps)
    report.run_ids = run_ids(frame)
    if len(report.run_ids) > 1:
        report.notes.append(pooled_runs_note(frame, report.run_ids))
    gpus, unrecorded = gpu_uuids(frame)
    if len(gpus) > 1 or (gpus and unrecorded):
        report.notes.append(f"timed on {gpu_words(gpus, unrecorded)}: two GPUs of one model may differ, so a difference "
                            "between configs timed on different GPUs may be the GPU's; one GPU alone: --where "
                            "gpu_uuid=UUID")
    if baseline not in known_impls:
        report.notes.append(f"baseline {baseline!r} is not in these results: no speedup-vs-baseline column "
                            f"(choose one of {', '.join(known_impls)} with --baseline)")
    report.notes.extend(skipped_notes)
    copies_note = placements_note(frame)
    if copies_note:
        report.notes.append(copies_note)
    if superseded:
        report.notes.append(f"{superseded} config{'s' * (superseded > 1)} timed on one copy and again on several "
                            "(sweep --placements, the same settings otherwise): the copies' rows stand for "
                            f"{'them' if superseded > 1 else 'it'}, the one-copy rows are left out")
    below_note = _below_floor_note(frame)
    if below_note:
        report.notes.append(below_note)
    report.tables = [
        summary_table(report), latency_table(report), alpha_table(report), fused_table(report), limits_table(report),
        roofline_table(report), kv_roofline_table(report),
    ]
    if any(cell.get("op") == "pack" for cell in report.cells):  # (a table of notes only where no pack was timed)
        report.tables.append(kv_roofline_table(report, "pack"))
    return report


def _below_floor_note(frame) -> str | None:
    """Rows faster than the empty launch of their own path, beyond their noise: a floor that is not one.
    The rule is sdbench.ops.launch_floor.rows_below_own_floor's, applied to the rows without their samples."""
    from sdbench.ops.launch_floor import FLOOR_KEY_COLUMNS, FLOOR_TOLERANCE, rows_below_own_floor

    pl = require_polars()
    names = frame.collect_schema().names()
    needed = ("run_id", *FLOOR_KEY_COLUMNS, "impl", "view", "status", "median_us", "launch_floor_us", "noise",
              "launch_path")
    frame = frame.with_columns(pl.lit(None).alias(name) for name in needed if name not in names)
    below = rows_below_own_floor(frame.select(needed).collect().to_dicts())
    if not below:
        return None
    listed = ", ".join(sorted({f"{row['impl']} ({row['view']})" for row in below}))
    legacy = any(row["launch_path"] is None for row in below)
    why = (" (rows written before launch_path existed share the custom-op floor, whatever their own launch path)"
           if legacy else "")
    allowed = "".join(f" (and {share:.0%} in the {view} view)" for view, share in FLOOR_TOLERANCE.items())
    return f"below their own launch floor by more than their and the floor's noise{allowed}: {listed}{why}"


def drop_superseded(frame, key_of=results.copies_row_key):
    """(frame less the one-copy rows that rows timed on copies replace (`results.superseded`, by key_of), how many
    configs lost rows so)."""
    pl = require_polars()
    names = frame.collect_schema().names()
    if "placement" not in names or not frame.select(pl.col("placement").is_not_null().any()).collect().item():
        return frame, 0
    # one string a (config, impl, view), null-safe, so the rows to drop are found without joining on nullable columns
    columns = [*CONFIG_KEYS, "impl", "view"]
    key = pl.concat_str([pl.col(name).cast(pl.String).fill_null("\u2205") for name in columns], separator="\x1f")
    distinct = frame.select(*columns, "status", "placement", key.alias("_key")).unique().collect().to_dicts()
    gone = results.superseded(distinct, key_of)
    plain = [row for row in distinct if row["placement"] is None and key_of(row) in gone]
    if not plain:
        return frame, 0
    dropped = sorted({row["_key"] for row in plain})
    configs = len({results.copies_key(row) for row in plain})
    return frame.filter(~(key.is_in(dropped) & pl.col("placement").is_null())), configs


def placements_note(frame) -> str | None:
    """Says that configs were timed on several copies of their workload (`sweep --placements`), that a cell is the
    median of the copies' medians, and how far apart the copies came: the widest spread (max - min over their
    median) of one implementation's copies in one view and run. None where no row names a copy."""
    pl = require_polars()
    if "placement" not in frame.collect_schema().names():
        return None
    spreads = frame.filter((pl.col("status") == "ok") & pl.col("placement").is_not_null()
                           & (pl.col("impl") != "launch_floor")).group_by([*CONFIG_KEYS, "run_id", "impl", "view"]).agg(
        pl.col("placement").n_unique().alias("copies"), pl.col("median_us").min().alias("low"),
        pl.col("median_us").max().alias("high"), pl.col("median_us").median().alias("middle")).filter(
        (pl.col("copies") > 1) & (pl.col("middle") > 0)).collect()
    if spreads.height == 0:
        return None
    rows = spreads.to_dicts()
    widest = max(rows, key=lambda row: (row["high"] - row["low"]) / row["middle"])
    configs = len({tuple(row[key] for key in CONFIG_KEYS) for row in rows})
    counts = sorted({row["copies"] for row in rows})
    each = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    return (f"{configs} config{'s' * (configs > 1)} timed on {each} copies of the workload each (sweep --placements): a "
            f"cell is the median of the copies' medians; the copies' widest spread is "
            f"{(widest['high'] - widest['low']) / widest['middle']:.1%} of their median, {widest['impl']} at "
            f"{_config_words(widest)} ({widest['view']} view: {widest['low']:.3g}–{widest['high']:.3g} µs)")


def run_ids(frame) -> list[str]:
    """The runs whose timed rows these results hold."""
    pl = require_polars()
    timed = frame.filter(pl.col("status") == "ok").select(pl.col("run_id").unique().sort()).collect()
    return [str(run_id) for run_id in timed.to_series().to_list()]


def gpu_uuids(frame) -> tuple[list[str], int]:
    """The physical GPUs (results' gpu_uuid) of the timed rows, sorted, and how many timed rows name none (files
    written before the column, or a GPU whose UUID could not be read)."""
    pl = require_polars()
    timed = frame.filter(pl.col("status") == "ok").select("gpu_uuid").collect().to_series()
    return sorted({str(uuid) for uuid in timed.drop_nulls().to_list()}), int(timed.null_count())


def gpu_words(gpus: list[str], unrecorded: int) -> str:
    """'2 physical GPUs (a, b)', '1 physical GPU (a) and 12 timed rows on an unrecorded one'."""
    words = f"{len(gpus)} physical GPU{'s' * (len(gpus) != 1)} ({', '.join(gpus)})"
    return words + (f" and {unrecorded} timed row{'s' * (unrecorded != 1)} on an unrecorded one" if unrecorded else "")


def pooled_runs_note(frame, ids: list[str]) -> str:
    """Says that several runs were pooled, and how: one median over the runs' medians per config."""
    pl = require_polars()
    overlap = frame.filter(pl.col("status") == "ok").group_by(list(CONFIG_KEYS)).agg(
        pl.col("run_id").n_unique().alias("runs")).filter(pl.col("runs") > 1).select(pl.len()).collect().item()
    shown = ", ".join(ids[:4]) + (", ..." if len(ids) > 4 else "")
    return (f"pooled {len(ids)} runs ({shown}): {overlap} configs were measured by more than one run and show the "
            "median of those runs' medians; one run alone: --where run_id=ID")


def select_tables(report: Report, title_part: str | None) -> list[ReportTable]:
    """The report's tables whose title contains title_part (case-insensitive); all of them for None."""
    if title_part is None:
        return report.tables
    chosen = [table for table in report.tables if title_part.lower() in table.title.lower()]
    if not chosen:
        raise SdbenchError(f"--table {title_part!r} matches no table; the tables are: "
                           + "; ".join(table.title for table in report.tables))
    return chosen


def _empty_message(paths: list[str | Path], wheres: list[Where]) -> str:
    """Why nothing is left: the filter (with the values its columns do take), or no timed rows at all."""
    pl = require_polars()
    if not wheres:
        return "the results hold no timed (status ok) rows: every implementation was unavailable, failed or errored"
    frame = scan(paths).filter(pl.col("status") == "ok")
    hints = []
    for column in dict.fromkeys(where.column for where in wheres):
        values = frame.select(pl.col(column).unique().sort()).collect().to_series().to_list()
        shown = ", ".join(f"{value:g}" if isinstance(value, float) else str(value) for value in values[:12])
        hints.append(f"{column} takes {shown}{', ...' if len(values) > 12 else ''}")
    what = " ".join(f"--where {where}" for where in wheres)
    return f"no timed rows match {what} ({'; '.join(hints)})"


def _gpu_label(frame) -> str:
    pl = require_polars()
    devices = frame.select("gpu_name", "hostname" if "hostname" in frame.collect_schema() else pl.lit(None).alias(
        "hostname")).unique().collect()
    gpus = sorted({row["gpu_name"] for row in devices.iter_rows(named=True) if row["gpu_name"]})
    if gpus:
        return " + ".join(gpus)
    hosts = sorted({row["hostname"] for row in devices.iter_rows(named=True) if row["hostname"]})
    return "CPU" + (f" ({', '.join(hosts)})" if hosts else "")


def _ceiling(report: Report, given: float | None) -> tuple[float | None, str]:
    """The copy-bandwidth ceiling: --ceiling-gbps, else the GPU's profile, else the best achieved."""
    if given:
        return given, "--ceiling-gbps"
    from sdbench import thresholds

    for profile in thresholds.load_profiles():
        if profile.copy_bandwidth_gbps and profile.gpu_name in report.gpu_label:
            return profile.copy_bandwidth_gbps, f"measured copy bandwidth in profile {profile.slug}.toml"
    achieved = [stat.achieved_gbps for cell in report.cells for name, stat in cell.views.items()
                if stat.achieved_gbps and name in ("gpu", "cpu")]
    if achieved:
        return max(achieved), "the best achieved in these results (no profile with a measured copy)"
    return None, ""


# --- helpers over cells ---------------------------------------------------------------------------------
def config_label(cell: Cell, varying: set[str]) -> str:
    parts = [f"b={cell.get('batch_size')}", f"γ={cell.get('gamma')}", f"α={cell.get('alpha'):g}"]
    if cell.get("kv_dim"):
        parts.append(f"kv={cell.get('kv_dim')}")
    # (settings: two sweeps of one config with other timing settings, e.g. --placements, are two cells)
    for key in ("dist", "token_dtype", "kv_dtype", "vocab_size", "cold_l2", "device", "gpu_name", "settings"):
        if key in varying:
            parts.append(f"{key}={cell.get(key)}")
    return " ".join(parts)


def varying_keys(cells: list[Cell]) -> set[str]:
    return {key for index, key in enumerate(CONFIG_KEYS) if len({cell.config[index] for cell in cells}) > 1}


def by_config(cells: list[Cell]) -> dict[tuple, dict[str, Cell]]:
    grouped: dict[tuple, dict[str, Cell]] = defaultdict(dict)
    for cell in cells:
        grouped[cell.config][cell.impl] = cell
    return grouped


def speedups(report: Report, cell: Cell, peers: dict[str, Cell]) -> tuple[float | None, float | None]:
    """(vs baseline, vs the strongest other peer) on the primary view; None where not measured."""
    view = report.primary_view
    own = cell.median(view)
    if own is None:
        return None, None
    base = peers.get(report.baseline)
    vs_base = base.median(view) / own if base is not None and base.median(view) is not None else None
    peer_times = [other.median(view) for name, other in peers.items()
                  if other.is_peer and name != cell.impl and other.median(view) is not None]
    vs_peer = min(peer_times) / own if peer_times else None
    return vs_base, vs_peer


def _impl_order(report: Report, impl: str, is_peer: bool) -> tuple:
    return (impl != report.baseline, not is_peer, impl)


def _view_cell(cell: Cell, view: str) -> str:
    stat = cell.views.get(view)
    if stat is None:
        return "—"
    if stat.launch_floor_us:
        return f"{format_us(stat.median_us)} ({stat.median_us / stat.launch_floor_us:.1f}×fl)"
    return format_us(stat.median_us)


def _geomean(values: list[float]) -> float | None:
    return float(np.exp(np.mean(np.log(values)))) if values else None


# --- the tables ---------------------------------------------------------------------------------------
def summary_table(report: Report) -> ReportTable:
    grouped = by_config(report.cells)
    per_impl: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: {"base": [], "peer": [], "wins": [], "n": []})
    for peers in grouped.values():
        timed = {name: cell.median(report.primary_view) for name, cell in peers.items()
                 if cell.median(report.primary_view) is not None}
        fastest = min(timed, key=timed.get) if timed else None
        for name, cell in peers.items():
            if not report.shown(cell) or name not in timed:
                continue
            entry = per_impl[(cell.get("op"), name)]
            vs_base, vs_peer = speedups(report, cell, peers)
            entry["n"].append(1)
            entry["wins"].append(name == fastest)
            if vs_base is not None:
                entry["base"].append(vs_base)
            if vs_peer is not None:
                entry["peer"].append(vs_peer)
    table = ReportTable(
        f"Summary: speedup per implementation over the grid ({report.primary_view} view, geometric mean)",
        ["op", "impl", "configs", f"vs {report.baseline}", "range", "vs best peer", "fastest at"],
    )
    for (op, name), entry in sorted(per_impl.items(), key=lambda item: (_op_index(item[0][0]), item[0][1])):
        span = f"{format_ratio(min(entry['base']))}–{format_ratio(max(entry['base']))}" if entry["base"] else "—"
        table.rows.append([op, name, str(len(entry["n"])), format_ratio(_geomean(entry["base"])), span,
                           format_ratio(_geomean(entry["peer"])), f"{sum(entry['wins'])} configs"])
    return table


def _op_index(op: str) -> int:
    return OP_ORDER.index(op) if op in OP_ORDER else len(OP_ORDER)


def latency_table(report: Report) -> ReportTable:
    varying = varying_keys(report.cells)
    columns = ["op", "config", "impl", *(f"{view} µs" for view in report.views), f"vs {report.baseline}", "vs best peer"]
    table = ReportTable(f"Median latency per implementation ({report.gpu_label}; speedups on the "
                        f"{report.primary_view} view; ×fl = times the launch floor of the same run and view)", columns)
    for peers in by_config(report.cells).values():
        for name, cell in sorted(peers.items(), key=lambda item: _impl_order(report, item[0], item[1].is_peer)):
            if not report.shown(cell):
                continue
            vs_base, vs_peer = speedups(report, cell, peers)
            table.rows.append([cell.get("op"), config_label(cell, varying), name,
                               *(_view_cell(cell, view) for view in report.views),
                               format_ratio(vs_base), format_ratio(vs_peer)])
    if not any(stat.launch_floor_us for cell in report.cells for stat in cell.views.values()):
        table.notes.append("no launch floor in these results (nothing launches on a CPU): no ×fl ratios")
    missing = [view for view in ("wall", "graph", "gpu") if view not in report.views]
    if missing and "cpu" in report.views:
        table.notes.append(f"CPU results: no {'/'.join(missing)} views (those come from CUDA runs); the cpu view is "
                           "the host clock around each call")
    elif missing:
        table.notes.append(f"no {'/'.join(missing)} view in these results")
    return table


def _alpha_view(report: Report) -> str:
    return "gpu" if "gpu" in report.views else report.primary_view


def alpha_table(report: Report) -> ReportTable:
    """How much each verify implementation's time moves with the acceptance rate."""
    view = _alpha_view(report)
    verify = [cell for cell in report.cells if cell.get("op") == "verify" and report.shown(cell) and cell.median(view)]
    table = ReportTable(f"α-sensitivity: naive vs ballot ({view} view, µs)", [])
    if not verify:
        table.notes.append("no verify rows in these results: nothing to show")
        return table
    names = sorted({cell.impl for cell in verify})
    wanted = [name for name in ("naive", "ballot") if name in names]
    if len(wanted) < 2:
        table.notes.append(f"no {' / '.join(n for n in ('naive', 'ballot') if n not in names)} verify rows here "
                           f"(CUDA kernels); showing the verify implementations present: {', '.join(names)}")
        wanted = names
    gammas = sorted({cell.get("gamma") for cell in verify})
    chosen_gammas = [g for g in (64, 128) if g in gammas] or gammas[-1:]
    if chosen_gammas != [64, 128]:
        table.notes.append(f"γ ∈ {{64, 128}} not both measured; showing γ = {', '.join(map(str, chosen_gammas))}")
    alphas = sorted({cell.get("alpha") for cell in verify})
    table.columns = ["impl", "b", "γ", *(f"α={alpha:g}" for alpha in alphas), "slope µs/α", "spread"]
    series: dict[tuple, dict[float, float]] = defaultdict(dict)
    for cell in verify:
        if cell.impl in wanted and cell.get("gamma") in chosen_gammas:
            series[(cell.impl, cell.get("batch_size"), cell.get("gamma"))][cell.get("alpha")] = cell.median(view)
    for (name, batch, gamma), points in sorted(series.items(), key=lambda item: (wanted.index(item[0][0]), item[0][1:])):
        slope, spread = alpha_slope(points)
        table.rows.append([name, str(batch), str(gamma), *(format_us(points.get(alpha)) for alpha in alphas),
                           "—" if slope is None else f"{0.0 if abs(slope) < 1e-9 else slope:+.3g}", "—" if spread is None else f"{spread:.0%}"])
    if len(alphas) < 2:
        table.notes.append("only one α measured: no slope")
    return table


def alpha_slope(points: dict[float, float]) -> tuple[float | None, float | None]:
    """(least-squares µs per unit α, (max − min) / min) over the measured α; None with one α."""
    if len(points) < 2:
        return None, None
    alphas = np.array(list(points.keys()), dtype=float)
    times = np.array(list(points.values()), dtype=float)
    return float(np.polyfit(alphas, times, 1)[0]), float((times.max() - times.min()) / times.min())


def fused_table(report: Report) -> ReportTable:
    """Fused verify-and-pack against the best two-step pipeline at each config, by accepted KV bytes."""
    from sdbench.thresholds import best_threshold

    view = report.primary_view
    cells = [cell for cell in report.cells if cell.get("op") == "verify_pack" and cell.median(view) is not None]
    names = sorted({cell.impl for cell in cells})
    fused, two_step = fused_and_two_step(names)
    table = ReportTable(f"Fused vs two-step verify-and-pack ({view} view, µs; sorted by accepted KV bytes)", [])
    if not fused or not two_step:
        table.notes.append(
            f"needs verify_pack rows of a fused kernel and a two-step pipeline; these results hold "
            f"{', '.join(names) or 'no verify_pack rows'}" + (" (fused kernels run on CUDA only)" if not fused else ""))
        return table
    varying = varying_keys(report.cells)
    with_copies = any(cell.views[view].by_copy for cell in cells)
    table.columns = ["config", "accepted KV", *fused, "best two-step", *(f"{name} / two-step" for name in fused),
                     *(f"{name} / two-step by copy" for name in fused if with_copies), "winner"]
    curves = _fused_against_best_two_step(cells, view, fused, two_step)
    rows = []
    for peers, times, best_name, best in _best_two_step_by_config(cells, view, fused, two_step):
        any_cell = next(iter(peers.values()))
        winner = min({**times, best_name: best}.items(), key=lambda item: item[1])[0]
        by_copy = [_ratio_range_by_copy(peers, name, two_step, view) for name in fused] if with_copies else []
        rows.append((any_cell.kv_bytes, [config_label(any_cell, varying), format_bytes(any_cell.kv_bytes),
                     *(format_us(times.get(name)) for name in fused), f"{format_us(best)} ({best_name})",
                     *(format_ratio(times[name] / best) if name in times else "—" for name in fused), *by_copy,
                     winner]))
    table.rows = [row for _, row in sorted(rows, key=lambda item: item[0])]
    table.notes.extend(_tie_notes(curves))
    # Issue #17's bar is in GPU time and in the graph view: each of the two that is not this table's view gets its own
    # count, over the implementations that view holds.
    for other in ("graph", "gpu"):
        if other != view and other in report.views:
            other_cells = [cell for cell in report.cells if cell.get("op") == "verify_pack" and cell.median(other) is not None]
            notes = _tie_notes(_fused_against_best_two_step(
                other_cells, other, *fused_and_two_step(sorted({cell.impl for cell in other_cells}))))
            table.notes.extend(f"{other} view: {note}" for note in notes or
                               ["no config holds both a fused kernel and a two-step pipeline"])
    for name, points in curves.items():
        kv_bytes = np.array([p[0] for p in points])
        tau, wrong = best_threshold(kv_bytes, np.array([p[1] for p in points]), np.array([p[2] for p in points]))
        if math.isinf(tau):
            table.notes.append(f"{name}: no crossover in measured range; τ = ∞ ({name} is the better choice at every "
                               "measured size)")
        elif tau <= 0:
            table.notes.append(f"{name}: no crossover in measured range; τ = 0 (the two-step pipeline is the better "
                               "choice at every measured size)")
        else:
            table.notes.append(f"{name}: crossover at τ ≈ {format_bytes(tau)} of accepted KV ({wrong} of "
                               f"{len(points)} configs misclassified); `sdbench calibrate-tau` adds a confidence band")
    return table


def fused_and_two_step(names: list[str]) -> tuple[list[str], list[str]]:
    """verify_pack implementation names split into the one-launch fused kernels and the two-step pipelines."""
    return [name for name in names if name.startswith("fused")], [name for name in names if not name.startswith("fused")]


def _best_two_step_by_config(cells, view: str, fused: list[str], two_step: list[str]):
    """Per config with a two-step row: (its cells by implementation, each fused kernel's median, the best two-step's
    name, its median)."""
    for peers in by_config(cells).values():
        steps = {name: peers[name].median(view) for name in two_step if name in peers}
        if steps:
            best_name = min(steps, key=steps.get)
            times = {name: peers[name].median(view) for name in fused if name in peers}
            yield peers, times, best_name, steps[best_name]


def _ratio_range_by_copy(peers: dict, name: str, two_step: list[str], view: str) -> str:
    """"low–high×" of a fused kernel over the best two-step copy by copy (copy c of each: the same input buffers,
    timed in one rotation; copy c of several runs pooled), over the copies every one of them has; "—" where there are
    none. The median's ratio can sit under a bar that one copy crosses."""
    if name not in peers:
        return "—"
    tables = [peers[other].views[view].by_copy for other in two_step if other in peers and view in peers[other].views]
    mine = peers[name].views[view].by_copy
    shared = set(mine).intersection(*tables) if tables else set()
    ratios = [mine[copy] / min(table[copy] for table in tables) for copy in shared]
    if not ratios:
        return "—"
    return f"{format_ratio(min(ratios))[:-1]}–{format_ratio(max(ratios))}"


def _fused_against_best_two_step(cells, view: str, fused: list[str], two_step: list[str]):
    """{fused kernel: [(accepted KV bytes, its median, the best two-step's median)]} over the configs."""
    curves: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for peers, times, _, best in _best_two_step_by_config(cells, view, fused, two_step):
        kv_bytes = next(iter(peers.values())).kv_bytes
        for name, value in times.items():
            curves[name].append((kv_bytes, value, best))
    return curves


def _tie_notes(curves) -> list[str]:
    return [f"{name} ≤ {FUSED_TIE:g} × the best two-step at {sum(value <= FUSED_TIE * best for _, value, best in points)}"
            f" of {len(points)} configs (worst {max(value / best for _, value, best in points):.2f}×)"
            for name, points in curves.items()]


FUSED_TIE = 1.03  # a fused kernel "ties" the best two-step within 3% (issue #17: ties within noise allowed)

# Issue #17's bar on the copy floor: for accepted KV >= 4 MB, cold-L2 GPU time <= 1.3 × floor + 2 µs, where
# the floor moves every accepted byte once each way at the copy ceiling.
KV_FLOOR_BAR_SCALE, KV_FLOOR_BAR_US, KV_FLOOR_BAR_MIN_BYTES = 1.3, 2.0, 4e6


def kv_roofline_table(report: Report, op: str = "verify_pack") -> ReportTable:
    """A KV op against its copy floor: every accepted KV byte read once and written once. verify_pack: its fused
    kernels, each a column, and the best two-step pipeline; pack: every implementation, each a column (#17 asks
    for pack near the floor at every scale too; the bar's verdict is given for it alike)."""
    table = ReportTable(f"{op} roofline: GPU time against the copy floor (accepted KV read + written)", [])
    cells = [cell for cell in report.cells if cell.get("op") == op and report.shown(cell)
             and cell.median("gpu") and cell.kv_bytes]
    if not cells or not report.ceiling_gbps:
        table.notes.append(f"no {op} rows with gpu time in these results" if not cells
                           else "no copy ceiling known (give --ceiling-gbps): no copy floor")
        return table
    names = sorted({cell.impl for cell in cells})
    if op == "verify_pack":
        fused, two_step = fused_and_two_step(names)
    else:
        fused, two_step = names, []
    varying = varying_keys(cells)
    table.columns = ["config", "accepted KV", "floor µs", *(f"{name} µs (% of copy)" for name in fused),
                     *(["best two-step µs (% of copy)"] if two_step else []),
                     f"≤ {KV_FLOOR_BAR_SCALE:g} × floor + {KV_FLOOR_BAR_US:g} µs"]
    met: dict[str, list[bool]] = defaultdict(list)
    rows = []
    for peers in by_config(cells).values():
        any_cell = next(iter(peers.values()))
        floor_us = 2 * any_cell.kv_bytes / report.ceiling_gbps / 1e3

        def shown(value: float | None, floor_us: float = floor_us) -> str:
            return "—" if value is None else f"{format_us(value)} ({floor_us / value:.0%})"

        times = {name: peers[name].median("gpu") for name in names if name in peers}
        steps = {name: times[name] for name in two_step if name in times}
        best = min(steps.values()) if steps else None
        judged = bool(any_cell.get("cold_l2")) and any_cell.kv_bytes >= KV_FLOOR_BAR_MIN_BYTES
        verdicts = []
        for name in [*fused, *(["best two-step"] if best is not None else [])]:
            value = best if name == "best two-step" else times.get(name)
            if judged and value is not None:
                ok = value <= KV_FLOOR_BAR_SCALE * floor_us + KV_FLOOR_BAR_US
                met[name].append(ok)
                verdicts.append(f"{name}: {'yes' if ok else 'no'}")
        rows.append((any_cell.kv_bytes, [config_label(any_cell, varying), format_bytes(any_cell.kv_bytes),
                                         f"{floor_us:.2f}", *(shown(times.get(name)) for name in fused),
                                         *([shown(best)] if two_step else []),
                                         "; ".join(verdicts) if judged else "—"]))
    table.rows = [row for _, row in sorted(rows, key=lambda item: item[0])]
    table.notes.append(f"floor = 2 × accepted KV bytes / copy ceiling {report.ceiling_gbps:.0f} GB/s "
                       f"({report.ceiling_source}); % of copy = floor / time (tokens and verify outputs not counted)")
    for name, verdicts in met.items():
        table.notes.append(f"{name}: within {KV_FLOOR_BAR_SCALE:g} × floor + {KV_FLOOR_BAR_US:g} µs at "
                           f"{sum(verdicts)} of {len(verdicts)} cold-L2 configs with ≥ "
                           f"{format_bytes(KV_FLOOR_BAR_MIN_BYTES)} accepted")
    return table


REGIMES = ("b ≤ 32", "b > 32", "KV < 1 MB", "KV 1–8 MB", "KV ≥ 8 MB")  # in table order


def _regime(cell: Cell) -> str:
    if cell.get("kv_dim"):
        size = cell.kv_bytes
        return "KV < 1 MB" if size < 1e6 else ("KV 1–8 MB" if size < 8e6 else "KV ≥ 8 MB")
    return "b ≤ 32" if cell.get("batch_size") <= 32 else "b > 32"


def classify(cell: Cell, alpha_spread: float | None, ceiling_gbps: float | None) -> tuple[str, float, float | None]:
    """(limiter, wall/gpu, fraction of the copy ceiling) for a cell with wall and gpu views."""
    wall, gpu = cell.median("wall"), cell.median("gpu")
    launch_ratio = wall / gpu
    gbps = cell.views["gpu"].achieved_gbps
    fraction = gbps / ceiling_gbps if gbps and ceiling_gbps else None
    if launch_ratio >= LAUNCH_BOUND_RATIO:
        return "launch-bound", launch_ratio, fraction
    if fraction is not None and fraction >= BANDWIDTH_BOUND_FRACTION:
        return "bandwidth-bound", launch_ratio, fraction
    # Only for KV-free ops: a KV op's time grows with α because it copies more, not because warps diverge.
    if not cell.get("kv_dim") and alpha_spread is not None and alpha_spread >= DIVERGENCE_SPREAD:
        return "divergence (α-sensitive)", launch_ratio, fraction
    return "kernel latency", launch_ratio, fraction


def limits_table(report: Report) -> ReportTable:
    table = ReportTable("What limited the speedup, by regime", [])
    if "wall" not in report.views or "gpu" not in report.views:
        table.notes.append(f"needs wall and gpu views (CUDA runs with CUPTI); these results hold "
                           f"{', '.join(report.views)}")
        return table
    cells = [cell for cell in report.cells if report.shown(cell) and cell.median("wall") and cell.median("gpu")]
    spreads = {}
    series: dict[tuple, dict[float, float]] = defaultdict(dict)
    for cell in cells:
        key = (cell.impl, *(value for name, value in zip(CONFIG_KEYS, cell.config, strict=True) if name != "alpha"))
        series[key][cell.get("alpha")] = cell.median("gpu")
    for key, points in series.items():
        spreads[key] = alpha_slope(points)[1]
    groups: dict[tuple, list] = defaultdict(list)
    for cell in cells:
        key = (cell.impl, *(value for name, value in zip(CONFIG_KEYS, cell.config, strict=True) if name != "alpha"))
        spread = None if cell.get("kv_dim") else spreads[key]  # KV ops grow with α by copying more: not divergence
        groups[(cell.get("op"), _regime(cell), cell.impl)].append((classify(cell, spread, report.ceiling_gbps), spread))
    table.columns = ["op", "regime", "impl", "configs", "limiter", "wall / gpu", "% of copy ceiling", "α-spread (gpu)"]
    def order(item):
        op, regime, name = item[0]
        return (_op_index(op), REGIMES.index(regime), name)

    for (op, regime, name), entries in sorted(groups.items(), key=order):
        labels = [entry[0][0] for entry in entries]
        top = max(set(labels), key=labels.count)
        fractions = [entry[0][2] for entry in entries if entry[0][2] is not None]
        spread_values = [entry[1] for entry in entries if entry[1] is not None]
        table.rows.append([
            op, regime, name, str(len(entries)), f"{top} ({labels.count(top)}/{len(labels)})",
            f"{np.median([entry[0][1] for entry in entries]):.1f}×",
            f"{np.median(fractions):.0%}" if fractions else "—",
            f"{np.median(spread_values):.0%}" if spread_values else "—",
        ])
    ceiling = (f"{report.ceiling_gbps:.0f} GB/s ({report.ceiling_source})" if report.ceiling_gbps
               else "unknown (no achieved bandwidth in these results)")
    table.notes.append(
        f"launch-bound: wall ≥ {LAUNCH_BOUND_RATIO:g}× gpu time; bandwidth-bound: ≥ {BANDWIDTH_BOUND_FRACTION:.0%} of "
        f"the copy ceiling = {ceiling}; divergence: gpu time grows ≥ {DIVERGENCE_SPREAD:.0%} across α; "
        "otherwise the kernel's own latency")
    return table


def roofline_table(report: Report) -> ReportTable:
    """prob_verify against its read floor: the bytes it must read (bytes_moved) over the copy ceiling."""
    table = ReportTable("prob_verify roofline: GPU time against the bytes it must read", [])
    cells = [cell for cell in report.cells if cell.get("op") == "prob_verify" and report.shown(cell)
             and cell.median("gpu") and cell.views["gpu"].achieved_gbps]
    if not cells or not report.ceiling_gbps:
        table.notes.append("no prob_verify rows with gpu time and bytes in these results" if not cells
                           else "no copy ceiling known (give --ceiling-gbps): no read floor")
        return table
    table.columns = ["config", "impl", "bytes read", "read floor µs", "gpu µs", "× floor", "≤ 1.5 × floor + 3 µs"]
    varying = varying_keys(cells)
    for cell in cells:
        gpu_us = cell.median("gpu")
        bytes_read = gpu_us * cell.views["gpu"].achieved_gbps * 1e3  # GB/s × µs = kB
        floor_us = bytes_read / report.ceiling_gbps / 1e3
        table.rows.append([config_label(cell, varying), cell.impl, format_bytes(bytes_read), f"{floor_us:.2f}",
                           format_us(gpu_us), format_ratio(gpu_us / floor_us), "yes" if gpu_us <= 1.5 * floor_us + 3
                           else "no"])
    table.notes.append(f"read floor = bytes read / copy ceiling {report.ceiling_gbps:.0f} GB/s "
                       f"({report.ceiling_source}); bytes: 2 scalars per draft token, then one p row and one q row "
                       "of V per sequence at its first rejection, p alone at the bonus")
    return table
