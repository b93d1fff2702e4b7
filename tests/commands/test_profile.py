"""`sdbench profile` without a GPU: CLI errors, tool choice, aggregation, parquet, and the nsys / ncu
plumbing driven through fake tools that replay captured output."""

import json
import stat
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from sdbench.cli import app
from sdbench.commands import profile
from sdbench.commands.profile import ImplProfile, KernelTime, ProfileReport, ProfileRequest, ToolChoice, ToolFailed
from sdbench.errors import SdbenchError
from sdbench.measure import tools
from sdbench.ops.workload import VerifyConfig
from tests.measure.test_tools import NCU_DETAILS, NSYS_KERN_SUM

runner = CliRunner()
CONFIG = VerifyConfig(batch_size=32, gamma=128, alpha=0.9)


# --- CLI errors: one line, exit code 2, no traceback -------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--tool", "nsight"], "unknown --tool 'nsight'"),
    (["--tool", "ncuu"], "did you mean 'ncu'?"),
    (["--impl", "torch_eagr"], "did you mean 'torch_eager'?"),
    (["--op", "verfy"], "unknown operation 'verfy'"),
    (["--b", "0"], "--b: 0 is below the minimum 1"),
    (["--b", "16,32"], "--b: profile takes one value, got 2"),
    (["--gamma", "x"], "--gamma: 'x' is not an integer"),
    (["--alpha", "1.5"], "--alpha: 1.5 is outside [0.0, 1.0]"),
    (["--kv-dim", "-1"], "--kv-dim: -1 is below the minimum 0"),
    (["--dist", "poisson"], "unknown distribution 'poisson'"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--iters", "0"], "--iters must be >= 1"),
    (["--profile-iters", "0"], "--profile-iters must be >= 1"),
])
def test_bad_input_is_one_line(args, message):
    result = runner.invoke(app, ["profile", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
@pytest.mark.parametrize("tool", ["auto", "torch", "nsys", "ncu"])
def test_without_cuda_every_tool_says_so(tool):
    result = runner.invoke(app, ["profile", "--impl", "torch_eager", "--tool", tool])
    assert result.exit_code == 2
    assert "profile needs a CUDA device" in result.output and "--device cpu" in result.output


# --- choosing tools ----------------------------------------------------------------------------
ALL_WORK = {"nsys": None, "ncu": None, "torch": None}


def test_auto_prefers_nsys_and_adds_ncu_counters():
    choice = profile.choose_tools("auto", ALL_WORK)
    assert (choice.timing, choice.counters) == ("nsys", True)
    assert [tool for tool, _ in choice.skipped] == ["torch"]


def test_auto_says_why_it_skipped_nsys_and_ncu():
    choice = profile.choose_tools("auto", {"nsys": "nsys's QdstrmImporter cannot load libdw.so.1",
                                           "ncu": "ncu not found", "torch": None})
    assert (choice.timing, choice.counters) == ("torch", False)
    assert dict(choice.skipped) == {"nsys": "nsys's QdstrmImporter cannot load libdw.so.1", "ncu": "ncu not found"}


def test_auto_with_only_ncu_times_with_ncu():
    choice = profile.choose_tools("auto", {"nsys": "missing", "ncu": None, "torch": "broken CUPTI"})
    assert choice.timing == "ncu" and choice.counters


def test_auto_with_nothing_lists_every_reason():
    with pytest.raises(SdbenchError, match="no profiler works here.*nsys: a.*ncu: b.*torch: c"):
        profile.choose_tools("auto", {"nsys": "a", "ncu": "b", "torch": "c"})


def test_explicit_tool_that_cannot_run_is_an_error():
    with pytest.raises(SdbenchError, match="--tool ncu cannot run here: ncu not found"):
        profile.choose_tools("ncu", {**ALL_WORK, "ncu": "ncu not found"})
    assert profile.choose_tools("torch", ALL_WORK).timing == "torch"
    assert profile.choose_tools("ncu", ALL_WORK).counters


def test_request_rejects_unknown_tool():
    with pytest.raises(SdbenchError, match="choose one of auto, nsys, ncu, torch"):
        ProfileRequest(op="verify", impls=(), config=CONFIG, tool="perf")


# --- aggregation and the decomposition ---------------------------------------------------------
def test_aggregate_device_events_per_iteration():
    events = [("verify_ballot", 1900.0), ("fill", 800.0)] * 10 + [("fill", 800.0)] * 10
    rows = profile.aggregate_kernels(events, iters=10)
    assert [(r.kernel, r.calls_per_iter) for r in rows] == [("verify_ballot", 1.0), ("fill", 2.0)]  # longest first
    assert rows[0].gpu_us == pytest.approx(1.9) and rows[1].gpu_us == pytest.approx(1.6)


def test_nsys_rows_become_per_iteration_kernels():
    rows = profile.kernels_from_nsys(tools.parse_nsys_kern_sum(NSYS_KERN_SUM), iters=10)
    reduce = rows[0]  # longest first
    assert reduce.short_name == "reduce_kernel"
    assert reduce.calls_per_iter == 2.0 and reduce.gpu_us == pytest.approx(5.248)
    assert sum(r.calls_per_iter for r in rows) == 5.0


def test_ncu_rows_average_counters_over_launches():
    rows = profile.kernels_from_ncu(tools.parse_ncu_csv(NCU_DETAILS), iters=2)
    naive = next(r for r in rows if r.short_name == "verify_naive_kernel")
    assert naive.calls_per_iter == 1.0
    assert naive.gpu_us == pytest.approx((26144 + 25856) / 1000 / 2)
    assert naive.metrics["smsp__thread_inst_executed_per_inst_executed.ratio"] == 4.86  # n/a launch left out
    assert naive.metrics["sm__warps_active.avg.pct_of_peak_sustained_active"] == pytest.approx(12.5)
    assert profile.warp_efficiency_pct(naive) == pytest.approx(100 * 4.86 / 32)
    fill = next(r for r in rows if r.short_name == "vectorized_elementwise_kernel")
    assert profile.warp_efficiency_pct(fill) == 100.0 and fill.calls_per_iter == 0.5


def test_host_wall_is_launch_overhead_plus_gpu_time():
    impl = ImplProfile("torch_eager", "torch", wall_us=180.0, timing_tool="nsys",
                       kernels=[KernelTime("a", 1, 3.0), KernelTime("b", 2, 5.0)])
    assert impl.gpu_us == 8.0 and impl.launch_overhead_us == 172.0 and impl.launches_per_iter == 3
    assert ImplProfile("x", "cuda", wall_us=None).launch_overhead_us is None


# --- parquet -----------------------------------------------------------------------------------
def _report(tmp_path) -> ProfileReport:
    request = ProfileRequest(op="verify", impls=("torch_eager", "naive"), config=CONFIG, out_dir=str(tmp_path))
    eager = ImplProfile("torch_eager", "torch", wall_us=200.0, timing_tool="torch",
                        kernels=[KernelTime("void at::native::reduce_kernel<(int)512>(T3)", 2, 5.2)])
    naive = ImplProfile("naive", "cuda", wall_us=40.0, timing_tool="torch",
                        kernels=[KernelTime(profile_naive := "verify_naive_kernel(const long *)", 1, 26.0)],
                        counters=[KernelTime(profile_naive, 1, 30.1, {
                            "smsp__thread_inst_executed_per_inst_executed.ratio": 4.86,
                            "sm__warps_active.avg.pct_of_peak_sustained_active": 12.5})])
    return ProfileReport(request, ToolChoice("torch", True), "20261101-120000-abcd", [eager, naive], [])


def test_parquet_rows_round_trip(tmp_path):
    report = _report(tmp_path)
    folder = profile.run_folder(tmp_path, report.run_id)
    path = profile.write_profile_parquet(report, folder, environment={"gpu_name": "NVIDIA H100 80GB HBM3"})
    assert path == tmp_path / "profile-20261101-120000-abcd" / "profile.parquet"
    assert not list(tmp_path.glob("*.parquet")) and not list(folder.glob("*.tmp"))  # the results folder stays sweep-only
    table = pq.read_table(path)
    assert table.schema.equals(profile.profile_schema(), check_metadata=False)
    rows = table.to_pylist()
    impl_rows = [r for r in rows if r["row"] == "impl"]
    assert [(r["impl"], r["wall_us"], r["launch_overhead_us"]) for r in impl_rows] == [
        ("torch_eager", 200.0, pytest.approx(194.8)), ("naive", 40.0, 14.0)]
    ncu = next(r for r in rows if r["tool"] == "ncu")
    assert ncu["impl"] == "naive" and ncu["kernel_short"] == "verify_naive_kernel"
    assert ncu["warp_efficiency_pct"] == pytest.approx(15.1875) and ncu["achieved_occupancy_pct"] == 12.5
    assert ncu["dram_throughput_pct"] is None
    assert {r["profile_schema_version"] for r in rows} == {1}
    assert {r["gamma"] for r in rows} == {128} and {r["gpu_name"] for r in rows} == {"NVIDIA H100 80GB HBM3"}


# --- nsys and ncu plumbing through fake tools --------------------------------------------------
def _fake_tool(path: Path, script: str) -> str:
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


_LOG_ARGS = 'echo "$@" >> "$FAKE_LOG"\n'
_OUTPUT_ARG = 'out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    samples = tmp_path / "samples"
    samples.mkdir()
    (samples / "nsys.csv").write_text(NSYS_KERN_SUM)
    (samples / "ncu.csv").write_text(NCU_DETAILS)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "log.txt"))
    monkeypatch.setenv("FAKE_SAMPLES", str(samples))
    reports = tmp_path / "reports"
    reports.mkdir()
    return SimpleNamespace(tmp=tmp_path, reports=reports, log=tmp_path / "log.txt")


def test_nsys_profiles_the_child_in_a_capture_range_then_reads_kern_sum(fake_env):
    nsys = _fake_tool(fake_env.tmp / "nsys", _LOG_ARGS + _OUTPUT_ARG + (
        'if [ "$1" = profile ]; then touch "$out.nsys-rep"; else cat "$FAKE_SAMPLES/nsys.csv"; fi\n'))
    spec = profile.child_spec("verify", "torch_eager", CONFIG, 20, 10)
    rows = profile.run_nsys(nsys, spec, fake_env.reports / "torch_eager", 10)
    assert len(rows) == 4 and rows[0].gpu_us == pytest.approx(5.248)
    profile_line, stats_line = fake_env.log.read_text().splitlines()
    for flag in ("--trace=cuda", "--sample=none", "--cpuctxsw=none", "--capture-range=cudaProfilerApi",
                 "--cuda-graph-trace=node",
                 "-m sdbench.commands.profile child"):
        assert flag in profile_line
    assert "--report cuda_gpu_kern_sum --format csv" in stats_line


def test_nsys_importer_failure_names_libdw(fake_env):
    nsys = _fake_tool(fake_env.tmp / "nsys", _OUTPUT_ARG + (
        'touch "$out.qdstrm"; echo "Importer error status: An unknown error occurred."; '
        'echo "Unable to retrieve the importer version"; exit 0\n'))
    with pytest.raises(ToolFailed, match="QdstrmImporter failed.*libdw1"):
        profile.run_nsys(nsys, "{}", fake_env.reports / "torch_eager", 10)


def test_ncu_exports_a_report_then_imports_it_as_csv(fake_env):
    ncu = _fake_tool(fake_env.tmp / "ncu", _LOG_ARGS + _OUTPUT_ARG + (
        'if [ "$1" = --import ]; then cat "$FAKE_SAMPLES/ncu.csv"; else touch "$out.ncu-rep"; fi\n'))
    rows = profile.run_ncu(ncu, "{}", fake_env.reports / "naive", profile.NCU_ITERS)
    assert {row.short_name for row in rows} == {"verify_naive_kernel", "vectorized_elementwise_kernel"}
    profile_line, import_line = fake_env.log.read_text().splitlines()
    assert "--profile-from-start off" in profile_line
    assert ",".join(profile.NCU_METRICS) in profile_line
    assert "--csv" in import_line and "--page details" in import_line


def test_ncu_permission_error_carries_the_fix(fake_env):
    ncu = _fake_tool(fake_env.tmp / "ncu", (
        'echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU '
        'Performance Counters on the target device 0."; exit 1\n'))
    with pytest.raises(ToolFailed, match="ERR_NVGPUCTRPERM.*NVreg_RestrictProfilingToAdminUsers=0"):
        profile.run_ncu(ncu, "{}", fake_env.reports / "naive", 2)


# --- auto falls back, and says so --------------------------------------------------------------
def test_auto_falls_back_to_torch_and_drops_unreadable_counters(tmp_path, monkeypatch):
    def nsys_fails(*args):
        raise ToolFailed("nsys: nsys left only a .qdstrm: its QdstrmImporter failed")

    def ncu_refused(*args):
        raise ToolFailed("ncu: ERR_NVGPUCTRPERM, GPU performance counters are not readable")

    monkeypatch.setattr(profile, "run_nsys", nsys_fails)
    monkeypatch.setattr(profile, "run_ncu", ncu_refused)
    monkeypatch.setattr(profile, "tool_unavailable", lambda tool, env=None: None)
    monkeypatch.setattr(profile, "_torch_kernels", lambda request, impl: [KernelTime("k", 1, 2.0)])
    request = ProfileRequest(op="verify", impls=(), config=CONFIG)
    choice = ToolChoice("nsys", True, [("torch", "nsys measures the same kernels")])
    notes: list[str] = []
    first, second = ImplProfile("a", "cuda"), ImplProfile("b", "cuda")
    for impl in (first, second):
        profile._profile_one(request, SimpleNamespace(name=impl.impl), impl, choice, tmp_path, notes)
    assert (first.timing_tool, second.timing_tool) == ("torch", "torch")
    assert first.kernels[0].gpu_us == 2.0 and first.error is None
    assert choice.timing == "torch" and not choice.counters
    assert [tool for tool, _ in choice.skipped] == ["nsys", "ncu"]
    assert len(notes) == 2  # once each, not once per implementation


def test_explicit_tool_failure_is_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(profile, "run_nsys", lambda *a: (_ for _ in ()).throw(ToolFailed("nsys: broken")))
    request = ProfileRequest(op="verify", impls=(), config=CONFIG, tool="nsys")
    with pytest.raises(ToolFailed, match="nsys: broken"):
        profile._profile_one(request, SimpleNamespace(name="a"), ImplProfile("a", "cuda"),
                             ToolChoice("nsys", False), tmp_path, [])


def test_child_spec_rebuilds_the_same_config():
    spec = json.loads(profile.child_spec("verify", "naive", CONFIG.replace(dist="geometric", seed=3), 5, 10))
    assert VerifyConfig(**spec["config"]) == CONFIG.replace(dist="geometric", seed=3)
    assert (spec["op"], spec["impl"], spec["warmup"], spec["iters"]) == ("verify", "naive", 5, 10)


def test_child_env_puts_this_checkout_first():
    env = profile.child_env({"PYTHONPATH": "/elsewhere"})
    root = str(Path(profile.__file__).resolve().parents[2])
    assert env["PYTHONPATH"] == f"{root}:/elsewhere"


# --- the whole command with the GPU parts faked (the real thing: tests/gpu/test_profile_gpu.py) ---
@pytest.fixture
def fake_gpu(monkeypatch):
    """run_profile as on a GPU machine where only torch.profiler works, with made-up measurements."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profile, "tool_unavailable",
                        lambda tool, env=None: None if tool == "torch" else f"{tool} not found")

    def wall(request, impls, profiles):
        for impl_profile in profiles:
            impl_profile.wall_us = 180.0

    monkeypatch.setattr(profile, "_measure_wall", wall)
    monkeypatch.setattr(profile, "_torch_kernels", lambda request, impl: [
        KernelTime("void at::native::reduce_kernel<(int)512, (int)1>(T3)", 2, 5.0),
        KernelTime("void at::native::elementwise_kernel<(int)128>(int, T3)", 5, 10.0)])
    monkeypatch.setattr(profile, "_environment", lambda: {"gpu_name": "fake"})


def test_run_profile_end_to_end_with_fakes(tmp_path, fake_gpu):
    request = ProfileRequest(op="verify", impls=("torch_eager",), config=CONFIG, out_dir=str(tmp_path))
    report = profile.run_profile(request)
    (eager,) = report.impls
    assert (eager.wall_us, eager.gpu_us, eager.launch_overhead_us, eager.launches_per_iter) == (180.0, 15.0, 165.0, 7)
    assert report.choice.timing == "torch" and dict(report.choice.skipped) == {"nsys": "nsys not found",
                                                                                "ncu": "ncu not found"}
    rows = pq.read_table(report.parquet_path).to_pylist()
    assert [row["row"] for row in rows] == ["impl", "kernel", "kernel"]


def test_cli_prints_the_decomposition_and_why_tools_were_skipped(tmp_path, fake_gpu):
    result = runner.invoke(app, ["profile", "--impl", "torch_eager", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for text in ("launch overhead", "165.00", "reduce_kernel", "not used: nsys: nsys not found", "profile.parquet"):
        assert text in result.output


def test_cli_explicit_tool_that_is_missing(tmp_path, fake_gpu):
    result = runner.invoke(app, ["profile", "--impl", "torch_eager", "--tool", "ncu", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--tool ncu cannot run here: ncu not found" in result.output


def test_device_events_count_kernels_once():
    """torch.compile wraps each call in a record_function range; its GPU span is not device work."""
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(name, device, kind, ns):
        return SimpleNamespace(name=lambda: name, device_type=lambda: device, activity_type=lambda: kind,
                               duration_ns=lambda: ns)

    events = [event("aten::eq", cpu, "cpu_op", 9000), event("Torch-Compiled Region", cuda, "gpu_user_annotation", 4000),
              event("triton_poi_fused_eq_0", cuda, "kernel", 2500), event("Memset (Device)", cuda, "gpu_memset", 700)]
    prof = SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: events)))
    assert list(profile._device_events(prof)) == [("triton_poi_fused_eq_0", 2500.0), ("Memset (Device)", 700.0)]


# --- run_torch: a session that lost a kernel's record is not a profile --------------------------
def _kineto_session(launches: int, records: int):
    """A fake profiler session: `launches` kernel launch calls, the first `records` of them recorded."""
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(name, device, correlation):
        return SimpleNamespace(name=lambda: name, device_type=lambda: device, correlation_id=lambda: correlation,
                               duration_ns=lambda: 2_000)

    events = [event("cudaLaunchKernel", cpu, 10 + i) for i in range(launches)]
    events += [event(f"kernel_{i}", cuda, 10 + i) for i in range(records)]
    profiler = SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: events))

    class Session:
        def __init__(self, **_):
            self.profiler = profiler

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    return Session


@pytest.mark.parametrize("sessions, expected", [
    ([(2, 2), (2, 1), (2, 2)], "ok"),  # the warm-up session, one that lost a record, a clean one
    ([(2, 2), (2, 1), (2, 0), (2, 1)], "CUPTI lost kernel records in 2 of 3 sessions and recorded nothing in 1"),
    ([(2, 2), (2, 0), (2, 0), (2, 0)], "recorded no device activity in 3 sessions"),
])
def test_run_torch_retries_a_session_that_lost_a_kernel_record(monkeypatch, sessions, expected):
    queue = [_kineto_session(*counts) for counts in sessions]
    monkeypatch.setattr(torch.profiler, "profile", lambda **kw: queue.pop(0)(**kw))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr("sdbench.measure.timing.CUPTI_RETRY_PAUSE_S", 0.0)
    if expected == "ok":
        kernels = profile.run_torch(lambda: None, iters=1)
        assert sorted(kernel.kernel for kernel in kernels) == ["kernel_0", "kernel_1"]
        assert queue == []
    else:
        with pytest.raises(ToolFailed, match=expected):
            profile.run_torch(lambda: None, iters=1)


def test_profile_rows_name_the_physical_gpu_the_environment_read(monkeypatch):
    """A profile row's gpu_uuid is the environment's (the results schema's column), and the profile schema holds it."""
    from sdbench.measure import environment

    monkeypatch.setattr(environment, "collect", lambda device: {"gpu_name": "NVIDIA H200", "gpu_uuid": "88017e5f-8bf7"})
    found = profile._environment()
    assert found["gpu_uuid"] == "88017e5f-8bf7" and found["gpu_name"] == "NVIDIA H200"
    assert "gpu_uuid" in profile.profile_schema().names
