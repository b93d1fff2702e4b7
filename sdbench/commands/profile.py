"""`sdbench profile`: where one verification step's host wall time goes, kernel by kernel.

    host wall (CUDA events around one call, sdbench.measure.timing's `wall` view)
        = GPU time (the call's kernels, from a profiler) + launch overhead (everything else:
          Python and dispatcher, launch latency, gaps between kernels, host syncs)

Tools (`--tool`):
- `torch`: CUPTI through torch.profiler, in this process — works wherever CUDA does.
- `nsys`:  a child process (`python -m sdbench.commands.profile child SPEC`) under `nsys profile
           --trace=cuda --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi`, read back
           with `nsys stats --report cuda_gpu_kern_sum --format csv`.
- `ncu`:   the same child under ncu with NCU_METRICS (warp efficiency, branch uniformity, achieved
           occupancy, DRAM throughput, kernel duration), exported to .ncu-rep and read with `--csv`.
           ncu replays every kernel with clocks locked to base: its durations are per kernel in
           isolation, so it is the timing source only when asked for (`--tool ncu`).
- `auto`:  GPU time from the best timing tool that works (nsys, else torch) plus ncu's counters when
           they are readable; every tool not used is reported with the reason.

One child process per (tool, implementation): the kernels in a report belong to that implementation
alone, whatever their names. The child warms up outside the capture range (compilation, autotuning,
lazy init), then runs `profiled_iters` calls between cudaProfilerStart and cudaProfilerStop.

Results go to `<out>/profile-<run_id>/profile.parquet` (schema: `profile_schema()`, documented in
docs/profiling.md), beside the tool reports. A subfolder: they are not sweep measurements, and the
report and `sweep --resume` read only a results folder's own parquet files.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import sdbench
from sdbench.errors import SdbenchError, closest, writable_folder
from sdbench.measure import results, tools
from sdbench.ops.workload import VerifyConfig

TOOLS = ("auto", "nsys", "ncu", "torch")
NCU_METRICS = (
    "smsp__thread_inst_executed_per_inst_executed.ratio",  # active threads per warp instruction (of 32)
    "smsp__sass_average_branch_targets_threads_uniform.pct",  # branches all threads of a warp agree on
    "sm__warps_active.avg.pct_of_peak_sustained_active",  # achieved occupancy
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",  # DRAM bandwidth used, % of peak
    "gpu__time_duration.sum",  # kernel duration (ns) under ncu's replay
)
# Short column names for the counters (table headers, parquet columns).
COUNTER_COLUMNS = {
    "smsp__thread_inst_executed_per_inst_executed.ratio": "threads_per_inst",
    "smsp__sass_average_branch_targets_threads_uniform.pct": "branch_uniformity_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
}
WARP_SIZE = 32
NCU_ITERS = 2  # ncu replays each kernel for its counters: a couple of calls show every kernel
CHILD_TIMEOUT_S = 300.0
PROFILE_SCHEMA_VERSION = 1
PROFILE_FILE = "profile.parquet"  # in <out>/profile-<run_id>/ (see run_folder)


class ToolFailed(SdbenchError):
    """A profiler ran but produced nothing usable (auto falls back; an explicit --tool reports it)."""


@dataclass(frozen=True)
class ProfileRequest:
    op: str
    impls: tuple[str, ...]  # registry names; empty: every implementation available here
    config: VerifyConfig
    tool: str = "auto"
    warmup: int = 20
    iters: int = 200
    profiled_iters: int = 10
    out_dir: str = "results"

    def __post_init__(self) -> None:
        if self.tool not in TOOLS:
            raise SdbenchError(f"unknown --tool {self.tool!r}{closest(self.tool, list(TOOLS))}; choose one of {', '.join(TOOLS)}")
        for option, value, minimum in (("--warmup", self.warmup, 0), ("--iters", self.iters, 1),
                                       ("--profile-iters", self.profiled_iters, 1)):
            if value < minimum:
                raise SdbenchError(f"{option} must be >= {minimum}, got {value}")


@dataclass
class KernelTime:
    """One kernel of one implementation, per iteration (one call of the implementation)."""

    kernel: str
    calls_per_iter: float
    gpu_us: float | None  # device time per iteration
    metrics: dict[str, float] = field(default_factory=dict)  # ncu counters (means over launches)

    @property
    def short_name(self) -> str:
        return tools.short_kernel_name(self.kernel)


@dataclass
class ImplProfile:
    impl: str
    backend: str
    wall_us: float | None = None  # median host wall per call (CUDA events)
    timing_tool: str | None = None
    kernels: list[KernelTime] = field(default_factory=list)  # from the timing tool
    counters: list[KernelTime] = field(default_factory=list)  # from ncu
    error: str | None = None
    counters_error: str | None = None

    @property
    def gpu_us(self) -> float | None:
        times = [kernel.gpu_us for kernel in self.kernels if kernel.gpu_us is not None]
        return sum(times) if times else None

    @property
    def launch_overhead_us(self) -> float | None:
        if self.wall_us is None or self.gpu_us is None:
            return None
        return self.wall_us - self.gpu_us

    @property
    def launches_per_iter(self) -> float | None:
        return sum(kernel.calls_per_iter for kernel in self.kernels) if self.kernels else None


@dataclass
class ToolChoice:
    timing: str  # nsys | torch | ncu: where GPU time comes from
    counters: bool  # also run ncu for its counters
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (tool, why it is not used)


@dataclass
class ProfileReport:
    request: ProfileRequest
    choice: ToolChoice
    run_id: str
    impls: list[ImplProfile]
    skipped_impls: list[tuple[str, str]]  # (impl, reason)
    parquet_path: Path | None = None
    reports_dir: Path | None = None
    notes: list[str] = field(default_factory=list)


# --- choosing a tool ---------------------------------------------------------------------------
def tool_unavailable(tool: str, env: dict[str, str] | None = None) -> str | None:
    """Why tool cannot profile here (None when it can). Fast: no profiling run."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if tool == "torch":
        return None
    info = tools.find_tool(tool, env)
    if not info.found:
        return f"{tool} not found (looked on PATH, CUDA_HOME, /usr/local/cuda*, /opt/nvidia)"
    if tool == "nsys":
        importer, missing = tools.importer_missing_libraries(info.path, env)
        if missing:
            return f"nsys's QdstrmImporter cannot load {', '.join(missing)}; fix: {tools.importer_fix(missing)}"
    # ncu's counter permission is not guessed from driver settings here: the first profiled kernel
    # tells (ERR_NVGPUCTRPERM), and auto then drops the counters with that reason.
    return None


def choose_tools(requested: str, unavailable: dict[str, str | None]) -> ToolChoice:
    """Which tools run, given why each cannot (pure: `unavailable` maps tool -> reason or None)."""
    if requested != "auto":
        reason = unavailable.get(requested)
        if reason is not None:
            raise SdbenchError(f"--tool {requested} cannot run here: {reason}")
        others = [(tool, f"--tool {requested} was asked for") for tool in ("nsys", "ncu", "torch") if tool != requested]
        return ToolChoice(timing=requested, counters=requested == "ncu", skipped=others)
    works = {tool: unavailable.get(tool) is None for tool in ("nsys", "ncu", "torch")}
    skipped = [(tool, unavailable[tool]) for tool in ("nsys", "ncu", "torch") if not works[tool]]
    if works["nsys"]:
        timing = "nsys"
        if works["torch"]:
            skipped.append(("torch", "nsys measures the same kernels from outside the process"))
    elif works["torch"]:
        timing = "torch"
    elif works["ncu"]:
        timing = "ncu"
    else:
        reasons = "; ".join(f"{tool}: {reason}" for tool, reason in skipped)
        raise SdbenchError(f"no profiler works here ({reasons})")
    return ToolChoice(timing=timing, counters=works["ncu"], skipped=skipped)


# --- aggregation (pure) ------------------------------------------------------------------------
def aggregate_kernels(events: Iterable[tuple[str, float]], iters: int) -> list[KernelTime]:
    """(kernel name, duration ns) per device event over `iters` calls -> per-iteration kernel rows,
    longest first."""
    totals: dict[str, list[float]] = {}
    for name, duration_ns in events:
        entry = totals.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += duration_ns
    rows = [KernelTime(name, count / iters, total_ns / 1000.0 / iters) for name, (count, total_ns) in totals.items()]
    return sorted(rows, key=lambda row: -(row.gpu_us or 0.0))


def kernels_from_nsys(kernels: list[tools.NsysKernel], iters: int) -> list[KernelTime]:
    rows = [KernelTime(k.name, k.instances / iters, k.total_ns / 1000.0 / iters) for k in kernels]
    return sorted(rows, key=lambda row: -(row.gpu_us or 0.0))


def kernels_from_ncu(launches: list[tools.NcuLaunch], iters: int) -> list[KernelTime]:
    """Per kernel: calls and ncu duration per iteration, and the mean of each counter over its launches."""
    grouped: dict[str, list[tools.NcuLaunch]] = {}
    for launch in launches:
        grouped.setdefault(launch.kernel, []).append(launch)
    rows = []
    for name, group in grouped.items():
        durations = [launch.metrics["gpu__time_duration.sum"] for launch in group if "gpu__time_duration.sum" in launch.metrics]
        metrics = {}
        for metric in COUNTER_COLUMNS:
            values = [launch.metrics[metric] for launch in group if metric in launch.metrics]
            if values:
                metrics[metric] = sum(values) / len(values)
        gpu_us = sum(durations) / 1000.0 / iters if durations else None
        rows.append(KernelTime(name, len(group) / iters, gpu_us, metrics))
    return sorted(rows, key=lambda row: -(row.gpu_us or 0.0))


def warp_efficiency_pct(kernel: KernelTime) -> float | None:
    """Active threads per executed warp instruction, as % of the 32 lanes (100 = no divergence)."""
    ratio = kernel.metrics.get("smsp__thread_inst_executed_per_inst_executed.ratio")
    return None if ratio is None else 100.0 * ratio / WARP_SIZE


# --- the child process -------------------------------------------------------------------------
def child_spec(op: str, impl: str, config: VerifyConfig, warmup: int, iters: int) -> str:
    return json.dumps({"op": op, "impl": impl, "config": dataclasses.asdict(config), "warmup": warmup, "iters": iters})


def child_argv(spec: str) -> list[str]:
    return [sys.executable, "-m", "sdbench.commands.profile", "child", spec]


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the child: this checkout of sdbench first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    package_root = str(Path(sdbench.__file__).resolve().parent.parent)  # the folder holding sdbench/
    current = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{package_root}:{current}" if current else package_root
    return env


def child_main(spec_text: str) -> None:
    """Run one implementation: warm up, then `iters` calls inside cudaProfilerStart/Stop."""
    import torch

    from sdbench import registry
    from sdbench.ops import make_workload

    spec = json.loads(spec_text)
    config = VerifyConfig(**spec["config"])
    impl = registry.get(spec["op"], spec["impl"])
    run = impl.prepare(make_workload(spec["op"], config, "cuda"))
    for _ in range(max(spec["warmup"], 1)):
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(spec["iters"]):
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _tail(text: str, lines: int = 1) -> str:
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) if kept else "no output"


def run_nsys(nsys_path: str, spec: str, report_base: Path, iters: int) -> list[KernelTime]:
    """Profile the child under nsys; per-iteration kernel times from cuda_gpu_kern_sum."""
    report_base = report_base.resolve()  # the child runs in report_base's folder
    env = tools.nsys_env(child_env())
    argv = [
        nsys_path, "profile", "--trace=cuda", "--sample=none", "--cpuctxsw=none",
        "--cuda-graph-trace=node",  # kernels inside CUDA graphs (reduce-overhead peers) one by one
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "-o", str(report_base), "-f", "true", *child_argv(spec),
    ]
    code, output = tools.run_quietly(argv, env=env, timeout=CHILD_TIMEOUT_S, cwd=str(report_base.parent))
    report = report_base.with_name(report_base.name + ".nsys-rep")
    if not report.exists():
        problem = tools.nsys_report_problem(output, report_base, code) or _tail(output, 2)
        if "QdstrmImporter" in problem or "Importer" in output:
            problem += f"; fix: {tools.importer_fix(['libdw.so.1'])}"
        raise ToolFailed(f"nsys: {problem}")
    code, stats = tools.run_quietly(
        [nsys_path, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--force-export=true", str(report)],
        env=env, timeout=CHILD_TIMEOUT_S, cwd=str(report_base.parent),
    )
    kernels = tools.parse_nsys_kern_sum(stats)
    if not kernels:
        raise ToolFailed(f"nsys stats found no kernels in {report} (exit {code}): {_tail(stats)}")
    return kernels_from_nsys(kernels, iters)


def run_ncu(ncu_path: str, spec: str, report_base: Path, iters: int) -> list[KernelTime]:
    """Profile the child under ncu with NCU_METRICS; per-kernel counters from the exported report."""
    report_base = report_base.resolve()  # the child runs in report_base's folder
    argv = [
        ncu_path, "--profile-from-start", "off", "--metrics", ",".join(NCU_METRICS),
        "-o", str(report_base), "-f", *child_argv(spec),
    ]
    code, output = tools.run_quietly(argv, env=child_env(), timeout=CHILD_TIMEOUT_S, cwd=str(report_base.parent))
    if tools.is_ncu_permission_error(output):
        raise ToolFailed(f"ncu: ERR_NVGPUCTRPERM, GPU performance counters are not readable; fix: {tools.NCU_PERMISSION_FIX}")
    report = report_base.with_name(report_base.name + ".ncu-rep")
    if not report.exists():
        raise ToolFailed(f"ncu wrote no report (exit {code}): {_tail(output, 2)}")
    code, text = tools.run_quietly(
        [ncu_path, "--import", str(report), "--csv", "--page", "details", "--print-units", "base"],
        timeout=CHILD_TIMEOUT_S,
    )
    launches = tools.parse_ncu_csv(text)
    if not launches:
        raise ToolFailed(f"ncu recorded no kernels in {report} (exit {code}): {_tail(text)}")
    return kernels_from_ncu(launches, iters)


def run_torch(run, iters: int) -> list[KernelTime]:
    """CUPTI device events of `iters` calls, in this process."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities):  # the first session initialises CUPTI; it can miss events
        run()
        torch.cuda.synchronize()
    from sdbench.measure.timing import CUPTI_ATTEMPTS, CUPTI_RETRY_PAUSE_S, lost_kernel_records

    silent = lossy = 0
    for attempt in range(CUPTI_ATTEMPTS):  # a session can record nothing, or lose a kernel's records
        if attempt:
            time.sleep(CUPTI_RETRY_PAUSE_S)
        with profile(activities=activities) as prof:
            for _ in range(iters):
                run()
            torch.cuda.synchronize()
        events = list(_device_events(prof))
        if not events:
            silent += 1
        elif lost_kernel_records(prof.profiler.kineto_results.events()):
            lossy += 1
        else:
            return aggregate_kernels(events, iters)
    if lossy:
        raise ToolFailed(f"CUPTI lost kernel records in {lossy} of {CUPTI_ATTEMPTS} sessions and recorded nothing "
                         f"in {silent}: the per-kernel table would miss kernels")
    raise ToolFailed(f"torch.profiler recorded no device activity in {CUPTI_ATTEMPTS} sessions (CUPTI unavailable?)")


def _device_events(prof) -> Iterable[tuple[str, float]]:
    """(name, duration ns) of every device-side event (kernels, memcpy, memset) in a profile."""
    import torch

    from sdbench.measure.timing import is_device_work

    cpu = torch.autograd.DeviceType.CPU
    for event in prof.profiler.kineto_results.events():
        if event.device_type() == cpu or not is_device_work(event):
            continue
        yield event.name(), float(event.duration_ns())


# --- the whole command -------------------------------------------------------------------------
def select_impls(request: ProfileRequest, device: str = "cuda"):
    """(implementations to profile, [(name, why skipped)]). Named ones must run here; by default
    every implementation of the op that can run this config here."""
    from sdbench import registry

    chosen, skipped = [], []
    for impl in registry.select(request.op, list(request.impls)):
        reason = impl.unavailable_reason(device, request.config)
        if reason is None:
            chosen.append(impl)
        elif request.impls:
            raise SdbenchError(f"{request.op}/{impl.name} cannot run here: {reason}")
        else:
            skipped.append((impl.name, reason))
    if not chosen:
        raise SdbenchError(f"no {request.op} implementation can run this config here: "
                           + "; ".join(f"{name}: {why}" for name, why in skipped))
    return chosen, skipped


def validate(request: ProfileRequest) -> None:
    """Every input check that needs no GPU (so it fails fast and the same way everywhere)."""
    from sdbench import registry

    if request.op not in registry.OPERATIONS:
        registry.get(request.op, "")  # raises the one-line error with a suggestion
    registry.select(request.op, list(request.impls))  # unknown implementation: one line with a suggestion
    writable_folder(request.out_dir)


def run_profile(request: ProfileRequest, progress=None) -> ProfileReport:
    """Measure wall time, profile every implementation, write the parquet; see the module doc."""
    import torch

    validate(request)
    if not torch.cuda.is_available():
        raise SdbenchError("profile needs a CUDA device and this machine has none "
                           "(CPU timings: `sdbench sweep --device cpu`; what runs here: `sdbench doctor`)")
    unavailable = {tool: tool_unavailable(tool) for tool in ("nsys", "ncu", "torch")}
    choice = choose_tools(request.tool, unavailable)
    impls, skipped_impls = select_impls(request)
    run_id = results.new_run_id()
    reports_dir = run_folder(request.out_dir, run_id)
    report = ProfileReport(request, choice, run_id, [ImplProfile(i.name, i.backend) for i in impls], skipped_impls)
    _measure_wall(request, impls, report.impls)
    reports_dir.mkdir(parents=True, exist_ok=True)
    report.reports_dir = reports_dir
    for impl, profiled in zip(impls, report.impls, strict=True):
        if profiled.error is not None:  # it could not even be prepared: nothing to profile
            continue
        if progress:
            progress(f"{impl.name}: {choice.timing}" + (" + ncu" if choice.counters and choice.timing != "ncu" else ""))
        _profile_one(request, impl, profiled, choice, reports_dir, report.notes)
    report.parquet_path = write_profile_parquet(report, reports_dir)
    return report


def run_folder(out_dir: str | Path, run_id: str) -> Path:
    """<out>/profile-<run_id>/: the run's parquet and tool reports. A subfolder, so that `sdbench report`
    and `sweep --resume`, which read a results folder's own parquet files, never meet profile rows."""
    return Path(out_dir) / f"profile-{run_id}"


def _measure_wall(request: ProfileRequest, impls, profiles: list[ImplProfile]) -> None:
    """Median host wall per call, all implementations round-robin (sdbench.measure.timing's wall view)."""
    from sdbench.measure import timing
    from sdbench.ops import make_workload

    workload = make_workload(request.op, request.config, "cuda")
    runs = {}
    for impl, profiled in zip(impls, profiles, strict=True):
        try:
            runs[impl.name] = impl.prepare(workload)
        except Exception as err:
            profiled.error = f"prepare failed: {type(err).__name__}: {err}"
    options = timing.TimingOptions(warmup=request.warmup, iters=request.iters, views=("wall",))
    measured = timing.measure(runs, "cuda", options)
    for profiled in profiles:
        result = measured.get(profiled.impl, {}).get("wall")
        if result is None:
            continue
        if result.stats is not None:
            profiled.wall_us = result.stats.median_us
        elif profiled.error is None:
            profiled.error = f"wall timing: {result.reason}"


def _profile_one(request: ProfileRequest, impl, profiled: ImplProfile, choice: ToolChoice, reports_dir: Path,
                 notes: list[str]) -> None:
    """Profile impl with the chosen tools. Under auto, a tool that fails for a reason of the machine
    (importer, counter permission) is dropped for the rest of the run, with a note."""
    auto = request.tool == "auto"
    base = reports_dir / impl.name
    try:
        if choice.timing == "nsys":
            spec = child_spec(request.op, impl.name, request.config, request.warmup, request.profiled_iters)
            try:
                profiled.kernels = run_nsys(tools.find_tool("nsys").path, spec, base, request.profiled_iters)
                profiled.timing_tool = "nsys"
            except ToolFailed as err:
                if not auto or tool_unavailable("torch") is not None:
                    raise
                notes.append(f"nsys failed, GPU time from torch instead: {err}")
                choice.skipped = [(tool, why) for tool, why in choice.skipped if tool != "torch"] + [("nsys", str(err))]
                choice.timing = "torch"
        if choice.timing == "torch":
            profiled.kernels = _torch_kernels(request, impl)
            profiled.timing_tool = "torch"
        if choice.timing == "ncu" or choice.counters:
            spec = child_spec(request.op, impl.name, request.config, request.warmup, NCU_ITERS)
            try:
                profiled.counters = run_ncu(tools.find_tool("ncu").path, spec, base, NCU_ITERS)
            except ToolFailed as err:
                if choice.timing == "ncu" or not auto:
                    raise
                profiled.counters_error = str(err)
                if tools.is_ncu_permission_error(str(err)):
                    notes.append(f"ncu counters dropped: {err}")
                    choice.skipped.append(("ncu", str(err)))
                    choice.counters = False
            if choice.timing == "ncu":
                profiled.kernels, profiled.timing_tool = profiled.counters, "ncu"
    except ToolFailed as err:
        if not auto:
            raise
        profiled.error = str(err)


def _torch_kernels(request: ProfileRequest, impl) -> list[KernelTime]:
    import torch

    from sdbench.ops import make_workload

    run = impl.prepare(make_workload(request.op, request.config, "cuda"))
    for _ in range(max(request.warmup, 1)):
        run()
    torch.cuda.synchronize()
    return run_torch(run, request.profiled_iters)


# --- parquet -----------------------------------------------------------------------------------
def profile_schema():
    import pyarrow as pa

    strings = ("run_id", "timestamp", "gpu_name", "gpu_cc", "gpu_uuid", "driver", "cuda_version", "torch_version",
               "sdbench_version", "hostname", "device", "op", "dist", "token_dtype", "kv_dtype", "impl", "backend",
               "row", "tool", "status", "reason", "kernel", "kernel_short")
    ints = ("batch_size", "gamma", "kv_dim", "vocab_size", "seed", "warmup", "iters", "profiled_iters")
    floats = ("alpha", "wall_us", "gpu_us", "launch_overhead_us", "launches_per_iter", "kernel_calls_per_iter",
              "kernel_gpu_us", "warp_efficiency_pct", *COUNTER_COLUMNS.values())
    fields = [("profile_schema_version", pa.int32())]
    fields += [(name, pa.string()) for name in strings]
    fields += [(name, pa.int32()) for name in ints]
    fields += [(name, pa.float64()) for name in floats]
    return pa.schema(fields, metadata={"sdbench_profile_schema_version": str(PROFILE_SCHEMA_VERSION)})


def _environment() -> dict:
    try:
        from sdbench.measure import environment as envinfo

        found = envinfo.collect("cuda")
    except Exception:
        found = {}
    import torch

    return {
        "gpu_name": found.get("gpu_name"), "gpu_cc": found.get("gpu_cc"), "gpu_uuid": found.get("gpu_uuid"),
        "driver": found.get("driver"),
        "cuda_version": found.get("cuda_version", torch.version.cuda), "torch_version": torch.__version__,
        "sdbench_version": found.get("sdbench_version"), "hostname": found.get("hostname"), "device": "cuda",
    }


def profile_rows(report: ProfileReport, environment: dict) -> list[dict]:
    """One `impl` row per implementation (the decomposition), then one `kernel` row per kernel and tool."""
    request, cfg = report.request, report.request.config
    common = {
        "run_id": report.run_id, "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **environment, "op": request.op, "batch_size": cfg.batch_size, "gamma": cfg.gamma, "alpha": cfg.alpha,
        "kv_dim": cfg.kv_dim, "vocab_size": cfg.vocab_size, "seed": cfg.seed, "dist": cfg.dist,
        "token_dtype": cfg.token_dtype, "kv_dtype": cfg.kv_dtype, "warmup": request.warmup, "iters": request.iters,
    }
    rows = []
    for profiled in report.impls:
        impl_columns = {
            **common, "impl": profiled.impl, "backend": profiled.backend, "wall_us": profiled.wall_us,
            "gpu_us": profiled.gpu_us, "launch_overhead_us": profiled.launch_overhead_us,
            "launches_per_iter": profiled.launches_per_iter,
        }
        rows.append({**impl_columns, "row": "impl", "tool": profiled.timing_tool,
                     "status": "error" if profiled.error else "ok", "reason": profiled.error or profiled.counters_error,
                     "profiled_iters": NCU_ITERS if profiled.timing_tool == "ncu" else request.profiled_iters})
        timing_iters = NCU_ITERS if profiled.timing_tool == "ncu" else request.profiled_iters
        sources = [(profiled.timing_tool, profiled.kernels, timing_iters)]
        if profiled.timing_tool != "ncu":  # with --tool ncu the timing rows are the ncu rows
            sources.append(("ncu", profiled.counters, NCU_ITERS))
        for tool, kernels, iters in sources:
            for kernel in kernels:
                rows.append({
                    **impl_columns, "row": "kernel", "tool": tool, "status": "ok", "profiled_iters": iters,
                    "kernel": kernel.kernel, "kernel_short": kernel.short_name,
                    "kernel_calls_per_iter": kernel.calls_per_iter, "kernel_gpu_us": kernel.gpu_us,
                    "warp_efficiency_pct": warp_efficiency_pct(kernel),
                    **{column: kernel.metrics.get(metric) for metric, column in COUNTER_COLUMNS.items()},
                })
    return rows


def write_profile_parquet(report: ProfileReport, folder: str | Path, environment: dict | None = None) -> Path:
    """Write the report's rows to folder/PROFILE_FILE (a temporary name, then rename)."""
    import pyarrow as pa


    schema = profile_schema()
    rows = profile_rows(report, _environment() if environment is None else environment)
    columns = {name: [row.get(name) for row in rows] for name in schema.names}
    columns["profile_schema_version"] = [PROFILE_SCHEMA_VERSION] * len(rows)
    table = pa.Table.from_pydict(columns, schema=schema)
    return results.write_table_atomically(table, Path(folder) / PROFILE_FILE)


if __name__ == "__main__":  # the child entry: python -m sdbench.commands.profile child SPEC
    if len(sys.argv) != 3 or sys.argv[1] != "child":
        sys.exit("usage: python -m sdbench.commands.profile child SPEC_JSON (internal: used by `sdbench profile`)")
    child_main(sys.argv[2])
