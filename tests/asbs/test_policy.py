"""The ASBS policy (sdbench/asbs/policy.py): the design's four named tests, and the float32 contract
checked against numpy's float32 arithmetic (an independent implementation of the same rounding)."""

import numpy as np
import pytest

from sdbench.asbs.policy import AdaptiveBlockPolicy, RequestState, f32, update_block_size

POLICY = AdaptiveBlockPolicy()


def _feed(request: RequestState, rounds: list[tuple[int, int]], pressure: bool = False) -> list[tuple[float, int]]:
    trail = []
    for accepted, proposed in rounds:
        request.ema_acceptance_rate, request.current_block_size = update_block_size(
            request, accepted, proposed, pressure, POLICY)
        trail.append((request.ema_acceptance_rate, request.current_block_size))
    return trail


def test_ema_rises_on_sustained_acceptance():
    request = RequestState(ema_acceptance_rate=f32(0.3), current_block_size=1)
    trail = _feed(request, [(1, 1)] + [(8, 8)] * 20)
    emas = [ema for ema, _ in trail]
    assert all(later > earlier for earlier, later in zip(emas, emas[1:], strict=False)), emas
    assert emas[-1] > 0.98 and trail[-1][1] == POLICY.max_block
    assert [block for _, block in trail][:3] == [1, 4, 4]  # min, then mid once ε' >= 0.5, then max from 0.8


def test_ema_falls_on_rejection_and_block_reaches_minimum():
    request = RequestState.start(POLICY)
    assert request.current_block_size == POLICY.max_block  # ε = 0.8 at the start
    trail = _feed(request, [(0, 8)] * 12)
    emas = [ema for ema, _ in trail]
    assert all(later < earlier for earlier, later in zip(emas, emas[1:], strict=False))
    blocks = [block for _, block in trail]
    assert blocks[0] == POLICY.mid_block and blocks[-1] == POLICY.min_block
    assert blocks == sorted(blocks, reverse=True)  # never back up while everything is rejected


def test_pressure_cap_is_enforced_and_never_exceeded():
    from sdbench.asbs.kvcache import KVCacheModel
    from sdbench.asbs.profiles import STEADY_HIGH
    from sdbench.asbs.simulator import simulate

    request = RequestState.start(POLICY)
    for accepted, proposed in [(8, 8), (4, 4), (2, 2), (0, 2), (8, 8)]:
        _, block = update_block_size(request, accepted, proposed, True, POLICY)
        assert block <= POLICY.pressure_cap
    # a batch that runs out of pages: every block proposed in a round after a pressured one is capped
    result = simulate([STEADY_HIGH] * 8, 200, seed=3, kv=KVCacheModel(page_size=16, capacity_pages=80))
    pressured = 0
    for simulated in result.requests:
        history, pressure = simulated.state.block_size_history, simulated.pressure_history
        for t in range(1, len(history)):
            if pressure[t - 1]:
                pressured += 1
                assert history[t] <= POLICY.pressure_cap, (t, history[t])
    assert pressured > 0, "the scenario must put the cache under pressure"


def test_single_rejection_after_ten_acceptances_does_not_collapse_block():
    request = RequestState.start(POLICY)
    _feed(request, [(8, 8)] * 10)
    assert request.current_block_size == POLICY.max_block
    ema, block = _feed(request, [(0, 8)])[0]
    assert block == POLICY.mid_block and block > POLICY.min_block and ema > POLICY.low


# --- the float32 contract, against numpy ------------------------------------------------------------
def _numpy_update(ema: np.float32, accepted: int, proposed: int, pressure: bool) -> tuple[np.float32, int]:
    alpha = np.float32(POLICY.alpha)
    rate = np.float32(accepted) / np.float32(proposed)
    ema = alpha * rate + (np.float32(1.0) - alpha) * ema  # numpy rounds each float32 operation
    block = (POLICY.max_block if ema >= np.float32(POLICY.high) else
             POLICY.mid_block if ema >= np.float32(POLICY.low) else POLICY.min_block)
    return ema, min(block, POLICY.pressure_cap) if pressure else block


def test_update_equals_numpy_float32_over_random_rounds():
    rng = np.random.default_rng(0)
    request = RequestState.start(POLICY)
    ema = np.float32(POLICY.initial_ema)
    for _ in range(5000):
        proposed = int(rng.integers(1, 9))
        accepted = int(rng.integers(0, proposed + 1))
        pressure = bool(rng.random() < 0.2)
        request.ema_acceptance_rate, request.current_block_size = update_block_size(
            request, accepted, proposed, pressure, POLICY)
        ema, block = _numpy_update(ema, accepted, proposed, pressure)
        assert request.ema_acceptance_rate == float(ema) and request.current_block_size == block


@pytest.mark.parametrize("bad", [dict(alpha=0), dict(low=0.9, high=0.8), dict(min_block=0), dict(pressure_cap=0)])
def test_bad_policies_are_refused(bad):
    with pytest.raises(ValueError):
        AdaptiveBlockPolicy(**bad)
