"""CLI behaviour common to every command: help everywhere, one-line errors, never a traceback."""

import pytest
from typer.testing import CliRunner

from sdbench.cli import app, parse_float_list, parse_int_list
from sdbench.errors import SdbenchError

runner = CliRunner()


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("list", "parity"):
        assert name in result.output


def test_list_shows_the_registry():
    result = runner.invoke(app, ["list", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "torch_eager" in result.output


def test_list_unknown_operation_is_one_line_error():
    result = runner.invoke(app, ["list", "--op", "verfy"])
    assert result.exit_code == 2
    assert "unknown operation 'verfy'" in result.output and "Traceback" not in result.output


def test_parse_lists():
    assert parse_int_list("1, 4,16", "--b", minimum=1) == [1, 4, 16]
    assert parse_float_list("0.3,0.9", "--alpha", 0, 1) == [0.3, 0.9]


def test_parse_list_errors_name_the_option():
    import pytest

    from sdbench.errors import SdbenchError

    with pytest.raises(SdbenchError, match="--gamma: 'x' is not an integer"):
        parse_int_list("8,x", "--gamma")
    with pytest.raises(SdbenchError, match="--b: 0 is below the minimum 1"):
        parse_int_list("0", "--b", minimum=1)
    with pytest.raises(SdbenchError, match=r"--alpha: 1.5 is outside \[0, 1\]"):
        parse_float_list("1.5", "--alpha", 0, 1)


# --- every file-system failure is one line and exit 2 (issue: a 50-line traceback and exit 1) ---------
@pytest.mark.parametrize("where", ["under-proc", "existing-file"])
@pytest.mark.parametrize("command", [
    ["sweep", "--preset", "quick", "--device", "cpu", "--impl", "torch_eager", "--iters", "2", "--warmup", "0"],
    ["profile", "--op", "verify", "--impl", "torch_eager", "--b", "4", "--gamma", "8", "--alpha", "0.5"],
], ids=["sweep", "profile"])
def test_an_out_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, where, command):
    from typer.testing import CliRunner

    out = "/proc/sdbench-out" if where == "under-proc" else str(tmp_path / "a-file")
    if where == "existing-file":
        (tmp_path / "a-file").write_text("x")
    result = CliRunner().invoke(app, [*command, "--out", out])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and out in result.output
    assert len(result.output.strip().splitlines()) <= 2  # one message (rich may wrap it once)


def test_a_profiles_folder_that_cannot_be_written_is_a_clear_error(tmp_path):
    from sdbench import thresholds

    profile = thresholds.Profile(gpu_name="Test GPU", tau_bytes=1.0)
    with pytest.raises(SdbenchError, match="cannot be written"):
        thresholds.write_profile(profile, "/proc/sdbench-profiles")


def test_version_is_printed():
    from typer.testing import CliRunner

    import sdbench

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"sdbench {sdbench.__version__}"


# --- machine-readable output and identifiers that are never truncated -----------------------------------
@pytest.mark.parametrize("fmt", ["json", "csv", "md"])
def test_list_speaks_json_csv_and_markdown(fmt):
    import csv
    import io
    import json

    from sdbench import registry

    result = runner.invoke(app, ["list", "--device", "cpu", "--format", fmt])
    assert result.exit_code == 0, result.output
    names = {impl.name for impl in registry.implementations()}
    if fmt == "json":
        found = {row["name"] for row in json.loads(result.output)}
    elif fmt == "csv":
        found = {row["name"] for row in csv.DictReader(io.StringIO(result.output))}
    else:
        found = {line.split("|")[2].strip() for line in result.output.splitlines()[2:]}
    assert found == names
    assert "[red]" not in result.output  # markup stripped


def test_tables_never_truncate_an_identifier_at_80_columns():
    from sdbench import registry

    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["list", "--device", "cpu"])
    assert result.exit_code == 0
    for impl in registry.implementations():
        assert impl.name in result.output, impl.name
    assert "…" not in result.output


def test_a_sweep_in_which_nothing_was_timed_exits_1_with_the_reasons(tmp_path, monkeypatch):
    from sdbench import registry

    def broken(workload):
        raise RuntimeError("CUDA out of memory: tried to allocate 8.00 GiB")

    for name in ("broken_a", "broken_b"):
        entry = registry.Implementation(op="verify", name=name, backend="torch", devices=("cpu",),
                                        description="always raises", prepare=broken)
        monkeypatch.setitem(registry._REGISTRY, entry.key, entry)
    result = runner.invoke(app, ["sweep", "--device", "cpu", "--impl", "broken_a,broken_b", "--b", "2", "--gamma", "4",
                                 "--alpha", "0.5", "--iters", "2", "--warmup", "0", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "no row was timed" in text and "broken_a, broken_b" in text and "tried to allocate 8.00 GiB" in text


def test_a_partly_failed_sweep_says_how_many_rows_failed_and_why(tmp_path, monkeypatch):
    from sdbench import registry

    def broken(workload):
        raise RuntimeError("kernel launch failed")

    entry = registry.Implementation(op="verify", name="broken_c", backend="torch", devices=("cpu",),
                                    description="always raises", prepare=broken)
    monkeypatch.setitem(registry._REGISTRY, entry.key, entry)
    result = runner.invoke(app, ["sweep", "--device", "cpu", "--impl", "torch_eager,broken_c", "--b", "2", "--gamma",
                                 "4", "--alpha", "0.5", "--iters", "2", "--warmup", "0", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "1 rows failed or raised" in text and "broken_c" in text and "kernel launch failed" in text
