"""Timing engine on the CPU: statistics on synthetic samples, round-robin order, failures, CUPTI attribution."""

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sdbench.measure import timing
from sdbench.ops.launch_floor import launch_floor

# Exact arithmetic on small synthetic lists: compare to 1e-12 relative.
REL = 1e-12


@pytest.mark.parametrize("samples", [[5.0], [3.0, 1.0], [1.0, 2.0, 3.0, 4.0], list(np.linspace(1, 7, 13)),
                                     [9.0, 1.0, 4.0, 4.0, 100.0, 2.5]])
@pytest.mark.parametrize("q", [0.0, 25.0, 50.0, 95.0, 100.0])
def test_percentile_matches_numpy_linear(samples, q):
    assert timing.percentile(samples, q) == pytest.approx(float(np.percentile(samples, q)), rel=REL)


def test_summarize_one_to_hundred():
    stats = timing.summarize([float(x) for x in range(100, 0, -1)])  # unsorted on purpose
    assert stats.median_us == 50.5
    assert stats.p95_us == pytest.approx(95.05, rel=REL)
    assert stats.min_us == 1.0
    assert stats.mean_us == 50.5
    assert stats.std_us == pytest.approx(math.sqrt(sum((x - 50.5) ** 2 for x in range(1, 101)) / 99), rel=REL)


def test_summarize_single_sample_has_zero_spread():
    assert timing.summarize([7.5]) == timing.Stats(7.5, 7.5, 7.5, 7.5, 0.0)


def test_summarize_outlier_moves_mean_not_median():
    stats = timing.summarize([10.0] * 9 + [1000.0])
    assert stats.median_us == 10.0 and stats.min_us == 10.0
    assert stats.mean_us == 109.0
    assert stats.p95_us == pytest.approx(10.0 + 0.55 * 990.0, rel=REL)


def test_summarize_nothing_is_none():
    assert timing.summarize([]) is None
    with pytest.raises(ValueError):
        timing.percentile([], 50.0)


def test_cpu_view_is_round_robin_with_rotating_start():
    calls = []
    callables = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    results = timing.measure(callables, "cpu", timing.TimingOptions(warmup=1, iters=3))
    assert calls == list("abc" "bca" "cab" "abc")  # 1 warm-up round + 3 timed, start rotating
    for name in "abc":
        assert results[name]["cpu"].status == "ok"
        assert len(results[name]["cpu"].samples_us) == 3
        assert all(sample >= 0.0 for sample in results[name]["cpu"].samples_us)


def test_cpu_view_measures_the_slow_callable_slower():
    def slow():
        torch.ones(200_000).cumsum(0)

    results = timing.measure({"fast": lambda: None, "slow": slow}, "cpu", timing.TimingOptions(warmup=2, iters=20))
    assert results["slow"]["cpu"].stats.median_us > results["fast"]["cpu"].stats.median_us


def test_a_raising_callable_is_an_error_and_the_others_go_on():
    def broken():
        raise RuntimeError("illegal memory access\nsecond line")

    results = timing.measure({"ok": lambda: None, "broken": broken}, "cpu", timing.TimingOptions(warmup=0, iters=5))
    assert results["broken"]["cpu"].status == "error"
    assert results["broken"]["cpu"].reason == "raised RuntimeError: illegal memory access"
    assert results["broken"]["cpu"].stats is None
    assert len(results["ok"]["cpu"].samples_us) == 5


def test_cold_l2_flushes_before_every_call(monkeypatch):
    log = []
    monkeypatch.setattr(timing, "l2_flush", lambda device: lambda: log.append("flush"))
    callables = {name: (lambda name=name: log.append(name)) for name in "ab"}
    timing.measure(callables, "cpu", timing.TimingOptions(warmup=1, iters=2, cold_l2=True))
    assert log == ["flush", "a", "flush", "b", "flush", "b", "flush", "a", "flush", "a", "flush", "b"]


def test_cpu_l2_flush_reads_a_large_buffer():
    timing.l2_flush("cpu")()  # runs; its size is a constant checked here
    assert timing.CPU_FLUSH_BYTES >= 32 * 2**20


def test_views_per_device():
    assert timing.views_for("cpu") == ("cpu",)
    assert timing.views_for("cuda") == ("wall", "graph", "gpu")
    assert timing.views_for("cuda", timing.TimingOptions(views=("gpu", "wall"))) == ("wall", "gpu")
    with pytest.raises(ValueError):
        timing.views_for("cpu", timing.TimingOptions(views=("wall",)))


@pytest.mark.parametrize("bad", [{"iters": 0}, {"warmup": -1}, {"gpu_iters": 0}])
def test_options_reject_nonsense(bad):
    with pytest.raises(ValueError):
        timing.TimingOptions(**bad)


def test_launch_floor_on_cpu_is_absent_with_a_reason():
    floor = launch_floor("cpu")
    assert floor.run is None and "CPU" in floor.reason


# --- CUPTI attribution, on synthetic kineto events ----------------------------------------------
CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def _event(name, device, start, duration, correlation=0, linked=0):
    return SimpleNamespace(
        name=lambda: name, device_type=lambda: device, start_ns=lambda: start, end_ns=lambda: start + duration,
        duration_ns=lambda: duration, correlation_id=lambda: correlation, linked_correlation_id=lambda: linked,
    )


def test_device_time_is_summed_per_annotation():
    """Event layout as recorded on an H100 (torch 2.11): a device event shares its correlation id
    with the runtime/driver call that launched it; a Triton launch (cuLaunchKernelEx) has no torch
    op around it, so its link is 0, and a CPU event with correlation 0 exists too."""
    mark = timing._MARK
    events = [
        _event("Activity Buffer Request", CPU, 10, 5, correlation=0),
        _event(f"{mark}0:0", CPU, 1_000, 500, correlation=1),
        _event("sdbench::verify_ballot", CPU, 1_100, 100, correlation=2),
        _event("cudaLaunchKernel", CPU, 1_150, 20, correlation=21, linked=2),
        _event("ballot_kernel", CUDA, 1_400, 2_000, correlation=21, linked=2),  # runs after its annotation ended
        _event(f"{mark}0:0", CUDA, 1_400, 2_000, correlation=1),  # GPU-side copy of the annotation
        _event("cuLaunchKernelEx", CPU, 1_200, 10, correlation=13),
        _event("triton_kernel", CUDA, 3_450, 1_000, correlation=13),  # Triton: no linked op
        _event("cudaLaunchKernel", CPU, 5_000, 20, correlation=30),  # the L2 flush, between iterations
        _event("flush_kernel", CUDA, 5_050, 9_000, correlation=30),
        _event(f"{mark}1:0", CPU, 20_000, 500, correlation=4),
        _event("orphan_kernel", CUDA, 20_600, 300, correlation=99),  # no launch call seen: own start time
    ]
    attribution = timing._device_time_per_annotation(events)
    assert attribution.per_iteration == {(0, 0): 3.0, (1, 0): 0.3}
    assert attribution.device_events == 4
    assert attribution.launches == {(0, 0): 2} and attribution.unmatched_launches == {}


def test_a_kernel_launch_without_its_device_record_is_counted_as_lost():
    """Seen on the H200 host: CUPTI kept the launch call of every pass over the logits but none of
    their kernel records, so the iteration summed the two later kernels alone. The flush's launch,
    between iterations, and a non-launch runtime call count for no iteration."""
    mark = timing._MARK
    events = [
        _event(f"{mark}0:0", CPU, 1_000, 500, correlation=1),
        _event("cuLaunchKernelEx", CPU, 1_100, 10, correlation=11),  # pass 1: its record is lost
        _event("cuLaunchKernelEx", CPU, 1_200, 10, correlation=12),
        _event("cudaLaunchKernel", CPU, 1_300, 10, correlation=13),
        _event("cudaStreamIsCapturing", CPU, 1_350, 1, correlation=14),
        _event("scan_kernel", CUDA, 1_600, 3_000, correlation=12),
        _event("race_kernel", CUDA, 4_700, 9_000, correlation=13),
        _event("cudaLaunchKernel", CPU, 20_000, 10, correlation=30),  # the flush: its record lost too
        _event(f"{mark}0:1", CPU, 30_000, 500, correlation=2),
        _event("cudaLaunchKernelExC", CPU, 30_100, 10, correlation=41),
        _event("one_kernel", CUDA, 30_400, 1_000, correlation=41),
    ]
    attribution = timing._device_time_per_annotation(events)
    assert attribution.per_iteration == {(0, 0): 12.0, (0, 1): 1.0}
    assert attribution.launches == {(0, 0): 3, (0, 1): 1}
    assert attribution.unmatched_launches == {(0, 0): 1}
    assert timing.lost_kernel_records(events) == 2  # the profile command's check: the flush's too


def test_the_blocking_kernel_is_no_iteration_s_work():
    """The gpu view's spin is launched between iterations. With its launch record, it belongs to none; if CUPTI lost
    that record, its own start (inside the timed call's annotation) would place it there: it is left out by name."""
    mark = timing._MARK
    events = [
        _event("cudaLaunchKernel", CPU, 900, 10, correlation=10),  # the spin's launch, recorded
        _event("at::cuda::(anonymous namespace)::spin_kernel(long)", CUDA, 1_005, 200_000, correlation=10),
        _event(f"{mark}0:0", CPU, 1_000, 500, correlation=1),
        _event("cuLaunchKernelEx", CPU, 1_100, 10, correlation=11),
        _event("pass1_kernel", CUDA, 201_010, 8_000, correlation=11),
        # the next iteration's spin: its launch record lost
        _event("at::cuda::(anonymous namespace)::spin_kernel(long)", CUDA, 300_005, 200_000, correlation=20),
        _event(f"{mark}0:1", CPU, 300_000, 500, correlation=2),
        _event("cuLaunchKernelEx", CPU, 300_100, 10, correlation=21),
        _event("pass1_kernel", CUDA, 500_010, 8_000, correlation=21),
    ]
    attribution = timing._device_time_per_annotation(events)
    assert attribution.per_iteration == {(0, 0): 8.0, (0, 1): 8.0}
    assert attribution.launches == {(0, 0): 1, (0, 1): 1} and attribution.unmatched_launches == {}


@pytest.mark.parametrize("intervals,busy", [
    ([], 0.0),
    ([(0, 1_000), (3_000, 4_500)], 2.5),  # one after another, a gap between: the durations summed
    ([(0, 2_000), (1_500, 4_000)], 4.0),  # the second starts inside the first (programmatic dependent launch)
    ([(1_500, 4_000), (0, 2_000), (2_500, 3_000)], 4.0),  # in any order, one inside another
    ([(0, 1_000), (1_000, 2_000)], 2.0),  # touching
])
def test_busy_time_counts_overlap_once(intervals, busy):
    assert timing.busy_us(intervals) == pytest.approx(busy)


def test_overlapping_kernels_of_an_iteration_count_once():
    """A race kernel launched with programmatic dependent launch starts 1 µs before pass 1 ends and waits:
    the iteration covers 10 µs of device time, not the 11 its durations sum to."""
    mark = timing._MARK
    events = [
        _event(f"{mark}0:0", CPU, 1_000, 500, correlation=1),
        _event("cuLaunchKernelEx", CPU, 1_100, 10, correlation=11),
        _event("cuLaunchKernelEx", CPU, 1_200, 10, correlation=12),
        _event("pass1_kernel", CUDA, 2_000, 8_000, correlation=11),
        _event("race_kernel", CUDA, 9_000, 3_000, correlation=12),
    ]
    assert timing._device_time_per_annotation(events).per_iteration == {(0, 0): 10.0}


def test_cupti_teardown_is_scoped_to_the_gpu_view_session(monkeypatch):
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    with timing._cupti_torn_down_after():
        assert os.environ["TEARDOWN_CUPTI"] == "1"
    assert "TEARDOWN_CUPTI" not in os.environ
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # the user's explicit choice wins
    with timing._cupti_torn_down_after():
        assert os.environ["TEARDOWN_CUPTI"] == "0"
    assert os.environ["TEARDOWN_CUPTI"] == "0"


def _attribution(per_iteration, device_events, iters, unmatched=None):
    launches = {key: 1 + (unmatched or {}).get(key, 0) for key in per_iteration}
    return timing.DeviceAttribution(per_iteration, device_events, launches, dict(unmatched or {}), iters)


def test_gpu_view_runs_a_silent_profiler_session_again(monkeypatch):
    """A session that records no device activity (CUPTI re-attaching) is retried, not reported as 0 µs."""
    sessions = []

    def fake_session(callables, device, options, flush, results):
        sessions.append(1)
        if len(sessions) == 1:
            return _attribution({}, 0, 2)
        return _attribution({(0, 0): 1.5, (0, 1): 2.5}, 2, 2)

    monkeypatch.setattr(timing, "_profile_session", fake_session)
    monkeypatch.setattr(timing, "CUPTI_RETRY_PAUSE_S", 0.0)
    result = timing._measure_gpu({"k": lambda: None}, "cuda", timing.TimingOptions(iters=2, gpu_iters=2), None)
    assert len(sessions) == 2 and result["k"].samples_us == [1.5, 2.5]
    sessions.clear()
    monkeypatch.setattr(timing, "_profile_session", lambda *a: (sessions.append(1), _attribution({}, 0, 2))[1])
    result = timing._measure_gpu({"k": lambda: None}, "cuda", timing.TimingOptions(iters=2, gpu_iters=2), None)
    assert len(sessions) == timing.CUPTI_ATTEMPTS and result["k"].status == "unavailable"


def test_gpu_view_never_reports_an_iteration_missing_a_kernel(monkeypatch):
    """A callable whose session lost a kernel's record is timed again in a later session; one measured
    cleanly keeps its first session's samples."""
    monkeypatch.setattr(timing, "CUPTI_RETRY_PAUSE_S", 0.0)
    sessions = []

    def lost_once(callables, device, options, flush, results):
        sessions.append(list(callables))
        if len(sessions) == 1:  # a (index 0) lost a record, b (index 1) is clean
            return _attribution({(0, 0): 14.0, (1, 0): 3.0}, 3, 1, unmatched={(0, 0): 1})
        return _attribution({(0, 0): 52.0}, 2, 1)

    monkeypatch.setattr(timing, "_profile_session", lost_once)
    options = timing.TimingOptions(iters=1, gpu_iters=1)
    result = timing._measure_gpu({"a": lambda: None, "b": lambda: None}, "cuda", options, None)
    assert sessions == [["a", "b"], ["a"]]
    assert result["a"].samples_us == [52.0] and result["b"].samples_us == [3.0]
    assert list(result) == ["a", "b"]


def test_gpu_view_gives_no_number_to_a_callable_never_measured_cleanly(monkeypatch):
    monkeypatch.setattr(timing, "CUPTI_RETRY_PAUSE_S", 0.0)
    sessions = []

    def lossy_silent_lossy(callables, device, options, flush, results):
        sessions.append(list(callables))
        if len(sessions) == 1:
            return _attribution({(0, 0): 14.0, (1, 0): 3.0}, 3, 1, unmatched={(0, 0): 1})
        if len(sessions) == 2:
            return _attribution({}, 0, 1)  # CUPTI recorded nothing
        return _attribution({(0, 0): 14.0}, 2, 1, unmatched={(0, 0): 1})

    monkeypatch.setattr(timing, "_profile_session", lossy_silent_lossy)
    options = timing.TimingOptions(iters=1, gpu_iters=1)
    result = timing._measure_gpu({"a": lambda: None, "b": lambda: None}, "cuda", options, None)
    assert sessions == [["a", "b"], ["a"], ["a"]]
    assert result["a"].status == "unavailable" and result["a"].samples_us == []
    assert "in 2 of 3 profiler sessions and recorded nothing in 1" in result["a"].reason
    assert result["b"].status == "ok" and result["b"].samples_us == [3.0]


def test_gpu_view_keeps_the_error_of_a_callable_that_raised(monkeypatch):
    """A callable that raised inside a session has that error as its result, and is not run again."""
    monkeypatch.setattr(timing, "CUPTI_RETRY_PAUSE_S", 0.0)
    sessions = []

    def one_raises(callables, device, options, flush, results):
        sessions.append(list(callables))
        timing._fail(results["bad"], RuntimeError("boom"), list(callables), "bad")
        return _attribution({(0, 0): 2.0}, 1, 1)

    monkeypatch.setattr(timing, "_profile_session", one_raises)
    options = timing.TimingOptions(iters=1, gpu_iters=1)
    result = timing._measure_gpu({"good": lambda: None, "bad": lambda: None}, "cuda", options, None)
    assert sessions == [["good", "bad"]]
    assert result["good"].samples_us == [2.0]
    assert result["bad"].status == "error" and "boom" in result["bad"].reason

    sessions.clear()  # alone, it raised before launching anything: a silent session, but the error stands

    def raises_alone(callables, device, options, flush, results):
        sessions.append(list(callables))
        timing._fail(results["bad"], torch.OutOfMemoryError("CUDA out of memory"), list(callables), "bad")
        return _attribution({}, 0, 1)

    monkeypatch.setattr(timing, "_profile_session", raises_alone)
    result = timing._measure_gpu({"bad": lambda: None}, "cuda", options, None)
    assert sessions == [["bad"]]
    assert result["bad"].status == "error" and "OutOfMemoryError" in result["bad"].reason


# --- noise-aware sampling: the criterion on synthetic samples -----------------------------------------
def test_median_noise_is_the_order_statistic_standard_error():
    rng = np.random.default_rng(0)
    tight = list(20.0 + rng.normal(0, 0.05, 400))  # ±0.25% spread: SE of the median far under 1%
    loose = list(20.0 * rng.lognormal(0, 0.5, 400))  # a heavy right tail, as launch times have
    assert timing.median_noise(tight) < 0.001
    assert timing.median_noise(loose) > 0.01
    assert timing.median_noise([5.0] * 50) == 0.0
    assert timing.median_noise([1.0, 2.0, 3.0]) is None  # too few samples to say


def test_more_samples_shrink_the_noise_like_one_over_root_n():
    rng = np.random.default_rng(1)
    samples = list(20.0 * rng.lognormal(0, 0.3, 6400))
    few, many = timing.median_noise(samples[:100]), timing.median_noise(samples)
    assert 4.0 < few / many < 12.0  # 64× the samples: ~8× less noise


def test_noisy_means_above_the_threshold_or_unknown():
    assert timing.is_noisy([1.0, 2.0], 0.5)
    assert not timing.is_noisy([5.0] * 20, 0.01)
    assert timing.is_noisy(list(np.linspace(1.0, 100.0, 40)), 0.01)


def test_options_refuse_a_meaningless_noise_budget():
    with pytest.raises(ValueError):
        timing.TimingOptions(max_noise=0.0)
    with pytest.raises(ValueError):
        timing.TimingOptions(max_time_s=-1.0)


@pytest.mark.parametrize(("per_copy_us", "copies"), [
    (0.5, timing.GRAPH_MAX_COPIES),  # an empty kernel: capped
    (timing.GRAPH_TARGET_US / 100, 100),
    (timing.GRAPH_TARGET_US / 2.4, 2),  # rounds to the nearest count
    (timing.GRAPH_TARGET_US, 1),
    (10 * timing.GRAPH_TARGET_US, 1),  # never fewer than one copy
    (0.0, timing.GRAPH_MAX_COPIES),  # a probe that read nothing
])
def test_graph_copies_fill_the_target_time(per_copy_us, copies):
    assert timing.graph_copies(per_copy_us) == copies


def test_floor_drift_is_flat_when_the_machine_slows_row_and_floor_alike():
    # the whole host slows 40% half-way: both move, the ratio does not
    floor = [20.0] * 100 + [28.0] * 100
    row = [30.0] * 100 + [42.0] * 100
    assert timing.floor_drift(row, floor) == pytest.approx(0.0)


def test_floor_drift_sees_a_row_that_moved_against_its_floor():
    # the row's launch path got 20% slower in the last quarter, the floor's did not
    floor = [20.0] * 200
    row = [30.0] * 150 + [36.0] * 50
    assert timing.floor_drift(row, floor) == pytest.approx(0.2)
    assert timing.floor_drift(row, floor) > timing.MAX_FLOOR_DRIFT


def test_floor_drift_pairs_samples_by_round_and_needs_enough_of_them():
    assert timing.floor_drift([1.0] * 7, [1.0] * 7) is None  # fewer than two per quarter
    # unequal lengths (a callable that left the rotation): only the common rounds are paired
    assert timing.floor_drift([2.0] * 8 + [99.0] * 8, [1.0] * 8) == pytest.approx(0.0)


def test_floor_drift_forgives_sampling_noise_but_not_a_real_shift():
    import numpy as np

    rng = np.random.default_rng(7)
    floor = (20.0 * rng.lognormal(0.0, 0.10, 400)).tolist()
    steady = (30.0 * rng.lognormal(0.0, 0.10, 400)).tolist()  # 10% per-sample spread, no drift at all
    flagged = [timing.floor_drift(steady[i:i + 200], floor[i:i + 200]) > timing.MAX_FLOOR_DRIFT for i in range(0, 200, 20)]
    assert not any(flagged)
    shifted = steady[:300] + [x * 1.25 for x in steady[300:]]  # the row's path 25% slower in the last quarter
    assert timing.floor_drift(shifted, floor) > timing.MAX_FLOOR_DRIFT


@pytest.mark.parametrize(("spent", "min_time", "noisy", "again"), [
    (0.1, 0.0, False, False),  # quiet: one batch is enough
    (0.1, 0.0, True, True),  # noisy and time left: another batch
    (0.1, 0.3, False, True),  # quiet but under --min-time: another batch
    (0.6, 0.3, True, False),  # noisy but --max-time spent: stop
    (0.4, 0.3, False, False),  # past --min-time and quiet: stop
])
def test_another_batch_follows_noise_within_min_and_max_time(spent, min_time, noisy, again):
    options = timing.TimingOptions(max_time_s=0.5, min_time_s=min_time, max_noise=0.01)
    quiet = [10.0] * 50
    loud = [10.0 + (i % 10) for i in range(50)]  # a median standard error far above 1%
    assert timing._another_batch(spent, options, [quiet, loud if noisy else quiet]) is again


def test_min_time_must_fit_inside_max_time():
    with pytest.raises(ValueError, match="min_time_s"):
        timing.TimingOptions(max_time_s=0.5, min_time_s=1.0)
