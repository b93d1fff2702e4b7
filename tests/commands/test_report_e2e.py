"""sdbench report's end-to-end section: the step breakdown from e2e parquet and the accepted-length
histogram against its binomial and geometric fits, on synthetic rows and sampled traces."""

import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sdbench.cli import app
from sdbench.commands.report import e2e
from sdbench.e2e import results as e2e_results
from sdbench.errors import SdbenchError

pytest.importorskip("polars")
runner = CliRunner()


def _rows(batch: int, gamma: int) -> list[dict]:
    common = {"schema_version": 1, "run_id": "r1", "device": "cuda", "batch_size": batch, "gamma": gamma,
              "temperature": 0.0, "max_new_tokens": 64}
    return [
        {**common, "method": "target_only", "verify_impl": "", "tokens_per_s": 1000.0},
        {**common, "method": "speculative", "verify_impl": "ballot", "tokens_per_s": 1500.0,
         "mean_accepted_length": 2.0, "draft_us": 600.0, "target_us": 300.0, "verify_us": 20.0,
         "bookkeeping_us": 80.0, "step_us": 1000.0, "matches_target": True},
        {**common, "method": "speculative", "verify_impl": "naive", "tokens_per_s": 500.0,
         "mean_accepted_length": 2.0, "draft_us": 600.0, "target_us": 300.0, "verify_us": 50.0,
         "bookkeeping_us": 80.0, "step_us": 1030.0, "matches_target": False},
    ]


@pytest.fixture()
def e2e_folder(tmp_path) -> Path:
    e2e_results.write_rows(_rows(8, 4), tmp_path / "e2e-b8-g4.parquet")
    return tmp_path


def _sample_geometric(a: float, gamma: int, n: int, rng: random.Random) -> list[int]:
    out = []
    for _ in range(n):
        k = 0
        while k < gamma and rng.random() < a:
            k += 1
        out.append(k)
    return out


def _sample_binomial(p: float, gamma: int, n: int, rng: random.Random) -> list[int]:
    return [sum(rng.random() < p for _ in range(gamma)) for _ in range(n)]


# --- the fits --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, gamma", [(0.2, 4), (0.6, 8), (0.95, 16)])
def test_geometric_pmf_and_fit_agree_with_a_plain_sum(a, gamma):
    pmf = e2e.geometric_pmf(gamma, a)
    assert math.isclose(sum(pmf), 1.0, rel_tol=1e-12)
    mean = sum(k * p for k, p in enumerate(pmf))  # the mean by definition, not by the closed form
    assert math.isclose(e2e.geometric_mean_length(a, gamma), mean, rel_tol=1e-12)
    assert math.isclose(e2e.fit_geometric(mean, gamma), a, rel_tol=1e-9)


def test_binomial_pmf_mean():
    pmf = e2e.binomial_pmf(8, 0.3)
    assert math.isclose(sum(pmf), 1.0) and math.isclose(sum(k * p for k, p in enumerate(pmf)), 2.4)


@pytest.mark.parametrize("model", ["geometric", "binomial"])
def test_the_closer_fit_is_the_model_that_drew_the_lengths(model):
    rng = random.Random(5)
    lengths = (_sample_geometric(0.6, 8, 20000, rng) if model == "geometric"
               else _sample_binomial(0.35, 8, 20000, rng))
    table = e2e.acceptance_table(lengths, 8, "trace.txt")
    assert f"closer: {model}" in table.notes[0]
    observed = [float(row[1]) for row in table.rows]
    assert math.isclose(sum(observed), 1.0, abs_tol=5e-3) and len(table.rows) == 9


def test_lengths_above_gamma_are_an_error():
    with pytest.raises(SdbenchError, match="k = 5 > γ = 4"):
        e2e.acceptance_table([1, 5], 4, "trace.txt")


# --- the step table --------------------------------------------------------------------------------------
def test_step_table_speedup_and_verify_share(e2e_folder):
    table = e2e.step_table(e2e.read_e2e(sorted(map(str, e2e_folder.glob("*.parquet")))))
    rows = {row[2]: row for row in table.rows}
    assert rows["—"][4] == "1.00×" and rows["ballot"][4] == "1.50×" and rows["naive"][4] == "0.50×"
    assert rows["ballot"][10] == "2.0%" and rows["naive"][10] == f"{50 / 1030:.1%}"
    assert rows["ballot"][11] == "yes" and rows["naive"][11] == "NO"


def test_split_paths_finds_e2e_files_in_folders(e2e_folder, tmp_path_factory):
    sweep, found = e2e.split_paths([e2e_folder])
    assert sweep == [] and [Path(path).name for path in found] == ["e2e-b8-g4.parquet"]


# --- through the CLI ----------------------------------------------------------------------------------
def test_report_cli_e2e_and_trace(e2e_folder, tmp_path):
    trace = tmp_path / "trace.txt"
    trace.write_text("0 1 2 4\n3 3\n")
    out = tmp_path / "page"
    result = runner.invoke(app, ["report", str(e2e_folder), "--trace", str(trace), "--format", "md", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "End to end: a decode step" in result.stdout and "Accepted lengths observed end to end" in result.stdout
    assert "γ = 4" in result.stdout  # the e2e results' γ
    page = (out / "e2e.md").read_text()
    assert "| b=8 γ=4 T=0 | speculative | ballot |" in page


def test_report_cli_with_sweep_and_e2e(e2e_folder, tmp_path):
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "cpu-sweep.parquet"
    result = runner.invoke(app, ["report", str(fixture), str(e2e_folder), "--format", "md", "--table", "End to end"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("### End to end")
