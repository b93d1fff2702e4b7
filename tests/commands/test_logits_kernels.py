"""logits_kernels' variant parser (the GPU run itself is a measurement tool, not tested here)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from sdbench.commands.logits_kernels import plan_changes  # noqa: E402
from sdbench.ops.prob_verify_logits import triton_kernels as tk  # noqa: E402


def test_default_changes_nothing():
    assert plan_changes("default", 32, 8, 128256, 132) == {}


def test_parts_combine_into_launcher_arguments():
    changes = plan_changes("scan-race+span8192+r256x8+race", 32, 8, 128256, 132)
    assert changes["scan"] == "race"
    assert changes["sample"] == "race"
    assert changes["stats_plan_"] == tk.StatsPlan(span=8192, splits=16)
    race = changes["race_plan"]
    # 126 chunks of 1024 columns; one wave of 8·132 = 1056 programs holds 33 a row -> 4 steps, 32 programs a row
    assert (race.rows, race.steps, race.programs, race.num_warps) == (256, 4, 32, 4)
    assert race.steps * race.programs * 4 * race.rows >= 128256
    assert 32 * race.programs <= 8 * 132


@pytest.mark.parametrize("variant", ["nocombine+scan-pass1", "scan-pass1+nocombine"])
def test_a_named_scan_holds_whatever_the_order(variant):
    assert plan_changes(variant, 32, 8, 128256, 132)["scan"] == "pass1"


@pytest.mark.parametrize("variant", ["nocombine", "nocombine+race"])
def test_nocombine_alone_scans_in_the_race(variant):
    assert plan_changes(variant, 32, 8, 128256, 132)["scan"] == "race"


def test_pass_one_programs_per_sm():
    plan = plan_changes("pps16", 1, 16, 128256, 132)["stats_plan_"]
    assert plan.splits * 33 <= 16 * 132 and plan.splits * plan.span >= 128256


def test_an_unknown_part_is_an_error():
    with pytest.raises(ValueError, match="unknown variant part"):
        plan_changes("fast", 1, 4, 32000, 132)


@pytest.mark.parametrize("variant", ["tile2048+warps8+pps24", "pps24+warps8+tile2048"])
def test_pass_one_step_plans_whole_steps(variant):
    plan = plan_changes(variant, 32, 8, 32000, 132)["stats_plan_"]
    assert (plan.tile, plan.num_warps) == (2048, 8)
    assert plan.span % 2048 == 0 and plan.splits * plan.span >= 32000 > (plan.splits - 1) * plan.span


def test_a_step_alone_keeps_the_default_waves():
    plan = plan_changes("tile2048", 32, 8, 32000, 132)["stats_plan_"]
    assert plan.tile == 2048 and plan.num_warps is None and plan.span % 2048 == 0


def test_a_split_cap_reaches_the_launcher():
    assert plan_changes("cap16", 1, 16, 151936, 132) == {"stats_max_splits": 16}
