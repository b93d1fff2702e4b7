"""The prob_verify reference: hand-checked draws, its float64 twin, and the parity contract built on it.

Tolerance: float intermediates (accept_probs) within reference.PROB_FLOAT_ATOL of the input dtype
(1e-5 float32, 1e-3 bfloat16); tokens and lengths bit for bit.
"""

import pytest
import torch

from sdbench import parity, registry
from sdbench.ops.prob_verify import reference
from sdbench.ops.prob_verify.workload import make_prob_workload
from sdbench.ops.workload import VerifyConfig
from sdbench.registry import BufferedRun, Implementation

Q_UNIFORM = [0.25, 0.25, 0.25, 0.25]
P_ROWS = [[0.4, 0.1, 0.3, 0.2], [0.1, 0.6, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]  # positions 0, 1 and the bonus


def _run(draft_tokens, p_rows, q_rows, uniforms, noise, **kwargs):
    batch = len(draft_tokens)
    target = torch.tensor(p_rows, dtype=torch.float32).expand(batch, -1, -1).contiguous()
    draft = torch.tensor(q_rows, dtype=torch.float32).expand(batch, -1, -1).contiguous()
    return reference.prob_verify(
        torch.tensor(draft_tokens), target, draft, torch.tensor(uniforms), torch.tensor(noise), **kwargs
    )


def test_hand_checked_accept_reject_residual_and_bonus():
    out = _run(
        draft_tokens=[[0, 1], [1, 0], [2, 3]],
        p_rows=P_ROWS, q_rows=[Q_UNIFORM, Q_UNIFORM],
        # seq 0: p >= q at both drafts, always accepted; seq 1: u·q = 0.125 >= p = 0.1 rejects at 0;
        # seq 2: accepts 0, then u·q = 0.1025 >= 0.1 rejects at 1.
        uniforms=[[0.99, 0.99], [0.5, 0.0], [0.9, 0.41]],
        noise=[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.1, 1.0], [1.0, 1.0, 1.0, 1.0]],
    )
    assert out["accepted_lengths"].tolist() == [2, 0, 1]
    # seq 0: bonus race over p_2 / 1 -> 3; seq 1: residual [0.15, 0, 0.05, 0] / [1, 1, 0.1, 1] -> 2;
    # seq 2: residual at row 1 is [0, 0.35, 0, 0] -> 1.
    assert out["next_tokens"].tolist() == [3, 2, 1]
    assert out["output_tokens"].tolist() == [[0, 1, 3], [2, -1, -1], [2, 1, -1]]


def test_accept_test_is_strict():
    # u·q == p exactly (0.5 · 0.25 == 0.125): rejected.
    out = _run([[0]], [[0.125, 0.875, 0, 0], [1, 0, 0, 0]], [Q_UNIFORM], [[0.5]], [[1.0] * 4])
    assert out["accepted_lengths"].tolist() == [0]
    assert out["next_tokens"].tolist() == [1]


def test_degenerate_residual_falls_back_to_p():
    # p(x) = 0 rejects; p <= q everywhere on that row leaves no residual mass: race over p instead.
    out = _run([[0]], [[0.0, 0.5, 0.5, 0.0], [1, 0, 0, 0]], [[0.2, 0.5, 0.5, 0.2]], [[0.3]], [[1.0, 1.0, 0.5, 1.0]])
    assert out["accepted_lengths"].tolist() == [0]
    assert out["next_tokens"].tolist() == [2]


def test_race_ties_go_to_the_smallest_index():
    out = _run([[0]], [[0.0, 0.5, 0.0, 0.5], [1, 0, 0, 0]], [[0.3, 0.3, 0.1, 0.3]], [[0.3]], [[1.0] * 4])
    assert out["next_tokens"].tolist() == [1]


def test_accept_probs_intermediate():
    out = _run([[0, 1]], P_ROWS, [Q_UNIFORM, [0.0, 0.0, 0.5, 0.5]], [[0.1, 0.1]], [[1.0] * 4], intermediates=True)
    assert out["accept_probs"].tolist() == [[1.0, 1.0]]  # p >= q, then q = 0 < p
    out = _run([[1, 0]], P_ROWS, [Q_UNIFORM, Q_UNIFORM], [[0.1, 0.1]], [[1.0] * 4], intermediates=True)
    assert out["accept_probs"][0, 0].item() == pytest.approx(0.4)


@pytest.mark.parametrize("prob_dtype,logprobs", [("float32", False), ("float32", True), ("bfloat16", False),
                                                 ("bfloat16", True)])
def test_output_structure(prob_dtype, logprobs):
    w = make_prob_workload(VerifyConfig(64, 5, 0.6, vocab_size=200, prob_dtype=prob_dtype, logprobs=logprobs, seed=1))
    out = reference.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise,
                                logprobs=logprobs)
    k = out["accepted_lengths"]
    assert k.dtype == torch.int64 and bool(((k >= 0) & (k <= 5)).all())
    assert 0 < int((k < 5).sum()) < 64  # the workload mixes rejections and bonus draws
    for row, length in enumerate(k.tolist()):
        tokens = out["output_tokens"][row].tolist()
        assert tokens[:length] == w.draft_tokens[row, :length].tolist()
        assert tokens[length] == out["next_tokens"][row].item()
        assert tokens[length + 1:] == [-1] * (5 - length)


def test_logprobs_are_the_exp_of_their_inputs():
    w = make_prob_workload(VerifyConfig(32, 4, 0.5, vocab_size=100, logprobs=True, seed=2))
    from_logs = reference.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms,
                                      w.exponential_noise, logprobs=True)
    from_probs = reference.prob_verify(w.draft_tokens, w.target_probs.exp(), w.draft_probs.exp(), w.uniforms,
                                       w.exponential_noise)
    for name in from_logs:
        assert torch.equal(from_logs[name], from_probs[name]), name


def test_bfloat16_inputs_use_float32_arithmetic():
    w = make_prob_workload(VerifyConfig(32, 4, 0.5, vocab_size=100, prob_dtype="bfloat16", seed=3))
    native = reference.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise,
                                   intermediates=True)
    upcast = reference.prob_verify(w.draft_tokens, w.target_probs.float(), w.draft_probs.float(), w.uniforms,
                                   w.exponential_noise, intermediates=True)
    for name in native:
        assert torch.equal(native[name], upcast[name]), name


@pytest.mark.parametrize("prob_dtype,logprobs", [("float32", False), ("bfloat16", True)])
def test_float64_reference_agrees(prob_dtype, logprobs):
    w = make_prob_workload(VerifyConfig(128, 8, 0.7, vocab_size=500, prob_dtype=prob_dtype, logprobs=logprobs, seed=4))
    args = (w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise)
    single = reference.prob_verify(*args, logprobs=logprobs, intermediates=True)
    double = reference.prob_verify_float64(*args, logprobs=logprobs)
    for name in ("accepted_lengths", "next_tokens", "output_tokens"):
        assert torch.equal(single[name], double[name]), name
    error = (single["accept_probs"].double() - double["accept_probs"]).abs().max().item()
    assert error < reference.PROB_FLOAT_ATOL["float32"]


# --- the parity contract for prob_verify -------------------------------------------------------
def _workload(**changes):
    return make_prob_workload(VerifyConfig(16, 4, 0.6, vocab_size=120, seed=5).replace(**changes))


def test_torch_eager_passes_parity():
    impl = registry.get("prob_verify", "torch_eager")
    for changes in ({}, {"prob_dtype": "bfloat16"}, {"logprobs": True}, {"token_dtype": "int32"}):
        assert parity.check(impl, _workload(**changes)) is None, changes


def _tampered(edit):
    """A prepared run returning the reference outputs (with accept_probs) after edit(outputs)."""
    def prepare(w):
        def run():
            outputs = reference.prob_verify(w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms,
                                            w.exponential_noise, logprobs=w.config.logprobs, intermediates=True)
            edit(outputs)
            return outputs
        return run
    return Implementation(op="prob_verify", name="tampered", backend="torch", description="", devices=("cpu",),
                          prepare=prepare)


def test_a_wrong_next_token_fails_parity():
    def shift(outputs):
        outputs["next_tokens"] = (outputs["next_tokens"] + 1) % 120
    assert parity.check(_tampered(shift), _workload()).startswith("next_tokens")


def test_float_intermediates_are_optional_and_tolerated():
    w = _workload()
    assert parity.check(_tampered(lambda outputs: outputs.pop("accept_probs")), w) is None

    def nudge(amount):
        def edit(outputs):
            outputs["accept_probs"] = outputs["accept_probs"] + amount
        return edit
    assert parity.check(_tampered(nudge(0.5e-5)), w) is None
    assert parity.check(_tampered(nudge(2e-5)), w).startswith("accept_probs")
    # bfloat16 inputs get the looser 1e-3
    assert parity.check(_tampered(nudge(5e-4)), _workload(prob_dtype="bfloat16")) is None


def test_unwritten_buffers_fail_because_of_poison():
    def prepare(w):
        outputs = {
            "accepted_lengths": torch.empty(16, dtype=torch.int64),
            "next_tokens": torch.empty(16, dtype=torch.int64),
            "output_tokens": torch.empty((16, 5), dtype=torch.int64),
        }
        return BufferedRun(lambda: None, outputs)
    lazy = Implementation(op="prob_verify", name="lazy", backend="torch", description="", devices=("cpu",),
                          prepare=prepare)
    assert parity.check(lazy, _workload()) is not None


def test_fast_randomness_has_no_token_reference():
    with pytest.raises(ValueError, match="supplied"):
        parity.expected_outputs("prob_verify", _workload().with_randomness("fast"))


def test_torch_eager_fast_mode_draws_its_own_randomness():
    w = _workload().with_randomness("fast")
    out = registry.get("prob_verify", "torch_eager").prepare(w)()
    k = out["accepted_lengths"]
    assert bool(((k >= 0) & (k <= 4)).all())
    assert torch.equal(out["output_tokens"].gather(1, k[:, None]).squeeze(1), out["next_tokens"])


# --- the input contract: degenerate rows and out-of-range tokens (sdbench.ops.input_contract) ----
def _bonus_race(bonus_row, noise):
    """All-accepted sequence (p = q = 1 at draft 0) racing on bonus_row."""
    vocab = len(bonus_row)
    p = torch.zeros(1, 2, vocab)
    p[0, 0, 0] = 1.0
    p[0, 1] = torch.tensor(bonus_row)
    q = torch.zeros(1, 1, vocab)
    q[0, 0, 0] = 1.0
    out = reference.prob_verify(torch.tensor([[0]]), p, q, torch.tensor([[0.5]]), torch.tensor([noise]))
    assert out["accepted_lengths"].tolist() == [1]
    return out["next_tokens"].item()


@pytest.mark.parametrize("value", [-0.5, -0.0, 0.0, float("nan"), float("-inf")])
def test_a_bonus_row_without_positive_mass_draws_the_smallest_noise(value):
    # tier 3: every column by 1 / E; the smallest E (column 2) wins, never a padding id == V
    assert _bonus_race([value] * 4, [1.0, 0.7, 0.2, 0.9]) == 2


def test_negative_keys_order_by_value_not_by_bits():
    # the Triton packing once ordered negative keys by their bit patterns (reversed): -E with the
    # largest E won. Here the largest E is column 0 and the smallest column 3.
    assert _bonus_race([-1.0] * 4, [5.0, 2.0, 1.5, 0.1]) == 3


def test_positive_mass_beats_the_degenerate_tiers():
    assert _bonus_race([-1.0, float("nan"), 1e-30, -0.0], [0.1, 0.1, 50.0, 0.1]) == 2
    assert _bonus_race([0.1, float("inf"), 0.2, float("inf")], [1.0, 3.0, 1.0, 1.0]) == 1  # inf ties: first index


def test_rejected_row_without_residual_or_target_mass_draws_the_smallest_noise():
    # p = 0 at the draft (rejected); p all negative on that row: no w > 0, no p > 0
    out = _run([[0]], [[-0.25] * 4, [1, 0, 0, 0]], [Q_UNIFORM], [[0.3]], [[1.0, 0.5, 2.0, 0.6]])
    assert out["accepted_lengths"].tolist() == [0]
    assert out["next_tokens"].tolist() == [1]


def test_out_of_range_tokens_are_rejected_and_flagged():
    # V = 4; tokens 40 and -3 (the example, which used to raise in the reference's gather)
    out = _run(
        draft_tokens=[[0, 40], [-3, 1], [0, 1]],
        p_rows=P_ROWS, q_rows=[Q_UNIFORM, Q_UNIFORM],
        uniforms=[[0.0, 0.0], [0.0, 0.0], [0.99, 0.99]], noise=[[1.0] * 4] * 3, intermediates=True,
    )
    assert out["accepted_lengths"].tolist() == [1, 0, 2]  # rejected at the bad position even with u = 0
    assert out["error_flags"].tolist() == [1, 1, 0]
    assert out["error_flags"].dtype == torch.int32
    assert out["accept_probs"][0, 1].item() == 0.0 and out["accept_probs"][1, 0].item() == 0.0
    assert bool(((out["output_tokens"] >= -1) & (out["output_tokens"] < 4)).all())
    # the race at the bad position's row is the ordinary residual race: seq 0 at row 1, p_1 - q
    assert out["next_tokens"].tolist()[0] == 1


def test_check_error_flags_raises_with_the_sequences():
    from sdbench.errors import SdbenchError
    from sdbench.ops.input_contract import check_error_flags

    check_error_flags({"error_flags": torch.zeros(3, dtype=torch.int32)})
    check_error_flags({"accepted_lengths": torch.zeros(3)})  # outputs without flags pass
    with pytest.raises(SdbenchError, match=r"1 sequence\(s\) \(2\).*draft token outside"):
        check_error_flags({"error_flags": torch.tensor([0, 0, 1], dtype=torch.int32)})


# --- rule="block": Sun et al.'s block verification on the same inputs ---------------------------
def test_block_rule_keeps_a_block_the_token_rule_rejects_at_its_first_draft():
    # p_0(1)/q = 0.4: w_1 = 0.4, r_1 = Σ max(0, 0.4·p_1 - q) = 0, so h_1 = 0; p_1(0)/q = 0.4: w_2 = 0.16 = h_2.
    # η_2 = 0.1 < 0.16 keeps both drafts (the token rule stops at 0: u·q = 0.125 >= 0.1); η_2 = 0.2 keeps none,
    # and the race at row 0 is over max(0, 1·p_0 - q) = [0.15, 0, 0.05, 0] / [1, 1, 0.1, 1] -> 2 (the bonus race
    # over p_2 = [0.1, 0.2, 0.3, 0.4] with the same noise -> 2 as well).
    inputs = dict(draft_tokens=[[1, 0], [1, 0]], p_rows=P_ROWS, q_rows=[Q_UNIFORM, Q_UNIFORM],
                  uniforms=[[0.5, 0.1], [0.5, 0.2]], noise=[[1.0, 1.0, 0.1, 1.0]] * 2)
    block, token = _run(**inputs, rule="block"), _run(**inputs)
    assert block["accepted_lengths"].tolist() == [2, 0] and token["accepted_lengths"].tolist() == [0, 0]
    assert block["output_tokens"].tolist() == [[1, 0, 2], [2, -1, -1]]


def test_block_rule_races_over_the_weighted_residual():
    # x = (1, 2): w_1 = 0.4; r_1 = Σ max(0, 0.4·p_1 - q_1) = 0.19, h_1 = 0.19 / 0.79 > η_1 = 0.2; w_2 = 0.4·0.2/0.45
    # = h_2 < η_2 = 0.5: τ = 1. The residual at row 1 is max(0, 0.4·p_1 - q_1) = [0, 0.19, 0, 0] -> token 1; the
    # unweighted max(0, p_1 - q_1) = [0.05, 0.55, 0, 0] would pick 0 with these noises.
    out = _run([[1, 2]], P_ROWS, [Q_UNIFORM, [0.05, 0.05, 0.45, 0.45]], [[0.2, 0.5]], [[0.01, 1.0, 1.0, 1.0]],
               rule="block")
    assert out["accepted_lengths"].tolist() == [1] and out["next_tokens"].tolist() == [1]


def test_block_rule_stops_before_an_out_of_range_token_and_flags_it():
    out = _run([[0, 40], [-3, 1]], P_ROWS, [Q_UNIFORM, Q_UNIFORM], [[0.0, 0.0], [0.0, 0.0]], [[1.0] * 4] * 2,
               rule="block")
    assert out["accepted_lengths"].tolist() == [1, 0]  # p = q = 0 there: w = 0 from that position on
    assert out["error_flags"].tolist() == [1, 1]


@pytest.mark.parametrize("prob_dtype", ["float32", "bfloat16"])
def test_block_rule_on_logprobs_equals_it_on_probabilities(prob_dtype):
    w = make_prob_workload(VerifyConfig(64, 4, vocab_size=50, prob_dtype=prob_dtype, seed=3))
    args = (w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise)
    plain = reference.prob_verify(*args, rule="block")
    logs = (w.draft_tokens, w.target_probs.float().log(), w.draft_probs.float().log(), w.uniforms,
            w.exponential_noise)
    logged = reference.prob_verify(*logs, rule="block", logprobs=True, compute_dtype=torch.float64)
    double = reference.prob_verify_float64(*args, rule="block")
    assert torch.equal(plain["output_tokens"], double["output_tokens"])
    assert torch.equal(logged["output_tokens"], double["output_tokens"])


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="rule"):
        _run([[0, 1]], P_ROWS, [Q_UNIFORM, Q_UNIFORM], [[0.5, 0.5]], [[1.0] * 4], rule="tree")
