"""The simulator against an independent plain loop (numpy float32, a hash written again from its C form),
the profiles, the KV accounting, and the runner."""

import numpy as np
import pytest

from sdbench.asbs.kvcache import KVCacheModel, pages
from sdbench.asbs.policy import AdaptiveBlockPolicy
from sdbench.asbs.profiles import COLLAPSE, DIP, STEADY_HIGH, STEADY_LOW, TraceProfile, hash32, threshold
from sdbench.asbs.simulator import mixed_batch, simulate


def _c_hash(seed, i, t, j):
    """hash32 from the C in profiles.py, with numpy uint32 wrap-around (independent of the Python version)."""
    def mix(x):
        with np.errstate(over="ignore"):
            x = np.uint32(x)
            x ^= x >> np.uint32(16)
            x = np.uint32(x * np.uint32(0x7FEB352D))
            x ^= x >> np.uint32(15)
            x = np.uint32(x * np.uint32(0x846CA68B))
            x ^= x >> np.uint32(16)
        return x
    return int(mix(mix(mix(mix(np.uint32(seed) ^ np.uint32(0x9E3779B9)) ^ np.uint32(i)) ^ np.uint32(t)) ^ np.uint32(j)))


def test_hash_matches_its_c_form():
    for args in [(0, 0, 0, 0), (7, 31, 999, 5), (2**32 - 1, 127, 12345, 7)]:
        assert hash32(*args) == _c_hash(*args)


def test_acceptance_frequency_follows_the_profile():
    limit = threshold(900)
    hits = sum(hash32(1, i, t, 0) < limit for i in range(64) for t in range(500))
    assert abs(hits / 32000 - 0.9) < 0.01


def test_profiles_by_progress():
    assert DIP.per_mille(0, 100) == 900 and DIP.per_mille(40, 100) == 200 and DIP.per_mille(60, 100) == 900
    assert COLLAPSE.per_mille(79, 100) == 900 and COLLAPSE.per_mille(80, 100) == 50
    assert STEADY_LOW.per_mille(50, 100) == 300


def _plain_loop(profiles, target_len, seed, policy, capacity, page_size, max_rounds=10_000):
    """The documented round order, written again: numpy float32 EMA, brute-force acceptance."""
    n = len(profiles)
    ema = [np.float32(policy.initial_ema)] * n
    block = [policy.max_block if ema[0] >= np.float32(policy.high) else policy.mid_block] * n
    committed = [0] * n
    history = [[] for _ in range(n)]
    for t in range(max_rounds):
        active = [i for i in range(n) if committed[i] < target_len]
        if not active:
            break
        live = sum(-(-(committed[i] + block[i]) // page_size) for i in active)
        pressure = live * 100 > 85 * capacity
        for i in active:
            proposed = block[i]
            limit = profiles[i].per_mille(committed[i], target_len) * 2**32 // 1000
            accepted = 0
            while accepted < proposed and _c_hash(seed, i, t, accepted) < limit:
                accepted += 1
            history[i].append(proposed)
            committed[i] += min(accepted + 1, target_len - committed[i])
            alpha = np.float32(policy.alpha)
            ema[i] = alpha * (np.float32(accepted) / np.float32(proposed)) + (np.float32(1) - alpha) * ema[i]
            b = (policy.max_block if ema[i] >= np.float32(policy.high) else
                 policy.mid_block if ema[i] >= np.float32(policy.low) else policy.min_block)
            block[i] = min(b, policy.pressure_cap) if pressure else b
    return history, committed


def test_simulator_equals_an_independent_plain_loop():
    policy = AdaptiveBlockPolicy()
    for batch, seed, capacity in [(1, 0, 10**6), (8, 3, 60), (13, 11, 10**6)]:
        profiles = mixed_batch(batch)
        result = simulate(profiles, 120, seed=seed, policy=policy, kv=KVCacheModel(page_size=16, capacity_pages=capacity))
        history, committed = _plain_loop(profiles, 120, seed, policy, capacity, 16)
        assert result.histories() == history and result.committed() == committed


def test_fixed_block_never_changes_and_everyone_finishes():
    result = simulate(mixed_batch(8), 64, seed=2, fixed_block=4)
    assert all(set(history) == {4} for history in result.histories())
    assert result.committed() == [64] * 8


def test_asbs_signature_on_a_mixed_batch():
    """A plateau at the middle block or above for steady acceptance 0.9 (with first-rejection counting,
    block 8 at 0.9 per token accepts ~64% of its drafts, block 4 ~77%: the EMA settles between 0.5 and
    0.8), the minimum for steady 0.3, a dip to the minimum and back, and a collapse to the minimum at the end."""
    result = simulate([STEADY_HIGH, STEADY_LOW, DIP, COLLAPSE], 400, seed=5)
    high, low, dip, collapse = result.histories()
    assert np.mean(high) >= 4 and high.count(1) <= len(high) // 20 and 8 in high[1:] and np.mean(low[5:]) < 1.5
    assert set(dip[len(dip) // 2 - 10: len(dip) // 2 + 10]) == {1} and dip[-1] >= 4
    assert np.mean(collapse[: len(collapse) // 3]) >= 4 and set(collapse[-20:]) == {1}


def test_kv_accounting():
    kv = KVCacheModel(page_size=4)
    kv.record_round(committed_before=3, proposed=8, accepted=1, committed_after=5)  # pages(11)=3, pages(5)=2
    assert kv.wasted_pages == 1 and kv.hit_rate == 1 / 8
    assert kv.fragmentation([5, 8]) == (8 + 8 - 13) / 16 and pages(0, 4) == 0


def test_trace_profile_replays_lengths():
    result = simulate([TraceProfile("t", [3, 0, 8])], 40, fixed_block=4)
    assert result.requests[0].accepted_history[:4] == [3, 0, 4, 3]


def test_runner_prints_the_table(capsys, monkeypatch):
    from sdbench.asbs.__main__ import main

    monkeypatch.setenv("COLUMNS", "200")

    assert main(["--batch", "8", "--target-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "ASBS" in out and "fixed 8" in out


def test_cli_asbs_prints_the_comparison(monkeypatch):
    from typer.testing import CliRunner

    from sdbench.cli import app

    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["asbs", "--batch", "4", "--target-len", "32"])
    assert result.exit_code == 0, result.output
    assert "ASBS" in result.output and "fixed 8" in result.output


def test_device_loop_refuses_a_batch_its_block_cannot_hold():
    from sdbench.asbs.device import MAX_BATCH, DeviceLoop

    with pytest.raises(ValueError, match=f"1 to {MAX_BATCH} requests"):
        DeviceLoop(mixed_batch(MAX_BATCH + 1), 10, device="cpu")
    with pytest.raises(ValueError, match=f"1 to {MAX_BATCH} requests"):
        DeviceLoop([], 10, device="cpu")
