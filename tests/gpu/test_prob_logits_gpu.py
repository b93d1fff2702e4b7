"""prob_verify_logits on CUDA: parity of every implementation with the reference over a grid (mixed
temperatures, bf16 and fp32), fast mode deterministic and graph-capturable, the designs agreeing on
fast-mode accept tests (and on every token when fused_logits draws by the race), the χ² exactness of
the kernels from logits, and the grid's largest point running.

Parity contract: tokens and lengths bit for bit against reference.prob_verify_logits (float32) on the
same supplied randomness. The kernels compute the same softmax with another summation order, so a
draw within ~1e-6 relative of a tie could differ (probability ~1e-6 per draw: not expected in this
grid's ~10^4 draws). χ² method and significance: tests/ops/prob_verify_logits/test_logits_exactness.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import pytest
import torch

from sdbench import parity, registry
from sdbench.ops.prob_verify_logits.checks import check
from sdbench.ops.prob_verify_logits.workload import LogitsConfig, logits_workload_from_logits, make_logits_workload

_TESTS = Path(__file__).resolve().parents[1] / "ops"
sys.path.insert(0, str(_TESTS / "prob_verify"))
sys.path.insert(0, str(_TESTS / "prob_verify_logits"))
from test_logits_exactness import SIGNIFICANCE, fixed_logits, group_pvalues, mixed_rounds  # noqa: E402
from test_prob_exactness import exactness_pvalues  # noqa: E402

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
IMPLS = ("torch_eager", "fused_logits", "vllm_v2_style", "softmax_fused_prob")


def _grid():
    for index, (batch, gamma, vocab, dtype) in enumerate(
            itertools.product((1, 32), (4, 16), (32000, 151936), ("float32", "bfloat16"))):
        yield LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, seed=index)
    yield LogitsConfig(128, 8, vocab_size=128256, logits_dtype="bfloat16", seed=50)
    yield LogitsConfig(512, 4, vocab_size=32000, seed=51)
    yield LogitsConfig(32, 8, vocab_size=32000, temperatures=(0.0,), draft_noise=0.1, token_dtype="int32", seed=52)
    yield LogitsConfig(32, 8, vocab_size=32000, temperatures=(0.6, 1.0), draft_noise=0.0, seed=53)  # all bonus draws
    yield LogitsConfig(32, 8, vocab_size=32000, draft_noise=3.0, seed=54)  # early rejections


GRID = list(_grid())


def _config_id(cfg: LogitsConfig) -> str:
    return f"b{cfg.batch_size}-g{cfg.gamma}-v{cfg.vocab_size}-{cfg.logits_dtype}-n{cfg.draft_noise}-{cfg.token_dtype}"


def _snapshot(outputs):
    return {key: value.clone() for key, value in outputs.items()}


@pytest.mark.parametrize("cfg", GRID, ids=_config_id)
def test_every_implementation_matches_the_reference(cfg):
    workload = make_logits_workload(cfg, DEVICE)
    failures = {}
    for name in IMPLS:
        impl = registry.get("prob_verify_logits", name)
        assert impl.unavailable_reason(DEVICE, cfg) is None, (name, impl.unavailable_reason(DEVICE, cfg))
        failure = check(impl, workload)
        if failure is not None:
            failures[name] = failure
    assert not failures, failures


def test_block_rule_runs_in_torch_eager_on_cuda():
    workload = make_logits_workload(LogitsConfig(32, 8, vocab_size=32000, rule="block", seed=3), DEVICE)
    assert check(registry.get("prob_verify_logits", "torch_eager"), workload) is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_mode_advances_on_the_device_and_the_designs_agree(dtype):
    """Call n of a prepared run draws at offset + n (device-side counters, no host work): it equals the first
    call of a run prepared at that offset; both designs make the same accept tests."""
    fast = make_logits_workload(LogitsConfig(32, 8, vocab_size=128256, logits_dtype=dtype, seed=8), DEVICE)
    fast = fast.with_randomness("fast", offset=5)
    fused = registry.get("prob_verify_logits", "fused_logits").prepare(fast)
    first, second = _snapshot(fused()), _snapshot(fused())
    vllm = registry.get("prob_verify_logits", "vllm_v2_style").prepare(fast)
    vllm_first, vllm_second = _snapshot(vllm()), _snapshot(vllm())
    at_six = _snapshot(registry.get("prob_verify_logits", "fused_logits").prepare(fast.with_randomness("fast", 6))())
    for name in first:
        assert torch.equal(second[name], at_six[name]), name
    for ours, peers in ((first, vllm_first), (second, vllm_second)):  # the same accept tests (the residual
        _assert_accept_alike(ours, peers)                              # draw differs: inversion, not the race)
    assert not torch.equal(first["output_tokens"], second["output_tokens"])
    assert bool((fused.philox_offsets == 7).all()) and bool((vllm.philox_offsets == 7).all())


@pytest.mark.parametrize("name,vocab", [("fused_logits", 32000), ("fused_logits", 128256), ("vllm_v2_style", 32000)])
def test_graph_replay_equals_eager(name, vocab):
    """At V = 32000 fused_logits' race scans; at V = 128256 pass 1 does (the race fills an H100/H200)."""
    fast = make_logits_workload(LogitsConfig(32, 8, vocab_size=vocab, seed=9), DEVICE).with_randomness("fast")
    run = registry.get("prob_verify_logits", name).prepare(fast)
    expected = _snapshot(run())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run.launch()
    parity.poison(run.outputs)
    run.philox_offsets.fill_(fast.offset)  # a replay draws at the counters and advances them, as a call does
    graph.replay()
    torch.cuda.synchronize()
    for key, value in expected.items():
        assert torch.equal(run.outputs[key], value), key
    assert bool((run.philox_offsets == fast.offset + 1).all())


@pytest.mark.parametrize("point,one_chunk", [((32, 16, 32000, "bfloat16"), True), ((32, 4, 128256, "bfloat16"), False)])
def test_fast_mode_draws_by_picks_where_a_race_program_takes_one_chunk(point, one_chunk):
    """`default_picks`: at b = 32, V = 32000 the H200's race plan gives each program one chunk and fast mode draws by
    "picks"; at V = 128256, several chunks a program, by "cdf" (docs/perf-notes.md, "Session 39"). Supplied
    randomness is the race either way."""
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    batch, gamma, vocab, dtype = point
    w = make_logits_workload(LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, seed=74), DEVICE)
    inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                   w.draft_temperature, w.uniforms, w.exponential_noise)
    launch = kernels.fused_logits_launcher(inputs, allocate_outputs(w), fast=True)
    assert (launch.plans[1].steps == 1) == one_chunk, launch.plans
    assert launch.sample == ("picks" if one_chunk else "cdf")
    assert kernels.fused_logits_launcher(inputs, allocate_outputs(w), fast=False).sample == "race"


@pytest.mark.parametrize("sample", ["race", "cdf", "picks"])  # the race's best keys, or the inversion's chunk masses
@pytest.mark.parametrize("scan", ["race", "early", "pass1", "kernel"])
def test_fused_logits_leaves_its_race_scratch_zeroed(scan, sample):
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    w = make_logits_workload(LogitsConfig(32, 4, vocab_size=32000, seed=10), DEVICE)
    inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                   w.draft_temperature, w.uniforms, w.exponential_noise)
    launch = kernels.fused_logits_launcher(inputs, allocate_outputs(w), fast=True, scan=scan, sample=sample)
    launch()
    launch()
    torch.cuda.synchronize()
    assert launch.scan == scan
    assert not any(counter.any() for counter in launch.scratch)


@pytest.mark.parametrize("randomness", ["fast", "supplied"])
def test_where_the_scan_runs_changes_no_output(randomness):
    """The accept scan in its own kernel, in pass 1 and in every race program (each after all of pass 1, or after its
    own sequence's: "early"): the same tokens, lengths and flags (fast mode: the same Philox draws), at a point where
    the race fills the machine (the default: early with PDL, else the kernel)."""
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    w = make_logits_workload(LogitsConfig(32, 8, vocab_size=128256, seed=12), DEVICE).with_randomness(randomness)
    w.draft_tokens[3, 2] = -1  # a bad id: flagged by whichever kernel scans
    inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                   w.draft_temperature, w.uniforms, w.exponential_noise)
    # fast mode draws by "cdf" (float64 inversion) and by "picks" (per-chunk candidates), each on one race plan for
    # every scan (the draws follow the plan's chunks, which each variant's compiled registers would size otherwise)
    pinned = kernels.RacePlan(rows=256, steps=1, programs=126, num_warps=4)  # 126 chunks of 1024: one a program
    for sample in ("cdf", "picks") if randomness == "fast" else (None,):
        results = []
        for scan in (None, "kernel", "pass1", "race", "early"):
            outputs = allocate_outputs(w)
            launch = kernels.fused_logits_launcher(inputs, outputs, fast=randomness == "fast", seed=w.seed, scan=scan,
                                                   sample=sample, race_plan=pinned)
            launch()
            results.append((launch.scan, {key: value.clone() for key, value in outputs.items()}))
        torch.cuda.synchronize()
        # the default here: early with PDL (b = 32 <= EARLY_MAX_BATCH), else the scan kernel
        default = "early" if kernels.pdl_available(torch.device(DEVICE)) else "kernel"
        assert [scan for scan, _ in results] == [default, "kernel", "pass1", "race", "early"]
        assert launch.sample == (sample or "race")
        for _, other in results[1:]:
            for key, value in results[0][1].items():
                assert torch.equal(value, other[key]), (sample, key)
        assert int(results[0][1]["error_flags"][3]) != 0


@pytest.mark.parametrize("randomness", ["fast", "supplied"])
@pytest.mark.parametrize("point", [(32, 16, 32000, "bfloat16", 0.3), (1, 16, 151936, "float32", 0.3),
                                   (128, 5, 32000, "float32", 0.3), (32, 4, 128256, "bfloat16", 0.3),
                                   (32, 16, 32000, "bfloat16", 0.0)], ids=lambda p: "b{}-g{}-v{}-{}-n{}".format(*p))
def test_reading_only_the_needed_rows_changes_no_output(point, randomness):
    """The accept scan reading only the rows it needs (lean_scan, the default: each position's target and draft row
    and the bonus row, each combined alone) against every row combined and then picked: the same tokens, lengths and
    flags bit for bit, in the race (scan "race") and in the scan kernel, for three calls in a row (fast mode: three
    draws). Mixed temperatures (greedy requests skip their draft rows), a bad id, γ = 5 padded to 8, and b = 1 with
    30 partials a row; draft noise 0 accepts every draft of a sampled request, so the bonus row (k = γ = GAMMA_PAD)
    is read. The reference agrees too (supplied randomness)."""
    from sdbench.ops.prob_verify_logits import reference
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    batch, gamma, vocab, dtype, noise = point
    w = make_logits_workload(LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, draft_noise=noise,
                                          seed=71), DEVICE).with_randomness(randomness)
    w.draft_tokens[batch // 2, gamma // 2] = vocab  # a bad id: flagged by whichever kernel scans
    inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                   w.draft_temperature, w.uniforms, w.exponential_noise)
    runs = {}
    for scan, lean in itertools.product(("race", "kernel"), (True, False)):
        outputs = allocate_outputs(w)
        # (sample "cdf": "picks" draws per chunk of the race plan, which each variant's compiled registers size)
        launch = kernels.fused_logits_launcher(inputs, outputs, fast=randomness == "fast", seed=w.seed, scan=scan,
                                               lean_scan=lean, sample="cdf")
        calls = []
        for _ in range(3):
            parity.poison(outputs)
            launch()
            calls.append(_snapshot(outputs))
        runs[scan, lean] = calls
    torch.cuda.synchronize()
    first = runs["race", True]
    for key, calls in runs.items():
        for call, (ours, theirs) in enumerate(zip(first, calls, strict=True)):
            for name, value in ours.items():
                assert torch.equal(value, theirs[name]), (key, call, name)
    assert int(first[0]["error_flags"][batch // 2]) != 0
    if noise == 0:  # the bonus row was read: some sequence accepted all γ drafts
        assert bool((first[0]["accepted_lengths"] == gamma).any())
    if randomness == "supplied":
        want = reference.prob_verify_logits(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                            w.draft_temperature, w.uniforms, w.exponential_noise)
        assert torch.equal(first[0]["accepted_lengths"], want["accepted_lengths"])
        assert torch.equal(first[0]["output_tokens"], want["output_tokens"])
    elif batch > 1:  # (b = 1: its one request is greedy, the same every call)
        assert not torch.equal(first[0]["output_tokens"], first[1]["output_tokens"])  # each call draws afresh


@pytest.mark.parametrize("randomness", ["fast", "supplied"])
@pytest.mark.parametrize("point", [(32, 8, 32000, "bfloat16", (0.0, 0.7, 1.0, 1.3)), (128, 4, 32000, "float32", (0.0, 1.0)),
                                   (1024, 4, 4096, "bfloat16", (0.0, 0.7, 1.0, 1.3)),
                                   (32, 16, 32000, "bfloat16", (0.0,)), (7, 3, 50000, "float32", (1.0,))],
                         ids=lambda p: "b{}-g{}-v{}-{}-t{}".format(*p[:4], len(p[4])))
def test_reading_programs_first_changes_no_output(point, randomness):
    """Pass 1's reading programs launched first (`_read_first`, an option up to B = READ_FIRST_MAX_BATCH) against
    row order (the default), with row order's plans (the option compiles to other registers, and the launcher's own
    re-plan could then split pass 1 otherwise): the same tokens, lengths and flags bit for bit (the same partials,
    computed by other programs), for three calls in a row, eager and replayed in a graph. Mixed batches (one request
    in four greedy, one in two), all greedy, all sampled, the largest batch it applies to (b = 1024) and a batch that
    pads (7). The launch reports the order it ran; supplied randomness, the reference agrees."""
    from sdbench.ops.prob_verify_logits import reference
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    batch, gamma, vocab, dtype, temperatures = point
    assert batch <= kernels.READ_FIRST_MAX_BATCH
    w = make_logits_workload(LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, draft_noise=0.3,
                                          temperatures=temperatures, seed=73), DEVICE).with_randomness(randomness)
    inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                   w.draft_temperature, w.uniforms, w.exponential_noise)
    runs, plans = {}, {}
    for read_first in (None, True):
        outputs = allocate_outputs(w)
        launch = kernels.fused_logits_launcher(inputs, outputs, fast=randomness == "fast", seed=w.seed,
                                               read_first=read_first, **plans)
        plans = dict(stats_plan_=launch.plans[0], race_plan=launch.plans[1])
        assert launch.read_first == bool(read_first)
        launch()  # (compiled before the capture)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch()
        calls = []
        for replay in (False, True, False):  # fast mode: each call draws afresh, from the same offsets in both runs
            parity.poison(outputs)
            graph.replay() if replay else launch()
            calls.append(_snapshot(outputs))
        runs[read_first] = calls
    torch.cuda.synchronize()
    for call, (ours, theirs) in enumerate(zip(runs[True], runs[None], strict=True)):
        for name, value in ours.items():
            assert torch.equal(value, theirs[name]), (call, name)
    if randomness == "supplied":
        want = reference.prob_verify_logits(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                            w.draft_temperature, w.uniforms, w.exponential_noise)
        for name in ("accepted_lengths", "output_tokens"):
            assert torch.equal(runs[True][0][name], want[name]), name


@pytest.mark.parametrize("shift", [0, 1])
@pytest.mark.parametrize("point", [(32, 8, 32000, "bfloat16"), (1, 16, 151936, "float32"), (512, 4, 32000, "bfloat16")],
                         ids=lambda p: "b{}-g{}-v{}-{}".format(*p))
def test_greedy_requests_need_no_draft_rows(point, shift):
    """The token rule skips a greedy target's draft rows: with NaN over them, fused_logits (its default plans, so
    PDL and the scan placement the size picks) and vllm_v2_style give the reference's outputs on the clean inputs,
    in supplied randomness, eager and replayed in a graph. shift 1 rolls the draft temperatures by one request, so
    greedy targets meet sampled drafts and sampled targets greedy drafts (proposing the draft's argmax). The workload
    is checked to be sensitive: a greedy target accepts a draft, and (shift 1) a sampled target rejects its greedy
    draft's argmax. b = 1: the grid's one request is greedy (every draft row skipped); b = 512: the scan kernel."""
    from sdbench.ops.prob_verify_logits import reference
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    batch, gamma, vocab, dtype = point
    if batch == 1 and shift:
        pytest.skip("one request: rolling the temperatures changes nothing")
    # (b = 1: less draft noise, so that its one greedy request accepts some of its drafts: 9 of 16)
    cfg = LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, draft_noise=0.1 if batch == 1 else 0.3,
                       seed=64)
    w = make_logits_workload(cfg, DEVICE)
    w.draft_temperature.copy_(w.target_temperature.roll(shift))
    greedy, greedy_draft = w.target_temperature == 0, w.draft_temperature == 0
    w.draft_tokens[greedy_draft] = w.draft_logits[greedy_draft].argmax(dim=2).to(w.draft_tokens.dtype)
    want = reference.prob_verify_logits(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                        w.draft_temperature, w.uniforms, w.exponential_noise)
    assert bool((want["accepted_lengths"][greedy] > 0).any())
    if shift:
        assert bool((want["accepted_lengths"][~greedy & greedy_draft] < gamma).any())
    w.draft_logits[greedy] = float("nan")
    inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                   w.draft_temperature, w.uniforms, w.exponential_noise)
    fused_out, peer_out = allocate_outputs(w), allocate_outputs(w, error_flags=False)
    fused = kernels.fused_logits_launcher(inputs, fused_out, fast=False)
    peer = kernels.vllm_v2_style_launcher(inputs, peer_out, fast=False)
    graph = torch.cuda.CUDAGraph()
    fused()  # (compiled before the capture)
    peer()
    with torch.cuda.graph(graph):
        fused()
        peer()
    for replay in (False, True):
        parity.poison(fused_out)
        parity.poison(peer_out)
        if replay:
            graph.replay()
        else:
            fused()
            peer()
        torch.cuda.synchronize()
        for key in ("output_tokens", "accepted_lengths", "next_tokens"):
            assert torch.equal(fused_out[key], want[key]), (replay, key)
            assert torch.equal(peer_out[key], want[key]), (replay, key)


def test_programmatic_dependent_launch_is_available_on_hopper():
    """The H100/H200 hosts' Triton takes launch_pdl: fused_logits' default there overlaps its launches."""
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels

    device = torch.device(DEVICE)
    if torch.cuda.get_device_capability(device) < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90+")
    assert kernels.pdl_available(device)


@pytest.mark.parametrize("rule,scan", [("token", "kernel"), ("token", "race"), ("token", "early"), ("token", "pass1"),
                                       ("block", None)])
@pytest.mark.parametrize("randomness", ["fast", "supplied"])
def test_programmatic_dependent_launch_changes_no_output(rule, scan, randomness):
    """With the scan kernel and the race started early (each waits for the kernel ahead before reading what it
    wrote; under scan "early", for its own sequence's pass-1 count), and, where the race scans, in either order of
    its loads, ten calls in a row give what ten calls
    without PDL give, call by call, eagerly and replayed in a CUDA graph. Before each call the inputs are
    overwritten with one of two workloads in turn (a plain copy, stream-ordered before pass 1), so every
    intermediate (pass 1's partials, the combined stats, the block rule's masses, k and row k's normalisers)
    differs from the previous call's: a read placed before its wait would take the other workload's and show."""
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    device = torch.device(DEVICE)
    if not kernels.pdl_available(device):
        pytest.skip("no programmatic dependent launch here (sm_90+ and a Triton with launch_pdl)")
    workloads, first = [], None
    for seed in (13, 14):
        w = make_logits_workload(LogitsConfig(32, 8, vocab_size=128256, seed=seed), DEVICE)
        first = first or w
        w.draft_tokens[5, 3] = 128256 if seed == 13 else 7  # a bad id in one workload only: its flag comes and goes
        workloads.append(kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                               w.draft_temperature, w.uniforms, w.exponential_noise))
    names = [field.name for field in dataclasses.fields(kernels.LogitsTensors)]
    inputs = kernels.LogitsTensors(*(getattr(workloads[0], name).clone() for name in names))

    def load(i: int) -> None:
        for name in names:
            getattr(inputs, name).copy_(getattr(workloads[i % 2], name))

    fast = randomness == "fast"
    race_scans = rule == "block" or scan in ("race", "early")
    orders = ((False, None), (True, None)) + (((True, False), (True, True)) if race_scans else ())
    calls = {}
    for pdl, tokens_first in orders:
        outputs = allocate_outputs(first)
        # (sample "cdf": "picks" draws per chunk of the race plan, which each variant's compiled registers size)
        launch = kernels.fused_logits_launcher(inputs, outputs, fast=fast, seed=13, rule=rule, scan=scan, pdl=pdl,
                                               tokens_first=tokens_first, sample="cdf")
        assert launch.pdl == pdl
        key = (pdl, tokens_first)
        calls[key] = []
        for i in range(10):
            load(i)
            launch()
            calls[key].append(_snapshot(outputs))
        if pdl:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                launch()
            launch.philox_offsets.fill_(0)
            for i in range(10):
                parity.poison(outputs)
                load(i)
                graph.replay()
                torch.cuda.synchronize()
                for name, value in calls[(False, None)][i].items():
                    assert torch.equal(outputs[name], value), (key, i, name)
    torch.cuda.synchronize()
    plain = calls.pop((False, None))
    for key, overlapped in calls.items():
        for i, (want, got) in enumerate(zip(plain, overlapped, strict=True)):
            for name, value in want.items():
                assert torch.equal(got[name], value), (key, i, name)
    assert [int(call["error_flags"][5]) != 0 for call in plain[:2]] == [True, False]
    assert not torch.equal(plain[0]["output_tokens"], plain[1]["output_tokens"])  # the two workloads differ


def test_plans_fill_waves_of_the_compiled_kernels():
    """On the GPU the launcher sizes pass 1 to about STATS_WAVES waves and the race to one wave of the
    programs per SM the compiled kernels allow (their registers), and says so in its plans."""
    from sdbench.ops.prob_verify.triton_kernels import resident_programs
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    w = make_logits_workload(LogitsConfig(32, 8, vocab_size=128256, seed=13), DEVICE)
    inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                   w.draft_temperature, w.uniforms, w.exponential_noise)
    launch = kernels.fused_logits_launcher(inputs, allocate_outputs(w), fast=True)
    stats_per_sm, race_per_sm = launch.programs_per_sm
    assert 1 <= race_per_sm <= stats_per_sm <= 32  # the race holds more registers than pass 1
    assert launch.stats_launch.programs_per_sm() == stats_per_sm  # pass 1's registers do not move with its split
    plan, race = launch.plans
    device = torch.device(DEVICE)
    assert plan == kernels.default_stats_plan(32, 8, 128256, device, per_sm=stats_per_sm)
    assert race == kernels.default_race_plan(32, 128256, device, per_sm=race_per_sm, token_race=True)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    assert 32 * race.programs <= race_per_sm * sms
    assert 32 * (2 * 8 + 1) * plan.splits >= 3 * stats_per_sm * sms  # several waves of pass 1
    props = torch.cuda.get_device_properties(device)
    for name in ("regs_per_multiprocessor", "max_threads_per_multi_processor", "shared_memory_per_multiprocessor"):
        assert hasattr(props, name), name  # the rule reads the device's own numbers, not its defaults
    assert resident_programs(255, 4, 0, props) == 2


@pytest.mark.parametrize("name,randomness", [("fused_logits", "fast"), ("fused_logits", "supplied"),
                                             ("vllm_v2_style", "fast"), ("softmax_fused_prob", "fast")])
def test_kernels_from_logits_are_exact_per_temperature(name, randomness):
    w = mixed_rounds(seed=21, device=DEVICE).with_randomness(randomness)
    outputs = registry.get("prob_verify_logits", name).prepare(w)()
    pvalues = group_pvalues(outputs, w)
    assert min(pvalues.values()) > SIGNIFICANCE, pvalues


def test_softmax_flashinfer_is_exact_or_says_why():
    impl = registry.get("prob_verify_logits", "softmax_flashinfer")
    reason = impl.unavailable_reason(DEVICE)
    if reason is not None:
        assert "flashinfer" in reason
        return
    w = mixed_rounds(seed=22, device=DEVICE).with_randomness("fast")
    pvalues = group_pvalues(impl.prepare(w)(), w)
    assert min(pvalues.values()) > SIGNIFICANCE, pvalues


def test_the_grids_largest_point_runs():
    """b=512, γ=16, V=151936 float32: 10 GB of logits generated on the device, both designs accept alike."""
    cfg = LogitsConfig(512, 16, vocab_size=151936, seed=11)
    fast = make_logits_workload(cfg, DEVICE).with_randomness("fast")
    fused = _snapshot(registry.get("prob_verify_logits", "fused_logits").prepare(fast)())
    k = fused["accepted_lengths"]
    assert bool(((k >= 0) & (k <= 16)).all())
    assert bool(((fused["next_tokens"] >= 0) & (fused["next_tokens"] < 151936)).all())
    assert torch.equal(fused["output_tokens"].gather(1, k[:, None]).squeeze(1), fused["next_tokens"])
    vllm = _snapshot(registry.get("prob_verify_logits", "vllm_v2_style").prepare(fast)())
    _assert_accept_alike(fused, vllm)


def _assert_accept_alike(ours: dict, peers: dict) -> None:
    """The same lengths and accepted drafts (fast mode draws the accept uniforms alike in every design)."""
    k = peers["accepted_lengths"]
    accepted = torch.arange(ours["output_tokens"].shape[1], device=k.device)[None, :] < k[:, None]
    assert torch.equal(ours["accepted_lengths"], k)
    assert torch.equal(ours["output_tokens"][accepted], peers["output_tokens"][accepted])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_drawing_by_the_race_makes_the_peers_draws(dtype):
    """fused_logits with sample="race" draws the exponential race on the Philox streams vllm_v2_style uses:
    every output equal, the residual tokens included."""
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    w = make_logits_workload(LogitsConfig(32, 8, vocab_size=128256, logits_dtype=dtype, seed=8), DEVICE)
    w = w.with_randomness("fast", offset=5)
    inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                   w.draft_temperature, w.uniforms, w.exponential_noise)
    race = allocate_outputs(w)
    kernels.fused_logits_launcher(inputs, race, fast=True, seed=w.seed, offset=5, sample="race")()
    vllm = _snapshot(registry.get("prob_verify_logits", "vllm_v2_style").prepare(w)())
    for name in vllm:
        assert torch.equal(race[name], vllm[name]), name


SPREAD_VOCAB = 8192  # 16 live columns, four in each of the first four 1024-column race chunks (of 8)


def _spread(logits: torch.Tensor, vocab: int = SPREAD_VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, 16] logits placed at columns 1024·c + 512·l + 100 + j of [rows, SPREAD_VOCAB] for live column
    i = 4c + 2l + j (-1e4 elsewhere: p = q = 0 there in float32), and those columns: chunk c holds two lanes of two
    adjacent live columns (`_race_vec`: lanes of 8 columns for bf16, 4 for fp32; 100, 101 sit in the lane that starts
    at 96 or 100, and 612, 613 in the one at 608 or 612)."""
    i = torch.arange(16)
    columns = (i // 4) * 1024 + ((i // 2) % 2) * 512 + 100 + i % 2
    wide = torch.full((logits.shape[0], vocab), -1e4)
    wide[:, columns] = logits
    return wide, columns


def _spread_draws(dtype: str, rounds: int = 100_000, parts: int = 4, sample: str = "cdf", vocab: int = SPREAD_VOCAB,
                  chunk: int = 1024):
    """fused_logits' outputs (fast mode: the inversion) over the spread logits, the tokens mapped back to
    0..15 (16 for a column that should never be drawn), and the p and q the kernel sees. chunk 1024: the plan the
    launcher picks here (8 chunks, four live columns in each of the first four); 2048: a race plan pinned to 2048-column
    chunks, one a program (the default at b = 32, V = 32000 where the race scans), whose units (`_pick_group`) hold 4
    lanes for float32 and 2 for bf16, so that live columns 1024 apart share a thread's unit."""
    target, draft = fixed_logits()
    wide_target, columns = _spread(target, vocab)
    wide_draft, _ = _spread(draft, vocab)
    index = torch.full((vocab,), 16, dtype=torch.int64, device=DEVICE)
    index[columns.to(DEVICE)] = torch.arange(16, device=DEVICE)
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    outputs = {"output_tokens": [], "accepted_lengths": []}
    for part in range(parts):
        cfg = LogitsConfig(rounds // parts, 2, vocab_size=vocab, logits_dtype=dtype, temperatures=(1.0,),
                           seed=30 + part)
        w = logits_workload_from_logits(wide_target.to(DEVICE).expand(cfg.batch_size, -1, -1),
                                        wide_draft.to(DEVICE).expand(cfg.batch_size, -1, -1), cfg)
        w = w.with_randomness("fast")
        out = allocate_outputs(w)
        chunks = -(-vocab // chunk)
        pinned = None if chunk == 1024 else kernels.RacePlan(rows=chunk // 4, steps=1, programs=chunks, num_warps=4)
        launch = kernels.fused_logits_launcher(
            kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                  w.draft_temperature, w.uniforms, w.exponential_noise), out, fast=True, seed=w.seed,
            offset=w.offset, sample=sample, race_plan=pinned)
        race = launch.plans[1]
        # the inversion's levels: vocab / chunk chunks, the live columns in the first 4096
        assert launch.sample == sample and (4 * race.rows, race.programs * race.steps) == (chunk, chunks), race
        launch()
        tokens = out["output_tokens"]
        outputs["output_tokens"].append(torch.where(tokens >= 0, index[tokens.clamp_min(0)], tokens).cpu())
        outputs["accepted_lengths"].append(out["accepted_lengths"].cpu())
    seen = w.target_logits[0][:, columns.to(DEVICE)].float().cpu(), w.draft_logits[0][:, columns.to(DEVICE)].float().cpu()
    return {name: torch.cat(parts_) for name, parts_ in outputs.items()}, seen


# picks at a vocab Triton does not know to be a multiple of 16: a lane is spread over threads, and its running sum is a
# shuffle scan, which can fall by an ulp (`_pick_in_chunk`'s w > 0 tests keep such a draw off dead columns)
# and picks at 2048-column chunks, whose float32 units are 4 lanes (16 columns) a thread
@pytest.mark.parametrize("sample,vocab,chunk", [("cdf", SPREAD_VOCAB, 1024), ("picks", SPREAD_VOCAB, 1024),
                                                ("picks", SPREAD_VOCAB - 1, 1024), ("picks", SPREAD_VOCAB, 2048)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_inversion_over_several_chunks_is_exact(dtype, sample, vocab, chunk):
    """Fast mode's residual draw by inversion (`_cdf_pick`: a chunk from the race programs' chunk masses,
    then a column within it; "picks": each program's candidate in its chunk, `_pick_in_chunk`, and the chunk chosen
    by mass, `_chunk_choice`) where the residual spreads over 4 chunks, two lanes of two live columns in each: the
    tokens' distribution is the target's (χ², test_prob_exactness's checks, p-value > 1e-3), and never a
    dead column. Must fail, the first-token check on the same draws with each drawn token moved (`_drawn_moved`):
    to the next chunk (a chunk-level mistake of the inversion), to the other lane of its chunk or to its neighbour
    in its lane (within-chunk mistakes)."""
    outputs, (target, draft) = _spread_draws(dtype, sample=sample, vocab=vocab, chunk=chunk)
    p, q = target.softmax(dim=1), draft.softmax(dim=1)
    assert int((outputs["output_tokens"] == 16).sum()) == 0
    pvalues = exactness_pvalues(outputs, p, q)
    assert min(pvalues.values()) > SIGNIFICANCE, pvalues
    for move in (lambda i: (i + 4) % 16, lambda i: i ^ 2, lambda i: i ^ 1):
        moved = {**outputs, "output_tokens": _drawn_moved(outputs, move)}
        assert exactness_pvalues(moved, p, q)["first_token"] < SIGNIFICANCE


def _drawn_moved(outputs: dict[str, torch.Tensor], move) -> torch.Tensor:
    """The tokens with each drawn one (position k: a residual or bonus draw) moved to live column move(i) (see
    `_spread`), the accepted drafts left alone."""
    tokens, k = outputs["output_tokens"].clone(), outputs["accepted_lengths"]
    rows = torch.arange(tokens.shape[0])
    tokens[rows, k] = move(tokens[rows, k])
    return tokens


# --- the one launch (fused_logits_launcher(single=True)): pass 1 and the race in one grid ----------------
ONE_LAUNCH_POINTS = [(1, 16, 151936, "bfloat16"), (32, 8, 32000, "bfloat16"), (32, 4, 128256, "float32"),
                     (128, 4, 128256, "bfloat16"), (512, 4, 32000, "bfloat16")]


def _one_launch_inputs(w):
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels

    return kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                 w.draft_temperature, w.uniforms, w.exponential_noise)


@pytest.mark.parametrize("point", ONE_LAUNCH_POINTS, ids=lambda p: "b{}-g{}-v{}-{}".format(*p))
def test_one_launch_equals_the_reference(point):
    """Supplied randomness, where the race programs really wait on pass-1 programs still running: tokens,
    lengths and the bad id's flag equal the float32 reference, at the default lag B (every race after all of
    pass 1), at lag 1 (each race right behind the next sequence's pass 1, so most of them wait) and B/3. Three
    calls on the same scratch, the inputs changed between them (the sequences rolled by one), so a race that
    read its partials before its sequence's pass 1 wrote them would read the last call's, and differ."""
    from sdbench.ops.prob_verify_logits import reference
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    batch, gamma, vocab, dtype = point
    w = make_logits_workload(LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, seed=60), DEVICE)
    w.draft_tokens[batch - 1, 0] = vocab  # a bad id
    inputs = _one_launch_inputs(w)
    for lag in (None, 1, max(1, batch // 3)):
        outputs = allocate_outputs(w)
        launch = kernels.fused_logits_launcher(inputs, outputs, fast=False, single=True, lag=lag)
        for call in range(3):
            if call:  # new inputs in the bound tensors: every sequence's rows and drafts move to the next one
                for tensor in (w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                               w.draft_temperature, w.uniforms, w.exponential_noise):
                    tensor.copy_(tensor.roll(1, dims=0))
            want = reference.prob_verify_logits(w.draft_tokens, w.target_logits, w.draft_logits,
                                                w.target_temperature, w.draft_temperature, w.uniforms,
                                                w.exponential_noise)
            parity.poison(outputs)
            launch()
            torch.cuda.synchronize()
            assert torch.equal(outputs["output_tokens"], want["output_tokens"]), (lag, launch.lag, call)
            assert torch.equal(outputs["accepted_lengths"], want["accepted_lengths"]), (lag, launch.lag, call)
            bad = (w.draft_tokens >= vocab).any(dim=1)
            assert torch.equal(outputs["error_flags"] != 0, bad), (lag, call)
            assert not any(counter.any() for counter in launch.scratch), (lag, call)


@pytest.mark.parametrize("point", ONE_LAUNCH_POINTS, ids=lambda p: "b{}-g{}-v{}-{}".format(*p))
def test_one_launch_draws_what_two_launches_draw(point):
    """Fast mode, five calls in a row: every call's tokens equal the two-launch design's at the same Philox
    offsets (the same accept uniforms, the same chunking of the inversion), the offsets advance once a call,
    and the scratch is left zeroed. Under sync-debug "error": no host sync."""
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    batch, gamma, vocab, dtype = point
    w = make_logits_workload(LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, seed=61),
                             DEVICE).with_randomness("fast")
    two_out, one_out = allocate_outputs(w), allocate_outputs(w)
    two = kernels.fused_logits_launcher(_one_launch_inputs(w), two_out, fast=True, seed=w.seed, offset=w.offset,
                                        sample="cdf")  # (the one launch draws by "cdf" or "race", never "picks")
    one = kernels.fused_logits_launcher(_one_launch_inputs(w), one_out, fast=True, seed=w.seed, offset=w.offset,
                                        single=True)
    assert one.plans[1].rows == two.plans[1].rows  # the inversion's chunks: the same columns, the same masses
    for call in range(5):
        parity.poison(one_out)
        torch.cuda.set_sync_debug_mode("error")
        try:
            two()
            one()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        for key, value in two_out.items():
            assert torch.equal(one_out[key], value), (call, key)
    assert torch.equal(one.philox_offsets, two.philox_offsets)
    assert bool((one.philox_offsets == w.offset + 5).all())
    assert not any(counter.any() for counter in one.scratch)


def test_one_launch_replays_in_a_graph():
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    w = make_logits_workload(LogitsConfig(32, 8, vocab_size=32000, seed=62), DEVICE).with_randomness("fast")
    outputs = allocate_outputs(w)
    launch = kernels.fused_logits_launcher(_one_launch_inputs(w), outputs, fast=True, seed=w.seed, offset=w.offset,
                                           single=True)
    launch()
    expected = _snapshot(outputs)
    graph = torch.cuda.CUDAGraph()
    launch.philox_offsets.fill_(w.offset)
    with torch.cuda.graph(graph):
        launch()
    parity.poison(outputs)
    launch.philox_offsets.fill_(w.offset)
    graph.replay()
    torch.cuda.synchronize()
    for key, value in expected.items():
        assert torch.equal(outputs[key], value), key
    assert bool((launch.philox_offsets == w.offset + 1).all())
    assert not any(counter.any() for counter in launch.scratch)


# --- compute-sanitizer ----------------------------------------------------------------------------
# fused_logits at every scan placement (the early race included: its count, its wait, its reset) and every fast-mode
# draw, the block rule, and the vLLM-style peer: no access outside the buffers, no read of memory never written (the
# partials' padding is zeroed once, `allocate_stats`), no shared-memory race, no barrier misuse.
SANITIZER_SCRIPT = """
import sys, torch
from sdbench import parity, registry
from sdbench.ops.prob_verify_logits import triton_kernels as kernels
from sdbench.ops.prob_verify_logits.common import allocate_outputs
from sdbench.ops.prob_verify_logits.workload import LogitsConfig, make_logits_workload
failed = 0
for cfg in (LogitsConfig(5, 3, vocab_size=3000, seed=1), LogitsConfig(9, 4, vocab_size=3001, logits_dtype="bfloat16", seed=2)):
    w = make_logits_workload(cfg, "cuda")
    w.draft_tokens[1, 1] = cfg.vocab_size  # a bad id
    for name in ("fused_logits", "vllm_v2_style"):
        failure = parity.check(registry.get("prob_verify_logits", name), w)
        failed += failure is not None
        print(name, failure, flush=True)
    fast = w.with_randomness("fast", offset=3)
    inputs = kernels.LogitsTensors(fast.draft_tokens, fast.target_logits, fast.draft_logits, fast.target_temperature,
                                   fast.draft_temperature, fast.uniforms, fast.exponential_noise)
    for scan in (None, "early", "kernel", "pass1", "race"):
        for sample in ("cdf", "picks", "race"):
            kernels.fused_logits_launcher(inputs, allocate_outputs(fast), fast=True, seed=fast.seed, scan=scan,
                                          sample=sample)()
    kernels.fused_logits_launcher(inputs, allocate_outputs(fast), fast=True, seed=fast.seed, rule="block")()
    torch.cuda.synchronize()
sys.exit(1 if failed else 0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "initcheck", "synccheck"])
def test_compute_sanitizer_clean(tool):
    from sanitizer import assert_sanitizer_clean

    assert_sanitizer_clean(tool, SANITIZER_SCRIPT)
