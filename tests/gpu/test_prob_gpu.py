"""prob_verify on CUDA: parity of every implementation over the grid, fused is sync-free and
graph-capturable, fast randomness is deterministic, and the kernels are exact in distribution (χ²).

Parity contract: tokens and lengths bit for bit against sdbench.reference.prob_verify on the same
supplied randomness; accept_probs within 1e-5 (float32 inputs) / 1e-3 (bfloat16 inputs).
χ² method and significance (p-value > 1e-3 passes): see tests/test_prob_exactness.py.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

from sdbench import parity, reference, registry
from sdbench.workload import VerifyConfig, make_prob_workload, prob_workload_from_distributions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the χ² helpers live with the CPU exactness test
from test_prob_exactness import (  # noqa: E402
    SIGNIFICANCE,
    exactness_pvalues,
    fixed_distributions,
    make_rounds,
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


def test_flashinfer_chain_refuses_supplied_randomness_or_is_unavailable():
    impl = registry.get("prob_verify", "flashinfer_chain")
    reason = impl.unavailable_reason(DEVICE)
    if reason is not None:
        assert "flashinfer" in reason
        return
    workload = make_prob_workload(VerifyConfig(4, 4, vocab_size=1000), DEVICE)
    with pytest.raises(Exception, match="supplied"):
        impl.prepare(workload)


def test_fused_plan_fills_the_machine_at_batch_32():
    from sdbench.kernels import prob_triton

    plan = prob_triton.default_fused_plan(32, 32000, torch.device(DEVICE))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert 32 * plan.splits >= sms, plan


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
    run = fused.prepare(fast)
    for _ in range(3):
        again = _snapshot(run)
        assert all(torch.equal(first[key], again[key]) for key in first)
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
                                             ("serial_sampler", "fast"), ("flashinfer_chain", "fast")])
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
    from sdbench.kernels import prob_triton

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
