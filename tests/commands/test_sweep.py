"""The sweep on the CPU: grids and presets, exact shards, interrupt + resume, parquet rows, CLI errors."""

import gc
import weakref
from collections import Counter

import pytest
import torch
from typer.testing import CliRunner

from sdbench import registry
from sdbench.cli import app
from sdbench.commands import sweep
from sdbench.errors import SdbenchError
from sdbench.measure import results
from sdbench.ops.workload import VerifyConfig

# Tiny iteration counts: these tests check bookkeeping, not speed.
FAST = {"device": "cpu", "warmup": 1, "iters": 3}


def _spec(tmp_path, **changes):
    return sweep.build_spec(**{"batch_sizes": [1, 4], "gammas": [8, 33], "alphas": [0.3, 0.9],
                               "impls": ["torch_eager"], "out_dir": tmp_path, **FAST, **changes})


def _keys(folder):
    return [results.config_key(row) for row in results.read_rows(folder) if row["impl"] == "torch_eager"]


# --- grids -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("preset", "size", "op"), [
    ("main", 36, "verify"), ("gamma-sensitivity", 12, "verify"), ("fused", 32, "verify_pack"), ("quick", 8, "verify"),
    ("scale", 40, "verify"), ("scale-kv", 256, "verify_pack"), ("scale-pack", 256, "pack"),
])
def test_presets(preset, size, op):
    spec = sweep.build_spec(preset)
    assert spec.op == op and len(sweep.grid(spec)) == size


def test_defaults_are_the_main_grid():
    assert sweep.grid(sweep.SweepSpec()) == sweep.grid(sweep.build_spec("main"))
    assert max(sweep.build_spec("scale").batch_sizes) == 4096 and max(sweep.build_spec("scale").gammas) == 1024


def test_options_override_a_preset():
    spec = sweep.build_spec("fused", gammas=[4], kv_dims=None)
    assert spec.gammas == (4,) and spec.kv_dims == (128, 512, 1024, 2048) and spec.op == "verify_pack"


def test_kv_ops_default_to_the_published_kv_widths():
    assert {cfg.kv_dim for cfg in sweep.grid(sweep.build_spec(op="pack"))} == {128, 512, 1024, 2048}
    assert {cfg.kv_dim for cfg in sweep.grid(sweep.SweepSpec())} == {0}


def test_seed_does_not_depend_on_grid_position():
    assert {cfg.seed for cfg in sweep.grid(sweep.build_spec("main", seed=7))} == {7}


@pytest.mark.parametrize("count", [1, 2, 3, 5, 7, 36, 40])
def test_shards_partition_the_grid_exactly(count):
    configs = sweep.grid(sweep.SweepSpec())
    shards = [sweep.shard(configs, index, count) for index in range(count)]
    flat = [cfg for part in shards for cfg in part]
    assert sorted(flat, key=repr) == sorted(configs, key=repr)
    assert len(flat) == len(set(flat)) == len(configs)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize(("text", "expected"), [("0/1", (0, 1)), ("3/4", (3, 4)), (" 1/2", (1, 2))])
def test_parse_shard(text, expected):
    assert sweep.parse_shard(text) == expected


@pytest.mark.parametrize("text", ["4/4", "-1/4", "1/0", "x", "1", "1/2/3", "a/b"])
def test_parse_shard_rejects(text):
    with pytest.raises(SdbenchError, match="--shard"):
        sweep.parse_shard(text)


# --- running -----------------------------------------------------------------------------------
def test_cpu_sweep_writes_one_row_per_config_impl_and_view(tmp_path):
    summary = sweep.run_sweep(_spec(tmp_path, impls=()))
    assert summary.measured == 8 and not summary.interrupted and len(summary.parts) == 8
    rows = results.read_rows(tmp_path)
    counts = Counter((results.config_key(row), row["impl"], row["view"]) for row in rows)
    assert set(counts.values()) == {1}
    impls = {row["impl"] for row in rows}
    assert {"torch_eager", "torch_compile", "launch_floor"} <= impls
    for row in rows:
        assert row["view"] == "cpu" and row["device"] == "cpu" and row["run_id"] == summary.run_id
        assert row["torch_version"] == torch.__version__ and row["gpu_name"] is None
        if row["impl"] == "torch_eager":
            assert row["status"] == "ok" and len(row["samples_us"]) == 3 and row["median_us"] > 0
            assert row["is_peer"] and row["mean_accepted_length"] is not None
        elif row["impl"] == "torch_compile":
            assert row["status"] == "unavailable" and "CUDA" in row["reason"]
        elif row["impl"] == "launch_floor":
            assert row["status"] == "unavailable" and row["median_us"] is None
    assert summary.median_of_medians("torch_eager", "cpu") > 0
    assert summary.statuses["torch_eager"] == {"ok": 8}


def test_placements_time_every_copy_in_memory_of_its_own_and_the_report_pools_them(tmp_path, monkeypatch):
    """--placements 3: three copies of the config's workload, each checked and timed with its floor; while a copy is
    built every earlier copy's inputs and prepared run (which holds its outputs) are alive, so it cannot be handed their
    memory, and all are freed once the config is done. One part, one config key, rows saying their copy; the report
    reads them as one config, the median of the copies' medians."""
    refs, alive_at_build = [], []
    real_make, real_ready = sweep.make_workload, sweep._ready

    def recording_make(op, cfg, device):
        alive_at_build.append([ref() is not None for ref in refs])
        workload = real_make(op, cfg, device)
        refs.append(weakref.ref(workload))
        return workload

    def recording_ready(impl, workload, timed_workload, device):
        status, reason, run = real_ready(impl, workload, timed_workload, device)
        if run is not None:
            refs.append(weakref.ref(run))
        return status, reason, run

    monkeypatch.setattr(sweep, "make_workload", recording_make)
    monkeypatch.setattr(sweep, "_ready", recording_ready)
    spec = _spec(tmp_path, op="verify_pack", kv_dims=[64], impls=["torch_eager"], batch_sizes=[64], gammas=[16],
                 alphas=[0.6], placements=3)
    summary = sweep.run_sweep(spec)
    assert summary.measured == 1 and len(summary.parts) == 1 and summary.statuses["torch_eager"] == {"ok": 1}
    assert alive_at_build == [[], [True, True], [True, True, True, True]]  # (a workload, then its prepared run)
    gc.collect()
    assert not any(ref() is not None for ref in refs)  # freed with the config
    rows = results.read_rows(tmp_path)
    assert len({results.config_key(row) for row in rows}) == 1 and rows[0]["settings"].endswith(" placements=3")
    for impl in ("torch_eager", "launch_floor"):
        assert sorted(row["placement"] for row in rows if row["impl"] == impl) == [0, 1, 2]
    eager = sorted(row["median_us"] for row in rows if row["impl"] == "torch_eager" and row["status"] == "ok")
    assert len(eager) == 3 and summary.median_of_medians("torch_eager", "cpu") == pytest.approx(eager[1])
    from sdbench.commands import report

    built = report.build_report([tmp_path])
    (cell,) = [cell for cell in built.cells if cell.impl == "torch_eager"]
    assert cell.median("cpu") == pytest.approx(eager[1])
    assert any(note.startswith("1 config timed on 3 copies of the workload each") for note in built.notes), built.notes
    one = sweep.run_sweep(_spec(tmp_path / "one", op="verify_pack", kv_dims=[64], impls=["torch_eager"],
                                batch_sizes=[64], gammas=[16], alphas=[0.6]))
    assert one.measured == 1 and {row["placement"] for row in results.read_rows(tmp_path / "one")} == {None}


def test_a_status_every_copy_shares_counts_once_per_config(tmp_path):
    """torch_compile is unavailable on the CPU on every copy: counted once for each of the two configs, not once a
    copy; the launch floor likewise."""
    summary = sweep.run_sweep(_spec(tmp_path, impls=["torch_eager", "torch_compile"], batch_sizes=[4], gammas=[8],
                                    alphas=[0.3, 0.9], placements=3))
    assert summary.statuses["torch_compile"] == {"unavailable": 2}
    assert summary.statuses["launch_floor"] == {"unavailable": 2} and summary.statuses["torch_eager"] == {"ok": 2}


def test_a_copy_that_cannot_be_built_is_an_error_and_no_later_copy_is_tried(tmp_path, monkeypatch):
    calls = []
    real = sweep.make_workload

    def second_fails(op, cfg, device):
        calls.append(cfg)
        if len(calls) == 2:
            raise MemoryError("no room for a second copy")
        return real(op, cfg, device)

    monkeypatch.setattr(sweep, "make_workload", second_fails)
    summary = sweep.run_sweep(_spec(tmp_path, batch_sizes=[4], gammas=[8], alphas=[0.5], placements=3))
    assert len(calls) == 2 and summary.statuses["torch_eager"] == {"ok": 1, "error": 1}
    eager = {row["placement"]: row for row in results.read_rows(tmp_path) if row["impl"] == "torch_eager"}
    assert set(eager) == {0, 1} and eager[0]["status"] == "ok" and eager[1]["status"] == "error"
    assert eager[1]["reason"] == "copy 1 of 3: building the workload raised MemoryError: no room for a second copy"


@pytest.mark.parametrize("placements", [0, -1])
def test_placements_below_one_are_refused(tmp_path, placements):
    with pytest.raises(SdbenchError, match="--placements must be >= 1"):
        sweep.validate(_spec(tmp_path, placements=placements))


def test_realised_acceptance_and_kv_bytes_are_recorded(tmp_path):
    spec = _spec(tmp_path, op="verify_pack", kv_dims=[8], batch_sizes=[5], gammas=[16], alphas=[0.6])
    sweep.run_sweep(spec)
    (row,) = [r for r in results.read_rows(tmp_path) if r["impl"] == "torch_eager"]
    from sdbench.ops.workload import make_verify_workload

    workload = make_verify_workload(sweep.grid(spec)[0], "cpu")
    accepted = int(workload.accepted_lengths.sum())
    assert row["mean_accepted_length"] == pytest.approx(accepted / 5)
    assert row["accepted_kv_bytes"] == accepted * 8 * 2  # float16
    assert row["bytes_moved"] == 2 * row["accepted_kv_bytes"]
    assert row["achieved_gbps"] == pytest.approx(row["bytes_moved"] / (row["median_us"] * 1e3))
    assert row["syncs"] is True


def test_interrupted_sweep_keeps_its_parts_and_resume_completes_it(tmp_path):
    stop_after = 3

    def interrupt(update: sweep.SweepProgress):
        if update.done == stop_after and update.current is None:
            raise KeyboardInterrupt

    first = sweep.run_sweep(_spec(tmp_path, run_id="first"), progress=interrupt)
    assert first.interrupted and first.measured == stop_after and first.remaining == 5
    assert len(list(tmp_path.glob("part-*.parquet"))) == stop_after
    assert not list(tmp_path.glob("*.tmp"))

    second = sweep.run_sweep(_spec(tmp_path, run_id="second", resume=True))
    assert not second.interrupted and second.skipped == stop_after and second.measured == 5
    keys = _keys(tmp_path)
    assert len(keys) == len(set(keys)) == 8

    third = sweep.run_sweep(_spec(tmp_path, resume=True))
    assert third.measured == 0 and third.skipped == 8
    assert len(_keys(tmp_path)) == 8


def test_shards_into_one_folder_cover_the_grid_once(tmp_path):
    for index in range(3):
        sweep.run_sweep(_spec(tmp_path, shard_index=index, shard_count=3, run_id="sharded"))
    keys = _keys(tmp_path)
    assert len(keys) == len(set(keys)) == 8
    assert {row["run_id"] for row in results.read_rows(tmp_path)} == {"sharded"}


def test_failed_parity_is_recorded_and_not_timed(tmp_path, monkeypatch):
    def wrong(w):
        return lambda: {"accepted_lengths": w.accepted_lengths + 1}

    impl = registry.Implementation(op="verify", name="off_by_one", backend="torch", description="",
                                   devices=("cpu",), prepare=wrong)
    monkeypatch.setitem(registry._REGISTRY, impl.key, impl)
    sweep.run_sweep(_spec(tmp_path, impls=["off_by_one", "torch_eager"], batch_sizes=[4], gammas=[8], alphas=[0.9]))
    by_impl = {row["impl"]: row for row in results.read_rows(tmp_path)}
    assert by_impl["off_by_one"]["status"] == "failed" and "accepted_lengths" in by_impl["off_by_one"]["reason"]
    assert by_impl["off_by_one"]["samples_us"] == [] and by_impl["off_by_one"]["median_us"] is None
    assert by_impl["torch_eager"]["status"] == "ok"


def test_parity_out_of_device_memory_is_an_error_not_a_failure(tmp_path, monkeypatch):
    """Seen on the H100 at b = 65,536: the check's reference and poisoned outputs did not fit beside a 16 GiB
    workload. A `failed` row would say the kernel disagreed with the reference."""
    real_check = sweep.parity.check

    def check(impl, workload):
        if impl.name == "too_big":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")
        return real_check(impl, workload)

    impl = registry.Implementation(op="verify", name="too_big", backend="torch", description="", devices=("cpu",),
                                   prepare=lambda w: lambda: {"accepted_lengths": w.accepted_lengths.clone()})
    monkeypatch.setitem(registry._REGISTRY, impl.key, impl)
    monkeypatch.setattr(sweep.parity, "check", check)
    sweep.run_sweep(_spec(tmp_path, impls=["too_big", "torch_eager"], batch_sizes=[4], gammas=[8], alphas=[0.9]))
    by_impl = {row["impl"]: row for row in results.read_rows(tmp_path)}
    assert by_impl["too_big"]["status"] == "error", by_impl["too_big"]
    assert "out of device memory" in by_impl["too_big"]["reason"] and "16.00 GiB" in by_impl["too_big"]["reason"]
    assert by_impl["torch_eager"]["status"] == "ok"


def test_prob_verify_without_implementations_is_a_clean_error(monkeypatch):
    original = registry.implementations
    monkeypatch.setattr(registry, "implementations", lambda op=None: [] if op == "prob_verify" else original(op))
    with pytest.raises(SdbenchError, match="prob_verify"):
        sweep.check_op_available("prob_verify")


def test_prob_verify_without_workloads_is_a_clean_error(monkeypatch):
    fake = registry.Implementation(op="prob_verify", name="fake", backend="torch", description="",
                                   devices=("cpu",), prepare=lambda w: None)
    monkeypatch.setattr(registry, "implementations", lambda op=None: [fake])

    def not_yet(op, cfg, device):
        raise SdbenchError("prob_verify workloads are not implemented yet")

    monkeypatch.setattr(sweep, "make_workload", not_yet)
    with pytest.raises(SdbenchError, match="cannot be swept here yet"):
        sweep.check_op_available("prob_verify")


def test_prob_verify_grid_sweeps_vocab_and_prob_dtype():
    spec = sweep.build_spec(op="prob_verify", vocab_sizes=[32000, 128256], prob_dtypes=["float32", "bfloat16"],
                            batch_sizes=[32], gammas=[8], alphas=[0.5])
    configs = sweep.grid(spec)
    assert {(c.vocab_size, c.prob_dtype) for c in configs} == {
        (32000, "float32"), (32000, "bfloat16"), (128256, "float32"), (128256, "bfloat16"),
    }
    assert sweep.config_columns("prob_verify", "cuda", configs[1], sweep.timing.TimingOptions())["kv_dtype"] == configs[1].prob_dtype


@pytest.mark.parametrize(("changes", "message"), [
    ({"op": "verfy"}, "did you mean 'verify'"),
    ({"kv_dims": [128]}, "moves no KV"),
    ({"op": "pack", "kv_dims": [0]}, "kv_dim must be >= 1"),
    ({"dist": "fixed"}, "--dist"),
    ({"impls": ["torch_eagr"]}, "did you mean 'torch_eager'"),
    ({"gammas": [0]}, "gamma"),
    ({"alphas": [1.5]}, "alpha"),
    ({"iters": 0}, "--iters"),
    ({"device": "tpu"}, "--device"),
])
def test_bad_specs_are_refused_before_anything_runs(tmp_path, changes, message):
    with pytest.raises(SdbenchError, match=message):
        sweep.run_sweep(_spec(tmp_path, **changes))
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_unknown_preset_suggests():
    with pytest.raises(SdbenchError, match="did you mean 'gamma-sensitivity'"):
        sweep.build_spec("gamma-sensitvity")


def test_configs_are_validated_objects():
    assert all(isinstance(cfg, VerifyConfig) for cfg in sweep.grid(sweep.build_spec("quick")))


# --- the command line --------------------------------------------------------------------------
runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, ["sweep", *args])


@pytest.mark.parametrize(("args", "message"), [
    (["--gamma", "8,x"], "--gamma: 'x' is not an integer"),
    (["--gamma", "0"], "--gamma: 0 is below the minimum 1"),
    (["--b", "0,4"], "--b: 0 is below the minimum 1"),
    (["--alpha", "0.3,1.2"], "--alpha: 1.2 is outside [0.0, 1.0]"),
    (["--alpha", "-0.1"], "--alpha: -0.1 is outside"),
    (["--impl", "torch_eagr"], "did you mean 'torch_eager'"),
    (["--shard", "4/4"], "--shard"),
    (["--shard", "two/4"], "--shard"),
    (["--preset", "quik"], "did you mean 'quick'"),
    (["--op", "verify", "--kv-dim", "128"], "moves no KV"),
    (["--dist", "uniform"], "--dist"),
    (["--points", "4:8:0.3:64", "--b", "4"], "--points gives whole configs"),
    (["--points", "4:8"], "--points: '4:8' is not b:γ:α"),
    (["--points", "4:8:0.3:64"], "--points: verify moves no KV"),
    (["--op", "verify_pack", "--points", "4:8:0.3"], "--points: verify_pack moves draft KV"),
    (["--points", "0:8:0.3"], "batch size must be >= 1"),
])
def test_cli_errors_are_one_line_with_exit_code_2(tmp_path, args, message):
    result = _invoke(*args, "--device", "cpu", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cli_cuda_without_a_gpu_says_use_cpu(tmp_path):
    result = _invoke("--device", "cuda", "--out", str(tmp_path))
    assert result.exit_code == 2 and "--device cpu" in result.output


def test_cli_quick_sweep_on_cpu_writes_parquet_and_a_summary(tmp_path):
    out = tmp_path / "quick"
    result = _invoke("--preset", "quick", "--device", "cpu", "--warmup", "0", "--iters", "2", "--out", str(out),
                     "--impl", "torch_eager", "--run-id", "ci")
    assert result.exit_code == 0, result.output
    assert "torch_eager" in result.output and "cpu µs" in result.output
    rows = results.read_rows(out)
    assert {row["run_id"] for row in rows} == {"ci"}
    assert len({results.config_key(row) for row in rows}) == 8

    again = _invoke("--preset", "quick", "--device", "cpu", "--warmup", "0", "--iters", "2", "--out", str(out),
                    "--resume", "--impl", "torch_eager")
    assert again.exit_code == 0 and "8 already present" in " ".join(again.output.split())
    assert len(results.read_rows(out)) == len(rows)


def test_points_sweep_the_given_configs_in_place_of_the_grid(tmp_path):
    """--points: exactly the configs given (b:γ:α:kv), in their order, each once, into the same folder as a grid sweep,
    and a preset's other settings stand."""
    spec = sweep.build_spec("scale-kv", points=sweep.parse_points("1024:32:0.3:64,8:4:0.9:4096,1024:32:0.3:64"))
    assert [(c.batch_size, c.gamma, c.alpha, c.kv_dim) for c in sweep.grid(spec)] == [(1024, 32, 0.3, 64), (8, 4, 0.9, 4096)]
    assert sweep.parse_points("3:5:0.25") == ((3, 5, 0.25, 0),)
    out = tmp_path / "points"
    result = _invoke("--op", "verify_pack", "--points", "4:8:0.3:64,2:4:0.9:128", "--device", "cpu", "--warmup", "0",
                     "--iters", "2", "--impl", "torch_eager", "--out", str(out))
    assert result.exit_code == 0, result.output
    configs = {(row["batch_size"], row["gamma"], row["alpha"], row["kv_dim"]) for row in results.read_rows(out)}
    assert configs == {(4, 8, 0.3, 64), (2, 4, 0.9, 128)}


def test_prob_verify_sweep_records_acceptance_and_roofline_bytes(tmp_path):
    spec = sweep.build_spec(op="prob_verify", impls=["torch_eager"], batch_sizes=[4], gammas=[4], alphas=[0.6],
                            vocab_sizes=[64], out_dir=tmp_path, **FAST)
    sweep.run_sweep(spec)
    (row,) = [r for r in results.read_rows(tmp_path) if r["impl"] == "torch_eager"]
    assert row["status"] == "ok" and row["vocab_size"] == 64 and row["kv_dtype"] == "float32"
    assert 0.0 <= row["mean_accepted_length"] <= 4.0
    assert row["bytes_moved"] > 0 and row["achieved_gbps"] > 0


def test_trace_and_fixed_distributions_have_clear_cli_errors(tmp_path):
    from typer.testing import CliRunner

    from sdbench.cli import app

    runner = CliRunner()
    base = ["sweep", "--device", "cpu", "--b", "2", "--gamma", "4", "--alpha", "0.5", "--out", str(tmp_path / "r")]
    missing = runner.invoke(app, [*base, "--dist", "trace", "--trace", str(tmp_path / "nope.txt")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    long_trace = tmp_path / "long.txt"
    long_trace.write_text("1 2 9\n")
    too_long = runner.invoke(app, [*base, "--dist", "trace", "--trace", str(long_trace)])
    assert too_long.exit_code == 2 and "length 9 outside [0, gamma=4]" in too_long.output
    no_file = runner.invoke(app, [*base, "--dist", "trace"])
    assert no_file.exit_code == 2 and "--trace PATH" in no_file.output
    no_k = runner.invoke(app, [*base, "--dist", "fixed"])
    assert no_k.exit_code == 2 and "--fixed-length" in no_k.output
    for result in (missing, too_long, no_file, no_k):
        assert "Traceback" not in result.output


def test_trace_distribution_sweeps_on_cpu(tmp_path):
    from typer.testing import CliRunner

    from sdbench.cli import app

    trace = tmp_path / "lengths.txt"
    trace.write_text("0 2 4 4\n")
    result = CliRunner().invoke(app, ["sweep", "--device", "cpu", "--b", "3", "--gamma", "4", "--alpha", "0.5",
                                      "--dist", "trace", "--trace", str(trace), "--iters", "3", "--warmup", "1",
                                      "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert list((tmp_path / "r").glob("part-*trace*.parquet"))


# --- the one config key: a changed measurement setting is a different config ----------------------
RESUME_BASE = dict(op="verify", impls=["torch_eager"], batch_sizes=[2], gammas=[4], alphas=[0.5], device="cpu",
                   warmup=0, iters=2, resume=True)


@pytest.mark.parametrize("change", [
    {"dist": "fixed", "fixed_length": 3},
    {"cold_l2": True},
    {"iters": 3},
    {"dist": "trace"},
], ids=["fixed-length", "cold-l2", "iters", "trace-content"])
def test_resume_remeasures_when_a_setting_changes(tmp_path, change):
    trace = tmp_path / "trace.txt"
    trace.write_text("1 2 3")
    first = dict(RESUME_BASE, **({"dist": "fixed", "fixed_length": 2} if "fixed_length" in change else {}))
    if change.get("dist") == "trace":
        first = dict(RESUME_BASE, dist="trace", trace_path=str(trace))
    out = tmp_path / "out"
    sweep.run_sweep(sweep.build_spec(out_dir=out, **first))
    same = sweep.run_sweep(sweep.build_spec(out_dir=out, **first))
    assert (same.measured, same.skipped) == (0, 1)  # resume skips what is already there
    if change.get("dist") == "trace":
        trace.write_text("0 0 4")  # same file name, new content: a different workload
        second = first
    else:
        second = dict(first, **change)
    again = sweep.run_sweep(sweep.build_spec(out_dir=out, **second))
    assert (again.measured, again.skipped) == (1, 0)
    assert len({results.config_key(row) for row in results.read_rows(out)}) == 2


def test_rows_record_their_median_noise_and_the_noisy_flag(tmp_path):
    spec = sweep.build_spec(op="verify", impls=["torch_eager"], batch_sizes=[2], gammas=[4], alphas=[0.5],
                            device="cpu", warmup=0, iters=20, max_noise=0.5, out_dir=tmp_path)
    sweep.run_sweep(spec)
    (row,) = [r for r in results.read_rows(tmp_path) if r["impl"] == "torch_eager"]
    assert row["noise"] is not None and row["noise"] >= 0
    assert row["noisy"] == (row["noise"] > 0.5)
    assert "max_noise=0.5" in row["settings"]


def test_a_meaningless_noise_budget_is_refused():
    with pytest.raises(SdbenchError, match="--max-noise"):
        sweep.validate(sweep.build_spec(device="cpu", max_noise=0.0))


def test_concurrent_sweeps_into_one_folder_never_measure_a_config_twice(tmp_path):
    """Two sweeps (threads here; processes behave the same: the claim is an O_EXCL file) over one grid."""
    import threading

    spec = sweep.build_spec(op="verify", impls=["torch_eager"], batch_sizes=[1, 2, 3], gammas=[4, 8], alphas=[0.5],
                            device="cpu", warmup=0, iters=3, resume=True, out_dir=tmp_path)
    summaries = []
    threads = [threading.Thread(target=lambda: summaries.append(sweep.run_sweep(spec))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    keys = [results.config_key(row) for row in results.read_rows(tmp_path) if row["impl"] == "torch_eager"]
    assert len(keys) == len(set(keys)) == 6  # every config once
    assert sum(s.measured for s in summaries) == 6
    assert not list(tmp_path.glob(".claim-*"))  # claims released


def test_a_claimed_config_is_skipped(tmp_path):
    spec = sweep.build_spec(op="verify", impls=["torch_eager"], batch_sizes=[2], gammas=[4], alphas=[0.5],
                            device="cpu", warmup=0, iters=3, out_dir=tmp_path)
    (cfg,) = sweep.grid(spec)
    options = sweep.timing.TimingOptions(warmup=0, iters=3, max_time_s=spec.max_time)
    key_values = {**sweep.config_columns("verify", "cpu", cfg, options),
                  "gpu_name": sweep.envinfo.collect("cpu").get("gpu_name")}
    with results.config_claim(tmp_path, key_values) as claimed:
        assert claimed
        summary = sweep.run_sweep(spec)  # another sweep while this one holds the claim
        assert (summary.measured, summary.skipped) == (0, 1)


def test_a_killed_sweeps_claim_is_taken_over(tmp_path):
    """A claim whose owner (this host, a pid that no longer runs) died is stale: a resume measures the config."""
    import socket
    import subprocess
    import sys

    spec = sweep.build_spec(op="verify", impls=["torch_eager"], batch_sizes=[2], gammas=[4], alphas=[0.5],
                            device="cpu", warmup=0, iters=3, out_dir=tmp_path, resume=True)
    (cfg,) = sweep.grid(spec)
    options = sweep.timing.TimingOptions(warmup=0, iters=3, max_time_s=spec.max_time)
    key_values = {**sweep.config_columns("verify", "cpu", cfg, options),
                  "gpu_name": sweep.envinfo.collect("cpu").get("gpu_name")}
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with results.config_claim(tmp_path, key_values) as claimed:  # find the lock's name, then plant a dead owner
        assert claimed
        (lock,) = tmp_path.glob(".claim-*")
    lock.write_text(f"{socket.gethostname()} {dead.pid}\n")
    summary = sweep.run_sweep(spec)
    assert (summary.measured, summary.skipped) == (1, 0)
    lock.write_text(f"another-host {dead.pid}\n")  # an owner this host cannot check: honoured
    again = sweep.build_spec(op="verify", impls=["torch_eager"], batch_sizes=[2], gammas=[4], alphas=[0.5],
                             device="cpu", warmup=0, iters=3, out_dir=tmp_path, resume=False)
    assert (sweep.run_sweep(again).measured, lock.exists()) == (0, True)



@pytest.mark.parametrize(("view", "row_samples", "noisy", "drift"), [
    ("wall", [30.0] * 40, False, 0.0),  # steady against a steady floor
    ("wall", [30.0] * 30 + [36.0] * 10, True, 0.2),  # moved 20% against its floor in the last quarter
    ("graph", [3.0] * 30 + [3.6] * 10, True, 0.2),
    ("gpu", [3.0] * 30 + [3.6] * 10, False, None),  # the gpu view is not read against a floor sampled beside it
])
def test_a_row_that_drifts_against_its_own_floor_is_noisy(view, row_samples, noisy, drift):
    row = {"status": "ok", "view": view, "samples_us": row_samples, "noisy": False}
    sweep._flag_floor_drift(row, sweep.timing.ViewResult(samples_us=[20.0] * 40))
    assert row["noisy"] is noisy
    assert row.get("floor_drift") == (pytest.approx(drift) if drift is not None else None)


def test_floor_drift_is_left_alone_without_a_measured_floor():
    row = {"status": "ok", "view": "wall", "samples_us": [30.0] * 40, "noisy": False}
    sweep._flag_floor_drift(row, None)
    sweep._flag_floor_drift(row, sweep.timing.ViewResult(status="error", reason="raised"))
    assert "floor_drift" not in row and row["noisy"] is False


def test_min_time_is_validated_and_recorded_only_when_set(tmp_path):
    with pytest.raises(SdbenchError, match="--min-time must be in"):
        sweep.validate(sweep.build_spec(device="cpu", out_dir=tmp_path, max_time=0.5, min_time=2.0))
    plain = sweep.config_columns("verify", "cpu", VerifyConfig(4, 8, 0.5), sweep.timing.TimingOptions(max_time_s=0.5))
    timed = sweep.config_columns("verify", "cpu", VerifyConfig(4, 8, 0.5),
                                 sweep.timing.TimingOptions(max_time_s=0.5, min_time_s=0.2))
    assert "min_time" not in plain["settings"] and timed["settings"].endswith(" min_time=0.2")


def test_a_row_is_read_against_its_own_paths_floor_else_the_custom_ops():
    ok = sweep.timing.ViewResult(samples_us=[20.0] * 10)
    triton = sweep.timing.ViewResult(samples_us=[40.0] * 10)
    failed = sweep.timing.ViewResult(status="error", reason="capture failed")
    timings = {"launch_floor": {"wall": ok, "graph": ok}, "launch_floor:triton": {"wall": triton, "graph": failed}}
    assert sweep._own_floor(timings, "triton", "wall") == ("triton", triton)
    assert sweep._own_floor(timings, "triton", "graph") == ("custom_op", ok)  # its own failed in that view
    assert sweep._own_floor(timings, "triton_bound", "wall") == ("custom_op", ok)  # never measured
    assert sweep._own_floor(timings, "custom_op", "wall") == ("custom_op", ok)
    assert sweep._own_floor({}, "custom_op", "wall") == ("custom_op", None)


# --- the wall view's host-state check ------------------------------------------------------------------
def _config_rows(batch: int, wall_floor_us: float, row_us: float = 30.0) -> list[dict]:
    """One config's rows as the sweep writes them: ballot and the custom-op floor in the wall and gpu views."""
    rows = []
    for view, floor_us in (("wall", wall_floor_us), ("gpu", 0.9)):
        for impl, median in (("ballot", row_us if view == "wall" else 2.0), ("launch_floor", floor_us)):
            rows.append({"op": "verify", "device": "cuda", "batch_size": batch, "gamma": 8, "alpha": 0.5, "kv_dim": 0,
                         "vocab_size": 32000, "dist": "binomial", "token_dtype": "int64", "kv_dtype": "float16",
                         "seed": 0, "cold_l2": False, "settings": "s", "run_id": "r", "impl": impl, "view": view,
                         "status": "ok", "median_us": median, "samples_us": [median] * 8, "noise": 0.0,
                         "noisy": False, "launch_floor_us": floor_us, "launch_path": "custom_op"})
    return rows


def _measured(tmp_path, wall_floors_us: list[float]) -> list[sweep.MeasuredConfig]:
    configs = []
    for batch, floor_us in enumerate(wall_floors_us, start=1):
        rows = _config_rows(batch, floor_us)
        part = results.write_part(tmp_path, f"part-r-b{batch}.parquet", rows)
        configs.append(sweep.MeasuredConfig(VerifyConfig(batch, 8, 0.5), rows, part))
    return configs


def _remeasure(second_floors_us: dict[int, float], calls: list[int]):
    """The second wall measurement of batch b: its floor from second_floors_us, rows as the first time."""
    def remeasure(cfg):
        calls.append(cfg.batch_size)
        return [row for row in _config_rows(cfg.batch_size, second_floors_us[cfg.batch_size]) if row["view"] == "wall"]
    return remeasure


def _wall(config: sweep.MeasuredConfig, impl: str = "ballot") -> dict:
    (row,) = [row for row in config.rows if row["view"] == "wall" and row["impl"] == impl]
    return row


@pytest.mark.parametrize(("second_floor_us", "kept", "wall_floor_us", "noisy"), [
    (20.5, True, 20.5, False),  # the host came back to its fast state: the second measurement is kept
    (32.0, True, 32.0, True),  # faster, still slow: kept, and flagged
    (36.0, False, 34.0, True),  # slower: the first measurement stays, flagged
])
def test_a_config_measured_in_a_slow_host_state_is_measured_again(tmp_path, second_floor_us, kept, wall_floor_us,
                                                                   noisy):
    measured = _measured(tmp_path, [20.0, 34.0])  # b=2's floor 1.7x the sweep's lowest
    summary = sweep.SweepSummary("r", tmp_path, "cuda", ("wall", "gpu"), 2, 2)
    calls: list[int] = []
    sweep.settle_host_state(measured, 0.15, _remeasure({2: second_floor_us}, calls), summary)
    assert calls == [2]  # only the slow config, once
    assert (summary.host_remeasured, summary.host_kept, summary.host_slowed_configs) == (1, int(kept), int(noisy))
    slow = _wall(measured[1])
    assert (slow["launch_floor_us"], slow["noisy"]) == (wall_floor_us, noisy)
    assert slow["host_slowed"] == pytest.approx(wall_floor_us / 20.0)
    assert _wall(measured[1], "launch_floor")["noisy"] is noisy
    assert [row["launch_floor_us"] for row in measured[1].rows if row["view"] == "gpu"] == [0.9, 0.9]  # untouched
    assert all(row.get("host_slowed") is None and not row["noisy"] for row in measured[1].rows if row["view"] == "gpu")
    assert (_wall(measured[0])["host_slowed"], _wall(measured[0])["noisy"]) == (1.0, False)
    # the parts on disk are what the summary says, rewritten in place: one part per config, no temporary
    on_disk = {(row["batch_size"], row["impl"], row["view"]): row for row in results.read_rows(tmp_path)}
    assert len(on_disk) == 8 and sorted(p.name for p in tmp_path.iterdir()) == ["part-r-b1.parquet", "part-r-b2.parquet"]
    assert on_disk[(2, "ballot", "wall")]["launch_floor_us"] == wall_floor_us
    assert on_disk[(2, "ballot", "wall")]["noisy"] is noisy
    assert summary.median_of_medians("launch_floor", "wall") == pytest.approx((20.0 + wall_floor_us) / 2)


def test_each_copys_wall_rows_are_replaced_by_that_copys_second_measurement(tmp_path):
    """--placements: a config's rows hold one (implementation, view) per copy; the second wall measurement's rows
    replace the first copy by copy, never one copy's row by another's."""
    first = [{**row, "placement": copy, "median_us": row["median_us"] + copy} for copy in (0, 1)
             for row in _config_rows(2, 34.0)]
    measured = _measured(tmp_path, [20.0])
    measured.append(sweep.MeasuredConfig(VerifyConfig(2, 8, 0.5), first,
                                         results.write_part(tmp_path, "part-r-b2.parquet", first)))

    def remeasure(cfg):  # faster (floor 21), each copy's ballot 100 + its copy
        return [{**row, "placement": copy, "median_us": 100.0 + copy if row["impl"] == "ballot" else row["median_us"]}
                for copy in (0, 1) for row in _config_rows(cfg.batch_size, 21.0) if row["view"] == "wall"]

    summary = sweep.SweepSummary("r", tmp_path, "cuda", ("wall", "gpu"), 2, 2)
    sweep.settle_host_state(measured, 0.15, remeasure, summary)
    assert summary.host_kept == 1
    walls = {(row["impl"], row["placement"]): row for row in measured[1].rows if row["view"] == "wall"}
    assert len(measured[1].rows) == 8 and len(walls) == 4
    assert (walls[("ballot", 0)]["median_us"], walls[("ballot", 1)]["median_us"]) == (100.0, 101.0)
    gpu = sorted(row["median_us"] for row in measured[1].rows if row["view"] == "gpu" and row["impl"] == "ballot")
    assert gpu == [2.0, 3.0]  # the gpu view of each copy, untouched


def test_a_wall_view_measured_again_keeps_its_configs_key(monkeypatch):
    # The retry measures the wall view alone, yet its rows replace rows of the sweep's config: same key. (Its
    # settings said views=wall, so the quick preset read back 10 configs instead of 8.) measure_config is
    # replaced by one that writes the columns of the options it was given, as the real one does.
    def measure_config(op, cfg, impls, device, options, floor, run_id, host_tolerance, placements):
        return [{**sweep.config_columns(op, device, cfg, options, host_tolerance, placements), "impl": "ballot",
                 "view": "wall"}]

    monkeypatch.setattr(sweep, "measure_config", measure_config)
    options = sweep.timing.TimingOptions(max_time_s=0.5)
    cfg = VerifyConfig(4, 8, 0.5)
    for placements in (1, 3):
        again = sweep._wall_remeasure("verify", [], "cuda", options, None, "r", 0.15, placements)(cfg)
        assert [results.config_key(row) for row in again] == [
            results.config_key(sweep.config_columns("verify", "cuda", cfg, options, 0.15, placements))]
    one, three = (sweep.config_columns("verify", "cuda", cfg, options, 0.15, n)["settings"] for n in (1, 3))
    assert three == one + " placements=3"  # a sweep of one copy keeps the key it had before the option


def test_a_sweep_in_one_host_state_is_left_as_measured(tmp_path):
    measured = _measured(tmp_path, [20.0, 21.5, 22.8])  # 14% apart at most
    before = [[dict(row) for row in config.rows] for config in measured]
    summary = sweep.SweepSummary("r", tmp_path, "cuda", ("wall", "gpu"), 3, 3)
    calls: list[int] = []
    sweep.settle_host_state(measured, 0.15, _remeasure({}, calls), summary)
    assert calls == [] and (summary.host_remeasured, summary.host_slowed_configs) == (0, 0)
    for config, rows in zip(measured, before, strict=True):
        assert [{k: v for k, v in row.items() if k != "host_slowed"} for row in config.rows] == rows
    assert [_wall(config)["host_slowed"] for config in measured] == pytest.approx([1.0, 1.075, 1.14])


def test_a_retry_that_lowers_the_sweeps_floor_checks_the_others_again_once_each(tmp_path):
    """b=3 ran slow (34 against 20); measured again it reads 17, the new lowest, which puts b=1 (22) and b=2
    (20) beyond 15% of it: they are measured again too, and nothing a second time."""
    measured = _measured(tmp_path, [22.0, 20.0, 34.0])
    summary = sweep.SweepSummary("r", tmp_path, "cuda", ("wall", "gpu"), 3, 3)
    calls: list[int] = []
    sweep.settle_host_state(measured, 0.15, _remeasure({1: 21.0, 2: 19.0, 3: 17.0}, calls), summary)
    assert calls == [3, 1, 2]
    assert [_wall(config)["launch_floor_us"] for config in measured] == [21.0, 19.0, 17.0]
    assert [_wall(config)["noisy"] for config in measured] == [True, False, False]  # 21 / 17 = 1.24
    assert (summary.host_remeasured, summary.host_kept, summary.host_slowed_configs) == (3, 3, 1)


def test_a_second_measurement_that_lost_a_row_is_not_kept(tmp_path):
    measured = _measured(tmp_path, [20.0, 34.0])
    summary = sweep.SweepSummary("r", tmp_path, "cuda", ("wall", "gpu"), 2, 2)

    def remeasure(cfg):
        rows = [row for row in _config_rows(cfg.batch_size, 20.0) if row["view"] == "wall"]
        rows[0].update(status="error", reason="raised RuntimeError", median_us=None, samples_us=[])
        return rows

    sweep.settle_host_state(measured, 0.15, remeasure, summary)
    assert (_wall(measured[1])["status"], _wall(measured[1])["launch_floor_us"]) == ("ok", 34.0)
    assert _wall(measured[1])["noisy"] and summary.host_kept == 0


def _fake_cuda_host(monkeypatch, wall_floors_us: list[float]) -> list[tuple[str, ...]]:
    """The sweep on a fake CUDA host: every view of CUDA, and timing.measure returning, for its n-th call, the
    floor wall_floors_us[n] and rows 3x it (constant samples: no noise). Returns the views of each call."""
    from sdbench.ops.launch_floor import LaunchFloor

    calls: list[tuple[str, ...]] = []

    def views_for(device, options=None):
        return tuple(options.views) if options is not None and options.views else sweep.timing.CUDA_VIEWS

    def measure(callables, device, options=None, *, not_capturable=None):
        views = views_for(device, options)
        if options.warmup == sweep.SWEEP_WARMUP_CALLS:  # the launch warm-up before the first config
            return {}
        floor_us = wall_floors_us[len(calls)]
        calls.append(views)
        return {name: {view: sweep.timing.ViewResult(samples_us=[floor_us * (1 if name.startswith("launch_floor") else 3)
                                                                 if view == "wall" else 1.0] * 16)
                       for view in views} for name in callables}

    monkeypatch.setattr(sweep.timing, "views_for", views_for)
    monkeypatch.setattr(sweep.timing, "measure", measure)
    monkeypatch.setattr(sweep, "launch_floor", lambda device: LaunchFloor(lambda: None, "cuda"))
    return calls


def _host_spec(tmp_path, **changes):
    return sweep.build_spec(op="verify", impls=["torch_eager"], batch_sizes=[1, 2, 3], gammas=[4], alphas=[0.5],
                            device="cpu", warmup=0, iters=3, out_dir=tmp_path, run_id="r", **changes)


def _wall_floors(folder) -> dict[int, tuple[float, bool]]:
    return {row["batch_size"]: (row["launch_floor_us"], row["noisy"]) for row in results.read_rows(folder)
            if row["view"] == "wall" and row["impl"] == "torch_eager"}


def test_the_sweep_measures_a_slow_configs_wall_view_again_and_resume_counts_it_once(tmp_path, monkeypatch):
    calls = _fake_cuda_host(monkeypatch, [20.0, 34.0, 21.0, 20.5])  # b=2 slow; measured again, fast
    summary = sweep.run_sweep(_host_spec(tmp_path))
    assert calls == [sweep.timing.CUDA_VIEWS] * 3 + [("wall",)]  # the second measurement: the wall view alone
    assert (summary.measured, summary.host_remeasured, summary.host_kept, summary.host_slowed_configs) == (3, 1, 1, 0)
    assert _wall_floors(tmp_path) == {1: (20.0, False), 2: (20.5, False), 3: (21.0, False)}
    rows = results.read_rows(tmp_path)
    assert len(list(tmp_path.glob("part-*.parquet"))) == 3 and not list(tmp_path.glob("*.tmp"))
    assert Counter((row["batch_size"], row["impl"], row["view"]) for row in rows).most_common(1)[0][1] == 1
    assert {row["view"]: row["launch_floor_us"] for row in rows if row["batch_size"] == 2} == {
        "wall": 20.5, "graph": 1.0, "gpu": 1.0}  # the other views keep the first measurement
    assert summary.median_of_medians("torch_eager", "wall") == pytest.approx(3 * 20.5)

    again = sweep.run_sweep(_host_spec(tmp_path, resume=True))
    assert (again.measured, again.skipped, again.host_remeasured) == (0, 3, 0)
    assert len(results.read_rows(tmp_path)) == len(rows) and len(calls) == 4


def test_the_sweep_flags_a_config_that_stays_slow(tmp_path, monkeypatch):
    _fake_cuda_host(monkeypatch, [20.0, 34.0, 21.0, 35.0])
    summary = sweep.run_sweep(_host_spec(tmp_path))
    assert (summary.host_remeasured, summary.host_kept, summary.host_slowed_configs) == (1, 0, 1)
    assert _wall_floors(tmp_path) == {1: (20.0, False), 2: (34.0, True), 3: (21.0, False)}
    (slow,) = [row for row in results.read_rows(tmp_path)
               if row["batch_size"] == 2 and row["impl"] == "torch_eager" and row["view"] == "wall"]
    assert slow["host_slowed"] == pytest.approx(1.7)


def test_a_sweep_in_one_host_state_measures_nothing_again(tmp_path, monkeypatch):
    calls = _fake_cuda_host(monkeypatch, [20.0, 22.0, 21.0])
    summary = sweep.run_sweep(_host_spec(tmp_path))
    assert len(calls) == 3 and summary.host_remeasured == 0
    assert _wall_floors(tmp_path) == {1: (20.0, False), 2: (22.0, False), 3: (21.0, False)}


def test_host_tolerance_is_validated_and_recorded_only_when_not_the_default(tmp_path, monkeypatch):
    with pytest.raises(SdbenchError, match="--host-tolerance must be > 0"):
        sweep.validate(sweep.build_spec(device="cpu", out_dir=tmp_path, host_tolerance=0.0))
    options = sweep.timing.TimingOptions(max_time_s=0.5)
    plain = sweep.config_columns("verify", "cpu", VerifyConfig(4, 8, 0.5), options)
    loose = sweep.config_columns("verify", "cpu", VerifyConfig(4, 8, 0.5), options, host_tolerance=0.8)
    assert "host_tolerance" not in plain["settings"] and loose["settings"].endswith(" host_tolerance=0.8")
    _fake_cuda_host(monkeypatch, [20.0, 34.0, 21.0])
    summary = sweep.run_sweep(_host_spec(tmp_path, host_tolerance=0.8))  # 1.7x is inside an 80% tolerance
    assert summary.host_remeasured == 0 and _wall_floors(tmp_path)[2] == (34.0, False)


def test_the_cli_says_what_the_host_state_check_did(tmp_path, monkeypatch):
    _fake_cuda_host(monkeypatch, [20.0, 34.0, 21.0, 35.0])
    result = _invoke("--op", "verify", "--impl", "torch_eager", "--b", "1,2,3", "--gamma", "4", "--alpha", "0.5",
                     "--device", "cpu", "--warmup", "0", "--iters", "3", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert ("host state (wall): 1 configs ran with a launch floor more than the tolerance above the sweep's lowest "
            "and were measured again (0 faster the second time); 1 stayed slow, their wall rows flagged noisy "
            "(host_slowed)") in " ".join(result.output.split())


def test_views_are_validated_passed_to_the_timer_and_recorded_only_when_a_subset(tmp_path, monkeypatch):
    with pytest.raises(SdbenchError, match="--views: gpu cannot be measured on cpu"):
        sweep.validate(sweep.build_spec(device="cpu", out_dir=tmp_path, views=("gpu",)))
    plain = sweep.config_columns("verify", "cpu", VerifyConfig(4, 8, 0.5), sweep.timing.TimingOptions())
    subset = sweep.config_columns("verify", "cpu", VerifyConfig(4, 8, 0.5),
                                  sweep.timing.TimingOptions(views=("gpu", "graph")))
    assert "views" not in plain["settings"] and subset["settings"].endswith(" views=gpu,graph")
    seen = []
    measure = sweep.timing.measure

    def spy(callables, device, options, **kwargs):
        seen.append(options.views)
        return measure(callables, device, options, **kwargs)

    monkeypatch.setattr(sweep.timing, "measure", spy)
    summary = sweep.run_sweep(_spec(tmp_path, batch_sizes=[1], gammas=[8], alphas=[0.3], views=("cpu",)))
    assert summary.views == ("cpu",) and seen and set(seen) == {("cpu",)}
    rows = results.read_rows(tmp_path)
    assert {row["view"] for row in rows} == {"cpu"} and all(row["settings"].endswith("views=cpu") for row in rows)
