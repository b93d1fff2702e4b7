"""The persistent ASBS loop (csrc/asbs_loop.cu) against the simulator: identical block-size histories and
committed lengths for the same seeds and profiles, in one launch, one round per launch, and replayed in a
CUDA graph; sync-free; bounded."""

from __future__ import annotations

import pytest
import torch

from sdbench import ext
from sdbench.asbs.device import DeviceLoop
from sdbench.asbs.kvcache import KVCacheModel
from sdbench.asbs.simulator import mixed_batch, simulate


@pytest.fixture(scope="module", autouse=True)
def built_extension():
    reason = ext.unavailable_reason()
    if reason is not None:
        pytest.fail(f"the CUDA extension must build on a GPU machine: {reason}")


# Above 1024 requests each lane holds 2 (the kernel's kSlots): 1100, and 2048 (with pressure).
CASES = [(1, 0, 10**6), (8, 3, 10**6), (32, 5, 150), (128, 9, 600), (40, 2, 10**6), (1100, 1, 10**6),
         (2048, 6, 16_000)]


@pytest.mark.parametrize("batch, seed, capacity", CASES, ids=[f"b{b}-s{s}-cap{c}" for b, s, c in CASES])
def test_one_launch_equals_the_simulator(batch, seed, capacity):
    profiles = mixed_batch(batch)
    kv = KVCacheModel(page_size=16, capacity_pages=capacity)
    expected = simulate(profiles, 200, seed=seed, kv=KVCacheModel(page_size=16, capacity_pages=capacity))
    loop = DeviceLoop(profiles, 200, seed=seed, kv=kv, history_rounds=1024, kv_dim=8)
    loop.run(rounds=1000)
    assert loop.rounds_run() == expected.rounds
    assert loop.committed_lengths() == expected.committed()
    assert loop.histories() == expected.histories()


@pytest.mark.parametrize("fixed", [None, 4])
def test_round_per_launch_and_graph_equal_the_simulator(fixed):
    profiles = mixed_batch(32)
    expected = simulate(profiles, 150, seed=7, fixed_block=fixed, kv=KVCacheModel(capacity_pages=250))
    stepped = DeviceLoop(profiles, 150, seed=7, fixed_block=fixed, kv=KVCacheModel(capacity_pages=250))
    for _ in range(expected.rounds + 5):  # extra launches after the end are no-ops
        stepped.step()
    assert stepped.histories() == expected.histories() and stepped.committed_lengths() == expected.committed()

    graphed = DeviceLoop(profiles, 150, seed=7, fixed_block=fixed, kv=KVCacheModel(capacity_pages=250))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    warm = DeviceLoop(profiles, 150, seed=7, fixed_block=fixed)  # warm-up launch on other state
    with torch.cuda.stream(side):
        warm.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            graphed.step()
    for _ in range(-(-(expected.rounds + 1) // 10)):
        graph.replay()
    torch.cuda.synchronize()
    assert graphed.histories() == expected.histories() and graphed.committed_lengths() == expected.committed()


def test_runs_under_sync_debug_error_and_is_bounded():
    loop = DeviceLoop(mixed_batch(16), 10**6, seed=1)  # never finishes: only the bound stops it
    loop.run(2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loop.run(50)
        loop.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert loop.rounds_run() == 53
    expected = simulate(mixed_batch(16), 10**6, seed=1, max_rounds=53)
    assert loop.histories() == expected.histories()


def test_kv_rows_are_written_for_committed_tokens_only():
    loop = DeviceLoop(mixed_batch(4), 40, seed=3, kv_dim=8)
    loop.run(1000)
    kv = loop.kv.float().cpu()
    for request, length in enumerate(loop.committed_lengths()):
        assert length == 40
        assert bool((kv[request, :length].abs().sum(1) > 0).all())  # hash bytes: a zero row is 1 in 2^64


SANITIZER_SCRIPT = """
import sys
from sdbench.asbs.device import DeviceLoop
from sdbench.asbs.kvcache import KVCacheModel
from sdbench.asbs.simulator import mixed_batch, simulate
expected = simulate(mixed_batch(40), 60, seed=4, kv=KVCacheModel(capacity_pages=150))
loop = DeviceLoop(mixed_batch(40), 60, seed=4, kv=KVCacheModel(capacity_pages=150), kv_dim=8)
loop.run(500)
sys.exit(0 if loop.histories() == expected.histories() else 1)
"""


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "initcheck", "synccheck"])
def test_compute_sanitizer_clean(tool):
    from sanitizer import assert_sanitizer_clean

    assert_sanitizer_clean(tool, SANITIZER_SCRIPT)
