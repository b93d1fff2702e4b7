"""sdbench.prob_verify on CPU tensors: supplied randomness equals the reference draw for draw, the fast
mode is reproducible per binding and moves on between calls, out= buffers, validation, and the Triton
fused kernel through the API under the interpreter."""

import textwrap

import pytest
import torch
from interpreted import run_interpreted

import sdbench
from sdbench import api
from sdbench.errors import SdbenchError
from sdbench.ops.prob_verify import reference
from sdbench.ops.prob_verify.workload import make_prob_workload
from sdbench.ops.workload import VerifyConfig


@pytest.fixture
def w():
    return make_prob_workload(VerifyConfig(6, 4, vocab_size=40, seed=2, token_dtype="int32"), "cpu")


def _bad(call, match):
    with pytest.raises(SdbenchError, match=match):
        call()


def test_exported():
    assert sdbench.prob_verify is api.prob_verify


def test_supplied_randomness_equals_the_reference(w):
    out = sdbench.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, uniforms=w.uniforms,
                              exponential_noise=w.exponential_noise)
    expected = reference.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise)
    for name in ("accepted_lengths", "next_tokens", "output_tokens"):
        assert torch.equal(out[name], expected[name]), name
    assert out["next_tokens"].dtype == torch.int32


def test_fast_mode_draws_fresh_numbers_each_call(w):
    torch.manual_seed(0)
    first = {k: v.clone() for k, v in sdbench.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs).items()}
    calls = [sdbench.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs)["next_tokens"].clone()
             for _ in range(5)]
    assert any(not torch.equal(first["next_tokens"], later) for later in calls)


def test_out_buffers_are_written(w):
    mine = torch.empty(6, dtype=torch.int64)
    out = sdbench.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, uniforms=w.uniforms,
                              exponential_noise=w.exponential_noise, out={"accepted_lengths": mine})
    assert out["accepted_lengths"] is mine
    expected = reference.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise)
    assert torch.equal(mine, expected["accepted_lengths"])


def test_validation(w):
    d, p, q = w.draft_tokens, w.target_probs, w.draft_probs
    _bad(lambda: sdbench.prob_verify(d, p[:, :4], q), r"target_probs must be \[batch, gamma \+ 1, V\]")
    _bad(lambda: sdbench.prob_verify(d, p, q[:, :, :39]), r"draft_probs must be \[batch, gamma, V\] = \[6, 4, 40\]")
    _bad(lambda: sdbench.prob_verify(d, p.double(), q.double()), r"share a dtype, float32 or bfloat16")
    _bad(lambda: sdbench.prob_verify(d, p, q, uniforms=w.uniforms), r"give both uniforms and exponential_noise")
    _bad(lambda: sdbench.prob_verify(d, p, q, uniforms=w.uniforms[:, :2], exponential_noise=w.exponential_noise),
         r"uniforms must be float32 \[6, 4\]")
    _bad(lambda: sdbench.prob_verify(d, p, q, seed=True), r"seed and offset must be integers")
    _bad(lambda: sdbench.prob_verify(d, p, q, impl="fussed"), r"did you mean 'fused'")
    _bad(lambda: sdbench.prob_verify(d, p, q, out={"packed_kv": torch.empty(1)}), r"out has unknown keys packed_kv")
    _bad(lambda: sdbench.prob_verify(d, p, q, out={"next_tokens": d.view(-1)[:6]}), r"overlaps draft_tokens")
    _bad(lambda: sdbench.prob_verify(d), r"give the probabilities .* or the logits")
    _bad(lambda: sdbench.prob_verify(d, p, q, target_logits=p), r"one of the two")


CHILD = textwrap.dedent("""
    import json, torch, sdbench
    from sdbench import registry
    from sdbench.ops.prob_verify import reference
    from sdbench.ops.prob_verify.workload import make_prob_workload
    from sdbench.ops.workload import VerifyConfig
    probe = registry.get("prob_verify", "fused").unavailable_reason("cpu")
    w = make_prob_workload(VerifyConfig(5, 3, vocab_size=64, seed=4), "cpu")
    report = {"probe": probe}
    if probe is None:
        out = sdbench.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, impl="fused", uniforms=w.uniforms,
                                  exponential_noise=w.exponential_noise)
        ref = reference.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise)
        report["same"] = all(torch.equal(out[k], ref[k]) for k in ("accepted_lengths", "next_tokens", "output_tokens"))
        a = sdbench.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, impl="fused", seed=3)["output_tokens"].clone()
        w2 = make_prob_workload(VerifyConfig(5, 3, vocab_size=64, seed=4), "cpu")  # other memory: a new binding
        c = sdbench.prob_verify(w2.draft_tokens, w2.target_probs, w2.draft_probs, impl="fused", seed=3)["output_tokens"]
        report["fresh_binding_repeats_the_stream"] = bool(torch.equal(a, c))
    print(json.dumps(report))
""")


def test_fused_kernel_through_the_api_under_the_interpreter():
    pytest.importorskip("triton")
    report = run_interpreted(CHILD)
    assert report["same"] and report["fresh_binding_repeats_the_stream"]


def test_from_logits_with_supplied_randomness_equals_the_reference():
    from sdbench.ops.prob_verify_logits.reference import prob_verify_logits
    from sdbench.ops.prob_verify_logits.workload import LogitsConfig, make_logits_workload

    w = make_logits_workload(LogitsConfig(5, 3, vocab_size=48, seed=6))
    out = sdbench.prob_verify(w.draft_tokens, target_logits=w.target_logits, draft_logits=w.draft_logits,
                              target_temperature=w.target_temperature, draft_temperature=w.draft_temperature,
                              uniforms=w.uniforms, exponential_noise=w.exponential_noise)
    expected = prob_verify_logits(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                  w.draft_temperature, w.uniforms, w.exponential_noise)
    for name in ("accepted_lengths", "next_tokens", "output_tokens"):
        assert torch.equal(out[name], expected[name]), name
    assert bool((w.target_temperature == 0).any())  # the mixed batch includes greedy requests
    _bad(lambda: sdbench.prob_verify(w.draft_tokens, target_logits=w.target_logits, draft_logits=w.draft_logits,
                                     target_temperature=w.target_temperature[:2], draft_temperature=w.draft_temperature),
         r"target_temperature must be float32 \[5\]")


def test_block_rule_from_logits_equals_its_reference_and_binds_apart_from_the_token_rule():
    from sdbench.ops.prob_verify_logits.reference import prob_verify_logits
    from sdbench.ops.prob_verify_logits.workload import LogitsConfig, make_logits_workload

    w = make_logits_workload(LogitsConfig(8, 6, vocab_size=16, seed=11))
    inputs = dict(target_logits=w.target_logits, draft_logits=w.draft_logits, target_temperature=w.target_temperature,
                  draft_temperature=w.draft_temperature, uniforms=w.uniforms, exponential_noise=w.exponential_noise,
                  impl="torch_eager")
    by_rule = {rule: {k: v.clone() for k, v in sdbench.prob_verify(w.draft_tokens, rule=rule, **inputs).items()}
               for rule in ("token", "block")}
    for rule, out in by_rule.items():  # the same tensors, one binding per rule
        expected = prob_verify_logits(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                      w.draft_temperature, w.uniforms, w.exponential_noise, rule=rule)
        for name in ("accepted_lengths", "next_tokens", "output_tokens"):
            assert torch.equal(out[name], expected[name]), (rule, name)
    # the rules answer differently here, so a binding shared between them would fail the comparison above
    assert not torch.equal(by_rule["token"]["output_tokens"], by_rule["block"]["output_tokens"])
    _bad(lambda: sdbench.prob_verify(w.draft_tokens, rule="blocks", **inputs), r"rule must be one of token, block")
    _bad(lambda: sdbench.prob_verify(w.draft_tokens, torch.ones(8, 7, 16), torch.ones(8, 6, 16), rule="block"),
         r"rule='block' runs from logits")


def test_bindings_are_reused_and_bounded(w):
    api._prob_bindings.clear()
    calls = []
    real = api._bind

    def counting(key, run):
        calls.append(key)
        return real(key, run)

    api._bind, previous = counting, api._bind
    try:
        for _ in range(3):
            sdbench.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, seed=1)
        assert len(calls) == 1  # prepared once for these tensors
        for _ in range(12):  # fresh tensors each time: new bindings, at most 8 kept
            sdbench.prob_verify(w.draft_tokens.clone(), w.target_probs.clone(), w.draft_probs.clone(), seed=1)
        assert len(calls) == 13 and len(api._prob_bindings) == api._PROB_BINDINGS_MAX
    finally:
        api._bind = previous
        api._prob_bindings.clear()
