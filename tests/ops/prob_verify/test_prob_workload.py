"""prob_verify workloads: shapes, storage modes, seeding, the controllable acceptance rate, roofline bytes."""

import math

import pytest
import torch

from sdbench.errors import SdbenchError
from sdbench.ops import make_workload
from sdbench.ops.prob_verify.workload import (
    ProbWorkload,
    decode_probs,
    make_prob_workload,
    prob_bytes,
    prob_workload_from_distributions,
)
from sdbench.ops.workload import VerifyConfig

STORAGE = [("float32", False), ("float32", True), ("bfloat16", False), ("bfloat16", True)]


@pytest.mark.parametrize("prob_dtype,logprobs", STORAGE)
def test_shapes_dtypes_and_storage(prob_dtype, logprobs):
    cfg = VerifyConfig(5, 3, 0.7, vocab_size=64, prob_dtype=prob_dtype, logprobs=logprobs, token_dtype="int32")
    w = make_workload("prob_verify", cfg, "cpu")
    assert isinstance(w, ProbWorkload) and w.randomness == "supplied"
    assert w.draft_tokens.shape == (5, 3) and w.draft_tokens.dtype == torch.int32
    assert w.target_probs.shape == (5, 4, 64) and w.draft_probs.shape == (5, 3, 64)
    assert w.target_probs.dtype == w.draft_probs.dtype == getattr(torch, prob_dtype)
    assert w.uniforms.shape == (5, 3) and w.uniforms.dtype == torch.float32
    assert w.exponential_noise.shape == (5, 64) and w.exponential_noise.dtype == torch.float32
    # bfloat16 keeps ~3 significant digits: a row of 64 sums to 1 within a few 1e-3.
    for stored in (w.target_probs, w.draft_probs):
        sums = decode_probs(stored, logprobs).sum(dim=-1)
        assert torch.allclose(sums, torch.ones_like(sums), atol=2e-2 if prob_dtype == "bfloat16" else 1e-5)


def test_randomness_ranges():
    w = make_prob_workload(VerifyConfig(64, 4, vocab_size=500, seed=1))
    assert bool((w.uniforms >= 0).all() and (w.uniforms < 1).all())
    assert bool((w.exponential_noise > 0).all() and torch.isfinite(w.exponential_noise).all())


def test_draft_tokens_have_positive_draft_probability():
    w = make_prob_workload(VerifyConfig(32, 6, 0.5, vocab_size=300, seed=2))
    q_at_draft = w.draft_probs.gather(2, w.draft_tokens[:, :, None]).squeeze(2)
    assert bool((q_at_draft > 0).all())


def test_same_seed_same_workload_other_seed_differs():
    cfg = VerifyConfig(4, 3, 0.6, vocab_size=100, seed=7)
    first, second = make_prob_workload(cfg), make_prob_workload(cfg)
    for name in ("draft_tokens", "target_probs", "draft_probs", "uniforms", "exponential_noise"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    other = make_prob_workload(cfg.replace(seed=8))
    assert not torch.equal(first.target_probs, other.target_probs)


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.6, 0.9, 1.0])
def test_realised_acceptance_tracks_alpha(alpha):
    # At V=4000 the independent part overlaps the target by ~0.01, so any alpha >= 0.1 is met
    # exactly before float32 rounding.
    w = make_prob_workload(VerifyConfig(16, 4, alpha, vocab_size=4000, seed=3))
    assert w.realised_acceptance == pytest.approx(alpha, abs=1e-4)


def test_small_alpha_is_clamped_up_to_the_natural_overlap():
    w = make_prob_workload(VerifyConfig(64, 4, 0.0, vocab_size=16, seed=4))
    assert 0.0 < w.realised_acceptance < 0.3


def test_with_randomness_shares_tensors_and_validates():
    w = make_prob_workload(VerifyConfig(2, 2, vocab_size=20))
    fast = w.with_randomness("fast", offset=5)
    assert fast.randomness == "fast" and fast.offset == 5 and fast.target_probs is w.target_probs
    with pytest.raises(SdbenchError, match="randomness"):
        w.with_randomness("quick")
    with pytest.raises(SdbenchError, match="offset"):
        w.with_randomness("fast", offset=-1)


def test_from_distributions_checks_shapes_and_stores_as_configured():
    p = torch.full((3, 3, 8), 1 / 8)
    q = torch.full((3, 2, 8), 1 / 8)
    cfg = VerifyConfig(3, 2, vocab_size=8, logprobs=True)
    w = prob_workload_from_distributions(p, q, cfg)
    assert torch.allclose(w.target_probs, torch.full_like(p, math.log(1 / 8)))
    assert w.realised_acceptance == pytest.approx(1.0)
    with pytest.raises(SdbenchError, match="gamma"):
        prob_workload_from_distributions(p, q, cfg.replace(gamma=3))


def test_prob_bytes_matches_the_issue_floor():
    cfg = VerifyConfig(32, 8, 0.9, vocab_size=32000)
    floor = prob_bytes(cfg, bonus_fraction=0.0)
    assert floor == 32 * 8 * 2 * 4 + 32 * 32000 * 4 * 2  # ~8.2 MB
    assert prob_bytes(cfg, bonus_fraction=1.0) == 32 * 8 * 2 * 4 + 32 * 32000 * 4
    expected = prob_bytes(cfg)  # alpha^gamma of the sequences read p alone
    assert prob_bytes(cfg, bonus_fraction=1.0) < expected < floor
    assert prob_bytes(cfg.replace(prob_dtype="bfloat16"), bonus_fraction=0.0) < floor
    supplied = prob_bytes(cfg, bonus_fraction=0.0, randomness="supplied")
    assert supplied == floor + 32 * 8 * 4 + 32 * 32000 * 4
