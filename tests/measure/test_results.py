"""The parquet contract: the schema matches docs/results-schema.md, rows round-trip, parts are atomic."""

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sdbench.errors import SdbenchError
from sdbench.measure import results

DOC = Path(__file__).resolve().parents[2] / "docs" / "results-schema.md"


def _config(**changes):
    values = {"op": "verify", "device": "cpu", "batch_size": 32, "gamma": 8, "alpha": 0.3, "kv_dim": 0,
              "vocab_size": 32000, "dist": "binomial", "fixed_length": None, "draft_lengths": None, "trace_sha256": None,
              "token_dtype": "int64",
              "kv_dtype": "float16", "seed": 0, "cold_l2": False, "settings": "warmup=20 iters=3 gpu_iters=50",
              "gpu_name": "NVIDIA H100 80GB HBM3"}
    return {**values, **changes}


def _ok_row(**changes):
    row = {
        **_config(), "run_id": "r1", "timestamp": "2026-11-22T10:00:00+00:00",
        "gpu_cc": "9.0", "gpu_sms": 132, "gpu_memory_gb": 85.0, "driver": "580.159",
        "gpu_uuid": "0f3e2a1c-7b4d-4e9a-8c21-5d6f7a8b9c0d", "cuda_version": "13.0",
        "torch_version": "2.11.0", "triton_version": "3.6.0", "sdbench_version": "0.1.0", "git_sha": "abc",
        "hostname": "h100", "python_version": "3.12.3", "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
        "mean_accepted_length": 2.4, "accepted_kv_bytes": 0, "impl": "ballot", "backend": "cuda", "is_peer": False,
        "syncs": False, "view": "wall", "status": "ok", "reason": None, "warmup": 20, "iters": 3,
        "median_us": 2.0, "p95_us": 2.9, "min_us": 1.0, "mean_us": 2.0, "std_us": 1.0, "samples_us": [1.0, 2.0, 3.0],
        "noise": None, "noisy": True, "calls_per_sample": None, "floor_drift": None, "host_slowed": None, "placement": None,
        "launch_floor_us": 18.5, "launch_path": "custom_op", "launch_floor_min_us": 18.5, "bytes_moved": None,
        "achieved_gbps": None,
    }
    return {**row, **changes}


def _failed_row():
    row = _ok_row(impl="naive", status="failed", reason="parity: accepted_lengths differ", samples_us=[])
    for column in ("median_us", "p95_us", "min_us", "mean_us", "std_us"):
        row[column] = None
    return row


def test_schema_columns_are_the_documented_ones_in_order():
    documented = []
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            documented.extend(re.findall(r"`([a-z0-9_]+)`", first_cell))
    assert documented == list(results.COLUMNS)
    assert results.SCHEMA.field("samples_us").type == pa.list_(pa.float64())


def test_rows_round_trip(tmp_path):
    rows = [_ok_row(), _failed_row()]
    path = results.write_part(tmp_path, "part-r1-x.parquet", rows)
    assert path.name == "part-r1-x.parquet"
    back = results.read_rows(tmp_path)
    assert back == [{**row, "schema_version": results.SCHEMA_VERSION} for row in rows]
    assert pq.read_schema(path).remove_metadata() == results.SCHEMA.remove_metadata()


def test_missing_nullable_columns_become_null():
    table = results.to_table([{"impl": "x", "view": "cpu", "status": "unavailable", "reason": "no CUDA"}])
    row = table.to_pylist()[0]
    assert row["median_us"] is None and row["samples_us"] == [] and row["schema_version"] == results.SCHEMA_VERSION


@pytest.mark.parametrize("bad", [{"median_ms": 1.0}, {"status": "passed"}, {"view": "host"}])
def test_rows_outside_the_contract_are_refused(bad):
    with pytest.raises(ValueError):
        results.to_table([{**_ok_row(), **bad}])


def test_write_is_atomic_and_leaves_no_temporary(tmp_path, monkeypatch):
    results.write_part(tmp_path, "part-a.parquet", [_ok_row()])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-a.parquet"]

    def crash(table, where):
        Path(where).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(results.pq, "write_table", crash)
    with pytest.raises(KeyboardInterrupt):
        results.write_part(tmp_path, "part-b.parquet", [_ok_row()])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-a.parquet"]


def test_readers_ignore_temporaries(tmp_path):
    results.write_part(tmp_path, "part-a.parquet", [_ok_row()])
    (tmp_path / "part-b.parquet.tmp").write_bytes(b"interrupted")
    assert len(results.read_rows(tmp_path)) == 1


def test_unknown_schema_version_is_refused(tmp_path):
    table = results.to_table([_ok_row()])
    table = table.set_column(0, "schema_version", pa.array([99], pa.int32()))
    pq.write_table(table, tmp_path / "part-future.parquet")
    with pytest.raises(SdbenchError, match="schema version 99"):
        results.read_results(tmp_path)


def test_empty_folder_reads_as_an_empty_table(tmp_path):
    assert results.read_results(tmp_path).num_rows == 0
    assert results.read_results(tmp_path).schema.names == list(results.COLUMNS)
    assert results.done_configs(tmp_path / "absent") == set()


def test_done_configs_are_the_written_keys(tmp_path):
    results.write_part(tmp_path, "part-1.parquet", [_ok_row(), _failed_row()])
    results.write_part(tmp_path, "part-2.parquet", [_ok_row(**_config(gamma=128, alpha=0.9))])
    assert results.done_configs(tmp_path) == {
        results.config_key(_config()), results.config_key(_config(gamma=128, alpha=0.9)),
    }


def test_part_names_are_readable_and_distinct():
    first = results.part_name("r1", _config())
    assert re.fullmatch(r"part-r1-verify-cpu-b32-g8-a0.3-kv0-v32000-binomial-int64-float16-s0-[0-9a-f]{8}\.parquet", first)
    assert results.part_name("r1", _config(alpha=0.6)) != first
    assert results.part_name("r1", _config(cold_l2=True)) != first  # the hash covers the whole config key
    assert results.part_name("r/2 x", _config()).startswith("part-r_2_x-")


def test_version_1_files_read_with_the_new_columns_null(tmp_path):
    """Committed results predate fixed_length / trace_sha256: they still read, with those columns null."""
    table = results.to_table([_ok_row(settings=None)]).drop_columns(["fixed_length", "trace_sha256", "settings"])
    table = table.set_column(0, "schema_version", pa.array([1], pa.int32()))
    pq.write_table(table, tmp_path / "part-old.parquet")
    (row,) = results.read_rows(tmp_path)
    assert row["fixed_length"] is None and row["trace_sha256"] is None and row["schema_version"] == 1
    assert results.done_configs(tmp_path) == {results.config_key(_config(settings=None))}


def test_a_config_timed_again_on_copies_supersedes_its_one_copy_rows():
    """sweep --placements N after a plain sweep of the same config (the same settings but placements): the plain rows of
    each (impl, view) the copies timed ok give way; a config whose other settings differ, an implementation the copies
    did not time, one whose copies failed, and the copies themselves stay."""
    def row(placement=None, status="ok", impl="fused", **config):
        return {**_config(**config), "impl": impl, "view": "gpu", "status": status, "placement": placement}

    plain = dict(settings="warmup=20 iters=3")
    copies = dict(settings="warmup=20 iters=3 placements=3")
    rows = [row(**plain), row(impl="ballot+pack_cuda", **plain), row(impl="ballot+pack_scan", **plain),
            row(batch_size=64, **plain), row(gamma=16, settings="warmup=20 iters=9"),
            *(row(copy, **copies) for copy in range(3)),  # fused on copies: supersedes the plain fused row
            *(row(copy, "error", impl="ballot+pack_scan", **copies) for copy in range(3)),  # failed: the plain row stays
            *(row(copy, gamma=16, settings="warmup=20 iters=3 placements=2") for copy in range(2))]  # other iters
    assert results.superseded(rows) == {results.copies_row_key(row(**plain))}
    kept, configs = results.without_superseded(rows)
    assert configs == 1 and len(kept) == len(rows) - 1 and row(**plain) not in kept
    assert results.without_superseded([r for r in rows if r["placement"] is None]) == (
        [r for r in rows if r["placement"] is None], 0)
