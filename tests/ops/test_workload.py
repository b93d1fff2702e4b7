"""The generator's contract: the oracle holds, seeds reproduce, distributions have the right mean."""

import math

import pytest
import torch

from sdbench.errors import SdbenchError
from sdbench.ops.workload import VerifyConfig, expected_accepted_length, make_verify_workload

DISTS = [
    dict(dist="binomial"),
    dict(dist="geometric"),
    dict(dist="fixed", fixed_length=5),
]


def _oracle_holds(w):
    k = w.accepted_lengths
    gamma = w.config.gamma
    draft, target = w.draft_tokens.long(), w.target_tokens.long()
    positions = torch.arange(gamma)
    before = positions[None, :] < k[:, None]
    assert torch.equal(draft[before], target[:, :gamma][before]), "target must agree before k_i"
    rejected = k < gamma
    rows = torch.nonzero(rejected).squeeze(1)
    assert bool((draft[rows, k[rejected]] != target[rows, k[rejected]]).all()), "target must differ at k_i"


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d["dist"])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("token_dtype", ["int64", "int32"])
def test_oracle_holds(dist, alpha, token_dtype):
    cfg = VerifyConfig(batch_size=257, gamma=33, alpha=alpha, token_dtype=token_dtype, vocab_size=7, **dist)
    w = make_verify_workload(cfg)
    _oracle_holds(w)
    assert w.draft_tokens.dtype == getattr(torch, token_dtype)
    assert w.draft_tokens.shape == (257, 33) and w.target_tokens.shape == (257, 34)
    assert int(w.draft_tokens.min()) >= 0 and int(w.draft_tokens.max()) < 7


def test_trace_distribution_draws_only_observed_lengths(tmp_path):
    trace = tmp_path / "lengths.txt"
    trace.write_text("0, 3\n7 3\n")
    w = make_verify_workload(VerifyConfig(batch_size=500, gamma=7, dist="trace", trace_path=str(trace)))
    _oracle_holds(w)
    assert set(w.accepted_lengths.tolist()) == {0, 3, 7}


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d["dist"])
def test_same_seed_same_inputs_other_seed_other_inputs(dist):
    cfg = VerifyConfig(batch_size=64, gamma=16, alpha=0.6, kv_dim=8, seed=11, **dist)
    a, b = make_verify_workload(cfg), make_verify_workload(cfg)
    c = make_verify_workload(cfg.replace(seed=12))
    for name in ("draft_tokens", "target_tokens", "accepted_lengths", "draft_kv"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.draft_tokens, c.draft_tokens)


@pytest.mark.parametrize("dist", ["binomial", "geometric"])
@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
def test_mean_accepted_length_matches_distribution(dist, alpha):
    n, gamma = 20000, 16
    w = make_verify_workload(VerifyConfig(batch_size=n, gamma=gamma, alpha=alpha, dist=dist, seed=5))
    k = w.accepted_lengths.double()
    mean = expected_accepted_length(w.config)
    # Five standard errors of the sample mean: a false alarm about once in 3.5 million runs.
    assert abs(float(k.mean()) - mean) < 5 * float(k.std()) / math.sqrt(n) + 1e-9


def test_geometric_and_binomial_differ_at_small_alpha():
    """The reason both exist: binomial overstates long runs when alpha is small."""
    binomial = expected_accepted_length(VerifyConfig(1, 16, 0.3, dist="binomial"))
    geometric = expected_accepted_length(VerifyConfig(1, 16, 0.3, dist="geometric"))
    assert binomial == pytest.approx(4.8) and geometric == pytest.approx(0.3 / 0.7, rel=1e-6)


def test_kv_is_random_not_zero():
    w = make_verify_workload(VerifyConfig(4, 8, kv_dim=16, kv_dtype="bfloat16"))
    assert w.draft_kv.shape == (4, 8, 16) and w.draft_kv.dtype == torch.bfloat16
    assert float(w.draft_kv.float().abs().mean()) > 0.1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0, gamma=8), "batch size"),
        (dict(batch_size=1, gamma=0), "gamma"),
        (dict(batch_size=1, gamma=8, alpha=1.5), "alpha"),
        (dict(batch_size=1, gamma=8, kv_dim=-1), "kv_dim"),
        (dict(batch_size=1, gamma=8, dist="poisson"), "distribution"),
        (dict(batch_size=1, gamma=8, dist="fixed", fixed_length=9), "fixed_length"),
        (dict(batch_size=1, gamma=8, dist="trace"), "trace"),
        (dict(batch_size=1, gamma=8, vocab_size=1), "vocab"),
        (dict(batch_size=1, gamma=8, token_dtype="int16"), "token dtype"),
    ],
)
def test_bad_configs_raise_clear_errors(kwargs, message):
    with pytest.raises(SdbenchError, match=message):
        VerifyConfig(**kwargs)


def test_trace_errors(tmp_path):
    with pytest.raises(SdbenchError, match="does not exist"):
        make_verify_workload(VerifyConfig(2, 4, dist="trace", trace_path=str(tmp_path / "missing")))
    long = tmp_path / "long.txt"
    long.write_text("1 2 9")
    with pytest.raises(SdbenchError, match="length 9 outside"):
        make_verify_workload(VerifyConfig(2, 4, dist="trace", trace_path=str(long)))


def test_trace_rounds_keep_the_recorded_batch_order(tmp_path):
    """trace-rounds: one recorded round (line seed mod #lines), in batch order, cycled to B; the sorted variant
    is that round longest first. The workload's tokens realise exactly those lengths."""
    from sdbench.ops.workload import expected_accepted_length

    trace = tmp_path / "rounds.txt"
    trace.write_text("0 5 1 5\n\n2 0 3\n")
    first = make_verify_workload(VerifyConfig(6, 5, dist="trace-rounds", trace_path=str(trace), seed=0))
    assert first.accepted_lengths.tolist() == [0, 5, 1, 5, 0, 5]
    second = make_verify_workload(VerifyConfig(4, 5, dist="trace-rounds", trace_path=str(trace), seed=1))
    assert second.accepted_lengths.tolist() == [2, 0, 3, 2]
    ordered = make_verify_workload(VerifyConfig(4, 5, dist="trace-rounds-sorted", trace_path=str(trace), seed=1))
    assert ordered.accepted_lengths.tolist() == [3, 2, 2, 0]
    assert expected_accepted_length(VerifyConfig(4, 5, dist="trace-rounds", trace_path=str(trace), seed=1)) == 7 / 4
    # the tokens: agreement up to k_i, a mismatch at k_i (when k_i < γ)
    mismatch = first.draft_tokens != first.target_tokens[:, :5]
    for row, k in enumerate(first.accepted_lengths.tolist()):
        assert not bool(mismatch[row, :k].any()) and (k == 5 or bool(mismatch[row, k]))


def test_trace_rounds_need_a_trace_and_check_it(tmp_path):
    from sdbench.errors import SdbenchError

    with pytest.raises(SdbenchError, match="needs a trace file"):
        VerifyConfig(2, 4, dist="trace-rounds")
    long = tmp_path / "long.txt"
    long.write_text("1 9\n")
    with pytest.raises(SdbenchError, match="outside"):
        VerifyConfig(2, 4, dist="trace-rounds-sorted", trace_path=str(long))


@pytest.mark.parametrize("op", ["prob_verify", "prob_verify_ragged", "prob_verify_logits"])
def test_every_probabilistic_workload_checks_its_randomness_the_same_way(op):
    """One home for the randomness mode and the fast-mode offset: a bad mode and a negative offset are refused by
    every probabilistic workload, and a good one shares the tensors."""
    from sdbench.ops import make_workload
    from sdbench.ops.prob_verify_logits.workload import LogitsConfig

    cfg = LogitsConfig(2, 3, 64, "float32") if op == "prob_verify_logits" else VerifyConfig(2, 3, 0.5)
    workload = make_workload(op, cfg, "cpu")
    with pytest.raises(SdbenchError, match="randomness must be one of"):
        workload.with_randomness("sometimes")
    with pytest.raises(SdbenchError, match="offset must be >= 0"):
        workload.with_randomness("fast", offset=-1)
    fast = workload.with_randomness("fast", offset=3)
    assert (fast.randomness, fast.offset) == ("fast", 3) and fast.draft_tokens is workload.draft_tokens
