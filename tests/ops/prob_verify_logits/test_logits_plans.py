"""fused_logits' plan choices on a GPU's shape (an SM count stands in for the device: no GPU needed)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sdbench.ops.prob_verify.triton_kernels import resident_programs  # noqa: E402
from sdbench.ops.prob_verify_logits import triton_kernels as kernels  # noqa: E402


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(multi_processor_count=132))
    return torch.device("cuda")


@pytest.mark.parametrize("batch,vocab,expected,with_pdl", [
    (1, 128256, "race", "race"),  # 126 race chunks fit beside each other: the repeated scans cost latency only
    (16, 32000, "race", "race"),
    (32, 128256, "kernel", "early"),  # 32·126 chunks: more than 16 per SM
    (128, 32000, "kernel", "early"),
    (512, 32000, "kernel", "kernel"),  # above EARLY_MAX_BATCH
])
def test_where_the_accept_scan_runs(h200, batch, vocab, expected, with_pdl):
    race = kernels.default_race_plan(batch, vocab, h200)
    assert kernels.default_scan(batch, race, h200) == expected
    assert kernels.default_scan(batch, race, h200, pdl=True) == with_pdl


@pytest.mark.parametrize("registers,warps,shared,expected", [
    (40, 4, 0, 12),  # pass 1 (bf16 and fp32): 1280 registers a warp, 12 warps per partition
    (64, 4, 1024, 8),  # the race at 1024-column chunks
    (72, 4, 1024, 7),
    (255, 4, 0, 2),
    (32, 1, 0, 32),  # the 32-block cap, before 64 warps
    (32, 4, 100 * 1024, 2),  # shared memory (+1 KB a block) binds
])
def test_resident_programs_follow_cudas_occupancy_rule(registers, warps, shared, expected):
    props = types.SimpleNamespace(regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                                  shared_memory_per_multiprocessor=233472)
    assert resident_programs(registers, warps, shared, props) == expected


@pytest.mark.parametrize("batch,gamma,vocab", [(32, 8, 128256), (128, 4, 128256), (32, 16, 32000), (512, 4, 128256)])
def test_pass_one_fills_several_waves(h200, batch, gamma, vocab):
    rows = batch * (2 * gamma + 1)
    plan = kernels.default_stats_plan(batch, gamma, vocab, h200, per_sm=12)
    programs = rows * plan.splits
    assert programs >= kernels.STATS_WAVES * 12 * 132 * 0.9  # about STATS_WAVES waves, not one and a third
    assert (plan.splits - 1) * plan.span < vocab <= plan.splits * plan.span


@pytest.mark.parametrize("batch,vocab", [(1, 128256), (32, 128256), (32, 32000), (128, 32000), (512, 128256),
                                         (4096, 151936)])
def test_the_race_is_one_wave(h200, batch, vocab):
    race = kernels.default_race_plan(batch, vocab, h200, per_sm=8)
    chunks = -(-vocab // (4 * race.rows))
    assert race.programs * race.steps >= chunks > (race.programs - 1) * race.steps  # every chunk, once
    least = min(chunks, kernels.RACE_MIN_PROGRAMS)
    assert race.programs >= least
    # at most a wave, unless RACE_MIN_PROGRAMS a sequence take more; most of one where the chunks fill it
    assert batch * race.programs <= max(batch * least, 8 * 132)
    if batch * chunks >= 8 * 132:
        assert batch * race.programs > 8 * 132 / 2


def test_pass_one_below_a_wave_pads_few_partials(h200):
    plan = kernels.default_stats_plan(1, 16, 151936, h200, per_sm=12)  # 149 tiles: 38 splits of 4 would pad to 64
    assert plan.splits == 30 and plan.span == 5 * kernels.STATS_TILE
    assert kernels.default_stats_plan(1, 16, 128256, h200, per_sm=12).splits == 32  # 126 tiles in 32: no change
    assert kernels.default_stats_plan(1, 4, 128256, h200, per_sm=12).splits == 32  # not 126 one-tile spans
    assert kernels.default_stats_plan(1, 4, 32000, h200, per_sm=12).splits == 32  # 32 one-tile spans stay
    assert kernels.default_stats_plan(32, 8, 128256, h200, per_sm=12).splits == 12  # several waves: no change
    # one tile a program fits a wave (9 rows × 149 tiles), but 149 partials pad to 256 (50 of 3 tiles to 64, 38 of 4 to 64)
    assert kernels.default_stats_plan(1, 4, 151936, h200, per_sm=12) == kernels.StatsPlan(5 * kernels.STATS_TILE, 30)


@pytest.mark.parametrize("batch,gamma,vocab,element_size,per_sm", [
    (32, 4, 32000, 4, 12),  # 288 rows × 8 spans of 4 tiles = 1.45 waves of 12 per SM
    (32, 8, 32000, 2, 9),  # 544 rows × 4 spans of 4 tiles (bf16: 2048 columns) = 1.83 waves of 9 per SM
])
def test_pass_one_between_one_and_two_waves_takes_one_wave(h200, batch, gamma, vocab, element_size, per_sm):
    rows, wave = batch * (2 * gamma + 1), per_sm * 132
    tile = kernels.stats_tile(element_size)
    four_tiles = kernels.stats_plan(rows, vocab, kernels.STATS_WAVES * wave, tile, kernels.STATS_MIN_TILES, wave=wave)
    assert wave < rows * four_tiles.splits <= 2 * wave  # the case the rule is for
    plan = kernels.default_stats_plan(batch, gamma, vocab, h200, per_sm=per_sm, element_size=element_size)
    assert rows * plan.splits <= wave and plan.splits < four_tiles.splits
    assert (plan.splits - 1) * plan.span < vocab <= plan.splits * plan.span  # every column, once
    # the measured plans (H100): 4 splits of 8192 columns, and 2 of 16384
    assert plan == (kernels.StatsPlan(8192, 4) if element_size == 4 else kernels.StatsPlan(16384, 2))


def test_pass_one_beyond_two_waves_keeps_its_spans(h200):
    # 544 rows × 8 spans of 4 tiles = 2.75 waves: halving the splits (1.37 waves) measured 0.8 µs slower
    plan = kernels.default_stats_plan(32, 8, 32000, h200, per_sm=12)
    assert plan == kernels.StatsPlan(4 * kernels.STATS_TILE, 8)


def test_race_chunks_are_capped_on_a_gpu(h200):
    race = kernels.default_race_plan(512, 128256, h200)
    assert 4 * race.rows <= kernels.RACE_CHUNK_MAX
    assert race.programs * race.steps * 4 * race.rows >= 128256


@pytest.mark.parametrize("batch,vocab,columns", [
    (32, 32000, 2048),  # 32 sequences of 32 chunks: the race scans in every program; one 2048-column step each
    (16, 128256, 2048),
    (4, 151936, 2048),  # 300 programs of 2048 columns: two an SM
    (2, 151936, 1024),  # 150: fewer than two an SM, so the row's parallelism wins (H100: +0.3 µs at 2048)
    (1, 151936, 1024),
    (8, 32000, 1024),
    (32, 128256, 1024),  # the race fills the machine (the scan kernel runs): unchanged
    (128, 32000, 1024),
    (512, 128256, 1024),
    (2, 32000, 512),  # too few programs at 1024 already: the prob sampler's smaller chunks, as before
])
def test_where_the_race_scans_in_every_program_its_chunks_are_larger(h200, batch, vocab, columns):
    race = kernels.default_race_plan(batch, vocab, h200, token_race=True)
    assert 4 * race.rows == columns
    # the block rule's race keeps the RACE_CHUNK_MAX plan
    assert kernels.default_race_plan(batch, vocab, h200) == kernels._race_plan(
        batch, vocab, h200, kernels.RACE_CHUNK_MAX, kernels.RACE_PER_SM_GUESS * 132)
    assert race.programs * race.steps * 4 * race.rows >= vocab
    # the scan's placement follows the RACE_CHUNK_MAX plan: larger chunks only where it is "race" there already
    capped = kernels._race_plan(batch, vocab, h200, kernels.RACE_CHUNK_MAX, kernels.RACE_PER_SM_GUESS * 132)
    assert kernels.default_scan(batch, race, h200) == kernels.default_scan(batch, capped, h200)


def test_pass_one_takes_several_tiles_once_a_wave_is_full(h200):
    plan = kernels.default_stats_plan(1, 16, 128256, h200)  # 33 rows × 126 tiles > a wave of 12 per SM
    assert plan.span >= kernels.STATS_MIN_TILES * kernels.STATS_TILE
    assert kernels.default_stats_plan(1, 4, 32000, h200).span == kernels.STATS_TILE  # 9 × 32 tiles fit a wave


@pytest.mark.parametrize("scan", ["pass1", "kernel", "early"])
def test_the_block_rule_refuses_another_scan(scan):
    inputs = types.SimpleNamespace(shape=(2, 3, 64), draft_tokens=torch.zeros(2, 3))  # refused before any launch
    with pytest.raises(ValueError, match="block rule scans in the race"):
        kernels.fused_logits_launcher(inputs, {}, fast=False, rule="block", scan=scan)


@pytest.mark.parametrize("scan,combine", [("pass1", False), ("kernel", True), ("early", True)])
def test_a_scan_refuses_the_wrong_combine(scan, combine):
    inputs = types.SimpleNamespace(shape=(2, 3, 64), draft_tokens=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="combine"):
        kernels.fused_logits_launcher(inputs, {}, fast=False, scan=scan, combine=combine)


def test_the_early_race_refuses_another_pass_one_order():
    t = _logits_tensors(torch.float32)  # (refused where pass 1 is built, before anything launches)
    with pytest.raises(ValueError, match="read_first and done"):
        kernels.fused_logits_launcher(t, _outputs(2, 3), fast=False, scan="early", read_first=True)


def test_a_lower_split_cap_below_a_wave_takes_longer_spans(h200):
    # 149 tiles of 1024 columns: 30 spans of 5 by default (above), 15 of 10 with at most 16 splits
    assert kernels.default_stats_plan(1, 16, 151936, h200, per_sm=12, max_splits=16) == kernels.StatsPlan(10240, 15)
    # bf16 steps 4 KiB (2048 columns): 75 tiles, 15 spans of 5 (float32: 30 spans of 5 tiles of 1024)
    assert kernels.default_stats_plan(1, 16, 151936, h200, per_sm=12, element_size=2) == kernels.StatsPlan(10240, 15)


def _logits_tensors(dtype):
    batch, gamma, vocab = 2, 3, 5000
    return kernels.LogitsTensors(
        torch.zeros(batch, gamma, dtype=torch.int64), torch.zeros(batch, gamma + 1, vocab, dtype=dtype),
        torch.zeros(batch, gamma, vocab, dtype=dtype), torch.ones(batch), torch.ones(batch),
        torch.zeros(batch, gamma), torch.zeros(batch, vocab))


@pytest.mark.parametrize("dtype,step", [(torch.float32, kernels.STATS_TILE), (torch.bfloat16, 2 * kernels.STATS_TILE)])
def test_pass_one_compiles_the_plans_step(dtype, step):
    """The step pass 1 is compiled with (its TILE and warps), from the plan or the logits' dtype; a plan's step
    and an explicit one that disagree are refused, not silently resolved (nothing is launched here)."""
    t = _logits_tensors(dtype)
    stats = kernels.allocate_stats(2, 3, 2, torch.device("cpu"))
    default = kernels._stats_launch(t, stats, kernels.StatsPlan(4 * step, 2))
    assert (default._meta["TILE"], default._meta["num_warps"]) == (step, kernels.STATS_WARPS)
    chosen = kernels._stats_launch(t, stats, kernels.StatsPlan(8192, 1, 4096, 8))
    assert (chosen._meta["TILE"], chosen._meta["num_warps"]) == (4096, 8)
    assert kernels._stats_launch(t, stats, kernels.StatsPlan(4096, 2), tile=1024)._meta["TILE"] == 1024  # the peer's
    with pytest.raises(ValueError, match="step of 1024"):
        kernels._stats_launch(t, stats, kernels.StatsPlan(8192, 1, 4096), tile=1024)


def _with_logits(t, target, draft):
    return kernels.LogitsTensors(t.draft_tokens, target, draft, t.target_temperature, t.draft_temperature, t.uniforms,
                                 t.exponential_noise)


def test_pass_one_reads_bf16_as_words_only_where_every_tile_is_aligned():
    """WORDS (`_load_tile` reads 32-bit words) only for bf16 whose every tile starts 4-byte aligned in both tensors,
    and only where asked: an odd vocabulary (odd strides), a base one element in, an odd span and float32 read elements
    (a word load there would fault on the GPU; the interpreter would read it anyway). Nothing is launched here."""
    t = _logits_tensors(torch.bfloat16)
    stats = kernels.allocate_stats(2, 3, 2, torch.device("cpu"))
    plan = kernels.StatsPlan(4096, 2)

    def words(tensors, span=4096, asked=True):
        return kernels._stats_launch(tensors, stats, kernels.StatsPlan(span, 2), bf16_words=asked)._meta["WORDS"]

    assert words(t) and not words(t, asked=False)
    assert not kernels._stats_launch(t, stats, plan)._meta["WORDS"]  # (callers name it: fused_logits and the peer do)
    assert not words(_logits_tensors(torch.float32))
    odd = torch.zeros(2, 4, 5001, dtype=torch.bfloat16)[..., :5000]  # rows 5001 elements apart
    assert not words(_with_logits(t, odd, t.draft_logits))
    assert not words(_with_logits(t, t.target_logits, torch.zeros(2, 3, 5001, dtype=torch.bfloat16)[..., 1:]))
    shifted = torch.zeros(2 * 4 * 5000 + 1, dtype=torch.bfloat16)[1:].view(2, 4, 5000)  # the base 2 bytes in
    assert shifted.data_ptr() % 4 == 2 and not words(_with_logits(t, shifted, t.draft_logits))
    assert words(t, span=4096 + 2) and not words(t, span=4096 + 1)


def test_the_reading_programs_first_only_where_greedy_drafts_leave_programs_empty():
    """read_first orders the programs the token rule's skip leaves empty, up to READ_FIRST_MAX_BATCH requests: the
    block rule (which reads every draft row), a larger batch and the one launch refuse it, as the one launch refuses
    sample "picks" (nothing is launched here)."""
    t = _logits_tensors(torch.float32)
    assert kernels.fused_logits_launcher(t, _outputs(2, 3), fast=True, read_first=True).read_first
    assert not kernels.fused_logits_launcher(t, _outputs(2, 3), fast=True).read_first  # off by default
    with pytest.raises(ValueError, match="read_first"):
        kernels.fused_logits_launcher(t, _outputs(2, 3), fast=True, rule="block", read_first=True)
    with pytest.raises(ValueError, match="read_first"):
        kernels.fused_logits_launcher(t, _outputs(2, 3), fast=True, single=True, read_first=False)
    with pytest.raises(ValueError, match="picks"):
        kernels.fused_logits_launcher(t, _outputs(2, 3), fast=True, single=True, sample="picks")
    batch = kernels.READ_FIRST_MAX_BATCH + 1
    wide = kernels.LogitsTensors(torch.zeros(batch, 1, dtype=torch.int64), torch.zeros(batch, 2, 64),
                                 torch.zeros(batch, 1, 64), torch.ones(batch), torch.ones(batch), torch.zeros(batch, 1),
                                 torch.zeros(batch, 64))
    with pytest.raises(ValueError, match="read_first"):
        kernels.fused_logits_launcher(wide, _outputs(batch, 1), fast=True, read_first=True)


def test_a_split_cap_needs_the_default_plan():
    t = _logits_tensors(torch.float32)
    with pytest.raises(ValueError, match="stats_max_splits"):
        kernels.fused_logits_launcher(t, {}, fast=True, stats_plan_=kernels.StatsPlan(4096, 2), stats_max_splits=16)


def test_programmatic_dependent_launch_needs_a_hopper_gpu_and_compiled_kernels():
    """Off on a CPU device (and under the interpreter): the default leaves it off and asking for it is refused,
    not silently dropped. On sm_90 with compiled kernels it is the default (its GPU test times nothing)."""
    assert not kernels.pdl_available(torch.device("cpu"))
    t = _logits_tensors(torch.float32)
    with pytest.raises(ValueError, match="pdl needs"):
        kernels.fused_logits_launcher(t, {}, fast=True, pdl=True)
    with pytest.raises(ValueError, match="single=True has one launch"):
        kernels.fused_logits_launcher(t, {}, fast=True, single=True, pdl=True)


def test_the_launch_option_is_asked_for_only_when_on():
    assert kernels._pdl_meta(True) == {"PDL": True, "launch_pdl": True} and kernels._pdl_meta(False) == {"PDL": False}


def test_the_race_loads_the_tokens_first_only_under_pdl_and_before_a_small_stats_load():
    """The order measured on the H100: tokens first where a program loads a few partials (b = 32, V = 32000,
    bf16: [16, 4] at γ = 4 to [64, 4] at γ = 16), stats first where it loads many (b = 1: [32-64, 16-32]); without
    PDL the stats first, the order of the kernels session 22 timed."""
    first = kernels.default_tokens_first
    assert first(4, 4, pdl=True) and first(8, 2, pdl=True) and first(16, 4, pdl=True)  # 64, 64 and 256 partials
    assert first(8, 1, pdl=True) and first(16, 1, pdl=True)  # combined rows: one partial a row
    assert not first(16, 16, pdl=True) and not first(16, 32, pdl=True) and not first(8, 32, pdl=True)
    assert not first(16, 5, pdl=True)  # [64, 8] once padded: 512
    assert not any(first(gamma, splits, pdl=False) for gamma in (1, 4, 16) for splits in (1, 4, 32))


def _outputs(batch: int, gamma: int) -> dict[str, torch.Tensor]:
    return {"accepted_lengths": torch.empty(batch, dtype=torch.int64), "next_tokens": torch.empty(batch, dtype=torch.int64),
            "output_tokens": torch.empty(batch, gamma + 1, dtype=torch.int64),
            "error_flags": torch.empty(batch, dtype=torch.int32)}


def test_under_pdl_the_load_order_follows_the_partials_the_race_reads():
    """The launch resolves the default from what its race reads: pass 1's partials uncombined (splits of them a
    row), or combined rows (one). Built on the CPU with pdl=True (nothing is launched: the launcher refuses PDL
    there, so this calls the launch builder it delegates to)."""
    t = _logits_tensors(torch.float32)  # γ = 3: R_PAD 8
    race = kernels.RacePlan(rows=32, steps=1, programs=2, num_warps=4)
    for splits, combine, want in ((64, False, False), (32, False, True), (64, True, True)):
        plan = kernels.StatsPlan(span=kernels.STATS_TILE, splits=splits)
        launch = kernels._fused_logits_launch(t, _outputs(2, 3), True, 0, 0, plan, "token", None, race, "race", None,
                                              combine, pdl=True)
        assert launch.tokens_first is want, (splits, combine)
        assert launch.race_launch._meta["TOKENS_FIRST"] is want and launch.race_launch._meta["PDL"]


def test_an_explicit_load_order_is_kept_and_a_race_that_does_not_scan_has_none():
    t = _logits_tensors(torch.float32)
    for scan, tokens_first, want in (("race", True, True), ("race", False, False), ("race", None, False),
                                     ("kernel", True, False), ("pass1", True, False)):
        launch = kernels.fused_logits_launcher(t, _outputs(2, 3), fast=True, scan=scan, tokens_first=tokens_first)
        assert launch.tokens_first is want, (scan, tokens_first)
        assert launch.race_launch._meta["TOKENS_FIRST"] is want


def test_the_early_race_waits_on_its_sequence_behind_a_plain_pass_one():
    """scan "early" built on the CPU with pdl=True (nothing is launched): pass 1 counts its programs a sequence
    (SEQUENCE_DONE) and starts with a plain launch, never launch_pdl, since the race's last arrival resets the count
    with a plain store that the next call's pass 1 must not overlap; the race launches with PDL, waits on its
    sequence's count (SEQUENCE_WAIT) of (2γ+1)·splits programs, combines the uncombined partials itself and scans
    (not SCANNED, no stop stats); the count is part of the scratch the tests check is left zeroed. Another scan
    leaves both off."""
    t = _logits_tensors(torch.float32)  # B = 2, γ = 3
    race = kernels.RacePlan(rows=32, steps=1, programs=2, num_warps=4)
    plan = kernels.StatsPlan(span=kernels.STATS_TILE, splits=4)
    launch = kernels._fused_logits_launch(t, _outputs(2, 3), True, 0, 0, plan, "token", None, race, "early", None,
                                          False, pdl=True)
    pass_one, race_meta = launch.stats_launch._meta, launch.race_launch._meta
    assert pass_one["SEQUENCE_DONE"] and "launch_pdl" not in pass_one and pass_one["PDL"]
    assert race_meta["SEQUENCE_WAIT"] and race_meta["launch_pdl"]
    assert not race_meta["SCANNED"] and not race_meta["STOP_STATS"] and race_meta["STATS_PAD"] == 4
    assert launch.race_launch._args[launch.race_launch._kernel.arg_names.index("pass_programs")] == 7 * 4
    assert launch.scratch[-1].shape == (2,) and not launch.scratch[-1].any()
    other = kernels._fused_logits_launch(t, _outputs(2, 3), True, 0, 0, plan, "token", None, race, "kernel", None,
                                         False, pdl=True)
    assert not other.stats_launch._meta["SEQUENCE_DONE"] and not other.race_launch._meta["SEQUENCE_WAIT"]
