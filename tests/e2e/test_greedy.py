"""Greedy: the loop emits the target's own greedy tokens, for every `verify` implementation.

Tolerance: exact token equality. The reference is the target alone through the same slot layout and
4-D masks (sdbench.e2e.slots), so a difference can only come from verification or bookkeeping; it is
also checked against HuggingFace's own generate() (batch 1, no padding, no gaps), which shares no code
with the loop. fp32 and seeded weights: a flip would need two logits within float32 rounding.
On CPU, sdbench.verify runs torch_eager for every name (the API's rule); on CUDA the same call runs
each kernel (tests/e2e/test_e2e_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from sdbench.e2e.speculative import speculative_generate, target_generate
from sdbench.e2e.verifier import implementation_names, make_verifier, unavailable_reason
from tests.e2e.conftest import PROMPTS, VOCAB, load

CPU = torch.device("cpu")
MAX_NEW = 24


def _speculative(target, draft, prompts, gamma=4, **kwargs):
    verifier = make_verifier(kwargs.pop("impl", "torch_eager"), 0.0, len(prompts), gamma, VOCAB, CPU)
    return speculative_generate(target, draft, prompts, gamma=gamma, max_new_tokens=MAX_NEW, verifier=verifier,
                                **kwargs)


@pytest.fixture(scope="module")
def target_greedy(models):
    return target_generate(models["target"], PROMPTS, max_new_tokens=MAX_NEW).tokens


@pytest.mark.parametrize("impl", implementation_names(0.0))
def test_greedy_output_equals_target_greedy(models, target_greedy, impl):
    reason = unavailable_reason(impl, 0.0, CPU)
    if reason is not None:
        pytest.skip(f"{impl}: {reason}")
    generation = _speculative(models["target"], models["close"], PROMPTS, impl=impl)
    assert generation.tokens == target_greedy
    assert any(k > 0 for row in generation.accepted_lengths for k in row)  # the draft was really used


def test_target_alone_equals_huggingface_generate(models, target_greedy):
    for prompt, expected in zip(PROMPTS, target_greedy, strict=True):
        out = models["target"].generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False,
                                        pad_token_id=0)
        assert out[0, len(prompt):].tolist() == expected


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_holds_for_every_gamma_and_a_far_draft(models, target_greedy, gamma):
    for draft in ("close", "far"):
        assert _speculative(models["target"], models[draft], PROMPTS, gamma=gamma).tokens == target_greedy


def test_sort_by_acceptance_changes_nothing_emitted(models, target_greedy):
    generation = _speculative(models["target"], models["close"], PROMPTS, sort_by_acceptance=True)
    assert generation.tokens == target_greedy


def test_batch_invariance(models, target_greedy):
    alone = [_speculative(models["target"], models["close"], [prompt]).tokens[0] for prompt in PROMPTS]
    reordered = _speculative(models["target"], models["close"], PROMPTS[::-1] + PROMPTS[:2]).tokens
    assert alone == target_greedy
    assert reordered[: len(PROMPTS)][::-1] == target_greedy


def test_eos_stops_a_sequence_and_the_rest_go_on(eos_pair_dir):
    target, draft = load(eos_pair_dir, "target"), load(eos_pair_dir, "close")
    prompts = [[2, 3, 4, 5, 6], [7, 8], [9], [20, 30, 40], [50, 51], [60]]
    expected = target_generate(target, prompts, max_new_tokens=MAX_NEW, eos_token_id=1).tokens
    generation = _speculative(target, draft, prompts, eos_token_id=1)
    assert generation.tokens == expected
    for tokens in expected:
        assert len(tokens) == MAX_NEW or tokens[-1] == 1
        assert 1 not in tokens[:-1]
