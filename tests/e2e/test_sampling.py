"""Sampling: the first emitted token is distributed as the target's own softmax(logits / T).

One prompt repeated over a batch of N sequences (N independent draws from one seeded generator), one
round each, against the exact distribution from a plain target forward (no cache): a chi-squared test
with bins of expected count < 5 pooled, rejecting at p < 1e-3 (a correct loop fails 1 run in 1000; the
seed is fixed, so the test is deterministic). The must-fail variant draws the residual from p instead of
max(0, p - q) and is shown to be rejected (p < 1e-6) by the same test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from sdbench.e2e.slots import sample_race
from sdbench.e2e.speculative import speculative_generate
from sdbench.e2e.verifier import implementation_names, make_verifier, unavailable_reason
from tests.e2e.conftest import VOCAB

CPU = torch.device("cpu")
PROMPT = [5, 17, 33]
TEMPERATURE, GAMMA, DRAWS = 1.0, 2, 4000


def residual_from_p(draft_tokens, target_probs, draft_probs, generator):
    """Wrong on purpose: the correct accept test, then the next token drawn from p, not max(0, p - q)."""
    batch, gamma = draft_tokens.shape
    uniforms = torch.rand((batch, gamma), generator=generator)
    p_at = target_probs[:, :gamma].gather(2, draft_tokens[:, :, None]).squeeze(2)
    q_at = draft_probs.gather(2, draft_tokens[:, :, None]).squeeze(2)
    accepted = (uniforms * q_at < p_at).long().cumprod(dim=1).sum(dim=1)
    return accepted, sample_race(target_probs[torch.arange(batch), accepted], generator)


def first_tokens(models, verifier):
    generation = speculative_generate(models["target"], models["far"], [PROMPT] * DRAWS, gamma=GAMMA,
                                      max_new_tokens=1, verifier=verifier, temperature=TEMPERATURE,
                                      generator=torch.Generator().manual_seed(0))
    return np.array([tokens[0] for tokens in generation.tokens])


def chi_squared_p_value(models, tokens):
    with torch.no_grad():
        logits = models["target"](torch.tensor([PROMPT])).logits[0, -1]
    expected = (logits / TEMPERATURE).softmax(dim=-1).double().numpy() * len(tokens)
    observed = np.bincount(tokens, minlength=VOCAB).astype(float)
    small = expected < 5
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    return chisquare(observed, expected * observed.sum() / expected.sum()).pvalue


@pytest.mark.parametrize("impl", implementation_names(TEMPERATURE))
def test_first_token_follows_the_target_distribution(models, impl):
    reason = unavailable_reason(impl, TEMPERATURE, CPU)
    if reason is not None:
        pytest.skip(f"{impl}: {reason}")
    verifier = make_verifier(impl, TEMPERATURE, DRAWS, GAMMA, VOCAB, CPU)
    assert chi_squared_p_value(models, first_tokens(models, verifier)) > 1e-3


def test_residual_drawn_from_p_is_rejected(models):
    assert chi_squared_p_value(models, first_tokens(models, residual_from_p)) < 1e-6
