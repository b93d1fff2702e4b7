"""The e2e parquet schema (documented in docs/e2e.md), its atomic writer, and the trace writer."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1

SCHEMA = pa.schema([
    ("schema_version", pa.int32()),
    ("run_id", pa.string()),
    ("method", pa.string()),  # speculative | target_only | hf_assisted
    ("verify_impl", pa.string()),  # registry name ("" for the peers)
    ("operation", pa.string()),  # verify (greedy) | prob_verify (sampling) | "" for the peers
    ("device", pa.string()),
    ("device_name", pa.string()),
    ("timer", pa.string()),  # cuda_events | perf_counter | "" (no phase split)
    ("target", pa.string()),
    ("draft", pa.string()),
    ("target_parameters", pa.int64()),
    ("draft_parameters", pa.int64()),
    ("dtype", pa.string()),
    ("batch_size", pa.int32()),
    ("gamma", pa.int32()),
    ("temperature", pa.float64()),
    ("max_new_tokens", pa.int32()),
    ("sort_by_acceptance", pa.bool_()),
    ("seed", pa.int64()),
    ("rounds", pa.int64()),
    ("emitted_tokens", pa.int64()),
    ("wall_s", pa.float64()),
    ("tokens_per_s", pa.float64()),
    ("target_forwards_per_token", pa.float64()),
    ("mean_accepted_length", pa.float64()),
    ("acceptance_rate", pa.float64()),
    ("draft_us", pa.float64()),
    ("target_us", pa.float64()),
    ("verify_us", pa.float64()),
    ("bookkeeping_us", pa.float64()),
    ("step_us", pa.float64()),
    ("matches_target", pa.bool_()),
    ("torch_version", pa.string()),
    ("transformers_version", pa.string()),
])


def write_rows(rows: list[dict], path: str | Path) -> Path:
    """Write rows as parquet atomically (a temp file in the same directory, then a rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([{name: row.get(name) for name in SCHEMA.names} for row in rows], schema=SCHEMA)
    handle, temp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(handle)
    try:
        pq.write_table(table, temp)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target


def write_trace(accepted_lengths: list[list[int]], path: str | Path) -> Path:
    """One line per round, the k_i of its active sequences: what `sdbench sweep --dist trace` reads."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    with os.fdopen(handle, "w") as file:
        file.write("".join(" ".join(map(str, row)) + "\n" for row in accepted_lengths if row))
    os.replace(temp, target)
    return target
