"""The only timing code: three views of the same prepared callables, interleaved, every sample kept.

Views (one per way a serving engine pays for the work):
- `wall`:  a CUDA-event pair around each eager call, with the device idle before the call, so the
           host's launch cost is inside the pair — what a host-driven decode loop pays.
- `graph`: the callable captured in a CUDA graph as `calls_per_sample` back-to-back copies, an event
           pair around each replay, the elapsed time divided by the copies — what the operation costs
           inside a graph-captured serving step (its kernels plus the gaps between graph nodes). The
           graph's launch latency is host-side and paid once per step, not per operation, and on a
           virtualised host it moves 2x between sessions (10-22 µs): a blocking kernel (nvbench's trick,
           a GPU spin of ~100-200 µs) holds the stream while the host queues the start event, the replay
           and the end event, so the pair times the replay alone; the copies (~GRAPH_TARGET_US of work
           per replay) amortise the graph's device-side start. With a cold L2 each replay holds one copy
           (a flush between copies would be timed). Callables that sync the host cannot be captured.
- `gpu`:   device time only: the time CUPTI's (torch.profiler's) kernel, memcpy and memset records cover
           per iteration (their durations summed less any overlap: a kernel launched with programmatic
           dependent launch starts inside the one before it; `busy_us`), over a bounded number of
           iterations (the profiler's post-processing is the cost),
           after untimed warm-up calls outside the profiler session. Each timed call is queued behind
           the blocking kernel (untimed, outside the iteration), so the launches the host makes within
           its ~200 µs reach the GPU before the call's first kernel starts, as when an engine's host runs
           ahead of the device. On an idle device instead, a kernel launched with programmatic dependent
           launch whose launch arrives after its primary has ended loses the overlap it gets when queued
           (perf-notes, "Session 29"). A call whose launches outlast the spin (an eager chain of dozens)
           loses nothing else: idle gaps between kernels count in neither case. Warm L2: an untimed call of the
           same callable right before each timed one, so the L2 holds its own data, not the previous
           callable's. CUPTI can lose every record of one kernel in a session while keeping the others:
           each kernel launch in an iteration must have its device record, or that callable's session
           is run again, and a callable that never gets a clean session is `unavailable`, not a number.
- `cpu`:   on a CPU device, `time.perf_counter_ns` around each call.

Every view runs its callables round-robin (the start rotates each round), so drift on a shared,
virtualised machine lands on all of them alike; the launch floor (an empty kernel) is just one more
callable in the rotation. Timing knows nothing about workloads, the registry or parquet: it takes
zero-argument callables and returns per-iteration samples in microseconds.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from sdbench.errors import describe_error

LAUNCH_FLOOR = "launch_floor"
CUDA_VIEWS = ("wall", "graph", "gpu")
CPU_VIEWS = ("cpu",)


# Eager calls made on a side stream before capture: lazy init (cuBLAS handles, Triton autotuning,
# allocator growth) must not happen inside the capture.
CAPTURE_WARMUP_CALLS = 3
_MARK = "sdbench-iter:"  # torch.profiler annotation prefix of one timed iteration
CPU_FLUSH_BYTES = 64 * 2**20  # larger than the last-level cache of the CI machines
# Graph view: copies per replay chosen so one replay holds about GRAPH_TARGET_US of work, between 1 and
# GRAPH_MAX_COPIES (an empty kernel, ~1.2 µs in a graph, gets the most: ~0.05-0.1 µs of launch latency
# left per sample). GRAPH_PROBE_COPIES copies estimate the per-copy time first.
GRAPH_TARGET_US = 500.0
GRAPH_MAX_COPIES = 256
GRAPH_PROBE_COPIES = 8
GRAPH_PROBE_REPLAYS = 3
# The blocking kernel before each timed graph replay and each timed gpu-view call: clock64 cycles of spin (~200 µs
# at 1.98 GHz), longer than the host needs to queue an event, a replay of up to GRAPH_MAX_COPIES nodes and another
# event, or a few Triton launches under the profiler.
BLOCKING_CYCLES = 400_000


# --- statistics --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stats:
    median_us: float
    p95_us: float
    min_us: float
    mean_us: float
    std_us: float  # sample standard deviation (n - 1); 0.0 for a single sample


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(samples)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(samples_us: Sequence[float]) -> Stats | None:
    """median / p95 / min / mean / std of the samples; None when there are none."""
    if not samples_us:
        return None
    count = len(samples_us)
    mean = math.fsum(samples_us) / count
    variance = math.fsum((x - mean) ** 2 for x in samples_us) / (count - 1) if count > 1 else 0.0
    return Stats(
        median_us=percentile(samples_us, 50.0),
        p95_us=percentile(samples_us, 95.0),
        min_us=min(samples_us),
        mean_us=mean,
        std_us=math.sqrt(variance),
    )


def median_noise(samples_us: Sequence[float]) -> float | None:
    """The relative standard error of the median, distribution-free (nvbench-style noise).

    The 95% confidence interval of a median from order statistics spans ranks n/2 ± 0.98·√n (sorted
    samples, no assumption on their distribution: launch-time samples are skewed and heavy-tailed);
    half its width over 1.96 is the median's standard error. Returned relative to the median; None with
    fewer than 8 samples (the interval would reach past the extremes).
    """
    count = len(samples_us)
    if count < 8:
        return None
    ordered = sorted(samples_us)
    spread = 0.98 * math.sqrt(count)
    low = ordered[max(0, math.floor(count / 2 - spread))]
    high = ordered[min(count - 1, math.ceil(count / 2 + spread))]
    median = percentile(ordered, 50.0)
    return (high - low) / 2.0 / 1.96 / median if median > 0 else None


DRIFT_QUARTERS = 4
MAX_FLOOR_DRIFT = 0.05  # the wall view's run-to-run bar: a row whose ratio to its floor moves more, moves between runs


def floor_drift(samples_us: Sequence[float], floor_us: Sequence[float]) -> float | None:
    """How much a row's ratio to its floor moved while it was sampled, beyond sampling error: the spread
    (max - min) of the ratio's median over DRIFT_QUARTERS consecutive stretches of the run, relative to its
    overall median, less twice the 95% half-width of the least certain stretch median (0 when the spread is
    within what sampling alone gives).

    Sample i of a row and of its floor come from the same round of the rotation, so a machine that slows
    both alike leaves the ratio flat; a state that reaches one launch path and not the other (the host's
    caches, the Python launcher against the dispatcher) moves it, and then the row will not repeat against
    its floor in another run either. None with fewer than two samples per stretch."""
    count = min(len(samples_us), len(floor_us))
    ratios = [row / floor for row, floor in zip(samples_us[:count], floor_us[:count], strict=True) if floor > 0]
    if len(ratios) < 2 * DRIFT_QUARTERS:
        return None
    stretch = len(ratios) // DRIFT_QUARTERS
    quarters = [ratios[i * stretch:(i + 1) * stretch] for i in range(DRIFT_QUARTERS)]
    medians = [percentile(quarter, 50.0) for quarter in quarters]
    overall = percentile(ratios, 50.0)
    if not overall > 0:
        return None
    # median_noise is a relative standard error: 1.96 of it is a 95% half-width, and two medians differ by
    # up to two half-widths by chance
    allowance = 2.0 * 1.96 * max((median_noise(quarter) or 0.0) * median for quarter, median in zip(quarters, medians, strict=True))
    return max(0.0, (max(medians) - min(medians) - allowance) / overall)


def is_noisy(samples_us: Sequence[float], max_noise: float) -> bool:
    """Above the noise threshold, or too few samples to tell."""
    noise = median_noise(samples_us)
    return noise is None or noise > max_noise


# --- results -----------------------------------------------------------------------------------
@dataclass
class ViewResult:
    """One callable in one view: every sample, or why there are none."""

    samples_us: list[float] = field(default_factory=list)
    status: str = "ok"  # ok | unavailable (cannot be measured this way) | error (raised while timing)
    reason: str | None = None
    calls_per_sample: int = 1  # graph view: copies of the call in each timed replay (a sample = elapsed / copies)

    @property
    def stats(self) -> Stats | None:
        return summarize(self.samples_us) if self.status == "ok" else None


Timings = dict[str, dict[str, ViewResult]]  # callable name -> view -> result


@dataclass(frozen=True)
class TimingOptions:
    warmup: int = 20
    iters: int = 200
    gpu_iters: int = 50  # iterations profiled for the gpu view (capped at iters)
    cold_l2: bool = False  # read a buffer of 2x L2 between iterations, outside the timed region (l2_flush)
    views: tuple[str, ...] | None = None  # None: every view of the device
    # Noise-aware sampling (wall and graph views): after the first `iters` samples, keep taking batches of
    # `iters` while a callable's median noise exceeds max_noise and less than max_time_s was spent on the view.
    max_noise: float = 0.01
    max_time_s: float = 0.0  # 0: a fixed sample count (iters), no extra batches
    min_time_s: float = 0.0  # keep taking batches, noisy or not, until this long was spent on the view (<= max_time_s)

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.iters < 1:
            raise ValueError(f"iters must be >= 1, got {self.iters}")
        if self.gpu_iters < 1:
            raise ValueError(f"gpu_iters must be >= 1, got {self.gpu_iters}")
        if not self.max_noise > 0:
            raise ValueError(f"max_noise must be > 0, got {self.max_noise}")
        if self.max_time_s < 0:
            raise ValueError(f"max_time_s must be >= 0, got {self.max_time_s}")
        if not 0 <= self.min_time_s <= self.max_time_s:
            raise ValueError(f"min_time_s must be in [0, max_time_s={self.max_time_s}], got {self.min_time_s}")


def views_for(device: str | torch.device, options: TimingOptions | None = None) -> tuple[str, ...]:
    """The views measured on device (the options' subset, if given)."""
    native = CUDA_VIEWS if torch.device(device).type == "cuda" else CPU_VIEWS
    if options is None or options.views is None:
        return native
    unknown = [view for view in options.views if view not in native]
    if unknown:
        raise ValueError(f"view(s) {unknown} cannot be measured on {device}; choose from {native}")
    return tuple(view for view in native if view in options.views)


def _rotation(names: list[str], round_index: int) -> list[str]:
    if not names:
        return names
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


# --- cold L2 -----------------------------------------------------------------------------------
def l2_flush(device: str | torch.device, dirty: bool = False) -> Callable[[], None]:
    """A callable that evicts the cache by reading a buffer of at least 2x its size, so the cache holds
    clean lines of other data and the timed call pays for its own misses only. dirty: write the buffer
    instead (the flush before 2026-11-25), which leaves the cache full of dirty lines whose write-back the
    next timed call pays (on the H200 up to ~8 µs a call, less where the call evicts less than the L2 holds;
    docs/perf-notes.md, "From logits, session 10")."""
    device = torch.device(device)
    if device.type == "cuda":
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20
        size = 2 * l2_bytes
    else:
        size = CPU_FLUSH_BYTES
    buffer = torch.zeros(size // 8, dtype=torch.int64, device=device)
    if dirty:
        return buffer.zero_
    return buffer.sum  # a read of every line (its one-number result is a negligible write)


# --- the views ---------------------------------------------------------------------------------
def measure(
    callables: Mapping[str, Callable[[], object]],
    device: str | torch.device,
    options: TimingOptions | None = None,
    *,
    not_capturable: Mapping[str, str] | None = None,
) -> Timings:
    """Time every callable in every view of device, round-robin within each view.

    not_capturable maps a name to the reason it must not be captured in a CUDA graph (it syncs the
    host, or it replays a graph of its own); its graph view is `unavailable` with that reason.
    A callable that raises is `error` in that view, with the exception, and leaves the rotation.
    """
    options = options or TimingOptions()
    device = torch.device(device)
    flush = l2_flush(device) if options.cold_l2 else None
    not_capturable = dict(not_capturable or {})
    results: Timings = {name: {} for name in callables}
    for view in views_for(device, options):
        if view == "cpu":
            view_results = _measure_cpu(callables, options, flush)
        elif view == "wall":
            view_results = _measure_wall(callables, device, options, flush)
        elif view == "graph":
            view_results = _measure_graph(callables, device, options, flush, not_capturable)
        else:
            view_results = _measure_gpu(callables, device, options, flush)
        for name, result in view_results.items():
            results[name][view] = result
    return results


def _measure_cpu(callables, options: TimingOptions, flush) -> dict[str, ViewResult]:
    results = {name: ViewResult() for name in callables}
    active = list(callables)
    for round_index in range(options.warmup + options.iters):
        timed = round_index >= options.warmup
        for name in _rotation(active, round_index):
            if flush is not None:
                flush()
            try:
                start_ns = time.perf_counter_ns()
                callables[name]()
                elapsed_ns = time.perf_counter_ns() - start_ns
            except Exception as err:
                _fail(results[name], err, active, name)
                continue
            if timed:
                results[name].samples_us.append(elapsed_ns / 1000.0)
    return results


def _fail(result: ViewResult, err: BaseException, active: list[str], name: str) -> None:
    result.status, result.reason, result.samples_us = "error", f"raised {describe_error(err)}", []
    if name in active:
        active.remove(name)


def _timing_events(count: int) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
    """count (start, end) pairs, created AND recorded once now: torch.cuda.Event creates its CUDA event
    lazily inside its first record(), which would otherwise put cudaEventCreate inside a timed pair."""
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    for start, end in pairs:
        start.record()
        end.record()
    return pairs


def _event_loop(runs: Mapping[str, Callable[[], object]], device, options, flush, results,
                block: Callable[[], None] | None = None) -> None:
    """Round-robin: flush (untimed), idle device, [block,] event, one run, event. Elapsed times after each batch.

    block, when given, is a GPU spin queued before the start event (untimed): the run's launch is then
    queued before the start event fires, and the pair times device execution alone.

    The first batch has `warmup` untimed rounds and `iters` timed ones; further batches of `iters` run, all
    callables in rotation, as _another_batch decides (noise, min_time_s, max_time_s).
    """
    started = time.perf_counter()
    active = [name for name in runs if results[name].status == "ok"]
    warmup = options.warmup
    while active:
        events = {name: _timing_events(options.iters) for name in active}
        torch.cuda.synchronize(device)
        for round_index in range(warmup + options.iters):
            timed = round_index >= warmup
            for name in _rotation(active, round_index):
                if flush is not None:
                    flush()
                # An idle device before the start event puts the host's launch cost inside the pair.
                torch.cuda.synchronize(device)
                try:
                    if block is not None:
                        block()
                    if timed:
                        start, end = events[name][round_index - warmup]
                        start.record()
                        runs[name]()
                        end.record()
                    else:
                        runs[name]()
                except Exception as err:
                    _fail(results[name], err, active, name)
        torch.cuda.synchronize(device)
        for name in active:
            calls = results[name].calls_per_sample
            results[name].samples_us += [start.elapsed_time(end) * 1000.0 / calls for start, end in events[name]]
        warmup = 0
        spent = time.perf_counter() - started
        if not _another_batch(spent, options, [results[name].samples_us for name in active]):
            break


def _another_batch(spent_s: float, options: TimingOptions, samples: list[Sequence[float]]) -> bool:
    """Whether a view takes another batch of `iters`, every callable in rotation: never once max_time_s is
    spent; always until min_time_s is; between them while any callable is noisy (a callable sampled alone
    later would see another machine state than the floor beside it: the wall view drifts within a sweep)."""
    if spent_s >= options.max_time_s:
        return False
    if spent_s < options.min_time_s:
        return True
    return any(is_noisy(taken, options.max_noise) for taken in samples)


def _measure_wall(callables, device, options, flush) -> dict[str, ViewResult]:
    results = {name: ViewResult() for name in callables}
    _event_loop(callables, device, options, flush, results)
    return results


def capture_graph(run: Callable[[], object], device: str | torch.device | None = None, copies: int = 1):
    """Capture run in a CUDA graph, `copies` times back to back: returns (graph, the outputs the last
    copy produced).

    Those outputs are the graph's static buffers: every replay rewrites them in place.
    """
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    side_stream = torch.cuda.Stream(device=device)
    side_stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side_stream):
        for _ in range(CAPTURE_WARMUP_CALLS):
            run()
    torch.cuda.current_stream(device).wait_stream(side_stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(copies):
            outputs = run()
    torch.cuda.synchronize(device)
    return graph, outputs


def graph_copies(per_copy_us: float) -> int:
    """Copies per replay so that one replay holds about GRAPH_TARGET_US of work."""
    if not per_copy_us > 0:
        return GRAPH_MAX_COPIES
    return max(1, min(GRAPH_MAX_COPIES, round(GRAPH_TARGET_US / per_copy_us)))


def _block_stream() -> None:
    """The blocking kernel: a GPU spin that holds the stream while the host queues what follows it
    (the graph view's replay and events; the gpu view's timed call, launched outside its annotation so
    that no iteration counts it)."""
    torch.cuda._sleep(BLOCKING_CYCLES)


def _probe_us(graph, device, copies: int) -> float:
    """Per-copy time of a graph of `copies` copies: the median of a few replays timed as the view times them."""
    probe = {"probe": ViewResult(calls_per_sample=copies)}
    _event_loop({"probe": graph.replay}, device, TimingOptions(warmup=1, iters=GRAPH_PROBE_REPLAYS), None, probe,
                block=_block_stream)
    if probe["probe"].stats is None:
        raise RuntimeError(f"the probe replay failed: {probe['probe'].reason}")
    return probe["probe"].stats.median_us


def _capture_amortised(run, device, cold_l2: bool):
    """(graph, copies): one copy under a cold L2, else as many as GRAPH_TARGET_US of work needs."""
    if cold_l2:
        graph, _ = capture_graph(run, device)
        return graph, 1
    probe, _ = capture_graph(run, device, copies=GRAPH_PROBE_COPIES)
    copies = graph_copies(_probe_us(probe, device, GRAPH_PROBE_COPIES))
    if copies == GRAPH_PROBE_COPIES:
        return probe, copies
    probe.reset()
    graph, _ = capture_graph(run, device, copies=copies)
    graph.replay()  # the first replay uploads the graph: not inside a timed pair, even with --warmup 0
    torch.cuda.synchronize(device)
    return graph, copies


def _measure_graph(callables, device, options, flush, not_capturable) -> dict[str, ViewResult]:
    results = {name: ViewResult() for name in callables}
    graphs = {}
    for name, run in callables.items():
        if name in not_capturable:
            results[name] = ViewResult(status="unavailable", reason=not_capturable[name])
            continue
        try:
            graphs[name], results[name].calls_per_sample = _capture_amortised(run, device, options.cold_l2)
        except Exception as err:
            results[name] = ViewResult(status="error", reason=f"CUDA graph capture failed: {describe_error(err)}")
            try:  # a failed capture can leave an error pending on the stream: clear it here, not in the next run
                torch.cuda.synchronize(device)
            except Exception:
                pass
    replays = {name: graph.replay for name, graph in graphs.items()}
    _event_loop(replays, device, options, flush, results, block=_block_stream)
    for graph in graphs.values():
        graph.reset()
    return results


@contextlib.contextmanager
def _cupti_torn_down_after():
    """Have kineto detach CUPTI when this profiler session ends (TEARDOWN_CUPTI=1 while it runs).

    Left attached (kineto's default), CUPTI adds ~9 µs to every later kernel launch: measured on
    the H100 host, an empty kernel's wall time went from 20.7 µs before a torch.profiler session to
    29.4 µs after it, and stayed at 25 µs with teardown. The gpu view profiles once per config, so
    without this every later wall and graph number would carry that tax. Scoped to this session:
    `sdbench profile` runs back-to-back sessions, and one that follows a teardown records nothing.
    A user's explicit setting wins.
    """
    previous = os.environ.get("TEARDOWN_CUPTI")
    if previous is None:
        os.environ["TEARDOWN_CUPTI"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TEARDOWN_CUPTI", None)


# A profiler session can record no device activity at all while CUPTI re-attaches (seen on the
# H100 host right after another session's teardown), or lose every record of one kernel while it
# keeps the others (seen on the H200 host: a 37 µs pass over the logits missing from all ten
# iterations of one design, which read 14 µs on a 36 µs floor). Either session is run again, after
# a pause, for the callables it did not measure cleanly; one that never gets a clean session gets
# no number.
CUPTI_ATTEMPTS = 3
CUPTI_RETRY_PAUSE_S = 0.25


def _measure_gpu(callables, device, options, flush) -> dict[str, ViewResult]:
    """CUPTI device time: each iteration inside a profiler annotation, the time its device work covers.

    Each callable keeps the samples of the first session in which every kernel it launched has its
    device record; later sessions run only the callables still without one."""
    settled: dict[str, ViewResult] = {}
    silent_sessions = 0
    lossy_sessions = {name: 0 for name in callables}
    for attempt in range(CUPTI_ATTEMPTS):
        pending = [name for name in callables if name not in settled]
        if not pending:
            break
        if attempt:
            time.sleep(CUPTI_RETRY_PAUSE_S)
        results = {name: ViewResult() for name in pending}
        try:
            session = _profile_session({name: callables[name] for name in pending}, device, options, flush, results)
        except Exception as err:
            reason = f"torch.profiler (CUPTI) failed: {describe_error(err)}"
            settled.update({name: ViewResult(status="unavailable", reason=reason) for name in pending})
            break
        for name in pending:  # it raised: that is its result, whatever else the session recorded
            if results[name].status != "ok":
                settled[name] = results[name]
        if not session.device_events:
            silent_sessions += 1
            continue
        for index, name in enumerate(pending):
            if name in settled:
                continue
            if any(which == index for which, _ in session.unmatched_launches):
                lossy_sessions[name] += 1
            else:
                results[name].samples_us = [session.per_iteration.get((index, i), 0.0) for i in range(session.iters)]
                settled[name] = results[name]
    for name in callables:
        if name in settled:
            continue
        if lossy_sessions[name]:
            reason = (f"CUPTI lost the device record of one of its kernel launches in {lossy_sessions[name]} of "
                      f"{CUPTI_ATTEMPTS} profiler sessions and recorded nothing in {silent_sessions}: "
                      "its device time would be too low")
        else:
            reason = f"CUPTI recorded no device activity in {CUPTI_ATTEMPTS} sessions (is the profiler usable here?)"
        settled[name] = ViewResult(status="unavailable", reason=reason)
    return {name: settled[name] for name in callables}


# Device-side kineto events that are not device work: GPU spans of record_function ranges (torch.compile
# wraps every compiled call in one, "Torch-Compiled Region") would count their kernels twice.
NOT_DEVICE_WORK = frozenset({"gpu_user_annotation", "user_annotation", "cuda_sync"})
# The blocking kernel's device name (`torch.cuda._sleep`: ATen's spin_kernel). Its launch precedes the timed call's
# annotation, so it belongs to no iteration; but should CUPTI lose that launch record, the event would be placed by its
# own start, which can fall inside the annotation, and ~200 µs of spin would join a sample. Never an iteration's work.
BLOCKING_KERNEL_NAME = "spin_kernel"


def is_device_work(event) -> bool:
    """True for a kineto device event that is real device work (a kernel, memcpy or memset)."""
    kind = event.activity_type() if hasattr(event, "activity_type") else ""
    return kind not in NOT_DEVICE_WORK


@dataclass
class DeviceAttribution:
    """What one profiler session says per (callable index, iteration): device µs, kernel launches made
    inside the iteration, and those launches with no device record (CUPTI lost it)."""

    per_iteration: dict[tuple[int, int], float]
    device_events: int
    launches: dict[tuple[int, int], int] = field(default_factory=dict)
    unmatched_launches: dict[tuple[int, int], int] = field(default_factory=dict)
    iters: int = 0


def _profile_session(callables, device, options, flush, results) -> DeviceAttribution:
    """One torch.profiler session over the interleaved iterations, attributed per iteration."""
    from torch.profiler import ProfilerActivity, profile, record_function

    names = list(callables)
    iters = min(options.gpu_iters, options.iters)
    active = list(names)
    # Untimed warm-up outside the profiler session, as in the other views: a callable's first calls
    # compile (Triton), load its module and allocate, and none of that belongs in a sample.
    for round_index in range(options.warmup):
        for name in _rotation(active, round_index):
            try:
                callables[name]()
                torch.cuda.synchronize(device)  # an asynchronous fault is this callable's
            except Exception as err:
                _fail(results[name], err, active, name)
    with _cupti_torn_down_after(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        # The session's first annotation and first recorded launch set up the profiler's host side for longer than
        # the blocking kernel spins: on the H100 (session 32) the first timed call of a process found its stream
        # idle, so it ran unqueued. One untimed annotation around a launch of the blocking kernel takes that cost
        # first; it is no iteration's (no _MARK, and the blocking kernel is never counted).
        with record_function("sdbench-profiler-warm-up"):
            _block_stream()
        torch.cuda.synchronize(device)
        for iteration in range(iters):
            for name in _rotation(active, iteration):
                try:
                    if flush is not None:
                        flush()
                    else:
                        # warm: the L2 holds what this callable's own last call left, not the previous
                        # callable's (in rotation a callable always follows the same one: the first
                        # design of a grid always followed one that writes ~the whole L2)
                        callables[name]()
                    torch.cuda.synchronize(device)
                    _block_stream()  # the call's launches queue behind it: the host ahead of the device
                    with record_function(f"{_MARK}{names.index(name)}:{iteration}"):
                        callables[name]()
                except Exception as err:
                    _fail(results[name], err, active, name)
        torch.cuda.synchronize(device)
    attribution = _device_time_per_annotation(prof.profiler.kineto_results.events())
    attribution.iters = iters
    return attribution


def is_kernel_launch(name: str) -> bool:
    """True for a CUDA runtime or driver call that launches one kernel (cudaLaunchKernel,
    cudaLaunchKernelExC, cuLaunchKernel, cuLaunchKernelEx, the cooperative ones). A launch that ran has
    one device record with its correlation id unless CUPTI lost it; one that failed, or was captured
    into a CUDA graph, has none (the timed callables do neither: a failed launch raises, and capture
    happens in their preparation)."""
    return name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel",
                            "cuLaunchCooperativeKernel"))


def lost_kernel_records(kineto_events) -> int:
    """Kernel launch calls in a profiler session whose device record never came (CUPTI lost it)."""
    cpu_type = torch.autograd.DeviceType.CPU
    launches, recorded = [], set()
    for event in kineto_events:
        if event.device_type() == cpu_type:
            if is_kernel_launch(event.name()):
                launches.append(event.correlation_id())
        elif is_device_work(event):
            recorded.add(event.correlation_id())
    return sum(correlation not in recorded for correlation in launches)


def busy_us(intervals_ns: Sequence[tuple[int, int]]) -> float:
    """µs during which at least one of the (start, end) ns intervals runs: their durations summed, less
    any overlap. Kernels in one stream run one after another, so this is their sum; a kernel launched with
    programmatic dependent launch starts before the one ahead of it ends and waits inside, and its
    duration summed would count that overlap twice. Idle gaps between kernels count in neither."""
    busy, reach = 0, None
    for start, end in sorted(intervals_ns):
        if reach is None or start >= reach:
            busy += end - start
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    return busy / 1000.0


def _device_time_per_annotation(kineto_events) -> DeviceAttribution:
    """Device time (µs) per (callable index, iteration) annotation: the time its device events cover
    (`busy_us`: their durations summed where they do not overlap).

    A device event is placed by the host time of the CUDA runtime / driver call that launched it
    (`cudaLaunchKernel`, `cuLaunchKernelEx`, `cudaGraphLaunch`…, which share its correlation id).
    Triton launches through the driver API with no torch op around them, so the launching op is
    not always known; the launch call always is. A launch outside every annotation (the L2 flush
    between iterations) belongs to no iteration. A kernel launch inside an annotation whose device
    record never came is counted as unmatched: that iteration's time is missing a kernel.
    """
    import bisect

    cpu_type = torch.autograd.DeviceType.CPU
    annotations = []  # (start_ns, end_ns, key)
    launch_start_by_correlation = {}
    kernel_launches = []  # (start_ns, correlation id)
    device_events = []
    for event in kineto_events:
        name = event.name()
        if event.device_type() == cpu_type:
            if name.startswith("cu"):  # a CUDA runtime or driver API call
                launch_start_by_correlation[event.correlation_id()] = event.start_ns()
                if is_kernel_launch(name):
                    kernel_launches.append((event.start_ns(), event.correlation_id()))
            elif name.startswith(_MARK):
                index, iteration = name[len(_MARK):].split(":")
                annotations.append((event.start_ns(), event.end_ns(), (int(index), int(iteration))))
        elif not name.startswith(_MARK) and BLOCKING_KERNEL_NAME not in name and is_device_work(event):
            device_events.append(event)
    annotations.sort()
    starts = [start for start, _, _ in annotations]

    def annotation_of(host_ns: int, strict_end: bool):
        slot = bisect.bisect_right(starts, host_ns) - 1
        if slot < 0:
            return None
        _, end_ns, key = annotations[slot]
        return None if strict_end and host_ns > end_ns else key

    attribution = DeviceAttribution(per_iteration={}, device_events=len(device_events))
    intervals: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for event in device_events:
        launched_ns = launch_start_by_correlation.get(event.correlation_id())
        # Without its launch call, place it by its own start: iterations are serialised by a sync.
        # With it, a launch between iterations (the L2 flush) is part of none.
        key = annotation_of(launched_ns if launched_ns is not None else event.start_ns(), launched_ns is not None)
        if key is not None:
            start = event.start_ns()
            intervals.setdefault(key, []).append((start, start + event.duration_ns()))
    attribution.per_iteration.update({key: busy_us(spans) for key, spans in intervals.items()})
    recorded = {event.correlation_id() for event in device_events}
    for launched_ns, correlation in kernel_launches:
        key = annotation_of(launched_ns, strict_end=True)
        if key is None:
            continue
        attribution.launches[key] = attribution.launches.get(key, 0) + 1
        if correlation not in recorded:
            attribution.unmatched_launches[key] = attribution.unmatched_launches.get(key, 0) + 1
    return attribution
