"""Block verification (rule="block") in `fused_logits` on CUDA: parity with the reference over a grid (γ 1 to 16,
mixed temperatures with greedy rows, bf16 and fp32, bad token ids), no host sync on the call, CUDA-graph replay,
fast mode deterministic, the χ² exactness of the kernel's block rule (fast and supplied randomness), and the
grid's largest point running.

Parity contract: as tests/gpu/test_prob_logits_gpu.py — tokens, lengths and error_flags bit for bit against
reference.prob_verify_logits (float32) on the same supplied randomness. The kernel sums the softmax
normalisers and the residual masses r_i in another order, so a draw within ~1e-6 relative of a tie (u·q
against p, η_i against h_i, the top two race keys) could differ: probability ~1e-6 per comparison, not
expected in this grid's ~10^4. χ² method, models and significance: tests/ops/prob_verify_logits/
test_logits_exactness.py, whose CPU tests also show that the same test at the same size rejects a residual
without the weight w_τ, an unnormalised h_i and stopping at the first failed test.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

from sdbench import parity, registry
from sdbench.ops.prob_verify_logits.checks import check
from sdbench.ops.prob_verify_logits.workload import LogitsConfig, make_logits_workload

_TESTS = Path(__file__).resolve().parents[1] / "ops"
sys.path.insert(0, str(_TESTS / "prob_verify"))
sys.path.insert(0, str(_TESTS / "prob_verify_logits"))
from test_logits_exactness import (  # noqa: E402
    PREFIX_SCALE,
    PREFIX_SEEDS,
    ROUNDS,
    SIGNIFICANCE,
    PrefixModel,
    _joint_pvalue,
    prefix_workload,
)

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
FUSED = "fused_logits"


def _grid():
    for index, (batch, gamma, vocab, dtype) in enumerate(
            itertools.product((1, 32), (1, 4, 8, 16), (32000, 128256), ("float32", "bfloat16"))):
        yield LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, rule="block", seed=100 + index)
    yield LogitsConfig(1, 8, vocab_size=128256, temperatures=(0.8,), rule="block", seed=149)  # b=1 above is greedy
    yield LogitsConfig(128, 8, vocab_size=151936, logits_dtype="bfloat16", rule="block", seed=150)
    yield LogitsConfig(32, 8, vocab_size=32000, temperatures=(0.0,), draft_noise=0.1, token_dtype="int32",
                       rule="block", seed=151)
    yield LogitsConfig(32, 8, vocab_size=32000, temperatures=(0.6, 1.0), draft_noise=0.0, rule="block",
                       seed=152)  # every draft kept: the bonus draw
    yield LogitsConfig(32, 8, vocab_size=32000, draft_noise=3.0, rule="block", seed=153)  # early stops
    yield LogitsConfig(32, 8, vocab_size=32000, temperatures=(1.0,), draft_noise=0.2, rule="block",
                       seed=154)  # high acceptance: many blocks kept past a failed token-wise test


GRID = list(_grid())


def _config_id(cfg: LogitsConfig) -> str:
    return (f"b{cfg.batch_size}-g{cfg.gamma}-v{cfg.vocab_size}-{cfg.logits_dtype}-n{cfg.draft_noise}"
            f"-t{len(cfg.temperatures)}-{cfg.token_dtype}-s{cfg.seed}")


def _snapshot(outputs):
    return {key: value.clone() for key, value in outputs.items()}


@pytest.mark.parametrize("cfg", GRID, ids=_config_id)
def test_block_rule_matches_the_reference(cfg):
    impl = registry.get("prob_verify_logits", FUSED)
    assert impl.unavailable_reason(DEVICE, cfg) is None, impl.unavailable_reason(DEVICE, cfg)
    assert check(impl, make_logits_workload(cfg, DEVICE)) is None


def test_block_rule_with_greedy_drafts_and_bad_token_ids_matches_the_reference():
    w = make_logits_workload(LogitsConfig(32, 8, vocab_size=32000, rule="block", seed=160), DEVICE)
    w.draft_temperature[::2] = 0.0  # greedy drafts under sampled and greedy targets
    w.draft_tokens[0, 3] = 32000 + 7
    w.draft_tokens[5, 0] = -1
    w.draft_tokens[6, 7] = 2**40
    impl = registry.get("prob_verify_logits", FUSED)
    assert check(impl, w) is None
    flags = impl.prepare(w)()["error_flags"]
    assert flags.nonzero().flatten().tolist() == [0, 5, 6]


@pytest.mark.parametrize("randomness", ["supplied", "fast"])
def test_block_rule_is_sync_free(randomness):
    w = make_logits_workload(LogitsConfig(32, 8, vocab_size=128256, logits_dtype="bfloat16", rule="block", seed=161),
                             DEVICE).with_randomness(randomness)
    run = registry.get("prob_verify_logits", FUSED).prepare(w)  # compiles and warms up
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
        run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


@pytest.mark.parametrize("randomness", ["supplied", "fast"])
def test_block_rule_graph_replay_equals_eager(randomness):
    w = make_logits_workload(LogitsConfig(32, 8, vocab_size=32000, rule="block", seed=162), DEVICE)
    w = w.with_randomness(randomness, offset=4)
    run = registry.get("prob_verify_logits", FUSED).prepare(w)
    expected = _snapshot(run())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # one more warm-up on the capture stream, as torch.cuda.graph advises
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run.launch()
    for _ in range(3):  # each replay starts from the scratch the previous one left: it must be clean
        parity.poison(run.outputs)
        run.philox_offsets.fill_(w.offset)  # fast mode: a replay advances the counters as an eager call does
        graph.replay()
        torch.cuda.synchronize()
        for key, value in expected.items():
            assert torch.equal(run.outputs[key], value), key
    if randomness == "fast":
        assert bool((run.philox_offsets == w.offset + 1).all())
    if randomness == "supplied":
        assert parity.compare(parity.expected_outputs("prob_verify_logits", w), run.outputs) is None


def test_block_rule_fast_mode_advances_and_leaves_its_scratch_zeroed():
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.common import allocate_outputs

    fast = make_logits_workload(LogitsConfig(32, 8, vocab_size=128256, logits_dtype="bfloat16", rule="block",
                                             seed=163), DEVICE).with_randomness("fast", offset=5)
    fused = registry.get("prob_verify_logits", FUSED)
    run = fused.prepare(fast)
    first, second = _snapshot(run()), _snapshot(run())
    at_five, at_six = _snapshot(fused.prepare(fast)()), _snapshot(fused.prepare(fast.with_randomness("fast", 6))())
    for name in first:  # call n draws at offset + n, counted on the device
        assert torch.equal(first[name], at_five[name]), name
        assert torch.equal(second[name], at_six[name]), name
    assert not torch.equal(first["output_tokens"], second["output_tokens"])
    inputs = kernels.LogitsTensors(fast.draft_tokens, fast.target_logits, fast.draft_logits, fast.target_temperature,
                                   fast.draft_temperature, fast.uniforms, fast.exponential_noise)
    launch = kernels.fused_logits_launcher(inputs, allocate_outputs(fast), fast=True, seed=fast.seed, offset=5,
                                           rule="block")
    launch()
    launch()
    torch.cuda.synchronize()
    assert not any(counter.any() for counter in launch.scratch)


@pytest.fixture(scope="module")
def prefix_models():
    return tuple(PrefixModel(seed=seed, scale=PREFIX_SCALE) for seed in PREFIX_SEEDS)


@pytest.mark.parametrize("randomness", ["fast", "supplied"])
def test_block_rule_is_exact_in_distribution(prefix_models, randomness):
    """10^5 rounds of prefix-dependent models (V=3, γ=2) through the kernel: the joint of three emitted tokens
    is the target's (the CPU test runs the interpreter on 400 rounds)."""
    target, draft = prefix_models
    w, _ = prefix_workload(target, draft, ROUNDS, seed=23, device=DEVICE)
    outputs = registry.get("prob_verify_logits", FUSED).prepare(w.with_randomness(randomness, offset=2))()
    cpu = {name: outputs[name].cpu() for name in ("output_tokens", "accepted_lengths")}
    assert _joint_pvalue(cpu, target, 1.0) > SIGNIFICANCE


def test_block_rule_at_the_grids_largest_point():
    """b=512, γ=16, V=151936 float32 (10 GB of logits): the mass scratch and the three launches at full size,
    outputs in range and consistent (no reference: it would materialise another 20 GB of p and q)."""
    cfg = LogitsConfig(512, 16, vocab_size=151936, rule="block", seed=164)
    fast = make_logits_workload(cfg, DEVICE).with_randomness("fast", offset=1)
    block = _snapshot(registry.get("prob_verify_logits", FUSED).prepare(fast)())
    k = block["accepted_lengths"]
    assert bool(((k >= 0) & (k <= 16)).all())
    assert bool(((block["next_tokens"] >= 0) & (block["next_tokens"] < 151936)).all())
    assert torch.equal(block["output_tokens"].gather(1, k[:, None]).squeeze(1), block["next_tokens"])
    assert not block["error_flags"].any()
