"""The results parquet contract (docs/results-schema.md): schema, the only writer, pyarrow readers.

A results folder holds `part-*.parquet` files, one per measured config, each written to a `.tmp`
name and renamed into place, so a crash or Ctrl-C never leaves a half-written part. Readers here
use pyarrow only (the GPU host has no polars); the report reads the same files with polars.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sdbench.errors import SdbenchError

SCHEMA_VERSION = 3
# Version 1 lacks fixed_length, trace_sha256 and settings; version 2 lacks calls_per_sample and floor_drift
# (its graph rows timed one copy per replay, launch latency included): missing columns read as null.
READABLE_SCHEMA_VERSIONS = (1, 2, 3)
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
    ("gpu_uuid", pa.string()),  # which physical GPU (null on the CPU and in files written before this column)
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
    ("fixed_length", pa.int32()),
    ("draft_lengths", pa.string()),
    ("trace_sha256", pa.string()),
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
    ("settings", pa.string()),
    ("placement", pa.int32()),  # sweep --placements N: which copy of the workload (0..N-1); null with one copy
    ("median_us", pa.float64()),
    ("p95_us", pa.float64()),
    ("min_us", pa.float64()),
    ("mean_us", pa.float64()),
    ("std_us", pa.float64()),
    ("samples_us", pa.list_(pa.float64())),
    ("noise", pa.float64()),
    ("noisy", pa.bool_()),
    ("calls_per_sample", pa.int32()),  # graph rows: copies of the call per timed replay (samples are per copy)
    ("floor_drift", pa.float64()),  # wall / graph rows: spread of the row / own-floor ratio over the run's quarters
    ("host_slowed", pa.float64()),  # wall rows: own floor / the sweep's lowest wall floor of that path (host state)
    ("launch_floor_us", pa.float64()),  # the floor of the row's own launch path (launch_path), same run and view
    ("launch_path", pa.string()),  # custom_op | triton | triton_bound | torch_eager (null before this column)
    ("launch_floor_min_us", pa.float64()),  # the lowest floor of the paths measured in that config and view
    ("bytes_moved", pa.int64()),
    ("achieved_gbps", pa.float64()),
], metadata={"sdbench_schema_version": str(SCHEMA_VERSION)})

COLUMNS = tuple(SCHEMA.names)
STATUSES = ("ok", "failed", "unavailable", "error")
VIEWS = ("wall", "graph", "gpu", "cpu")

# THE config key: what a row measured (the workload) and how (L2 state, and `settings`: the sweep's
# warm-up and iteration counts, one string shared by every view of a config — a row's own `iters` differ
# by view, the gpu view profiling fewer). --resume,
# the report's cells, compare and calibrate-tau all group rows by it; rows that differ in any of these
# columns never pool. The machine columns are added where runs of one machine belong together (resume,
# report) and left out where runs are matched across machines (compare).
CONFIG_COLUMNS = (
    "op", "batch_size", "gamma", "alpha", "kv_dim", "vocab_size", "dist", "fixed_length", "draft_lengths", "trace_sha256",
    "token_dtype", "kv_dtype", "seed", "cold_l2", "settings",
)
MACHINE_COLUMNS = ("device", "gpu_name")
ConfigKey = tuple


def config_key(values: Mapping[str, Any], machine: bool = True) -> ConfigKey:
    """The config key of a row or row-shaped dict (alpha rounded so 0.3 read back equals 0.3); with the
    machine columns unless machine=False. Columns a row lacks (older files) count as None."""
    columns = CONFIG_COLUMNS + (MACHINE_COLUMNS if machine else ())
    return tuple(_key_value(column, values.get(column)) for column in columns)


# sweep --placements N (N > 1) writes " placements=N" into a row's settings, so a config measured on one copy and again
# on several is two configs by the key above. Where both exist, the copies' measurement stands for the config.
PLACEMENTS_SETTING = re.compile(r" placements=\d+")


def copies_key(values: Mapping[str, Any]) -> ConfigKey:
    """A row's config key with `placements=N` taken out of its settings: a config's one-copy and copies rows share it."""
    settings = values.get("settings")
    return config_key({**values, "settings": PLACEMENTS_SETTING.sub("", settings) if settings else settings})


def copies_row_key(values: Mapping[str, Any]) -> tuple:
    """What a row timed, with `placements=N` out of its settings: (copies_key, impl, view)."""
    return copies_key(values), values.get("impl"), values.get("view")


def superseded(rows: Iterable[Mapping[str, Any]], key_of: Callable[[Mapping[str, Any]], Any] = copies_row_key) -> set:
    """Keys (key_of of a row) of one-copy rows (no `placement`) that rows timed on copies of the same workload replace:
    a config swept plainly and again with --placements into the same results (the same settings but placements) is
    read from its copies alone. Per implementation and view, and only where a copy row is `ok`: a copies sweep of
    fewer implementations, or one whose copies failed, leaves the other rows standing. Rows with a `placement` are
    never among them."""
    keyed = [(key_of(row), row) for row in rows]  # one key a row: config_key and the settings regex are not free
    with_copies = {key for key, row in keyed if row.get("placement") is not None and row.get("status") == "ok"}
    return {key for key, row in keyed if row.get("placement") is None and key in with_copies}


def without_superseded(rows: list[dict]) -> tuple[list[dict], int]:
    """rows less the one-copy rows that copies replace (`superseded`), and how many configs lost rows so."""
    gone = superseded(rows)
    kept = [row for row in rows if row.get("placement") is not None or copies_row_key(row) not in gone]
    return kept, len({key[0] for key in gone})


def _key_value(column: str, value: Any) -> Any:
    if column == "alpha" and value is not None:
        return round(float(value), 9)
    return value


def trace_sha256(path: str | Path | None) -> str | None:
    """The trace file's content hash: a changed trace is a different workload even under the same name."""
    if path is None:
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def new_run_id() -> str:
    """The one run-id format: UTC time to the second and 4 random hex digits (sortable, unique enough)."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


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
    return _SLUG_UNSAFE.sub("_", f"part-{run_id}-{slug}-{_key_digest(key_values)}") + ".parquet"


def _key_digest(key_values: Mapping[str, Any]) -> str:
    """8 hex digits of the config key (machine included): in every part's name, so a listing finds a config."""
    return hashlib.sha256(repr(config_key(key_values)).encode()).hexdigest()[:8]


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
# The columns without which a parquet file is not sdbench results (a friendly refusal, not a KeyError).
REQUIRED_COLUMNS = (
    "schema_version", "run_id", "gpu_name", "device", "op", "batch_size", "gamma", "alpha", "kv_dim", "impl",
    "is_peer", "view", "status", "median_us", "samples_us", "launch_floor_us", "accepted_kv_bytes",
)


def resolve_files(paths: list[str | Path]) -> list[Path]:
    """Parquet files named, or found directly in named folders, in a stable order."""
    if not paths:
        raise SdbenchError("no results given: name parquet files or folders written by `sdbench sweep`")
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():  # a folder's own parts, not its subfolders' (docs/results-schema.md)
            found = sorted(path.glob("*.parquet"))
            if not found:
                nested = sorted({str(part.parent) for part in path.rglob("*.parquet")})
                hint = f"; its subfolders do: name them ({', '.join(nested[:3])}{', ...' if len(nested) > 3 else ''})" if nested else (
                    " (is it a `sdbench sweep --out` folder?)")
                raise SdbenchError(f"folder {str(path)!r} holds no .parquet files{hint}")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise SdbenchError(f"no such file or folder: {str(path)!r}")
    return list(dict.fromkeys(files))


def check_file(path: Path) -> None:
    """Refuse what is not sdbench results of a known schema version, in one line."""
    try:
        names = pq.read_schema(path).names
    except Exception:  # pyarrow raises several types for "not parquet"
        raise SdbenchError(f"{str(path)!r} is not a parquet file") from None
    missing = [column for column in REQUIRED_COLUMNS if column not in names]
    if missing:
        raise SdbenchError(
            f"{str(path)!r} is not sdbench results (missing columns: {', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); report reads parquet written by `sdbench sweep`"
        )
    versions = set(pq.read_table(path, columns=["schema_version"]).column(0).to_pylist())
    unknown = sorted(v for v in versions if v not in READABLE_SCHEMA_VERSIONS)
    if unknown:
        raise SdbenchError(
            f"{str(path)!r} has results schema version {unknown[0]}; this sdbench reads version "
            f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))} (use the sdbench that wrote it, or re-run the sweep)"
        )


def read_checked_rows(paths: list[str | Path]) -> list[dict]:
    """Every row of the named files or folders as a dict of SCHEMA, each file checked first (pyarrow
    alone: calibrate-tau runs on the GPU host, which has no polars)."""
    rows: list[dict] = []
    for path in resolve_files(paths):
        check_file(path)
        rows.extend(read_part(path).to_pylist())
    return rows


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
    unknown = versions - set(READABLE_SCHEMA_VERSIONS)
    if unknown:
        raise SdbenchError(
            f"{path} has results schema version {sorted(unknown)[0]}; this sdbench reads versions "
            f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))} (use the sdbench that wrote it, or re-run the sweep)"
        )


def read_part(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """One part as a table of SCHEMA (or of columns): columns an older version lacks read as null."""
    path = Path(path)
    present = set(pq.read_schema(path).names)
    wanted = list(COLUMNS) if columns is None else list(columns)
    table = pq.read_table(path, columns=[c for c in dict.fromkeys(["schema_version", *wanted]) if c in present])
    _check_version(path, table)
    for name in wanted:
        if name not in present:
            table = table.append_column(SCHEMA.field(name), pa.nulls(table.num_rows, SCHEMA.field(name).type))
    return table.select(wanted).cast(pa.schema([SCHEMA.field(c) for c in wanted]))


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


@contextlib.contextmanager
def config_claim(folder: str | Path, key_values: Mapping[str, Any], resume: bool = True):
    """Claim one config of a results folder for this process: yields True when it is ours to measure.

    The claim is a lock file created with O_CREAT | O_EXCL (atomic on local and NFS v3+ filesystems), named
    by a hash of the config key, and removed when the config's part is written (or the measurement fails).
    A second sweep or resume into the same folder at the same time skips what the first has claimed or
    written (with resume: a part whose name carries this config's key hash, a directory listing, not a read).
    The lock holds its owner's host and pid: a lock left by a killed sweep on this host (its pid is gone) is
    stale and taken over, so a resume after a timeout measures the config the killed sweep was on. A lock
    from another host is honoured (its owner cannot be checked from here): delete the `.claim-*` file.
    """
    digest = hashlib.sha256(repr(config_key(key_values)).encode()).hexdigest()[:16]
    lock = Path(folder) / f".claim-{digest}"
    for attempt in range(2):
        try:
            handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            if attempt == 0 and _stale_claim(lock):
                lock.unlink(missing_ok=True)  # two resumes racing here: O_EXCL still lets only one in
                continue
            yield False
            return
    os.write(handle, f"{socket.gethostname()} {os.getpid()}\n".encode())
    os.close(handle)
    try:
        if resume and any(Path(folder).glob(f"part-*-{_key_digest(key_values)}.parquet")):
            yield False  # finished by another sweep since this one listed the folder
        else:
            yield True
    finally:
        lock.unlink(missing_ok=True)


def _stale_claim(lock: Path) -> bool:
    """True when the lock was written on this host by a process that no longer runs."""
    try:
        host, pid = lock.read_text().split()
        pid_number = int(pid)
    except (OSError, ValueError):
        return False  # being written right now, or not ours to judge
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid_number, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


def done_configs(folder: str | Path) -> set[ConfigKey]:
    """The config keys already written under folder (what --resume skips)."""
    if not Path(folder).is_dir():
        return set()
    table = read_results(folder, list(CONFIG_COLUMNS + MACHINE_COLUMNS))
    return {config_key(row) for row in table.to_pylist()}
