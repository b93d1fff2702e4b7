"""The results parquet contract (docs/results-schema.md): schema, the only writer, pyarrow readers.

A results folder holds `part-*.parquet` files, one per measured config, each written to a `.tmp`
name and renamed into place, so a crash or Ctrl-C never leaves a half-written part. Readers here
use pyarrow only (the GPU host has no polars); the report reads the same files with polars.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sdbench.errors import SdbenchError

SCHEMA_VERSION = 1
PART_GLOB = "part-*.parquet"

SCHEMA = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("timestamp", pa.string()),
    ("gpu_name", pa.string()),
    ("gpu_cc", pa.string()),
    ("gpu_sms", pa.int32()),
    ("gpu_memory_gb", pa.float64()),
    ("driver", pa.string()),
    ("cuda_version", pa.string()),
    ("torch_version", pa.string()),
    ("triton_version", pa.string()),
    ("sdbench_version", pa.string()),
    ("git_sha", pa.string()),
    ("hostname", pa.string()),
    ("python_version", pa.string()),
    ("sm_clock_mhz", pa.int32()),
    ("mem_clock_mhz", pa.int32()),
    ("device", pa.string()),
    ("op", pa.string()),
    ("batch_size", pa.int32()),
    ("gamma", pa.int32()),
    ("kv_dim", pa.int32()),
    ("vocab_size", pa.int32()),
    ("seed", pa.int32()),
    ("alpha", pa.float64()),
    ("dist", pa.string()),
    ("token_dtype", pa.string()),
    ("kv_dtype", pa.string()),
    ("mean_accepted_length", pa.float64()),
    ("accepted_kv_bytes", pa.int64()),
    ("impl", pa.string()),
    ("backend", pa.string()),
    ("is_peer", pa.bool_()),
    ("syncs", pa.bool_()),
    ("view", pa.string()),
    ("status", pa.string()),
    ("reason", pa.string()),
    ("warmup", pa.int32()),
    ("iters", pa.int32()),
    ("cold_l2", pa.bool_()),
    ("median_us", pa.float64()),
    ("p95_us", pa.float64()),
    ("min_us", pa.float64()),
    ("mean_us", pa.float64()),
    ("std_us", pa.float64()),
    ("samples_us", pa.list_(pa.float64())),
    ("launch_floor_us", pa.float64()),
    ("bytes_moved", pa.int64()),
    ("achieved_gbps", pa.float64()),
], metadata={"sdbench_schema_version": str(SCHEMA_VERSION)})

COLUMNS = tuple(SCHEMA.names)
STATUSES = ("ok", "failed", "unavailable", "error")
VIEWS = ("wall", "graph", "gpu", "cpu")

# What identifies a config for --resume: the workload it measures and where it ran.
CONFIG_COLUMNS = (
    "op", "device", "batch_size", "gamma", "alpha", "kv_dim", "vocab_size", "dist", "token_dtype", "kv_dtype", "seed",
)
ConfigKey = tuple


def config_key(values: Mapping[str, Any]) -> ConfigKey:
    """The resume key of a row or a row-shaped dict (alpha rounded so 0.3 read back equals 0.3)."""
    return tuple(round(float(values[c]), 9) if c == "alpha" else values[c] for c in CONFIG_COLUMNS)


# --- writing -----------------------------------------------------------------------------------
def to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts keyed by column) as a table of SCHEMA; missing nullable columns become null."""
    rows = list(rows)
    for row in rows:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"not results-schema columns: {sorted(unknown)}")
        if row.get("status") not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {row.get('status')!r}")
        if row.get("view") not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {row.get('view')!r}")
    columns = {}
    for name in COLUMNS:
        if name == "schema_version":
            columns[name] = [SCHEMA_VERSION] * len(rows)
        elif name == "samples_us":
            columns[name] = [list(row.get(name) or []) for row in rows]
        else:
            columns[name] = [row.get(name) for row in rows]
    return pa.Table.from_pydict(columns, schema=SCHEMA)


_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9_.=-]+")


def part_name(run_id: str, key_values: Mapping[str, Any]) -> str:
    """A readable, unique file name for one config of one run."""
    c = key_values
    slug = (
        f"{c['op']}-{c['device']}-b{c['batch_size']}-g{c['gamma']}-a{float(c['alpha']):g}-kv{c['kv_dim']}"
        f"-v{c['vocab_size']}-{c['dist']}-{c['token_dtype']}-{c['kv_dtype']}-s{c['seed']}"
    )
    return _SLUG_UNSAFE.sub("_", f"part-{run_id}-{slug}") + ".parquet"


def write_part(folder: str | Path, name: str, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write rows as folder/name atomically: to `name.tmp`, then os.replace (never a partial part)."""
    return write_table_atomically(to_table(rows), Path(folder) / name)


def write_table_atomically(table: pa.Table, final: Path) -> Path:
    """Write table to final through `final.tmp` and os.replace: readers never see a partial file."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.with_name(f"{final.name}.tmp")
    try:
        pq.write_table(table, temporary)
        os.replace(temporary, final)
    finally:
        if temporary.exists():
            temporary.unlink()
    return final


# --- reading -----------------------------------------------------------------------------------
def part_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Every part file in the given folders (not their subfolders) or the given files, sorted; `.tmp` never."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found.extend(sorted(path.glob(PART_GLOB)))
        elif path.is_file() and path.suffix == ".parquet":
            found.append(path)
        elif not path.exists():
            raise SdbenchError(f"results path {str(path)!r} does not exist")
    return found


def _check_version(path: Path, table: pa.Table) -> None:
    if "schema_version" not in table.column_names:
        raise SdbenchError(f"{path} is not an sdbench results file (no schema_version column)")
    versions = set(table.column("schema_version").to_pylist())
    unknown = versions - {SCHEMA_VERSION}
    if unknown:
        raise SdbenchError(
            f"{path} has results schema version {sorted(unknown)[0]}; this sdbench reads version {SCHEMA_VERSION}"
        )


def read_part(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    path = Path(path)
    wanted = None if columns is None else list(dict.fromkeys(["schema_version", *columns]))
    table = pq.read_table(path, columns=wanted)
    _check_version(path, table)
    return table if columns is None else table.select(columns)


def read_results(paths: str | Path | Iterable[str | Path], columns: list[str] | None = None) -> pa.Table:
    """Every part under paths as one pyarrow table of SCHEMA (an empty table when there are none)."""
    tables = [read_part(path, columns) for path in part_files(paths)]
    if not tables:
        schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
        return schema.empty_table()
    return pa.concat_tables(tables)


def read_rows(paths: str | Path | Iterable[str | Path], columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows as dicts (small result sets: tests, summaries)."""
    return read_results(paths, columns).to_pylist()


def done_configs(folder: str | Path) -> set[ConfigKey]:
    """The config keys already written under folder (what --resume skips)."""
    if not Path(folder).is_dir():
        return set()
    table = read_results(folder, list(CONFIG_COLUMNS))
    return {config_key(row) for row in table.to_pylist()}
