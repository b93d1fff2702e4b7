"""The one-launch probe of issue #18 (csrc/tools/logits_one_launch.cu) against the reference from logits.

The probe is an experiment, not a registered design; these tests keep what it times honest: k and the error flags
exact at every sequence, next tokens and output rows equal to the reference on supplied randomness (the probe's
softmax sums in another order with ex2.approx, so a near-tie could flip a token: not expected at these sizes),
and every counter and flag back at zero after each call, so the next call (or a graph replay) starts clean.
"""

from __future__ import annotations

import pytest
import torch

from sdbench.ops.prob_verify_logits.workload import LogitsConfig, make_logits_workload

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def module():
    from sdbench.commands.logits_one_launch import build

    return build()


CASES = [  # batch, γ, V, dtype, temperatures, draft noise
    (1, 4, 32000, "float32", (1.0,), 0.5),
    (1, 16, 151936, "bfloat16", (0.7,), 0.5),
    (32, 4, 32000, "bfloat16", (0.0, 0.7, 1.0, 1.3), 0.5),
    (33, 7, 4096, "bfloat16", (0.0, 0.7, 1.0, 1.3), 0.5),  # γ odd, a row of one split
    (64, 16, 32000, "float32", (1.0, 1.3), 0.5),
    (16, 5, 32000, "bfloat16", (1.0,), 0.0),  # the draft is the target: every draft accepted, the bonus row raced
    (16, 5, 32000, "float32", (0.9,), 4.0),  # a far draft: mostly rejected at the first position
    (8, 3, 32000, "bfloat16", (0.0,), 0.5),  # greedy only: no race item runs
    (257, 2, 8192, "float32", (0.0, 1.0), 0.5),  # more sequences than a lag of one wave
]


@pytest.mark.parametrize("lag", ["auto", 0, 100000])  # 0: a sequence's race right after its stats; 100000: after all
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-t{len(c[4])}-n{c[5]}")
def test_probe_matches_reference(module, case, lag):
    from sdbench.commands.logits_one_launch import check

    batch, gamma, vocab, dtype, temperatures, noise = case
    cfg = LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, temperatures=temperatures,
                       draft_noise=noise, seed=batch + gamma)
    w = make_logits_workload(cfg, "cuda")
    # lag 0 also takes one 16 KiB group an item and 4-step race chunks; the others plan their own
    result = check(module, w, lag=lag, chunk_steps=1 if lag != 0 else 4, groups="auto" if lag != 0 else 1)
    assert result["token_mismatch"] == 0 and result["rows_mismatch"] == 0, result
    if noise == 0.0:
        assert result["mean_k"] == gamma  # every draft accepted: the bonus row's race ran
    torch.cuda.synchronize()


def test_probe_flags_bad_tokens(module):
    from sdbench.commands.logits_one_launch import check

    cfg = LogitsConfig(6, 4, vocab_size=32000, logits_dtype="bfloat16", seed=3)
    w = make_logits_workload(cfg, "cuda")
    w.draft_tokens[1, 0] = 32000
    w.draft_tokens[4, 2] = -1
    result = check(module, w)  # the flags compared with the reference's inside
    assert result["token_mismatch"] == 0, result
