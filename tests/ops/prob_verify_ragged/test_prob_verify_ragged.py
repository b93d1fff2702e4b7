"""prob_verify_ragged on the CPU, without Triton: the reference against the padded operation, the workload's
layout, the vectorised torch_eager peer against the per-request reference, the input contract, the roofline
bytes, parity's grid and a sweep of the op (its γ_i distribution in the config key)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sdbench import parity, registry
from sdbench.ops.prob_verify.reference import prob_verify
from sdbench.ops.prob_verify.workload import make_prob_workload, prob_bytes
from sdbench.ops.prob_verify_ragged.reference import prob_verify_ragged
from sdbench.ops.prob_verify_ragged.workload import cut_to_lengths, make_ragged_prob_workload
from sdbench.ops.workload import VerifyConfig

OP = "prob_verify_ragged"


def _reference(w):
    return prob_verify_ragged(w.draft_tokens, w.target_probs, w.draft_probs, w.cu_num_draft_tokens, w.uniforms,
                              w.exponential_noise, logprobs=w.config.logprobs)


@pytest.mark.parametrize("cfg", [
    VerifyConfig(6, 4, 0.6, vocab_size=50, seed=1),
    VerifyConfig(5, 7, 0.9, vocab_size=40, prob_dtype="bfloat16", logprobs=True, token_dtype="int32", seed=2),
    VerifyConfig(1, 1, 0.0, vocab_size=16, seed=3),
    VerifyConfig(4, 3, 1.0, vocab_size=16, seed=4),
], ids=["fp32", "bf16-log-int32", "b1-g1", "all-accepted"])
def test_reference_equals_the_padded_operation_when_every_request_drafts_gamma(cfg):
    padded = make_prob_workload(cfg)
    w = make_ragged_prob_workload(cfg.replace(draft_lengths="full"))
    want = prob_verify(padded.draft_tokens, padded.target_probs, padded.draft_probs, padded.uniforms,
                       padded.exponential_noise, logprobs=cfg.logprobs)
    got = _reference(w)
    assert torch.equal(got["accepted_lengths"], want["accepted_lengths"])
    assert torch.equal(got["next_tokens"], want["next_tokens"]) and got["next_tokens"].dtype == want["next_tokens"].dtype
    assert torch.equal(got["output_tokens"], want["output_tokens"].flatten())
    assert torch.equal(got["error_flags"], want["error_flags"])


def test_a_request_without_drafts_draws_its_bonus_token_from_its_one_row():
    """γ_i = 0: k_i = 0 and the next token is argmax over p > 0 of p / E on the request's target row."""
    w = make_ragged_prob_workload(VerifyConfig(4, 3, 0.5, vocab_size=30, seed=5), draft_lengths=torch.tensor([2, 0, 3, 0]))
    out = _reference(w)
    for request, row in ((1, 2 + 1), (3, 5 + 3)):  # row = cu[i-1] + i
        p, noise = w.target_probs[row], w.exponential_noise[request]
        want = int(torch.where(p > 0, p / noise, torch.full_like(p, -1.0)).argmax())
        assert int(out["accepted_lengths"][request]) == 0 and int(out["next_tokens"][request]) == want
        assert int(out["output_tokens"][row]) == want
    assert out["output_tokens"].shape == (w.draft_tokens.shape[0] + 4,)


def test_workload_cuts_the_padded_workload_to_each_draft_length():
    cfg = VerifyConfig(3, 4, 0.7, vocab_size=20, seed=6)
    padded = make_prob_workload(cfg)
    w = make_ragged_prob_workload(cfg, draft_lengths=torch.tensor([4, 0, 2]))
    assert w.cu_num_draft_tokens.tolist() == [4, 4, 6] and w.draft_tokens.shape == (6,)
    assert w.target_probs.shape == (9, 20) and w.draft_probs.shape == (6, 20) and w.uniforms.shape == (6,)
    assert torch.equal(w.target_probs[5], padded.target_probs[1, 0])  # request 1's one row: its bonus row
    assert torch.equal(w.target_probs[6:9], padded.target_probs[2, :3])
    assert torch.equal(w.draft_probs[4:6], padded.draft_probs[2, :2]) and torch.equal(w.uniforms[4:6], padded.uniforms[2, :2])
    assert torch.equal(w.exponential_noise, padded.exponential_noise)
    fast = w.with_randomness("fast", offset=3)
    assert (fast.randomness, fast.offset) == ("fast", 3) and fast.target_probs is w.target_probs


def bad_token_workload(token_dtype: str = "int64"):
    """Drafts outside [0, V) (V = 37) in requests 0 and 2, request 1 clean, request 3 without drafts."""
    w = make_ragged_prob_workload(VerifyConfig(4, 3, 0.9, vocab_size=37, token_dtype=token_dtype, seed=21),
                                  draft_lengths=torch.tensor([3, 2, 3, 0]))
    tokens = w.draft_tokens.clone()
    tokens[1], tokens[5], tokens[7] = 40, -3, 37
    return dataclasses.replace(w, draft_tokens=tokens)


def test_bad_tokens_are_rejected_and_flagged_by_the_reference():
    out = _reference(bad_token_workload())
    assert out["error_flags"].tolist() == [1, 0, 1, 0]
    assert int(out["accepted_lengths"][0]) <= 1 and int(out["accepted_lengths"][2]) == 0
    assert bool(((out["next_tokens"] >= 0) & (out["next_tokens"] < 37)).all())


EAGER_CASES = [
    (VerifyConfig(7, 5, 0.7, vocab_size=50, seed=1), None),
    (VerifyConfig(9, 6, 0.9, vocab_size=40, draft_lengths="bimodal", seed=2), None),
    (VerifyConfig(4, 3, 0.9, vocab_size=30, logprobs=True, prob_dtype="bfloat16", seed=3), [0, 0, 0, 0]),
    (VerifyConfig(4, 3, 1.0, vocab_size=30, token_dtype="int32", seed=4), [3, 0, 1, 2]),
    (VerifyConfig(1, 5, 0.3, vocab_size=64, seed=5), None),
    (VerifyConfig(3, 33, 0.97, vocab_size=24, logprobs=True, seed=6), [33, 0, 17]),
]


@pytest.mark.parametrize("cfg, lengths", EAGER_CASES, ids=[f"case{i}" for i in range(len(EAGER_CASES))])
def test_torch_eager_matches_the_reference(cfg, lengths):
    w = make_ragged_prob_workload(cfg, draft_lengths=None if lengths is None else torch.tensor(lengths))
    assert parity.check(registry.get(OP, "torch_eager"), w) is None


def test_torch_eager_follows_the_input_contract():
    assert parity.check(registry.get(OP, "torch_eager"), bad_token_workload("int32")) is None


@pytest.mark.parametrize("bad", [[5, 2, 1014, -7, 1 << 40], [3, 20, 20, 20, 20], [-1, -1, -1, -1, -1]],
                         ids=["decreasing-huge-negative", "past-T", "all-negative"])
def test_torch_eager_stays_in_bounds_on_bad_offsets(bad):
    """Its answer is defined on valid offsets only, but any offsets index inside the inputs (on the CPU an
    index outside them raises)."""
    w = make_ragged_prob_workload(VerifyConfig(5, 5, 0.7, vocab_size=40, seed=9), draft_lengths=torch.tensor([3, 5, 0, 2, 4]))
    out = registry.get(OP, "torch_eager").prepare(dataclasses.replace(w, cu_num_draft_tokens=torch.tensor(bad)))()
    assert bool(((out["next_tokens"] >= 0) & (out["next_tokens"] < 40)).all())
    assert bool((out["accepted_lengths"] >= 0).all()) and bool((out["accepted_lengths"] <= 14).all())


def test_torch_eager_fast_mode_draws_fresh_numbers_each_call():
    w = make_ragged_prob_workload(VerifyConfig(16, 4, 0.5, vocab_size=200, seed=7)).with_randomness("fast")
    torch.manual_seed(0)
    run = registry.get(OP, "torch_eager").prepare(w)
    first, second = run()["output_tokens"].clone(), run()["output_tokens"].clone()
    assert not torch.equal(first, second)
    assert parity.compare(_reference(w), run()) is not None  # it does not read the supplied numbers


def unshifted(workload):
    """workload with target rows moved so that a correct kernel reads what one that forgets the one-row
    shift per earlier request (request i's rows from cu[i-1], not cu[i-1] + i) would read."""
    from sdbench.ops.verify_ragged.reference import draft_positions

    cu = workload.cu_num_draft_tokens
    batch, total = cu.shape[0], workload.draft_tokens.shape[0]
    starts = draft_positions(cu, total)[0]
    _, _, slot_request, slot_local = draft_positions(cu + torch.arange(batch, device=cu.device) + 1, total + batch)
    return dataclasses.replace(workload, target_probs=workload.target_probs[starts[slot_request] + slot_local])


def test_parity_rejects_a_kernel_that_forgets_the_bonus_row_shift():
    """The check can fail: the reference on unshifted rows differs from the reference."""
    w = make_ragged_prob_workload(VerifyConfig(6, 4, 0.6, vocab_size=50, seed=8))
    wrong = registry.Implementation(op=OP, name="unshifted", backend="torch", description="", devices=("cpu",),
                                    prepare=lambda workload: lambda: _reference(unshifted(workload)))
    assert parity.check(wrong, w) is not None


# --- exactness in distribution (χ², the machinery of tests/ops/prob_verify/test_prob_exactness.py) --------
def ragged_rounds(rounds: int, device: str = "cpu", seed: int = 1):
    """(ragged, padded): `rounds` requests over the same p [3, V], q [2, V] (V = 16), drafting 0, 1, 2
    tokens in turn, and the padded workload they were cut from."""
    from test_prob_exactness import fixed_distributions, make_rounds

    p, q = fixed_distributions()
    padded = make_rounds(p, q, rounds=rounds, device=device, seed=seed)
    return cut_to_lengths(padded, torch.arange(rounds) % 3), padded


def ragged_pvalues(outputs, w, padded) -> dict[str, float]:
    """χ² p-values per draft length g: every request's first emitted token ~ p_0 (γ_i = 0: its bonus draw);
    for g >= 1 the padded checks (acceptance, second token, bonus token) on the requests drafting g."""
    from test_prob_exactness import chi_square_pvalue, exactness_pvalues, stored_distributions, token_counts

    p, q = stored_distributions(padded)
    lengths = w.draft_lengths.cpu()
    slots = (torch.cat([w.cu_num_draft_tokens.new_zeros(1), w.cu_num_draft_tokens[:-1]]).cpu()
             + torch.arange(lengths.numel()))
    tokens, accepted = outputs["output_tokens"].cpu(), outputs["accepted_lengths"].cpu()
    pvalues = {}
    for gamma in (0, 1, 2):
        mine = lengths == gamma
        emitted = tokens[slots[mine][:, None] + torch.arange(gamma + 1)]
        if gamma == 0:
            pvalues["bonus_only_first_token"] = chi_square_pvalue(token_counts(emitted[:, 0], p.shape[1]), p[0])
            continue
        checks = exactness_pvalues({"output_tokens": emitted, "accepted_lengths": accepted[mine]}, p[:gamma + 1],
                                   q[:gamma])
        pvalues.update({f"g{gamma}_{name}": value for name, value in checks.items()})
    return pvalues


@pytest.fixture(scope="module")
def chi2_helpers_on_path():
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parents[1] / "prob_verify")
    sys.path.insert(0, here)
    yield
    sys.path.remove(here)


def test_torch_eager_fast_mode_is_exact_and_the_row_shift_check_can_fail(chi2_helpers_on_path):
    from test_prob_exactness import SIGNIFICANCE

    w, padded = ragged_rounds(60_000)
    w = w.with_randomness("fast")
    eager = registry.get(OP, "torch_eager")
    torch.manual_seed(3)
    pvalues = ragged_pvalues(eager.prepare(w)(), w, padded)
    assert min(pvalues.values()) > SIGNIFICANCE, pvalues
    wrong = ragged_pvalues(eager.prepare(unshifted(w))(), w, padded)
    # with lengths 0, 1, 2 in turn the unshifted bonus row of every other one-draft request is p_0, not p_1
    assert wrong["g1_bonus_token"] < SIGNIFICANCE, wrong


def test_prob_bytes_of_ragged_lengths():
    cfg = VerifyConfig(4, 8, 0.5, vocab_size=1000)
    assert prob_bytes(cfg, draft_lengths=[8, 8, 8, 8]) == prob_bytes(cfg)
    assert prob_bytes(cfg, bonus_fraction=0.0, draft_lengths=[0, 8, 2, 6]) == 16 * 2 * 4 + 4 * 1000 * 4 * 2
    every_bonus = prob_bytes(cfg, draft_lengths=[0, 0, 0, 0], randomness="supplied")
    assert every_bonus == 4 * 1000 * 4 + 4 * 1000 * 4  # one p row each, plus the noise rows


def test_parity_grid_cycles_the_draft_length_distributions():
    configs = list(parity.configs_for(OP, parity.INTERPRETER_QUICK_GRID))
    assert len(configs) == parity.count_configs("prob_verify", parity.INTERPRETER_QUICK_GRID)
    assert {cfg.draft_lengths for cfg in configs} == {"uniform", "full", "bimodal"}
    assert {cfg.draft_lengths for cfg in parity.configs_for("prob_verify", parity.INTERPRETER_QUICK_GRID)} == {"uniform"}


def test_cut_keeps_the_randomness_mode():
    padded = make_prob_workload(VerifyConfig(2, 2, vocab_size=10)).with_randomness("fast", offset=5)
    w = cut_to_lengths(padded, torch.tensor([1, 2]))
    assert (w.randomness, w.offset) == ("fast", 5)


def test_sweep_axis_is_in_the_config_key(tmp_path):
    from sdbench.commands import sweep
    from sdbench.measure import results

    for kind in ("uniform", "bimodal"):
        spec = sweep.build_spec(op=OP, impls=["torch_eager"], batch_sizes=[8], gammas=[4], alphas=[0.5],
                                vocab_sizes=[64], device="cpu", warmup=0, iters=3, out_dir=tmp_path, draft_lengths=kind,
                                resume=True)
        summary = sweep.run_sweep(spec)
        assert summary.measured == 1  # the second kind is a new config, not skipped by --resume
    rows = [row for row in results.read_rows(tmp_path) if row["impl"] == "torch_eager"]
    assert {row["draft_lengths"] for row in rows} == {"uniform", "bimodal"}
    assert all(row["status"] == "ok" and row["vocab_size"] == 64 and row["kv_dtype"] == "float32"
               and 0.0 <= row["mean_accepted_length"] <= 4.0 and row["bytes_moved"] > 0 for row in rows)
