"""The chain floors (csrc/tools/chain_floor.cu) do the work they stand for: every KV floor packs the reference's
rows, every two-pass shape picks torch's tokens, at shapes that cover partial blocks and both logits dtypes. A floor
that skipped work would time as a lower bound it is not. GPU only (nvcc builds the library)."""

from __future__ import annotations

import math

import pytest
import torch

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
    names = [f"two_pass[{a},{b}]" for a, b in chain_floor.LOGITS_SHAPES] + ["rows_max[4]", "rows_max[8]"]
    # the default temperatures cycle (0, 0.7, 1, 1.3): request 0 of every batch is greedy, so the sampled floors run
    assert sorted(runs) == sorted(names + [f"sampled_{name}" for name in names])


@pytest.mark.parametrize("bf16", [True, False])
def test_the_sampled_pass_reads_every_row_but_a_greedy_requests_drafts(lib, bf16):
    """rows_max with greedy_period 4 (requests 0 and 4 of 6 greedy): every target row's and every sampled request's
    draft row's per-split maxima equal torch's, and a greedy request's draft rows are never written (still NaN)."""
    cfg = LogitsConfig(6, 4, 5000 if not bf16 else 4096, "bfloat16" if bf16 else "float32")
    workload = make_workload("prob_verify_logits", cfg, "cuda")
    target, draft = workload.target_logits, workload.draft_logits
    row_units, rows_units = chain_floor.logits_row_units(cfg), 4
    splits = math.ceil(row_units / (chain_floor.THREADS * rows_units))
    partials = torch.full((6 * 9, splits), float("nan"), device="cuda")
    picks = torch.empty(6, dtype=torch.int64, device="cuda")
    status = lib.chain_floor_two_pass(target.data_ptr(), draft.data_ptr(), partials.data_ptr(), picks.data_ptr(),
                                      6, 4, row_units, int(bf16), rows_units, 2, 0, 4, chain_floor._stream())
    torch.cuda.synchronize()
    assert status == 0
    per_split = chain_floor.THREADS * rows_units * chain_floor.UNIT // target.element_size()  # logits a split reads
    rows = torch.cat([target.reshape(-1, cfg.vocab_size), draft.reshape(-1, cfg.vocab_size)]).float()
    padded = torch.nn.functional.pad(rows, (0, splits * per_split - cfg.vocab_size), value=float("-inf"))
    want = padded.reshape(rows.shape[0], splits, per_split).amax(dim=2)
    greedy_drafts = torch.zeros(rows.shape[0], dtype=torch.bool, device="cuda")
    for seq in (0, 4):
        greedy_drafts[6 * 5 + seq * 4: 6 * 5 + seq * 4 + 4] = True
    assert torch.isnan(partials[greedy_drafts]).all(), "a greedy request's draft row was read"
    assert torch.equal(partials[~greedy_drafts], want[~greedy_drafts])


def test_a_two_pass_floor_against_other_picks_fails_its_check(lib, monkeypatch):
    """The comparison is wired: against a shifted reference every shape fails."""
    workload = make_workload("prob_verify_logits", LogitsConfig(4, 4, 4096, "float32"), "cuda")
    right = chain_floor.expected_picks
    monkeypatch.setattr(chain_floor, "expected_picks", lambda w: right(w) + 1)
    with pytest.raises(SdbenchError, match="picked other tokens"):
        chain_floor.logits_floor_runs(lib, workload)
    with pytest.raises(SdbenchError, match="sampled_two_pass.* picked other tokens"):
        chain_floor.two_pass_runs(lib, workload, chain_floor.greedy_period(workload))
