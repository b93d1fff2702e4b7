"""The draft-cache gap: with the fix, acceptance equals a loop that has no gap by construction.

The reference recomputes both models from scratch on each sequence's own contiguous context every
round (no cache, no batch, no padding), so it cannot miss a position; rounds are synchronized but each
sequence's k_i depends only on its own context, so its per-round k_i must match the batched loop's.
"""

from __future__ import annotations

import torch

from sdbench.e2e.speculative import speculative_generate
from sdbench.e2e.verifier import make_verifier
from tests.e2e.conftest import PROMPTS, VOCAB

GAMMA, MAX_NEW = 4, 24


@torch.no_grad()
def no_cache_accepted_lengths(target, draft, prompt, gamma, max_new_tokens):
    context, lengths, emitted = list(prompt), [], 0
    while emitted < max_new_tokens:
        drafts = []
        for _ in range(gamma):
            drafts.append(int(draft(torch.tensor([context + drafts])).logits[0, -1].argmax()))
        target_tokens = target(torch.tensor([context + drafts])).logits[0, len(context) - 1:].argmax(-1).tolist()
        k = 0
        while k < gamma and drafts[k] == target_tokens[k]:
            k += 1
        new = drafts[:k] + [target_tokens[k]]
        context += new
        emitted += len(new)
        lengths.append(k)
    return lengths


def _batched(target, draft, gap_fix):
    verifier = make_verifier("torch_eager", 0.0, len(PROMPTS), GAMMA, VOCAB, torch.device("cpu"))
    return speculative_generate(target, draft, PROMPTS, gamma=GAMMA, max_new_tokens=MAX_NEW, verifier=verifier,
                                draft_gap_fix=gap_fix).accepted_lengths


def _expected_rounds(per_sequence):
    rounds = max(len(lengths) for lengths in per_sequence)
    return [[lengths[r] for lengths in per_sequence if len(lengths) > r] for r in range(rounds)]


def test_fixed_loop_matches_the_gapless_reference(models):
    per_sequence = [no_cache_accepted_lengths(models["target"], models["close"], p, GAMMA, MAX_NEW) for p in PROMPTS]
    assert any(k == GAMMA for lengths in per_sequence for k in lengths)  # the gap case really occurs
    assert _batched(models["target"], models["close"], gap_fix=True) == _expected_rounds(per_sequence)


def test_the_target_as_its_own_draft_accepts_everything_only_with_the_fix(models):
    fixed = _batched(models["target"], models["target"], gap_fix=True)
    assert all(k == GAMMA for row in fixed for k in row)
    unfixed = _batched(models["target"], models["target"], gap_fix=False)
    assert any(k < GAMMA for row in unfixed for k in row)  # the must-fail variant: the gap costs acceptance
