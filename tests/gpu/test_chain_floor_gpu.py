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


# (bf16, V, rows_units, P): one split and several (bf16 V = 32000 at 4 units a thread: 4 splits), P = 2 and 4, a batch
# of 7 (not a multiple of either)
@pytest.mark.parametrize(("bf16", "vocab", "rows_units", "period"),
                         [(True, 4096, 4, 4), (True, 32000, 4, 2), (False, 5000, 8, 4), (False, 5000, 4, 2)])
def test_the_sampled_pass_reads_every_row_but_a_greedy_requests_drafts(lib, bf16, vocab, rows_units, period):
    """rows_max with greedy_period P (request s greedy iff s % P == 0): every target row's and every sampled request's
    draft row's per-split maxima equal torch's; a greedy request's draft rows and two guard rows past the buffer are
    never written (still NaN)."""
    batch, gamma = 7, 4
    cfg = LogitsConfig(batch, gamma, vocab, "bfloat16" if bf16 else "float32")
    workload = make_workload("prob_verify_logits", cfg, "cuda")
    target, draft = workload.target_logits, workload.draft_logits
    row_units = chain_floor.logits_row_units(cfg)
    splits = math.ceil(row_units / (chain_floor.THREADS * rows_units))
    rows = batch * (2 * gamma + 1)
    partials = torch.full((rows + 2, splits), float("nan"), device="cuda")  # two guard rows past the floor's
    picks = torch.empty(batch, dtype=torch.int64, device="cuda")
    status = lib.chain_floor_two_pass(target.data_ptr(), draft.data_ptr(), partials.data_ptr(), picks.data_ptr(),
                                      batch, gamma, row_units, int(bf16), rows_units, 2, 0, period,
                                      chain_floor._stream())
    torch.cuda.synchronize()
    assert status == 0
    per_split = chain_floor.THREADS * rows_units * chain_floor.UNIT // target.element_size()  # logits a split reads
    logits = torch.cat([target.reshape(-1, vocab), draft.reshape(-1, vocab)]).float()
    padded = torch.nn.functional.pad(logits, (0, splits * per_split - vocab), value=float("-inf"))
    want = padded.reshape(rows, splits, per_split).amax(dim=2)
    unwritten = torch.zeros(rows + 2, dtype=torch.bool, device="cuda")
    unwritten[rows:] = True
    target_rows = batch * (gamma + 1)
    for seq in range(0, batch, period):
        unwritten[target_rows + seq * gamma: target_rows + (seq + 1) * gamma] = True
    assert torch.isnan(partials[unwritten]).all(), "a greedy request's draft row, or a row past the buffer, was written"
    assert torch.equal(partials[~unwritten], want[~unwritten[:rows]])


def test_a_two_pass_floor_against_other_picks_fails_its_check(lib, monkeypatch):
    """The comparison is wired: against a shifted reference every shape fails."""
    workload = make_workload("prob_verify_logits", LogitsConfig(4, 4, 4096, "float32"), "cuda")
    right = chain_floor.expected_picks
    monkeypatch.setattr(chain_floor, "expected_picks", lambda w: right(w) + 1)
    with pytest.raises(SdbenchError, match="picked other tokens"):
        chain_floor.logits_floor_runs(lib, workload)
    with pytest.raises(SdbenchError, match="sampled_two_pass.* picked other tokens"):
        chain_floor.two_pass_runs(lib, workload, chain_floor.greedy_period(workload))
