"""prob_verify on CUDA: parity of every implementation over the grid, fused is sync-free and
graph-capturable, fast randomness is deterministic, and the kernels are exact in distribution (χ²).

Parity contract: tokens and lengths bit for bit against sdbench.reference.prob_verify on the same
supplied randomness; accept_probs within 1e-5 (float32 inputs) / 1e-3 (bfloat16 inputs).
χ² method and significance (p-value > 1e-3 passes): see tests/ops/prob_verify/test_prob_exactness.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import pytest
import torch

from sdbench import parity, registry
from sdbench.ops.prob_verify import reference
from sdbench.ops.prob_verify.workload import make_prob_workload, prob_workload_from_distributions
from sdbench.ops.workload import VerifyConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops" / "prob_verify"))  # the χ² helpers live with the CPU exactness test
from test_prob_exactness import (  # noqa: E402
    SIGNIFICANCE,
    SPECIAL_CASES,
    _pairs_of_sequences,
    _residual_draws_of_two_calls,
    exactness_pvalues,
    fixed_distributions,
    make_rounds,
    special_distributions,
    stored_distributions,
)

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
IMPLS = ("torch_eager", "flashspec", "serial_sampler", "fused")
STORAGES = (("float32", False), ("float32", True), ("bfloat16", False), ("bfloat16", True))


def _grid():
    """V=32000 over every B x γ x storage; the big vocabularies at small B (storage cycled)."""
    for batch, gamma, (prob_dtype, logprobs) in itertools.product((1, 8, 32, 128), (1, 4, 8, 16), STORAGES):
        yield VerifyConfig(batch, gamma, 0.8, vocab_size=32000, prob_dtype=prob_dtype, logprobs=logprobs,
                           seed=batch * 100 + gamma)
    for index, (vocab, batch, gamma) in enumerate(itertools.product((128256, 152064), (1, 8), (1, 4, 8, 16))):
        prob_dtype, logprobs = STORAGES[index % len(STORAGES)]
        yield VerifyConfig(batch, gamma, 0.8, vocab_size=vocab, prob_dtype=prob_dtype, logprobs=logprobs, seed=index)
    for alpha in (0.0, 0.5, 1.0):  # all rejections, a mix, all bonus draws
        yield VerifyConfig(32, 8, alpha, vocab_size=32000, seed=7, token_dtype="int32")


GRID = list(_grid())


def _config_id(cfg: VerifyConfig) -> str:
    storage = f"{cfg.prob_dtype}{'-log' if cfg.logprobs else ''}"
    return f"b{cfg.batch_size}-g{cfg.gamma}-v{cfg.vocab_size}-{storage}-a{cfg.alpha}-{cfg.token_dtype}"


@pytest.mark.parametrize("cfg", GRID, ids=_config_id)
def test_every_implementation_matches_the_reference(cfg):
    workload = make_prob_workload(cfg, DEVICE)
    failures = {}
    for name in IMPLS:
        impl = registry.get("prob_verify", name)
        assert impl.unavailable_reason(DEVICE, cfg) is None, (name, impl.unavailable_reason(DEVICE, cfg))
        failure = parity.check(impl, workload)
        if failure is not None:
            failures[name] = failure
    assert not failures, failures


@pytest.mark.parametrize("name", ["flashinfer_chain", "flashinfer_chain+adapter"])
def test_flashinfer_chain_refuses_supplied_randomness(name):
    impl = registry.get("prob_verify", name)
    reason = impl.unavailable_reason(DEVICE)
    if reason is not None:
        assert "flashinfer" in reason.lower()
        pytest.skip(reason)
    workload = make_prob_workload(VerifyConfig(4, 4, vocab_size=1000), DEVICE)
    with pytest.raises(Exception, match="supplied"):
        impl.prepare(workload)


def test_flashinfer_engine_call_advances_and_agrees_with_its_adapter():
    """The engine call: int32 outputs, counters zeroed every call (not accumulated), fresh draws per
    call; the adapter row gives the same tokens from the same seed and offset in sdbench's dtypes."""
    engine, adapter = registry.get("prob_verify", "flashinfer_chain"), registry.get("prob_verify", "flashinfer_chain+adapter")
    reason = engine.unavailable_reason(DEVICE)
    if reason is not None:
        pytest.skip(reason)
    workload = make_prob_workload(VerifyConfig(16, 4, 0.6, vocab_size=4000, seed=31), DEVICE).with_randomness("fast", offset=2)
    run = engine.prepare(workload)
    first = {key: value.clone() for key, value in run().items()}
    second = {key: value.clone() for key, value in run().items()}
    assert first["output_tokens"].dtype == torch.int32
    assert bool((first["accepted_lengths"] <= 4).all()) and bool((second["accepted_lengths"] <= 4).all())
    assert not torch.equal(first["output_tokens"], second["output_tokens"])
    adapted = adapter.prepare(workload)()
    assert torch.equal(adapted["output_tokens"].cpu(), first["output_tokens"].long().cpu())
    assert torch.equal(adapted["accepted_lengths"].cpu(), first["accepted_lengths"].long().cpu())


def test_fused_plan_fills_the_machine_at_batch_32():
    from sdbench.ops.prob_verify import triton_kernels as prob_triton

    plan = prob_triton.default_fused_plan(32, 32000, torch.device(DEVICE))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert 32 * plan.splits >= sms, plan


def test_fused_spreads_one_sequence_over_the_machine():
    """b=1: the row is split over about one program per SM (latency), not a handful."""
    from sdbench.ops.prob_verify import triton_kernels as prob_triton

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for vocab in (32000, 128256):
        plan = prob_triton.default_fused_plan(1, vocab, torch.device(DEVICE))
        assert plan.splits >= sms // 2, (vocab, plan)


def _fused_with_plan(workload, plan):
    from sdbench.ops.prob_verify import triton_kernels as prob_triton

    batch, gamma = workload.draft_tokens.shape
    outputs = {
        "accepted_lengths": torch.empty(batch, dtype=torch.int64, device=DEVICE),
        "next_tokens": torch.empty(batch, dtype=workload.draft_tokens.dtype, device=DEVICE),
        "output_tokens": torch.empty((batch, gamma + 1), dtype=workload.draft_tokens.dtype, device=DEVICE),
        "error_flags": torch.empty(batch, dtype=torch.int32, device=DEVICE),
    }
    best = torch.zeros(batch, dtype=torch.int64, device=DEVICE)
    arrivals = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    inputs = prob_triton.ProbTensors(workload.draft_tokens, workload.target_probs, workload.draft_probs,
                                     workload.uniforms, workload.exponential_noise, logprobs=workload.config.logprobs)
    parity.poison(outputs)
    prob_triton.launch_fused(inputs, outputs, best, arrivals, plan, fast=workload.randomness == "fast",
                             seed=workload.seed, offset=workload.offset)
    torch.cuda.synchronize()
    assert not best.any() and not arrivals.any(), "scratch not reset"
    return outputs


SPECIAL_KERNEL_CASES = [(name, kind, gamma) for name in ("fused", "flashspec", "flashinfer_chain+adapter")
                        for kind, gamma in SPECIAL_CASES]


@pytest.mark.parametrize("name, kind, gamma", SPECIAL_KERNEL_CASES,
                         ids=[f"{n}-{k}-g{g}" for n, k, g in SPECIAL_KERNEL_CASES])
def test_kernels_are_exact_on_special_supports(name, kind, gamma):
    """Zeros in p and in q, p == q (every draft accepted: the bonus path), γ = 1, 4, 16, fast randomness."""
    impl = registry.get("prob_verify", name)
    p, q = special_distributions(kind, gamma)
    rounds = make_rounds(p, q, device=DEVICE, seed=gamma)
    reason = impl.unavailable_reason(DEVICE, rounds.config)
    if reason is not None:
        pytest.skip(reason)
    torch.manual_seed(17)
    outputs = impl.prepare(rounds.with_randomness("fast", offset=2))()
    pvalues = exactness_pvalues(outputs, *stored_distributions(rounds))
    assert min(pvalues.values()) > SIGNIFICANCE, pvalues


@pytest.mark.parametrize("randomness", ["supplied", "fast"])
def test_fused_tokens_do_not_depend_on_the_plan(randomness):
    """Every chunk size and warp count gives the same tokens: the reference's in supplied mode, and
    flashspec's in fast mode (the Philox stream is keyed by column, not by tile)."""
    from sdbench.ops.prob_verify import triton_kernels as prob_triton

    vocab = 32000
    workload = make_prob_workload(VerifyConfig(32, 8, 0.6, vocab_size=vocab, seed=21), DEVICE)
    workload = workload.with_randomness(randomness, offset=4)
    if randomness == "supplied":
        expected = parity.expected_outputs("prob_verify", workload)
    else:
        expected = _snapshot(registry.get("prob_verify", "flashspec").prepare(workload))
    for chunk, warps in ((256, 1), (256, 2), (512, 4), (1024, 4), (2048, 4), (2048, 8), (4096, 4)):
        plan = prob_triton.FusedPlan(chunk=chunk, splits=-(-vocab // chunk), num_warps=warps)
        outputs = _fused_with_plan(workload, plan)
        if randomness == "supplied":
            assert parity.compare(expected, outputs) is None, plan
        else:
            assert all(torch.equal(outputs[key], expected[key]) for key in outputs), plan


def test_fused_launches_directly_and_honours_launch_hooks():
    """After the warm-up, fused bypasses JITFunction.run; a Triton launch hook installed later is
    still called (the launch then goes through Triton's own path), and the tokens never change."""
    from triton import knobs

    from sdbench.ops.prob_verify import triton_kernels as prob_triton

    workload = make_prob_workload(VerifyConfig(8, 4, 0.6, vocab_size=32000, seed=22), DEVICE)
    run = registry.get("prob_verify", "fused").prepare(workload)  # warms up, which binds
    assert isinstance(run.launch, prob_triton.BoundLaunch)
    assert run.launch.direct_reason is None, run.launch.direct_reason
    expected = parity.expected_outputs("prob_verify", workload)
    parity.poison(run.outputs)
    assert parity.compare(expected, run()) is None
    hook = knobs.runtime.launch_enter_hook
    if not hasattr(hook, "add"):
        pytest.skip("this Triton has no HookChain launch hooks")
    seen = []
    hook.add(seen.append)
    try:
        parity.poison(run.outputs)
        outputs = run()
        torch.cuda.synchronize()
    finally:
        hook.remove(seen.append)
    assert seen, "the launch hook was not called"
    assert parity.compare(expected, outputs) is None


def test_fused_fallback_race_spans_programs():
    """w = 0 on the whole rejected row (q >= p everywhere, unnormalised q), with p's mass in three
    chunks far apart: the last program reruns the race over p across the whole row, like the
    reference, in every Triton implementation."""
    vocab, batch = 5000, 64
    support = torch.tensor([1, 2100, 4200])
    p = torch.zeros(batch, 2, vocab)
    p[:, 0, support] = torch.tensor([0.4, 0.3, 0.3])
    p[:, 1, :] = 1 / vocab
    q = torch.zeros(batch, 1, vocab)
    q[:, 0, torch.tensor([0, 1, 2100, 4200])] = torch.tensor([0.3, 0.5, 0.5, 0.5])
    workload = prob_workload_from_distributions(p.to(DEVICE), q.to(DEVICE), VerifyConfig(batch, 1, vocab_size=vocab, seed=23))
    assert bool((workload.draft_tokens == 0).any())
    from sdbench.ops.prob_verify import triton_kernels as prob_triton

    assert prob_triton.default_fused_plan(batch, vocab, torch.device(DEVICE)).splits >= 3
    for name in ("fused", "flashspec", "serial_sampler"):
        assert parity.check(registry.get("prob_verify", name), workload) is None, name
    outputs = _snapshot(registry.get("prob_verify", "fused").prepare(workload.with_randomness("fast", offset=3)))
    rejected = outputs["accepted_lengths"] == 0
    assert bool(rejected.any())
    assert bool(torch.isin(outputs["next_tokens"][rejected].cpu(), support).all()), outputs["next_tokens"][rejected]


# --- sync-free and graph-capturable --------------------------------------------------------------
@pytest.mark.parametrize("randomness", ["supplied", "fast"])
def test_fused_is_sync_free(randomness):
    workload = make_prob_workload(VerifyConfig(32, 8, 0.8, vocab_size=32000), DEVICE).with_randomness(randomness)
    run = registry.get("prob_verify", "fused").prepare(workload)  # compiles and warms up
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
        run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


@pytest.mark.parametrize("name", ["fused", "flashspec", "serial_sampler"])
@pytest.mark.parametrize("randomness", ["supplied", "fast"])
def test_graph_replay_matches_eager(name, randomness):
    if name == "serial_sampler" and randomness == "fast":
        pytest.skip("serial_sampler's fast mode draws from the global generator: replays differ by design")
    workload = make_prob_workload(VerifyConfig(32, 8, 0.6, vocab_size=32000, seed=3), DEVICE)
    workload = workload.with_randomness(randomness, offset=5)
    run = registry.get("prob_verify", name).prepare(workload)
    eager = {key: value.clone() for key, value in run().items()}
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # one more warm-up on the capture stream, as torch.cuda.graph advises
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        captured = run()
    parity.poison(captured)
    if randomness == "fast":  # every replay advances the device-side offset: fresh draws, reproducible
        previous = None
        for _ in range(3):
            start = int(run.philox_offsets[0])
            graph.replay()
            torch.cuda.synchronize()
            replayed = {key: value.clone() for key, value in captured.items()}
            fresh = _snapshot(registry.get("prob_verify", name).prepare(workload.with_randomness("fast", offset=start)))
            for key, value in fresh.items():
                assert torch.equal(replayed[key], value), (key, start)
            assert int(run.philox_offsets[0]) == start + 1
            if previous is not None:
                assert not torch.equal(previous["output_tokens"], replayed["output_tokens"])
            previous = replayed
        return
    for _ in range(3):  # replays start from the scratch the previous one left: it must be clean
        graph.replay()
        torch.cuda.synchronize()
        for key, value in eager.items():
            assert torch.equal(captured[key], value), key
    if randomness == "supplied":
        assert parity.compare(parity.expected_outputs("prob_verify", workload), captured) is None


# --- fast randomness -----------------------------------------------------------------------------
def _snapshot(run):
    return {key: value.clone() for key, value in run().items()}


def test_fast_mode_is_deterministic_and_shared_by_fused_and_flashspec():
    base = make_prob_workload(VerifyConfig(32, 8, 0.5, vocab_size=32000, seed=4), DEVICE)
    fast = base.with_randomness("fast", offset=11)
    fused, flashspec = registry.get("prob_verify", "fused"), registry.get("prob_verify", "flashspec")
    first = _snapshot(fused.prepare(fast))
    run, seed_run = fused.prepare(fast), flashspec.prepare(fast)
    calls = []
    for call in range(3):  # call j of a run = the first call of a run prepared at offset 11 + j
        again, seed_again = _snapshot(run), _snapshot(seed_run)
        at_offset = _snapshot(fused.prepare(base.with_randomness("fast", offset=11 + call)))
        assert all(torch.equal(at_offset[key], again[key]) for key in first), call
        assert all(torch.equal(again[key], seed_again[key]) for key in first), call
        calls.append(again["output_tokens"])
    assert all(torch.equal(first[key], _snapshot(fused.prepare(fast))[key]) for key in first)
    assert not torch.equal(calls[0], calls[1]) and not torch.equal(calls[1], calls[2])
    seed_design = _snapshot(flashspec.prepare(fast))
    assert all(torch.equal(first[key], seed_design[key]) for key in first)
    other_offset = _snapshot(fused.prepare(base.with_randomness("fast", offset=12)))
    assert not torch.equal(first["output_tokens"], other_offset["output_tokens"])


# --- exactness in distribution (χ², 10^5 rounds) ------------------------------------------------
@pytest.fixture(scope="module")
def rounds():
    p, q = fixed_distributions()
    return make_rounds(p, q, device=DEVICE)


@pytest.mark.parametrize("name,randomness", [("fused", "supplied"), ("fused", "fast"), ("flashspec", "fast"),
                                             ("serial_sampler", "fast"), ("flashinfer_chain+adapter", "fast")])
def test_kernels_are_exact_in_distribution(rounds, name, randomness):
    impl = registry.get("prob_verify", name)
    reason = impl.unavailable_reason(DEVICE, rounds.config)
    if reason is not None:
        pytest.skip(reason)
    torch.manual_seed(13)  # the peers' fast modes draw from the default generator
    outputs = impl.prepare(rounds.with_randomness(randomness, offset=1))()
    pvalues = exactness_pvalues(outputs, *stored_distributions(rounds))
    assert min(pvalues.values()) > SIGNIFICANCE, pvalues


@pytest.mark.parametrize("randomness", ["supplied", "fast"])
def test_fused_split_sweep_is_exact_in_distribution(randomness):
    """Support spread over 3 vocabulary tiles, one program per tile: the atomic combine decides."""
    from sdbench.ops.prob_verify import triton_kernels as prob_triton

    vocab, rounds_count, support = 4500, 100_000, torch.arange(16) * 281
    p_small, q_small = fixed_distributions(vocab=16, gamma=1, seed=5)
    p = torch.zeros(2, vocab)
    q = torch.zeros(1, vocab)
    p[:, support], q[:, support] = p_small, q_small
    cfg = VerifyConfig(rounds_count, 1, vocab_size=vocab, seed=6)
    # Expanded views (stride 0 over the batch): the kernels take strides, and 10^5 copies would be 5 GB.
    workload = prob_workload_from_distributions(p.to(DEVICE).expand(rounds_count, -1, -1),
                                                q.to(DEVICE).expand(rounds_count, -1, -1), cfg)
    workload = workload.with_randomness(randomness, offset=2)
    plan = prob_triton.fused_plan(rounds_count, vocab, target_programs=3 * rounds_count)
    assert plan.splits == 3
    outputs = {
        "accepted_lengths": torch.empty(rounds_count, dtype=torch.int64, device=DEVICE),
        "next_tokens": torch.empty(rounds_count, dtype=torch.int64, device=DEVICE),
        "output_tokens": torch.empty((rounds_count, 2), dtype=torch.int64, device=DEVICE),
        "error_flags": torch.empty(rounds_count, dtype=torch.int32, device=DEVICE),
    }
    best = torch.zeros(rounds_count, dtype=torch.int64, device=DEVICE)
    arrivals = torch.zeros(rounds_count, dtype=torch.int32, device=DEVICE)
    inputs = prob_triton.ProbTensors(workload.draft_tokens, workload.target_probs, workload.draft_probs,
                                     workload.uniforms, workload.exponential_noise, logprobs=False)
    prob_triton.launch_fused(inputs, outputs, best, arrivals, plan, fast=randomness == "fast", seed=workload.seed,
                             offset=workload.offset)
    assert not best.any() and not arrivals.any()
    if randomness == "supplied":
        expected = reference.prob_verify(workload.draft_tokens, workload.target_probs, workload.draft_probs,
                                         workload.uniforms, workload.exponential_noise)
        assert parity.compare(expected, outputs) is None
    pvalues = exactness_pvalues(outputs, p, q)
    assert min(pvalues.values()) > SIGNIFICANCE, pvalues



# --- the input contract on the GPU, γ > 16, independence of fast draws -----------------------------
def _on_device(workload):
    names = ("draft_tokens", "target_probs", "draft_probs", "uniforms", "exponential_noise")
    return dataclasses.replace(workload, **{name: getattr(workload, name).to(DEVICE) for name in names})


@pytest.mark.parametrize("name", ["fused", "flashspec", "serial_sampler", "torch_eager"])
@pytest.mark.parametrize("case", ["bad_tokens_int64", "bad_tokens_int32", "degenerate_rows"])
def test_bad_input_follows_the_input_contract(name, case):
    """Tokens outside [0, V) are rejected and flagged, never read; degenerate rows give the
    reference's token (tests/ops/prob_verify/test_prob_triton.py builds both workloads)."""
    from test_prob_triton import bad_token_workload, degenerate_rows_workload

    workload = degenerate_rows_workload() if case == "degenerate_rows" else bad_token_workload(case.rsplit("_", 1)[1])
    assert parity.check(registry.get("prob_verify", name), _on_device(workload)) is None


@pytest.mark.parametrize("name", ["fused", "flashspec"])
def test_bad_input_in_fast_mode_stays_in_range(name):
    from test_prob_triton import bad_token_workload, degenerate_rows_workload

    for workload in (bad_token_workload("int64"), degenerate_rows_workload()):
        outputs = _snapshot(registry.get("prob_verify", name).prepare(_on_device(workload).with_randomness("fast")))
        vocab = workload.config.vocab_size
        assert bool(((outputs["next_tokens"] >= 0) & (outputs["next_tokens"] < vocab)).all()), outputs
        assert torch.equal(outputs["error_flags"].cpu(), reference.draft_token_errors(workload.draft_tokens, vocab))


@pytest.mark.parametrize("gamma", [17, 32, 64])
def test_long_drafts_match_the_reference(gamma):
    cfg = VerifyConfig(8, gamma, 0.95, vocab_size=32000, seed=gamma)
    workload = make_prob_workload(cfg, DEVICE)
    for name in ("fused", "flashspec", "serial_sampler"):
        assert parity.check(registry.get("prob_verify", name), workload) is None, name


@pytest.mark.parametrize("name", ["fused", "flashspec"])
def test_fast_draws_are_independent_across_sequences_and_calls(rounds, name):
    """10^5 sequences: pairs of sequences of one batch, and two consecutive calls of one prepared run
    (the device-side offset advanced between them), pass the χ² independence checks."""
    p, q = stored_distributions(rounds)
    run = registry.get("prob_verify", name).prepare(rounds.with_randomness("fast", offset=7))
    first, second = _snapshot(run), _snapshot(run)
    assert _pairs_of_sequences(first, p) > SIGNIFICANCE
    assert _residual_draws_of_two_calls(first, second, p, q) > SIGNIFICANCE
    assert min(exactness_pvalues(second, p, q).values()) > SIGNIFICANCE
