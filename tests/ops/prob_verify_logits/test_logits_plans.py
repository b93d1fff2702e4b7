"""fused_logits' plan choices on a GPU's shape (an SM count stands in for the device: no GPU needed)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sdbench.ops.prob_verify_logits import triton_kernels as kernels  # noqa: E402


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(multi_processor_count=132))
    return torch.device("cuda")


@pytest.mark.parametrize("batch,gamma,vocab,expected", [
    (1, 16, 128256, False),  # the race's 126 programs fit beside each other: the repeated scans are free
    (16, 8, 32000, False),
    (32, 8, 128256, True),  # 32·126 race programs fill 16 per SM, 126 against 17 rows a sequence
    (128, 16, 32000, True),
    (512, 4, 32000, True),  # 5 race programs a sequence against 9 rows
    (512, 16, 128256, False),  # 5 against 33: the extra arrivals in pass 1 cost more than the repeats
])
def test_where_the_accept_scan_runs(h200, batch, gamma, vocab, expected):
    race = kernels.default_race_plan(batch, vocab, h200)
    assert kernels.default_scan_in_pass_one(batch, gamma, race, h200) is expected


def test_race_chunks_are_capped_on_a_gpu(h200):
    race = kernels.default_race_plan(512, 128256, h200)
    assert 4 * race.rows <= kernels.RACE_CHUNK_MAX
    assert race.programs * race.steps * 4 * race.rows >= 128256


def test_pass_one_takes_several_tiles_once_a_wave_is_full(h200):
    plan = kernels.default_stats_plan(1, 16, 128256, h200)  # 33 rows × 126 tiles > 16 programs per SM
    assert plan.span >= kernels.STATS_MIN_TILES * kernels.STATS_TILE
    assert kernels.default_stats_plan(1, 4, 32000, h200).span == kernels.STATS_TILE  # 9 × 32 tiles fit a wave


def test_the_block_rule_refuses_the_pass_one_scan():
    inputs = types.SimpleNamespace(shape=(2, 3, 64), draft_tokens=torch.zeros(2, 3))  # refused before any launch
    with pytest.raises(ValueError, match="token rule"):
        kernels.fused_logits_launcher(inputs, {}, fast=False, rule="block", scan_in_pass_one=True)
