"""The ragged layout through the public API (`cu_num_draft_tokens=`): verify, verify_pack and prob_verify on
CPU tensors equal their ragged references, caller buffers are honoured, bad shapes are one-line errors; and
sdbench's Triton kernels through the API under the interpreter (a subprocess: triton.jit reads
TRITON_INTERPRET at decoration), with γ_i past every kernel's cap on the T-sized bound of γ_max the API
passes (it never reads the offsets)."""

import textwrap

import pytest
import torch
from interpreted import run_interpreted

import sdbench
from sdbench.errors import SdbenchError
from sdbench.ops.prob_verify_ragged.reference import prob_verify_ragged
from sdbench.ops.prob_verify_ragged.workload import make_ragged_prob_workload
from sdbench.ops.verify_pack_ragged.reference import verify_pack_ragged
from sdbench.ops.verify_ragged.reference import verify_ragged
from sdbench.ops.verify_ragged.workload import make_ragged_workload
from sdbench.ops.workload import VerifyConfig


@pytest.fixture
def greedy():
    return make_ragged_workload(VerifyConfig(5, 9, 0.7, kv_dim=12, token_dtype="int32", seed=3), "cpu",
                                torch.tensor([9, 0, 4, 1, 7]))


@pytest.fixture
def prob():
    return make_ragged_prob_workload(VerifyConfig(5, 4, 0.6, vocab_size=40, seed=2), "cpu", torch.tensor([4, 0, 2, 1, 3]))


def _bad(call, match):
    with pytest.raises(SdbenchError, match=match) as raised:
        call()
    assert "\n" not in str(raised.value)  # one line


def _equal(out, expected):
    for name, tensor in expected.items():
        got = out[name] if name != "packed_kv" else out[name][: tensor.shape[0]]
        assert torch.equal(got, tensor) and got.dtype == tensor.dtype, name


def test_verify_ragged_on_cpu(greedy):
    w = greedy
    out = sdbench.verify(w.draft_tokens, w.target_tokens, cu_num_draft_tokens=w.cu_num_draft_tokens)
    _equal(out, verify_ragged(w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens))
    assert torch.equal(out["accepted_lengths"], w.accepted_lengths)  # the workload's own oracle


def test_verify_ragged_writes_the_callers_buffers(greedy):
    w = greedy
    accepted = torch.full((5,), -1, dtype=torch.int64)
    out = sdbench.verify(w.draft_tokens, w.target_tokens, cu_num_draft_tokens=w.cu_num_draft_tokens,
                         out={"accepted_lengths": accepted})
    assert out["accepted_lengths"] is accepted and torch.equal(accepted, w.accepted_lengths)


@pytest.mark.parametrize("impl", ["auto", "torch_eager"])
def test_verify_pack_ragged_on_cpu(greedy, impl):
    w = greedy
    out = sdbench.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv, impl=impl,
                              cu_num_draft_tokens=w.cu_num_draft_tokens)
    assert out["packed_kv"].shape == (21, 12)  # T rows, the first Σ k_i valid
    _equal(out, verify_pack_ragged(w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens, w.draft_kv))


def test_prob_verify_ragged_supplied_randomness_equals_the_reference(prob):
    w = prob
    out = sdbench.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, cu_num_draft_tokens=w.cu_num_draft_tokens,
                              uniforms=w.uniforms, exponential_noise=w.exponential_noise)
    _equal(out, prob_verify_ragged(w.draft_tokens, w.target_probs, w.draft_probs, w.cu_num_draft_tokens, w.uniforms,
                                   w.exponential_noise))
    assert out["output_tokens"].shape == (10 + 5,)


def test_prob_verify_ragged_fast_mode_and_out_buffers(prob):
    w = prob
    torch.manual_seed(0)
    mine = torch.empty(15, dtype=torch.int64)
    tokens = []
    for _ in range(4):
        last = sdbench.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs,
                                   cu_num_draft_tokens=w.cu_num_draft_tokens, out={"output_tokens": mine})
        tokens.append(mine.clone())
    assert any(not torch.equal(tokens[0], later) for later in tokens[1:])
    assert last["output_tokens"] is mine
    starts = torch.tensor([0, 4, 4, 6, 7])  # cu[i-1] for lengths 4, 0, 2, 1, 3
    slot_of_next = starts + torch.arange(5) + last["accepted_lengths"]
    assert torch.equal(mine[slot_of_next], last["next_tokens"])
    assert bool((last["accepted_lengths"] <= w.draft_lengths).all())


def test_ragged_validation(greedy, prob):
    g, p = greedy, prob
    cu = g.cu_num_draft_tokens
    _bad(lambda: sdbench.verify(g.draft_tokens[None], g.target_tokens, cu_num_draft_tokens=cu),
         r"draft_tokens must be 1-D \[T\].*got shape \[1, 21\]")
    _bad(lambda: sdbench.verify(g.draft_tokens, g.target_tokens[:-1], cu_num_draft_tokens=cu),
         r"target_tokens must be \[T \+ batch\] = \[26\] for draft_tokens \[21\] and 5 requests.*got \[25\]")
    _bad(lambda: sdbench.verify(g.draft_tokens, g.target_tokens, cu_num_draft_tokens=cu.int()),
         r"cu_num_draft_tokens must be int64, got int32")
    _bad(lambda: sdbench.verify(g.draft_tokens, g.target_tokens, cu_num_draft_tokens=cu[None]),
         r"cu_num_draft_tokens must be 1-D \[batch\]")
    _bad(lambda: sdbench.verify(g.draft_tokens, g.target_tokens, cu_num_draft_tokens=cu[:0]),
         r"with batch >= 1")
    _bad(lambda: sdbench.verify(g.draft_tokens, g.target_tokens, cu_num_draft_tokens=cu.tolist()),
         r"cu_num_draft_tokens must be a torch.Tensor, got list")
    _bad(lambda: sdbench.verify(g.draft_tokens, g.target_tokens.long(), cu_num_draft_tokens=cu),
         r"target_tokens dtype int64 differs from draft_tokens int32")
    _bad(lambda: sdbench.verify_pack(g.draft_tokens, g.target_tokens, g.draft_kv[:4], cu_num_draft_tokens=cu),
         r"draft_kv must be \[T, kv_dim\] = \[21, kv_dim\]")
    _bad(lambda: sdbench.verify_pack(g.draft_tokens, g.target_tokens, g.draft_kv, cu_num_draft_tokens=cu,
                                     expected_alpha=2.0), r"expected_alpha must be a number in \[0, 1\]")
    _bad(lambda: sdbench.verify(g.draft_tokens, g.target_tokens, cu_num_draft_tokens=cu, out={"packed_kv": None}),
         r"out has unknown keys packed_kv")
    pcu = p.cu_num_draft_tokens
    _bad(lambda: sdbench.prob_verify(p.draft_tokens, p.target_probs[:-1], p.draft_probs, cu_num_draft_tokens=pcu),
         r"target_probs must be \[T \+ batch, V\] = \[15, V\]")
    _bad(lambda: sdbench.prob_verify(p.draft_tokens, p.target_probs, p.draft_probs[:, :30], cu_num_draft_tokens=pcu),
         r"draft_probs must be \[T, V\] = \[10, 40\]")
    _bad(lambda: sdbench.prob_verify(p.draft_tokens, p.target_probs, p.draft_probs, cu_num_draft_tokens=pcu,
                                     uniforms=p.uniforms[None], exponential_noise=p.exponential_noise),
         r"uniforms must be float32 \[10\]")
    _bad(lambda: sdbench.prob_verify(p.draft_tokens, p.target_probs, p.draft_probs, cu_num_draft_tokens=pcu,
                                     out={"output_tokens": torch.empty(5, 3, dtype=torch.int64)}),
         r"out\['output_tokens'\] must be int64 \[15\]")
    _bad(lambda: sdbench.prob_verify(p.draft_tokens, target_logits=p.target_probs, draft_logits=p.draft_probs,
                                     cu_num_draft_tokens=pcu), r"takes probabilities")


CHILD = textwrap.dedent("""
    import json, torch, sdbench
    from sdbench import registry
    from sdbench.ops.prob_verify_ragged.reference import prob_verify_ragged
    from sdbench.ops.prob_verify_ragged.workload import make_ragged_prob_workload
    from sdbench.ops.verify_pack_ragged.reference import verify_pack_ragged
    from sdbench.ops.verify_ragged.reference import verify_ragged
    from sdbench.ops.verify_ragged.workload import make_ragged_workload
    from sdbench.ops.workload import VerifyConfig

    report = {"probe": registry.get("prob_verify_ragged", "fused").unavailable_reason("cpu"), "failures": []}
    def same(name, got, want):
        for key, value in want.items():
            mine = got[key][: value.shape[0]] if key == "packed_kv" else got[key]
            if not torch.equal(mine, value):
                report["failures"].append(f"{name}: {key} {mine.tolist()} != {value.tolist()}")
    if report["probe"] is None:
        # T = 310 > every cap on the T-sized γ_max bound (scan 32, pack programs 128, recovered programs 128)
        lengths = torch.tensor([150, 0, 129, 31])
        g = make_ragged_workload(VerifyConfig(4, 150, 1.0, kv_dim=8, seed=1), "cpu", lengths)
        want = verify_ragged(g.draft_tokens, g.target_tokens, g.cu_num_draft_tokens)
        buffers = {"accepted_lengths": torch.empty(4, dtype=torch.int64)}
        got = sdbench.verify(g.draft_tokens, g.target_tokens, impl="block_triton", cu_num_draft_tokens=g.cu_num_draft_tokens,
                             out=buffers)
        same("verify block_triton", got, want)
        report["verify_wrote_in_place"] = got["accepted_lengths"] is buffers["accepted_lengths"]
        got = sdbench.verify_pack(g.draft_tokens, g.target_tokens, g.draft_kv, cu_num_draft_tokens=g.cu_num_draft_tokens)
        same("verify_pack auto", got, verify_pack_ragged(g.draft_tokens, g.target_tokens, g.cu_num_draft_tokens, g.draft_kv))
        p = make_ragged_prob_workload(VerifyConfig(4, 150, 0.95, vocab_size=64, seed=2), "cpu", lengths)
        want = prob_verify_ragged(p.draft_tokens, p.target_probs, p.draft_probs, p.cu_num_draft_tokens, p.uniforms,
                                  p.exponential_noise)
        for impl in ("fused", "serial_sampler"):
            got = sdbench.prob_verify(p.draft_tokens, p.target_probs, p.draft_probs, impl=impl, uniforms=p.uniforms,
                                      exponential_noise=p.exponential_noise, cu_num_draft_tokens=p.cu_num_draft_tokens)
            same(f"prob_verify {impl}", {k: v for k, v in got.items() if k in want}, {k: want[k] for k in got if k in want})
        first = sdbench.prob_verify(p.draft_tokens, p.target_probs, p.draft_probs, seed=3,
                                    cu_num_draft_tokens=p.cu_num_draft_tokens)["output_tokens"].clone()
        second = sdbench.prob_verify(p.draft_tokens, p.target_probs, p.draft_probs, seed=3,
                                     cu_num_draft_tokens=p.cu_num_draft_tokens)["output_tokens"].clone()
        other = make_ragged_prob_workload(VerifyConfig(4, 150, 0.95, vocab_size=64, seed=2), "cpu", lengths)
        fresh = sdbench.prob_verify(other.draft_tokens, other.target_probs, other.draft_probs, seed=3,
                                    cu_num_draft_tokens=other.cu_num_draft_tokens)["output_tokens"]
        report["fast_moves_on"] = not torch.equal(first, second)
        report["fresh_binding_repeats_the_stream"] = bool(torch.equal(first, fresh))
        # offsets are never read on the host: decreasing and huge ones go to the kernel, which clamps them
        bad = torch.tensor([200, 5, 1 << 40, -3])
        got = sdbench.prob_verify(p.draft_tokens, p.target_probs, p.draft_probs, cu_num_draft_tokens=bad)
        report["bad_offsets_in_range"] = bool(((got["next_tokens"] >= 0) & (got["next_tokens"] < 64)).all())
    print(json.dumps(report))
""")


def test_sdbench_kernels_through_the_api_under_the_interpreter():
    pytest.importorskip("triton")
    report = run_interpreted(CHILD, timeout=900)
    assert report["failures"] == []
    assert report["verify_wrote_in_place"] and report["fast_moves_on"] and report["fresh_binding_repeats_the_stream"]
    assert report["bad_offsets_in_range"]
