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


def test_one_launch_parts():
    changes = plan_changes("one+lag3+span8192+reg56", 32, 8, 128256, 132)
    assert changes == {"single": True, "lag": 3, "maxnreg": 56, "stats_plan_": tk.StatsPlan(span=8192, splits=16)}
    assert plan_changes("one+lag100000", 32, 8, 128256, 132)["lag"] == 32  # at most B


@pytest.mark.parametrize("variant", ["nocombine+scan-pass1", "scan-pass1+nocombine"])
def test_a_named_scan_holds_whatever_the_order(variant):
    assert plan_changes(variant, 32, 8, 128256, 132)["scan"] == "pass1"


def test_the_early_race_is_a_scan_variant():
    assert plan_changes("scan-early", 32, 4, 128256, 132) == {"scan": "early"}


@pytest.mark.parametrize("variant", ["nocombine", "nocombine+race"])
def test_nocombine_alone_scans_in_the_race(variant):
    assert plan_changes(variant, 32, 8, 128256, 132)["scan"] == "race"


def test_pass_one_programs_per_sm():
    plan = plan_changes("pps16", 1, 16, 128256, 132)["stats_plan_"]
    assert plan.splits * 33 <= 16 * 132 and plan.splits * plan.span >= 128256


def test_read_first_parts():
    assert plan_changes("roworder", 32, 8, 32000, 132) == {"read_first": False}
    assert plan_changes("readfirst+nowords", 32, 8, 32000, 132) == {"read_first": True, "bf16_words": False}


def test_words_parts():
    assert plan_changes("nowords", 32, 8, 128256, 132) == {"bf16_words": False}
    assert plan_changes("words+scan-race", 32, 8, 128256, 132) == {"bf16_words": True, "scan": "race"}


def test_an_unknown_part_is_an_error():
    with pytest.raises(ValueError, match="unknown variant part"):
        plan_changes("fast", 1, 4, 32000, 132)


@pytest.mark.parametrize("variant", ["tile2048+warps8+pps12", "pps12+warps8+tile2048"])
def test_pass_one_step_plans_whole_steps(variant):
    # 544 rows, 1584 programs: 3 splits; in 1024-column tiles a span of 11 (11264 columns), in 2048 one of 6
    assert plan_changes(variant, 32, 8, 32000, 132)["stats_plan_"] == tk.StatsPlan(12288, 3, 2048, 8)


def test_spans_are_whole_steps_of_the_logits_dtype():
    assert plan_changes("pps12", 32, 8, 32000, 132)["stats_plan_"] == tk.StatsPlan(11264, 3)  # float32: 1024 a step
    assert plan_changes("pps12", 32, 8, 32000, 132, element_size=2)["stats_plan_"] == tk.StatsPlan(12288, 3)  # bf16
    assert plan_changes("warps8", 1, 4, 32000, 132, element_size=2)["stats_plan_"].span % 2048 == 0


def test_a_step_alone_keeps_the_default_plan():
    # 4 waves of 12 programs per SM over 544 rows want 12 splits of 16 tiles of 2048 columns, but a span holds
    # STATS_MIN_TILES (4) once the tiles exceed a wave: 4 splits of 8192, 1.37 waves; 2 splits fit one wave
    # (`pass_one_plan`), as the shipped bf16 plan does there
    assert plan_changes("tile2048", 32, 8, 32000, 132)["stats_plan_"] == tk.StatsPlan(16384, 2, 2048, None)
    # several waves: the rule leaves the plan alone (63 tiles in 11 spans of 6, 5984 programs)
    assert plan_changes("tile2048", 32, 8, 128256, 132)["stats_plan_"] == tk.StatsPlan(12288, 11, 2048, None)


def test_a_split_cap_reaches_the_launcher_or_the_plan():
    assert plan_changes("cap16", 1, 16, 151936, 132) == {"stats_max_splits": 16}
    # with a plan of its own the cap shapes that plan: 149 tiles in 15 spans of 10, not 30 of 5
    assert plan_changes("cap16+pps12", 1, 16, 151936, 132)["stats_plan_"] == tk.StatsPlan(10240, 15)
    assert "stats_max_splits" not in plan_changes("cap16+pps12", 1, 16, 151936, 132)


def test_timeline_phases_read_the_marks():
    """Two pass-1 programs and two race programs of one sequence, marks in ns: the phases are their differences."""
    import torch

    from sdbench.commands.logits_kernels import timeline_phases

    # pass 1: (entry, partial computed, SM, unused)
    pass1 = torch.tensor([[1000, 5000, 3, 0], [1200, 7000, 4, 0]], dtype=torch.int64).flatten()
    # race: (entry, stop known, chunks done, arrived, outputs known, SM, last); the third program's sequence has a
    # greedy target (no chunks read: slot 2 stays 0), so it counts in the entry and stop phases only
    race = torch.tensor([[9000, 9500, 10000, 10300, 0, 1, 0, 0],
                         [9100, 9800, 10100, 10600, 11600, 2, 1, 0],
                         [9050, 9350, 0, 9900, 0, 3, 0, 0]], dtype=torch.int64).flatten()
    phases = timeline_phases(pass1, race)
    assert phases["pass1_span"] == pytest.approx(6.0) and phases["pass1_entry_spread"] == pytest.approx(0.2)
    # partials at 4.0 and 6.0 µs after the first entry: the upper middle and the 90th percentile's rank (0)
    assert phases["pass1_half"] == pytest.approx(6.0) and phases["pass1_p90"] == pytest.approx(4.0)
    # the two sampled programs only: chunks 0.5 and 0.3 µs (median of two: torch's lower), arrivals 0.3 and 0.5
    assert phases["chunks"] == pytest.approx(0.3) and phases["arrival"] == pytest.approx(0.3)
    assert phases["gap"] == pytest.approx(2.0)  # last partial at 7.0 µs, first race entry at 9.0
    assert phases["race_entry_spread"] == pytest.approx(0.1)
    assert phases["last_draw"] == pytest.approx(1.0) and phases["race_span"] == pytest.approx(2.6)
    assert phases["last_arrival"] == pytest.approx(1.6)
    assert phases["to_stop"] == pytest.approx(0.5)  # 0.5, 0.7 and 0.3: all three programs
    # a third pass-1 program that read nothing (a greedy target's draft row) is left out of pass 1's phases
    skipped = torch.cat([pass1, torch.tensor([1100, 1150, 5, 0], dtype=torch.int64)])
    assert timeline_phases(skipped, race, read=torch.tensor([True, True, False])) == phases
    assert timeline_phases(skipped, race)["pass1_half"] == pytest.approx(4.0)  # counted, it moves the middle


def test_pass1_tail_reads_the_marks_by_sm_row_and_split():
    """One sequence at γ = 1 (rows: target 0, 1, draft 2), two splits: six programs on three SMs, marks in ns. The
    columns are checked against values worked out by hand from the marks."""
    import math

    import torch

    from sdbench.commands.logits_kernels import pass1_tail, timeline_phases

    # (entry, partial computed, SM, unused), program order: (row 0, split 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)
    pass1 = torch.tensor([[1000, 3000, 7, 0], [1000, 2000, 7, 0],
                          [1100, 6000, 8, 0], [1100, 4000, 9, 0],
                          [1200, 9000, 9, 0], [1200, 5000, 9, 0]], dtype=torch.int64)
    tail = pass1_tail(pass1, gamma=1, splits=2)
    # SM 7 done at 2.0 µs after the first entry, SM 8 at 5.0, SM 9 at 8.0; SMs ran 2, 1 and 3 programs
    assert tail["sm_done_first"] == pytest.approx(2.0)
    assert (tail["sm_programs_min"], tail["sm_programs_max"]) == (1.0, 3.0)
    # target rows done at 2.0, 1.0, 5.0, 3.0 (upper middle 3.0); draft at 8.0, 4.0 (8.0); last splits 1.0, 3.0, 4.0
    assert tail["target_half"] == pytest.approx(3.0) and tail["draft_half"] == pytest.approx(8.0)
    assert tail["last_split_half"] == pytest.approx(3.0)
    # the draft row read nothing (a greedy target): left out, its SM's count and done time with it
    read = torch.tensor([True, True, True, True, False, False])
    skipped = pass1_tail(pass1, gamma=1, splits=2, read=read)
    assert math.isnan(skipped["draft_half"]) and skipped["sm_programs_max"] == 2.0
    assert skipped["target_half"] == pytest.approx(3.0) and skipped["sm_done_first"] == pytest.approx(2.0)
    # timeline_phases adds these columns only when it is given γ and the splits
    race = torch.tensor([[9000, 9500, 10000, 10300, 11000, 1, 1, 0]], dtype=torch.int64).flatten()
    assert "sm_done_first" not in timeline_phases(pass1.flatten(), race)
    with_tail = timeline_phases(pass1.flatten(), race, gamma=1, splits=2)
    assert {key: with_tail[key] for key in tail} == tail


def test_pass1_reads_marks_the_draft_rows_of_greedy_targets():
    import torch

    from sdbench.commands.logits_kernels import pass1_reads

    read = pass1_reads(torch.tensor([0.0, 0.7]), gamma=2, splits=2).view(2, 5, 2)
    assert not read[0, 3:].any() and read[0, :3].all() and read[1].all()


def test_a_timeline_build_mirrors_the_shipped_launch():
    """`_launches` gives the timeline build the shipped launch's plans, scan and combine, so the marks time the
    design the per-kernel line times; the launcher refuses a timeline build it would plan itself."""
    from sdbench.commands.logits_kernels import _launches
    from sdbench.ops.prob_verify_logits.workload import LogitsConfig, make_logits_workload

    w = make_logits_workload(LogitsConfig(3, 2, vocab_size=300, seed=5)).with_randomness("fast")
    for variant in ("default", "scan-kernel", "nocombine"):
        shipped, timeline = _launches(variant, w, 3, 2, 300, 132, True)
        assert shipped.timeline is None and timeline.timeline is not None
        assert (timeline.plans, timeline.scan, timeline.combine) == (shipped.plans, shipped.scan, shipped.combine)
    assert _launches("default", w, 3, 2, 300, 132, False)[1] is None
    assert _launches("one", w, 3, 2, 300, 132, True)[1] is None  # the one launch has no timeline build
    from sdbench.commands.logits_kernels import _inputs
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    with pytest.raises(ValueError, match="mirrors a launch"):
        tk.fused_logits_launcher(_inputs(w), allocate_outputs(w), True, w.seed, 0, timeline=True)
    with pytest.raises(ValueError, match="no scan, combine or mass plan"):  # the tool prints and skips such a variant
        _launches("one+scan-kernel", w, 3, 2, 300, 132, False)
    with pytest.raises(ValueError, match="single=True has none"):
        tk.fused_logits_launcher(_inputs(w), allocate_outputs(w), True, w.seed, 0, single=True, timeline=True)


def test_sample_variants_name_the_draw():
    assert plan_changes("cdf", 32, 8, 32000, 132) == {"sample": "cdf"}
    assert plan_changes("race+scan-kernel", 32, 8, 32000, 132) == {"sample": "race", "scan": "kernel"}


def test_launch_variants_name_pdl_and_the_races_load_order():
    assert plan_changes("nopdl", 32, 8, 32000, 132) == {"pdl": False}
    assert plan_changes("pdl+tokens-last", 32, 8, 32000, 132) == {"pdl": True, "tokens_first": False}
    assert plan_changes("nopdl+tokens-first", 1, 16, 32000, 132) == {"pdl": False, "tokens_first": True}


def test_a_calls_device_time_counts_its_overlap_once():
    """Three calls of two kernels each, the second starting inside the first (PDL); the calls one after another."""
    from sdbench.commands.logits_kernels import per_call_busy_us

    spans = [(0, 5_000), (4_000, 7_000), (10_000, 12_000), (11_000, 13_000), (20_000, 21_000), (22_000, 23_000)]
    assert per_call_busy_us(list(reversed(spans)), 3) == pytest.approx([7.0, 3.0, 2.0])
    with pytest.raises(RuntimeError, match="5 kernel records for 3 calls"):  # a record CUPTI lost
        per_call_busy_us(spans[:5], 3)


def test_a_row_records_what_the_launch_resolved():
    """A CPU-built launch (nothing runs): the row's choices are the launch's, an explicit order and the defaults
    resolved alike; a launcher without them (the peer's) records none."""
    import torch

    from sdbench.commands.logits_kernels import launch_choices, launch_plans

    batch, gamma, vocab = 2, 3, 5000
    t = tk.LogitsTensors(torch.zeros(batch, gamma, dtype=torch.int64), torch.zeros(batch, gamma + 1, vocab),
                         torch.zeros(batch, gamma, vocab), torch.ones(batch), torch.ones(batch),
                         torch.zeros(batch, gamma), torch.zeros(batch, vocab))
    outputs = {"accepted_lengths": torch.empty(batch, dtype=torch.int64),
               "next_tokens": torch.empty(batch, dtype=torch.int64),
               "output_tokens": torch.empty(batch, gamma + 1, dtype=torch.int64),
               "error_flags": torch.empty(batch, dtype=torch.int32)}
    for tokens_first, lean, read_first, sample in ((True, True, None, None), (False, True, False, "picks"),
                                                   (True, False, True, "race")):
        launch = tk.fused_logits_launcher(t, outputs, True, 0, 0, scan="race", combine=True, tokens_first=tokens_first,
                                          lean_scan=lean, read_first=read_first, sample=sample)
        assert launch_choices(launch) == {"scan": "race", "combine": True, "pdl": False, "tokens_first": tokens_first,
                                          "lean_scan": lean, "read_first": bool(read_first),
                                          "sample": sample or "cdf"}
    assert launch_choices(tk.fused_logits_launcher(t, outputs, True, 0, 0, scan="kernel"))["tokens_first"] is False
    assert launch_choices(lambda: None) is None
    # the plans it ran: pass 1's and the race's (a race program's steps among them)
    stats, race = tk.StatsPlan(span=1024, splits=5), tk.RacePlan(rows=256, steps=3, programs=4, num_warps=2)
    launch = tk.fused_logits_launcher(t, outputs, True, 0, 0, stats_plan_=stats, race_plan=race)
    assert launch_plans(launch, 4) == (
        dict(span=1024, splits=5, tile=tk.stats_tile(4), num_warps=tk.STATS_WARPS, per_sm=None, race_per_sm=None),
        dict(rows=256, steps=3, programs=4, num_warps=2))
    assert launch_plans(lambda: None, 4) == (None, None)


def test_the_launch_floor_is_timed_as_a_variant_is(monkeypatch):
    """The empty launch goes through `per_kernel_us` with the variants' iterations and flush (the median call's
    device time is its floor); where none can launch, no number."""
    from sdbench.commands import logits_kernels
    from sdbench.ops.launch_floor import LaunchFloor

    assert logits_kernels.launch_floor_us(LaunchFloor(None, "triton_bound", "no kernel launch on a CPU device"), 5) is None
    seen = []

    def timed(run, iters, flush=None):
        seen.append((run, iters, flush))
        return {"_empty": 0.61}, 0.58

    monkeypatch.setattr(logits_kernels, "per_kernel_us", timed)
    empty, flush = object(), object()
    assert logits_kernels.launch_floor_us(LaunchFloor(empty, "triton_bound"), 7, flush) == 0.58
    assert seen == [(empty, 7, flush)]
