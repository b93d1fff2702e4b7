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
from sdbench.measure import results
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
    result = tau.calibrate([path], small=SMALL, large=LARGE, profiles_dir=tmp_path / "profiles")
    grid = _kv_bytes(result.fit.points)
    below = max(x for x in grid if x < PLANTED_TAU_WALL)
    above = min(x for x in grid if x > PLANTED_TAU_WALL)
    assert below < result.fit.tau_bytes < above
    assert result.fit.low_bytes <= result.fit.tau_bytes <= result.fit.high_bytes
    assert result.fit.misclassified == 0 and result.fit.crossover


@pytest.mark.parametrize("view, planted", [("gpu", 5.0 / (1 / 90.0e3 - 1 / 2.5e6)), ("graph", PLANTED_TAU_WALL * 19 / 40)])
def test_fits_any_view(tmp_path, view, planted):
    result = tau.calibrate([_write(tmp_path, PLANTED)], small=SMALL, large=LARGE, view=view, write=False)
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
    fit = tau.calibrate([_write(tmp_path, models)], small=SMALL, large=LARGE, write=False).fit
    assert math.isinf(fit.tau_bytes) and not fit.crossover
    assert fit.message().startswith("no crossover in measured range; τ = ∞")


def test_large_always_wins_says_no_crossover_tau_zero(tmp_path):
    models = {("verify_pack", SMALL): lambda c, v: 500.0, ("verify_pack", LARGE): lambda c, v: 50.0}
    fit = tau.calibrate([_write(tmp_path, models)], small=SMALL, write=False).fit  # large: the study's
    assert fit.tau_bytes == 0 and "no crossover in measured range; τ = 0" in fit.message()


def test_calibrate_writes_the_profile(tmp_path):
    result = tau.calibrate([_write(tmp_path, PLANTED)], small=SMALL, large=LARGE, profiles_dir=tmp_path / "profiles")
    assert result.path == tmp_path / "profiles" / "nvidia-h100-80gb-hbm3.toml"
    written = thresholds.read_profile(result.path)
    assert written.gpu_name == "NVIDIA H100 80GB HBM3" and written.gpu_cc == "9.0" and written.gpu_sms == 132
    assert written.driver == "580.159" and written.tau_bytes == pytest.approx(result.fit.tau_bytes)
    assert (written.small_impl, written.large_impl) == (SMALL, LARGE)
    assert written.launch_floor_us == pytest.approx(19.0)
    assert written.copy_bandwidth_gbps > 0 and "achieved" in written.copy_bandwidth_source
    assert written.source_run_ids == ["synthetic-a"] and written.sdbench_version and written.date
    assert written.configs == len(result.fit.points)


@pytest.mark.parametrize("cold_rows", ["all", "all but one"])
def test_the_profiles_launch_floor_is_the_warm_rows_whatever_the_cold_rows_count(tmp_path, cold_rows):
    """Warm and cold sweeps pooled: the profile's launch floor is the warm rows' (a cold row's floor carries the
    L2 flush's aftermath), not a median over both states that flips to their mean when the rows are even."""
    warm = synthetic_results.make_rows(PLANTED)
    cold = [{**row, "cold_l2": True, "run_id": "synthetic-cold",
             "launch_floor_us": None if row["launch_floor_us"] is None else row["launch_floor_us"] * 3}
            for row in warm]
    if cold_rows == "all but one":
        cold.remove(next(row for row in cold if row["impl"] == SMALL and row["view"] == "wall"))
    path = synthetic_results.write(tmp_path / "part-0.parquet", warm + cold)
    profile = tau.calibrate([path], small=SMALL, large=LARGE, write=False).profile
    assert profile.launch_floor_us == pytest.approx(19.0)
    only_cold = synthetic_results.write(tmp_path / "cold" / "part-0.parquet", cold)
    assert tau.calibrate([only_cold], small=SMALL, large=LARGE, write=False).profile.launch_floor_us == pytest.approx(57.0)


def test_offline_recalibration_keeps_the_measured_copy_bandwidth(tmp_path, monkeypatch):
    """No GPU of the results' kind: the replaced profile's measured ceiling stays (the report's floors read it),
    noted once with its date, also below what the results achieved (L2-resident rows beat a DRAM copy). Not
    kept: a bandwidth that was itself the best achieved, another GPU's profile under the same file name, or a
    ceiling under IMPLAUSIBLE_CEILING_FRACTION of what the results achieved."""
    def no_gpu(*args, **kwargs):
        raise RuntimeError("no GPU of that kind here")

    monkeypatch.setattr(tau, "measure_copy_bandwidth_gbps", no_gpu)
    results = [_write(tmp_path, PLANTED)]
    profiles = tmp_path / "profiles"

    def calibrated(folder):
        return thresholds.read_profile(tau.calibrate(results, small=SMALL, large=LARGE, profiles_dir=folder).path)

    first = calibrated(profiles)
    achieved = first.copy_bandwidth_gbps
    assert "achieved" in first.copy_bandwidth_source and achieved > 0
    measured = {"copy_bandwidth_gbps": achieved * 2, "copy_bandwidth_source": "cuda events: 256 MiB copy",
                "date": "2026-01-02"}
    thresholds.write_profile(Profile(**{**first.__dict__, **measured}), profiles)
    for _ in range(2):
        again = calibrated(profiles)
        assert again.copy_bandwidth_gbps == achieved * 2
        assert again.copy_bandwidth_source == f"cuda events: 256 MiB copy; {tau.KEPT} (dated 2026-01-02)"
    below = tmp_path / "below-achieved"
    thresholds.write_profile(Profile(**{**first.__dict__, **measured, "copy_bandwidth_gbps": achieved * 0.8}), below)
    assert calibrated(below).copy_bandwidth_gbps == pytest.approx(achieved * 0.8)  # the H100's case: kept
    for name, change in [("another-gpu", {"gpu_name": "NVIDIA H100 PCIe"}),
                         ("implausible", {"copy_bandwidth_gbps": achieved * tau.IMPLAUSIBLE_CEILING_FRACTION * 0.99}),
                         ("achieved", {"copy_bandwidth_source": "max achieved in the results (no copy measured)"})]:
        folder = tmp_path / name
        written = thresholds.write_profile(Profile(**{**first.__dict__, **measured, **change}), folder)
        written.rename(folder / f"{first.slug}.toml")  # the same file name whatever the GPU
        assert calibrated(folder).copy_bandwidth_gbps == pytest.approx(achieved), name


def test_a_given_copy_ceiling_is_the_profiles_and_a_later_offline_run_keeps_it(tmp_path, monkeypatch):
    """--copy-gbps (a ceiling measured on the results' GPU elsewhere) replaces the results' best achieved, also
    when it is below it (the H100's case), and is kept like a measured one by the next offline calibration."""
    def no_gpu(*args, **kwargs):
        raise RuntimeError("no GPU of that kind here")

    monkeypatch.setattr(tau, "measure_copy_bandwidth_gbps", no_gpu)
    results = [_write(tmp_path, PLANTED)]
    profiles = tmp_path / "profiles"
    achieved = tau.calibrate(results, small=SMALL, large=LARGE, write=False).profile.copy_bandwidth_gbps
    given = tau.calibrate(results, small=SMALL, large=LARGE, profiles_dir=profiles, copy_gbps=achieved * 0.8)
    written = thresholds.read_profile(given.path)
    assert written.copy_bandwidth_gbps == pytest.approx(achieved * 0.8)
    assert written.copy_bandwidth_source.startswith(tau.GIVEN_COPY) and tau.copy_ceiling_is_measured(
        written.copy_bandwidth_source)
    later = thresholds.read_profile(tau.calibrate(results, small=SMALL, large=LARGE, profiles_dir=profiles).path)
    assert later.copy_bandwidth_gbps == pytest.approx(achieved * 0.8) and tau.KEPT in later.copy_bandwidth_source
    # a committed profile's given source, reworded by hand to say which copy it was, is still a given one
    reworded = "given with --copy-gbps: the 256 MiB device-to-device copy measured on an H200 on 2026-11-25"
    thresholds.write_profile(Profile(**{**written.__dict__, "copy_bandwidth_source": reworded}), profiles)
    kept = thresholds.read_profile(tau.calibrate(results, small=SMALL, large=LARGE, profiles_dir=profiles).path)
    assert kept.copy_bandwidth_gbps == pytest.approx(achieved * 0.8) and kept.copy_bandwidth_source.startswith(reworded)
    for bad in (0.0, -5.0, math.inf, math.nan):
        with pytest.raises(SdbenchError, match="--copy-gbps"):
            tau.calibrate(results, small=SMALL, large=LARGE, write=False, copy_gbps=bad)


def test_a_given_copy_ceiling_wins_over_measuring_here(tmp_path, monkeypatch):
    """On a GPU of the results' kind calibrate-tau measures the copy itself, unless one is given."""
    import torch

    results = [_write(tmp_path, PLANTED)]
    name = thresholds.read_profile(tau.calibrate(results, small=SMALL, large=LARGE,
                                                 profiles_dir=tmp_path / "p").path).gpu_name
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: name)
    runs = iter([1100.0, 1234.0, 1200.0])  # the ceiling is the best of its runs, not the first or the median
    monkeypatch.setattr(tau, "measure_copy_bandwidth_gbps", lambda *args, **kwargs: next(runs))
    here = tau.calibrate(results, small=SMALL, large=LARGE, write=False).profile
    assert here.copy_bandwidth_gbps == 1234.0 and here.copy_bandwidth_source.startswith("cuda events")
    given = tau.calibrate(results, small=SMALL, large=LARGE, write=False, copy_gbps=2828.5).profile
    assert given.copy_bandwidth_gbps == 2828.5 and given.copy_bandwidth_source.startswith(tau.GIVEN_COPY)


def test_cli_takes_a_copy_ceiling_and_says_when_it_has_none(tmp_path, monkeypatch):
    monkeypatch.setattr(tau, "measure_copy_bandwidth_gbps", lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("no GPU")))
    path = _write(tmp_path, PLANTED)
    base = ["calibrate-tau", str(path), "--small", SMALL, "--large", LARGE, "--profiles"]
    result = runner.invoke(app, [*base, str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "--copy-gbps" in result.output  # the best achieved stood in: the CLI says so
    result = runner.invoke(app, [*base, str(tmp_path / "b"), "--copy-gbps", "2828.5"])
    assert result.exit_code == 0, result.output
    assert "--copy-gbps" not in result.output
    assert thresholds.read_profile(tmp_path / "b" / "nvidia-h100-80gb-hbm3.toml").copy_bandwidth_gbps == 2828.5


def test_cli_prints_the_rule_and_writes(tmp_path):
    path = _write(tmp_path, PLANTED)
    result = runner.invoke(app, ["calibrate-tau", str(path), "--small", SMALL, "--large", LARGE, "--profiles", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert "accepted KV bytes < τ = 3." in result.output.replace("\n", " ")
    assert (tmp_path / "p" / "nvidia-h100-80gb-hbm3.toml").is_file()


def test_cli_names_any_pair_and_explains_a_missing_one(tmp_path):
    models = {("verify_pack", "fused"): lambda c, v: 10.0, ("verify_pack", LARGE): PLANTED[("verify_pack", LARGE)]}
    path = _write(tmp_path, models)
    result = runner.invoke(app, ["calibrate-tau", str(path), "--small", "fused", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "no crossover in measured range; τ = ∞" in result.output
    result = runner.invoke(app, ["calibrate-tau", str(path), "--large", LARGE, "--dry-run"])
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
        tau.calibrate([path], small=SMALL, write=False)
    assert tau.calibrate([path], small=SMALL, gpu_name="NVIDIA L40S", write=False).profile.gpu_cc == "8.9"


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

    def fake_sweep(out_dir, impls, device="cuda", progress=None, grid=None):
        assert (Path(out_dir), list(impls), grid) == (tmp_path / "sweep", [SMALL, LARGE], sweep.CALIBRATION_GRID)
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



def _fewest_by_brute_force(loss, budget):
    """(fewest segments within budget, the least loss with that many) over every assignment of impls to groups."""
    import itertools

    least = {}
    for assignment in itertools.product(range(loss.shape[1]), repeat=loss.shape[0]):
        count = 1 + sum(a != b for a, b in zip(assignment, assignment[1:], strict=False))
        least[count] = min(least.get(count, math.inf), sum(loss[g, i] for g, i in enumerate(assignment)))
    count = min(count for count, value in least.items() if value <= budget + 1e-9)
    return count, least[count]


@pytest.mark.parametrize("seed", range(25))
def test_fewest_segments_is_exact(seed):
    rng = np.random.default_rng(seed)
    loss = rng.exponential(size=(7, 3)) * (rng.random((7, 3)) < 0.6)  # ties (zeros) included
    budget = loss.min(axis=1).sum() + rng.uniform(0.0, 2.0)
    plan, least_by_count = thresholds.fewest_segments(loss, loss, budget)
    count, least = _fewest_by_brute_force(loss, budget)
    assert len(plan) == count and least_by_count[count - 1] == pytest.approx(least)
    assert sum(loss[start:end, impl].sum() for start, end, impl in plan) == pytest.approx(least)
    assert [start for start, _, _ in plan] == [0] + [end for _, end, _ in plan[:-1]] and plan[-1][1] == 7
    assert all(left[2] != right[2] for left, right in zip(plan, plan[1:], strict=False))

# --- the per-size race ------------------------------------------------------------------------------
# Accepted KV = b · (0.5 · γ) · kv_dim · 2 = b · γ · kv_dim over this grid: 16 configs, 12 distinct sizes from
# 1 KB to 134 MB (16 KB, 131 KB, 1.05 MB and 8.39 MB twice).
RACE_GRID = dict(batch_sizes=(1, 8, 64, 512), gammas=(8, 128), alphas=(0.5,), kv_dims=(128, 2048))
RACE_BYTES = sorted(b * g * d for b in (1, 8, 64, 512) for g in (8, 128) for d in (128, 2048))
CANDIDATES = ("fused", "fused_scan", "ballot+pack_cuda", "ballot+pack_scan")


def _planted(winner_at, fast=10.0, slow=12.0, overrides=None):
    """Every candidate takes `slow` µs except the winner at that size (`fast`); overrides[(impl, range)] wins."""
    def model(impl):
        def median(config, view):
            for (name, low, high), value in (overrides or {}).items():
                if name == impl and low <= config["kv_bytes"] < high:
                    return value
            return fast if winner_at(config["kv_bytes"]) == impl else slow
        return median
    return {("verify_pack", impl): model(impl) for impl in CANDIDATES}


def _race(tmp_path, models, noise=0.002, **options):
    rows = synthetic_results.make_rows(models, noise=noise, **RACE_GRID)
    path = synthetic_results.write(tmp_path / "race.parquet", rows)
    return tau.calibrate([path], write=False, **options)


def _gap_midpoint(bound):
    """The geometric middle of the measured gap around bound (a constant ratio crosses zero there)."""
    below, above = max(x for x in RACE_BYTES if x < bound), min(x for x in RACE_BYTES if x > bound)
    return math.sqrt(below * above)


def test_race_finds_two_planted_segments_at_the_crossover(tmp_path):
    """fused: 5 µs + one SM's copy; fused_scan: 8 µs + the whole GPU's; they cross at 3 / (1/1e5 - 1/2e6) B."""
    crossover = 3 / (1 / 1e5 - 1 / 2e6)  # 316 KB
    models = {("verify_pack", "fused"): lambda c, v: 5.0 + c["kv_bytes"] / 1e5,
              ("verify_pack", "fused_scan"): lambda c, v: 8.0 + c["kv_bytes"] / 2e6,
              ("verify_pack", "ballot+pack_cuda"): lambda c, v: 20.0 + c["kv_bytes"] / 2e6,
              ("verify_pack", "ballot+pack_scan"): lambda c, v: 21.0 + c["kv_bytes"] / 2e6}
    fit = _race(tmp_path, models).fit
    assert [segment.impl for segment in fit.segments] == ["fused", "fused_scan"]
    cut = fit.segments[0].high_bytes
    assert max(x for x in RACE_BYTES if x < crossover) < cut < min(x for x in RACE_BYTES if x > crossover)
    assert fit.segments[0].low_bytes == 0 and fit.segments[1].low_bytes == cut and math.isinf(fit.segments[1].high_bytes)
    assert fit.misclassified == 0 and fit.geomean_loss == pytest.approx(0.0, abs=1e-12)


def test_race_finds_three_planted_segments(tmp_path):
    winner = lambda kv: "fused" if kv < 1e5 else "ballot+pack_cuda" if kv < 3e6 else "fused_scan"  # noqa: E731
    fit = _race(tmp_path, _planted(winner)).fit
    assert [(s.impl, len(s.points), s.wins) for s in fit.segments] == [
        ("fused", 5, 5), ("ballot+pack_cuda", 7, 7), ("fused_scan", 4, 4)]
    assert [s.high_bytes for s in fit.segments[:2]] == pytest.approx([_gap_midpoint(1e5), _gap_midpoint(3e6)])
    assert all(segment.worst.ratio(segment.impl) == pytest.approx(1.0) for segment in fit.segments)
    assert "3 segments" in fit.message() and "0 of 16 configs misclassified" in fit.message()


@pytest.mark.parametrize("tolerance", [0.0, 0.01, 0.5])
def test_one_winner_everywhere_is_one_segment(tmp_path, tolerance):
    """No made-up crossover, even with no tolerance: fused_scan wins everywhere, by 1% to 2x."""
    models = {("verify_pack", "fused_scan"): lambda c, v: 10.0,
              ("verify_pack", "fused"): lambda c, v: 10.1 + c["kv_bytes"] / 1e6,
              ("verify_pack", "ballot+pack_cuda"): lambda c, v: 20.0,
              ("verify_pack", "ballot+pack_scan"): lambda c, v: 11.0}
    fit = _race(tmp_path, models, tolerance=tolerance).fit
    assert [(s.impl, s.low_bytes, s.high_bytes) for s in fit.segments] == [("fused_scan", 0.0, math.inf)]
    assert fit.message().startswith("no crossover in measured range: fused_scan is the better choice at every")


# fused wins by 1.5x everywhere but between 100 KB and 3 MB, where ballot+pack_cuda is 5% faster (7 configs).
NARROW = _planted(lambda kv: "fused", fast=10.0, slow=15.0,
                  overrides={("ballot+pack_cuda", 1e5, 3e6): 10.0, ("fused", 1e5, 3e6): 10.5})


def test_a_real_narrow_win_is_its_own_segment(tmp_path):
    """Measured tightly (0.2% noise), 5% on 7 of 16 configs is worth a segment at 1% tolerance."""
    fit = _race(tmp_path, NARROW, noise=0.002).fit
    assert [segment.impl for segment in fit.segments] == ["fused", "ballot+pack_cuda", "fused"]


def test_a_noise_level_difference_merges(tmp_path):
    """The same 5% under 30% sample noise (~6% standard error per median) is a tie: one segment, fused,
    whose cost the report still shows (worst +5%)."""
    fit = _race(tmp_path, NARROW, noise=0.3).fit
    assert [segment.impl for segment in fit.segments] == ["fused"]
    only = fit.segments[0]
    assert (only.wins, only.ties) == (9, 7)
    assert only.worst.ratio("fused") == pytest.approx(1.05)
    assert fit.misclassified == 7 and fit.within_noise == 7


def test_the_noise_column_stands_in_for_missing_samples(tmp_path):
    rows = synthetic_results.make_rows(NARROW, noise=0.002, **RACE_GRID)
    for row in rows:
        row.update(samples_us=[], noise=0.06)
    fit = tau.calibrate([synthetic_results.write(tmp_path / "r.parquet", rows)], write=False).fit
    assert [segment.impl for segment in fit.segments] == ["fused"]


def test_copies_of_a_workload_count_once_and_their_spread_is_the_noise():
    """sweep --placements: a config's rows that are copies give the median of their medians (not of their pooled
    samples) and a noise that holds the spread between them; the same rows as plain repeats pool their samples."""
    rng = np.random.default_rng(2)
    rows = [row for row in synthetic_results.make_rows(NARROW, **RACE_GRID) if row["view"] == "graph"]
    timed = [row for row in rows if row["impl"] != "launch_floor"]
    at_config = [row for row in timed if row["batch_size"] == timed[0]["batch_size"]
                 and row["gamma"] == timed[0]["gamma"] and row["kv_dim"] == timed[0]["kv_dim"]]
    fused = next(row for row in at_config if row["impl"] == "fused")
    copies = []
    for copy, (center, count) in enumerate(((10.0, 100), (10.3, 100), (11.0, 400))):
        samples = rng.normal(center, 0.01, count).tolist()
        copies.append({**fused, "placement": copy, "samples_us": samples, "median_us": float(np.median(samples))})
    others = [{**row, "placement": copy} for row in at_config if row["impl"] != "fused" for copy in range(3)]
    impls = tuple(sorted({row["impl"] for row in at_config}))
    (point,), _ = tau.race_points(copies + others, impls, "graph")
    assert point.median_us["fused"] == pytest.approx(10.3, abs=0.01)
    assert point.noise["fused"] > 0.01  # the copies' ~10% spread, not the samples' 0.1%
    (pooled,), _ = tau.race_points([{**row, "placement": None} for row in copies + others], impls, "graph")
    assert pooled.median_us["fused"] == pytest.approx(11.0, abs=0.01) and pooled.noise["fused"] < 0.002


def test_a_config_timed_again_on_copies_is_raced_from_the_copies_only(tmp_path):
    """A plain race sweep, then one config again on three copies (sweep --placements, same settings otherwise) in
    the same results: the race has one point a config, and that config's fused time is the copies'."""
    rows = [{**row, "settings": "warmup=5 iters=40"} for row in synthetic_results.make_rows(NARROW, **RACE_GRID)]
    first = next(row for row in rows if row["impl"] == "fused")
    again = [{**row, "settings": "warmup=5 iters=40 placements=3", "placement": copy, "run_id": "b",
              "median_us": row["median_us"] * (3.0 if row["impl"] == "fused" else 1.0),
              "samples_us": [value * (3.0 if row["impl"] == "fused" else 1.0) for value in row["samples_us"]]}
             for row in rows if results.config_key(row) == results.config_key(first) for copy in range(3)]
    folder = tmp_path / "results"
    synthetic_results.write(folder / "part-a.parquet", rows)
    synthetic_results.write(folder / "part-b.parquet", again)
    result = tau.calibrate([folder], write=False, view=first["view"])
    alone = tau.calibrate([folder / "part-a.parquet"], write=False, view=first["view"])
    assert result.superseded == 1 and alone.superseded == 0
    assert len(result.fit.points) == len(alone.fit.points)
    moved = [(a, b) for a, b in zip(result.fit.points, alone.fit.points, strict=True)
             if a.median_us["fused"] != pytest.approx(b.median_us["fused"])]
    assert len(moved) == 1 and moved[0][0].median_us["fused"] == pytest.approx(3.0 * moved[0][1].median_us["fused"])


def test_the_tau_band_holds_the_spread_between_copies():
    """The small implementation timed on three copies that differ by ±5% near a planted crossing: τ's band is wider
    than when the same samples are pooled into one array (the copies resampled, not only their samples)."""
    rng = np.random.default_rng(8)
    kv = [2.0 ** power for power in range(10, 30)]
    small_us = [3.0 + size / 90.0e3 for size in kv]
    large_us = [8.0 + size / 2.5e6 for size in kv]
    spread, pooled_points = [], []
    for size, small, large in zip(kv, small_us, large_us, strict=True):
        small_copies = [rng.normal(small * factor, small * 0.001, 50) for factor in (0.95, 1.0, 1.05)]
        large_samples = [rng.normal(large, large * 0.001, 50)]
        spread.append(tau.PairPoint((size,), size, small, large, small_copies, large_samples))
        pooled_points.append(tau.PairPoint((size,), size, small, large, [np.concatenate(small_copies)], large_samples))
    with_copies, pooled = tau.fit_tau(spread, SMALL, LARGE), tau.fit_tau(pooled_points, SMALL, LARGE)
    assert with_copies.tau_bytes == pooled.tau_bytes
    assert with_copies.high_bytes / with_copies.low_bytes > pooled.high_bytes / pooled.low_bytes


def test_tolerance_buys_fewer_segments_at_a_reported_cost(tmp_path):
    """At 5% tolerance the 5% narrow win (1.5% of the geometric mean) is merged away, and the report says what
    that costs: exp(7/16 · log 1.05) - 1."""
    fit = _race(tmp_path, NARROW, noise=0.002, tolerance=0.05).fit
    assert [segment.impl for segment in fit.segments] == ["fused"]
    assert fit.geomean_loss == pytest.approx(1.05 ** (7 / 16) - 1, rel=1e-9)
    assert fit.total_loss == pytest.approx(7 * 0.5 / (16 * 10.0), rel=1e-9)


def test_fused_against_the_best_sync_free_two_step(tmp_path):
    """fused 10 vs 12 below 100 KB (0.83x), 12 vs 10 to 3 MB (1.2x, 7 configs), 12 vs 12 above (1.0x)."""
    winner = lambda kv: "fused" if kv < 1e5 else "ballot+pack_cuda" if kv < 3e6 else "fused_scan"  # noqa: E731
    fused = _race(tmp_path, _planted(winner)).fused
    assert len(fused.rows) == 16 and fused.within == 5 + 4
    point, two_step, ratio = fused.worst
    assert ratio == pytest.approx(1.2) and two_step == "ballot+pack_cuda" and 1e5 <= point.kv_bytes < 3e6
    assert fused.message().startswith("fused ≤ 1.03 × the best sync-free two-step at 9 of 16 configs; worst 1.20x")


def test_the_syncing_two_step_is_not_a_sync_free_one():
    assert tau.sync_free_two_steps(("fused", "ballot+pack_torch", "ballot+pack_cuda", "ballot+pack_scan")) == [
        "ballot+pack_cuda", "ballot+pack_scan"]


def test_race_cli_prints_the_tables_writes_the_profile_and_the_dispatcher_follows_it(tmp_path):
    from sdbench import dispatch

    winner = lambda kv: "fused" if kv < 1e5 else "ballot+pack_cuda" if kv < 3e6 else "fused_scan"  # noqa: E731
    path = synthetic_results.write(tmp_path / "race.parquet", synthetic_results.make_rows(
        _planted(winner), noise=0.002, **RACE_GRID))
    result = CliRunner(env={"COLUMNS": "250"}).invoke(
        app, ["calibrate-tau", str(path), "--view", "graph", "--profiles", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "fused ÷ best two-step" in output and "│ ballot+pack_cuda │ ballot+pack_cuda │ 1.20 │" in output
    assert "[92.7 KB, 4.19 MB) │ ballot+pack_cuda │ 7 │ 7" in output
    assert "fused ≤ 1.03 × the best sync-free two-step at 9 of 16 configs" in output
    assert "accepted KV bytes < 92.7 KB -> fused, < 4.19 MB -> ballot+pack_cuda, else fused_scan" in output
    profile = thresholds.read_profile(tmp_path / "p" / "nvidia-h100-80gb-hbm3.toml")
    assert profile.segment_impls == ["fused", "ballot+pack_cuda", "fused_scan"] and profile.view == "graph"
    assert profile.candidates == list(CANDIDATES) and profile.configs == 16 and profile.misclassified == 0
    for kv_bytes in RACE_BYTES:  # b · γ · kv_dim · elem with b = γ = 1, α = 1 and 1-byte elements
        assert dispatch.decide(1, 1, kv_bytes, 1, 1.0, profile).impl == winner(kv_bytes)


def test_race_takes_the_candidates_the_results_hold_and_names_the_rest(tmp_path):
    models = {key: value for key, value in NARROW.items() if key[1] != "ballot+pack_scan"}
    fit = _race(tmp_path, models).fit
    assert fit.impls == ("fused", "fused_scan", "ballot+pack_cuda") and fit.absent == ("ballot+pack_scan",)


def test_race_needs_two_measured_candidates(tmp_path):
    result = runner.invoke(app, ["calibrate-tau", str(_write(tmp_path, PLANTED)), "--dry-run"])
    assert result.exit_code == 2
    assert "the per-size race needs two or more" in result.output and "--small/--large" in result.output
    result = runner.invoke(app, ["calibrate-tau", str(_write(tmp_path, PLANTED)), "--impls", "fused,fused_scan",
                                 "--dry-run"])
    assert result.exit_code == 2 and "--impls fused, fused_scan not measured" in " ".join(result.output.split())


def test_race_over_any_named_set_including_the_study_pair(tmp_path):
    """--impls races any set: the study's pair as two segments at the planted τ."""
    fit = tau.calibrate([_write(tmp_path, PLANTED)], impls=[SMALL, LARGE], write=False).fit
    assert [segment.impl for segment in fit.segments] == [SMALL, LARGE]
    grid = sorted({point.kv_bytes for point in fit.points})
    assert max(x for x in grid if x < PLANTED_TAU_WALL) < fit.segments[0].high_bytes < min(
        x for x in grid if x > PLANTED_TAU_WALL)


def test_race_and_pair_options_exclude_each_other(tmp_path):
    with pytest.raises(SdbenchError, match="either --impls"):
        tau.calibrate([_write(tmp_path, PLANTED)], impls=["fused"], small=SMALL, write=False)


def test_without_results_the_race_sweeps_its_candidates_over_larger_batches(tmp_path, monkeypatch):
    from sdbench.commands import sweep

    swept = tmp_path / "sweep" / "run-1"
    seen = {}

    def fake_sweep(out_dir, impls, device="cuda", progress=None, grid=None):
        seen.update(impls=list(impls), grid=grid)
        synthetic_results.write(swept / "part-0.parquet", synthetic_results.make_rows(NARROW, **RACE_GRID))
        return swept

    monkeypatch.setattr(sweep, "run_calibration_sweep", fake_sweep)
    result = runner.invoke(app, ["calibrate-tau", "--sweep-out", str(tmp_path / "sweep"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert seen["impls"] == list(CANDIDATES) and max(seen["grid"]["batch_sizes"]) > 32


def test_the_race_says_what_fewer_segments_would_cost(tmp_path):
    """NARROW, tightly measured: one segment loses 5% on 7 of 16 configs, three lose nothing."""
    fit = _race(tmp_path, NARROW, noise=0.002).fit
    assert fit.loss_by_count == pytest.approx([1.05 ** (7 / 16) - 1, 1.05 ** (7 / 16) - 1, 0.0], abs=1e-12)


def test_winners_that_follow_the_batch_not_the_bytes_are_flagged(tmp_path):
    """fused wins at b = 1 and 64, fused_scan at b = 8 and 512: along the bytes they interleave."""
    def winning_at(batch_sizes):
        return lambda c, v: 10.0 if c["batch_size"] in batch_sizes else 13.0

    models = {("verify_pack", impl): winning_at(wins) for impl, wins in (
        ("fused", (1, 64)), ("fused_scan", (8, 512)), ("ballot+pack_cuda", ()), ("ballot+pack_scan", ()))}
    fit = _race(tmp_path, models).fit
    impls = [segment.impl for segment in fit.segments]
    assert len(impls) > 3 and set(impls) == {"fused", "fused_scan"}
    assert "fused, fused_scan hold several segments: the winners interleave along accepted KV" in fit.message()
    assert "several segments" not in _race(tmp_path, NARROW, noise=0.3).fit.message()
