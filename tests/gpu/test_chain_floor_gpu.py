"""The chain floors (csrc/tools/chain_floor.cu) do the work they stand for: every KV floor packs the reference's
rows, every two-pass shape picks torch's tokens, at shapes that cover partial blocks and both logits dtypes. A floor
that skipped work would time as a lower bound it is not. GPU only (nvcc builds the library)."""

from __future__ import annotations

import pytest

from sdbench.commands import chain_floor
from sdbench.errors import SdbenchError
from sdbench.ops import make_workload
from sdbench.ops.prob_verify_logits.workload import LogitsConfig
from sdbench.ops.verify_pack.reference import verify_pack
from sdbench.ops.workload import VerifyConfig


@pytest.fixture(scope="module")
def lib():
    return chain_floor.library()


@pytest.mark.parametrize("cfg", [VerifyConfig(1, 4, 0.9, kv_dim=64), VerifyConfig(37, 8, 0.6, kv_dim=128),
                                 VerifyConfig(300, 32, 0.3, kv_dim=1024), VerifyConfig(64, 128, 0.9, kv_dim=64),
                                 VerifyConfig(8, 4, 0.0, kv_dim=64)])  # the last accepts nothing: no launch
def test_every_kv_floor_packs_the_reference_rows(lib, cfg):
    workload = make_workload("verify_pack", cfg, "cuda")
    expected = verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv)
    runs = chain_floor.kv_floor_runs(lib, workload, expected)  # each checked once inside
    assert sorted(runs) == sorted([f"copy[{u}]" for u in (1, 2, 4, 8)] +
                                  [f"{kind}[{u}]" for kind in ("gather", "speculative") for u in (1, 2, 4)])


def test_a_kv_floor_given_wrong_offsets_fails_its_check(lib):
    workload = make_workload("verify_pack", VerifyConfig(64, 8, 0.9, kv_dim=128), "cuda")
    expected = verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv)
    shifted = dict(expected, packed_offsets=expected["packed_offsets"].roll(1))
    with pytest.raises(SdbenchError, match="did not pack"):
        chain_floor.kv_floor_runs(lib, workload, shifted)


# draft_noise 0: the draft is the target, so no row stops a sequence and every race reads the bonus row alone
@pytest.mark.parametrize("cfg", [LogitsConfig(3, 4, 32000, "bfloat16", draft_noise=0.05),
                                 LogitsConfig(5, 8, 5000, "float32"), LogitsConfig(2, 16, 128256, "bfloat16"),
                                 LogitsConfig(4, 4, 4096, "bfloat16", draft_noise=0.0)])
def test_every_two_pass_shape_picks_torchs_tokens(lib, cfg):
    workload = make_workload("prob_verify_logits", cfg, "cuda")
    runs = chain_floor.logits_floor_runs(lib, workload)  # each two-pass shape checked once inside
    assert sorted(runs) == sorted([f"two_pass[{a},{b}]" for a, b in chain_floor.LOGITS_SHAPES] +
                                  ["rows_max[4]", "rows_max[8]"])


def test_a_two_pass_floor_against_other_picks_fails_its_check(lib, monkeypatch):
    """The comparison is wired: against a shifted reference every shape fails."""
    workload = make_workload("prob_verify_logits", LogitsConfig(4, 4, 4096, "float32"), "cuda")
    right = chain_floor.expected_picks
    monkeypatch.setattr(chain_floor, "expected_picks", lambda w: right(w) + 1)
    with pytest.raises(SdbenchError, match="picked other tokens"):
        chain_floor.logits_floor_runs(lib, workload)
