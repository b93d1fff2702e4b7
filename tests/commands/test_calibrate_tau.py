"""calibrate-tau and profiles: a planted crossover is recovered within one grid step, a one-sided race
says "no crossover" (τ = ∞ or 0), and profiles survive a TOML round trip."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sdbench import thresholds
from sdbench.cli import app
from sdbench.commands import calibrate_tau as tau
from sdbench.errors import SdbenchError
from sdbench.thresholds import Profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import synthetic_results  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cpu-sweep.parquet"
SMALL, LARGE = "fused_single_block", "ballot+pack_torch"
runner = CliRunner()
# Single-block fused: cheap launch, one SM copying (~90 GB/s). Two-step: more launches, whole-GPU copy.
PLANTED = {
    ("verify_pack", SMALL): lambda c, v: {"wall": 20.0, "graph": 11.0, "gpu": 3.0}[v] + c["kv_bytes"] / 90.0e3,
    ("verify_pack", LARGE): lambda c, v: {"wall": 60.0, "graph": 30.0, "gpu": 8.0}[v] + c["kv_bytes"] / 2.5e6,
}
PLANTED_TAU_WALL = 40.0 / (1 / 90.0e3 - 1 / 2.5e6)  # 3.73 MB


def _write(tmp_path, models, **grid) -> Path:
    return synthetic_results.write(tmp_path / "part-0.parquet", synthetic_results.make_rows(models, **grid))


def _kv_bytes(points) -> list[float]:
    return sorted({point.kv_bytes for point in points})


def test_recovers_a_planted_crossover_within_one_grid_step(tmp_path):
    path = _write(tmp_path, PLANTED)
    result = tau.calibrate([path], profiles_dir=tmp_path / "profiles")
    grid = _kv_bytes(result.fit.points)
    below = max(x for x in grid if x < PLANTED_TAU_WALL)
    above = min(x for x in grid if x > PLANTED_TAU_WALL)
    assert below < result.fit.tau_bytes < above
    assert result.fit.low_bytes <= result.fit.tau_bytes <= result.fit.high_bytes
    assert result.fit.misclassified == 0 and result.fit.crossover


@pytest.mark.parametrize("view, planted", [("gpu", 5.0 / (1 / 90.0e3 - 1 / 2.5e6)), ("graph", PLANTED_TAU_WALL * 19 / 40)])
def test_fits_any_view(tmp_path, view, planted):
    result = tau.calibrate([_write(tmp_path, PLANTED)], view=view, write=False)
    grid = _kv_bytes(result.fit.points)
    assert max(x for x in grid if x < planted) < result.fit.tau_bytes < min(x for x in grid if x > planted)


def test_interpolates_in_log_bytes_between_measured_points():
    xs = np.array([1e5, 1e6, 1e7])
    small = np.array([10.0, 10.0, 40.0])  # log ratio at 1e6: log(10/20); at 1e7: log(40/20)
    large = np.array([20.0, 20.0, 20.0])
    tau_bytes, wrong = thresholds.best_threshold(xs, small, large)
    assert wrong == 0
    assert tau_bytes == pytest.approx(10 ** (6 + 0.5), rel=1e-9)  # |log 0.5| == |log 2|: halfway in log


def test_small_always_wins_says_no_crossover_tau_infinite(tmp_path):
    models = {("verify_pack", SMALL): lambda c, v: 5.0 + c["kv_bytes"] / 5e6, ("verify_pack", LARGE): PLANTED[("verify_pack", LARGE)]}
    fit = tau.calibrate([_write(tmp_path, models)], write=False).fit
    assert math.isinf(fit.tau_bytes) and not fit.crossover
    assert fit.message().startswith("no crossover in measured range; τ = ∞")


def test_large_always_wins_says_no_crossover_tau_zero(tmp_path):
    models = {("verify_pack", SMALL): lambda c, v: 500.0, ("verify_pack", LARGE): lambda c, v: 50.0}
    fit = tau.calibrate([_write(tmp_path, models)], write=False).fit
    assert fit.tau_bytes == 0 and "no crossover in measured range; τ = 0" in fit.message()


def test_calibrate_writes_the_profile(tmp_path):
    result = tau.calibrate([_write(tmp_path, PLANTED)], profiles_dir=tmp_path / "profiles")
    assert result.path == tmp_path / "profiles" / "nvidia-h100-80gb-hbm3.toml"
    written = thresholds.read_profile(result.path)
    assert written.gpu_name == "NVIDIA H100 80GB HBM3" and written.gpu_cc == "9.0" and written.gpu_sms == 132
    assert written.driver == "580.159" and written.tau_bytes == pytest.approx(result.fit.tau_bytes)
    assert (written.small_impl, written.large_impl) == (SMALL, LARGE)
    assert written.launch_floor_us == pytest.approx(19.0)
    assert written.copy_bandwidth_gbps > 0 and "achieved" in written.copy_bandwidth_source
    assert written.source_run_ids == ["synthetic-a"] and written.sdbench_version and written.date
    assert written.configs == len(result.fit.points)


def test_cli_prints_the_rule_and_writes(tmp_path):
    path = _write(tmp_path, PLANTED)
    result = runner.invoke(app, ["calibrate-tau", str(path), "--profiles", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert "accepted KV bytes < τ = 3." in result.output.replace("\n", " ")
    assert (tmp_path / "p" / "nvidia-h100-80gb-hbm3.toml").is_file()


def test_cli_names_any_pair_and_explains_a_missing_one(tmp_path):
    models = {("verify_pack", "fused"): lambda c, v: 10.0, ("verify_pack", LARGE): PLANTED[("verify_pack", LARGE)]}
    path = _write(tmp_path, models)
    result = runner.invoke(app, ["calibrate-tau", str(path), "--small", "fused", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "no crossover in measured range; τ = ∞" in result.output
    result = runner.invoke(app, ["calibrate-tau", str(path), "--dry-run"])
    assert result.exit_code == 2
    assert "no config has both fused_single_block and ballot+pack_torch" in result.output
    assert "fused" in result.output


def test_cpu_results_are_refused():
    result = runner.invoke(app, ["calibrate-tau", str(FIXTURE), "--dry-run"])
    assert result.exit_code == 2 and "CPU rows only" in result.output


def test_several_gpus_need_a_choice(tmp_path):
    rows = synthetic_results.make_rows(PLANTED) + synthetic_results.make_rows(
        PLANTED, gpu={**synthetic_results.H100, "gpu_name": "NVIDIA L40S", "gpu_cc": "8.9"})
    path = synthetic_results.write(tmp_path / "both.parquet", rows)
    with pytest.raises(SdbenchError, match="several GPUs"):
        tau.calibrate([path], write=False)
    assert tau.calibrate([path], gpu_name="NVIDIA L40S", write=False).profile.gpu_cc == "8.9"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="would run the mini-sweep on this GPU")
def test_no_results_and_no_gpu_is_a_clear_error():
    result = runner.invoke(app, ["calibrate-tau", "--dry-run"])
    assert result.exit_code == 2 and "no results given and no CUDA device" in result.output


# --- profiles ---------------------------------------------------------------------------------------
PROFILE = Profile(gpu_name="NVIDIA H100 80GB HBM3", tau_bytes=3.7e6, gpu_cc="9.0", gpu_sms=132, driver="580.159",
                  tau_low_bytes=3.1e6, tau_high_bytes=math.inf, launch_floor_us=19.2, copy_bandwidth_gbps=2987.5,
                  source_run_ids=["run-a", "run \"b\""], note="a note with \\ and \"quotes\"", date="2026-11-22")


def test_profile_toml_round_trip(tmp_path):
    path = thresholds.write_profile(PROFILE, tmp_path)
    assert path.name == "nvidia-h100-80gb-hbm3.toml"
    assert thresholds.read_profile(path) == PROFILE


def test_fallback_parser_reads_what_we_write():
    """Python 3.10 has no tomllib: the flat parser must read every profile we write."""
    data = thresholds.parse_flat_toml(thresholds.dumps(PROFILE))
    assert Profile(**data) == PROFILE
    assert thresholds.parse_flat_toml("tau_bytes = inf # comment\n")["tau_bytes"] == math.inf


def test_infinite_tau_round_trips_and_reads_as_always_small(tmp_path):
    forever = Profile(gpu_name="NVIDIA H100 80GB HBM3", tau_bytes=math.inf, small_impl="fused")
    assert thresholds.read_profile(thresholds.write_profile(forever, tmp_path)).tau_bytes == math.inf
    assert "always fused (no crossover in measured range; τ = ∞)" in forever.rule()


def test_bad_profiles_are_one_line_errors(tmp_path):
    (tmp_path / "x.toml").write_text('gpu_name = "A"\ntau_bytes = 1.0\nsurprise = 1\n')
    with pytest.raises(SdbenchError, match="unknown keys surprise"):
        thresholds.read_profile(tmp_path / "x.toml")
    (tmp_path / "x.toml").write_text('gpu_name = "A"\n')
    with pytest.raises(SdbenchError, match="missing 'tau_bytes'"):
        thresholds.read_profile(tmp_path / "x.toml")


def test_match_profile_by_name_then_cc_and_model():
    h100_pcie = Profile(gpu_name="NVIDIA H100 PCIe", gpu_cc="9.0", tau_bytes=1.0)
    found = thresholds.match_profile([PROFILE, h100_pcie], "NVIDIA H100 PCIe", "9.0")
    assert found is h100_pcie
    assert thresholds.match_profile([PROFILE], "NVIDIA H100 NVL", "9.0") is PROFILE  # same CC and model
    assert thresholds.match_profile([PROFILE], "NVIDIA H200", "9.0") is None
    assert thresholds.match_profile([PROFILE], "NVIDIA L40S", "8.9") is None


def test_without_results_the_cli_chains_the_mini_sweep_then_the_fit(tmp_path, monkeypatch):
    """calibrate-tau reads results and never measures: the CLI runs the mini-sweep and hands the fit its folder."""
    from sdbench.commands import sweep

    swept = tmp_path / "sweep" / "run-1"

    def fake_sweep(out_dir, small, large, device="cuda", progress=None):
        assert (Path(out_dir), small, large) == (tmp_path / "sweep", SMALL, LARGE)
        synthetic_results.write(swept / "part-0.parquet", synthetic_results.make_rows(PLANTED))
        return swept

    monkeypatch.setattr(sweep, "run_calibration_sweep", fake_sweep)
    result = runner.invoke(app, ["calibrate-tau", "--sweep-out", str(tmp_path / "sweep"), "--small", SMALL,
                                 "--large", LARGE, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f"mini-sweep results: {swept}" in result.output.replace("\n", "")


def test_calibrate_refuses_to_measure():
    with pytest.raises(SdbenchError, match="no results given"):
        tau.calibrate([], write=False)


SEGMENTED = Profile(gpu_name="NVIDIA H200", gpu_cc="9.0", segment_upper_bytes=[40255.38242518707, 2.5e6, math.inf],
                    segment_impls=["fused", "ballot+pack_cuda", "fused_scan"],
                    candidates=["fused", "fused_scan", "ballot+pack_cuda", "ballot+pack_scan"], view="graph",
                    configs=508, misclassified=12, source_run_ids=["run-a"], note="three segments")


def test_per_size_profile_round_trips_in_flat_toml(tmp_path):
    text = thresholds.dumps(SEGMENTED)
    assert "segment_upper_bytes = [40255.38242518707, 2500000.0, inf]\n" in text
    assert 'segment_impls = ["fused", "ballot+pack_cuda", "fused_scan"]\n' in text
    assert "tau_bytes" not in text and "small_impl" not in text  # one rule form per file
    assert thresholds.read_profile(thresholds.write_profile(SEGMENTED, tmp_path)) == SEGMENTED
    assert Profile(**thresholds.parse_flat_toml(text)) == SEGMENTED  # Python 3.10's reader too


def test_per_size_rule_in_words():
    assert SEGMENTED.rule() == ("NVIDIA H200: accepted KV bytes < 40.3 KB -> fused, < 2.5 MB -> ballot+pack_cuda, "
                                "else fused_scan")
    one = Profile(gpu_name="G", segment_upper_bytes=[math.inf], segment_impls=["fused"])
    assert one.rule() == "G: always fused (it won at every measured size)"


@pytest.mark.parametrize("body, message", [
    ('segment_upper_bytes = [1.0, inf]\nsegment_impls = ["a"]\n', "same length"),
    ('segment_upper_bytes = [2.0, 1.0, inf]\nsegment_impls = ["a", "b", "c"]\n', "rise strictly"),
    ('segment_upper_bytes = [1.0, 2.0]\nsegment_impls = ["a", "b"]\n', "end with inf"),
    ('segment_impls = ["a"]\n', "same length"),
    ('segment_upper_bytes = [inf]\nsegment_impls = ["a"]\ntau_bytes = 1.0\n', "keep one form"),
    ('note = "x"\n', "missing 'tau_bytes' (or segment_upper_bytes and segment_impls)"),
])
def test_bad_per_size_profiles_are_one_line_errors(tmp_path, body, message):
    (tmp_path / "x.toml").write_text('gpu_name = "A"\n' + body)
    with pytest.raises(SdbenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        thresholds.read_profile(tmp_path / "x.toml")
