"""verify_pack_ragged on the CPU: the reference against a plain per-request loop, the workload's KV rows
against the padded workload's, and the Triton pipeline under the interpreter (in a subprocess, since
triton.jit reads TRITON_INTERPRET at decoration time); a sweep of the op end to end."""

import textwrap

import pytest
import torch
from interpreted import run_interpreted

from sdbench.ops.verify_pack_ragged.reference import verify_pack_ragged
from sdbench.ops.verify_ragged.workload import make_ragged_workload
from sdbench.ops.workload import VerifyConfig, make_verify_workload


def _plain_loop(draft, target, kv_rows):
    """Per request: the first mismatch k, then its first k KV rows appended; offsets as they grow."""
    accepted, packed, offsets = [], [], []
    for d, t, rows in zip(draft, target, kv_rows, strict=True):
        k = 0
        while k < len(d) and d[k] == t[k]:
            k += 1
        offsets.append(len(packed))
        accepted.append(k)
        packed.extend(rows[:k])
    return accepted, packed, offsets


@pytest.mark.parametrize("lengths, agree", [
    ([0], 0.5), ([1], 1.0), ([5, 0, 3, 0, 0, 7], 0.8), ([33, 1, 64, 0, 31], 0.97), ([8] * 20, 0.0), ([8] * 20, 1.0),
])
def test_reference_equals_a_plain_loop(lengths, agree):
    rng = torch.Generator().manual_seed(len(lengths))
    draft, target, kv_rows = [], [], []
    for length in lengths:
        d = torch.randint(0, 5, (length,), generator=rng).tolist()
        t = torch.randint(0, 5, (length + 1,), generator=rng).tolist()
        for j in range(length):
            if torch.rand((), generator=rng).item() < agree:
                t[j] = d[j]
        draft.append(d)
        target.append(t)
        kv_rows.append(torch.randn(length, 3, generator=rng).tolist())
    kv = torch.tensor([row for rows in kv_rows for row in rows], dtype=torch.float32).view(-1, 3)
    out = verify_pack_ragged(torch.tensor([x for d in draft for x in d], dtype=torch.int64),
                             torch.tensor([x for t in target for x in t], dtype=torch.int64),
                             torch.cumsum(torch.tensor(lengths), 0), kv)
    accepted, packed, offsets = _plain_loop(draft, target, kv_rows)
    assert out["accepted_lengths"].tolist() == accepted
    assert out["packed_offsets"].tolist() == offsets
    assert out["packed_kv"].tolist() == packed if packed else out["packed_kv"].shape[0] == 0


@pytest.mark.parametrize("cfg", [VerifyConfig(1, 1, 0.5, kv_dim=8), VerifyConfig(33, 9, 0.7, kv_dim=16, dist="geometric"),
                                 VerifyConfig(8, 31, 1.0, kv_dim=4, kv_dtype="bfloat16")])
def test_workload_kv_rows_are_the_padded_rows_cut_to_each_draft_length(cfg):
    w = make_ragged_workload(cfg)
    padded = make_verify_workload(cfg)
    assert w.draft_kv.shape == (w.draft_tokens.shape[0], cfg.kv_dim) and w.draft_kv.dtype == padded.draft_kv.dtype
    start = 0
    for i, length in enumerate(w.draft_lengths.tolist()):
        assert torch.equal(w.draft_kv[start:start + length], padded.draft_kv[i, :length])
        start += length
    # the tokens do not depend on whether KV was drawn
    without_kv = make_ragged_workload(cfg.replace(kv_dim=0))
    assert without_kv.draft_kv is None and torch.equal(without_kv.draft_tokens, w.draft_tokens)


CHILD = textwrap.dedent("""
    import json, torch
    from sdbench import parity, registry
    from sdbench.ops.verify_ragged.workload import make_ragged_workload
    from sdbench.ops.workload import VerifyConfig

    report = {"failures": [], "checked": 0, "probe": None}
    cases = [(VerifyConfig(1, 1, 0.0, kv_dim=8), None), (VerifyConfig(6, 33, 0.9, dist="geometric", kv_dim=300), None),
             (VerifyConfig(9, 8, 1.0, token_dtype="int32", kv_dim=8, kv_dtype="bfloat16"), None),
             (VerifyConfig(5, 8, 0.5, kv_dim=8), [0, 0, 0, 0, 0]), (VerifyConfig(4, 70, 1.0, kv_dim=8), [70, 0, 1, 69]),
             # γ_max past ROW_PROGRAMS_MAX (128): each copy program takes every 128th accepted row
             (VerifyConfig(3, 300, 1.0, kv_dim=8), [300, 0, 129])]
    impl = registry.get("verify_pack_ragged", "block_triton+pack_triton")
    report["probe"] = impl.unavailable_reason("cpu")
    for cfg, lengths in cases:
        w = make_ragged_workload(cfg, "cpu", None if lengths is None else torch.tensor(lengths))
        failure = parity.check(impl, w)
        report["checked"] += 1
        if failure:
            report["failures"].append(f"{cfg} {lengths}: {failure}")
    # bad offsets: decreasing cu makes two requests' clamped ranges overlap, so Σ k_i (16) passes the 10-row
    # buffer; rows past it must not be written (a guard band after the buffer stays untouched)
    from sdbench.ops.verify_pack_ragged import triton_impls
    from sdbench.ops.verify_ragged.workload import RaggedVerifyWorkload
    kv = torch.arange(40, dtype=torch.float16).view(10, 4) + 1
    bad = RaggedVerifyWorkload(VerifyConfig(3, 8, 1.0, kv_dim=4), torch.zeros(10, dtype=torch.int64),
                               torch.zeros(13, dtype=torch.int64), torch.tensor([8, 2, 10]), torch.tensor([8, 0, 8]),
                               torch.tensor([8, 0, 8]), draft_kv=kv)
    band = torch.full((64, 4), -7.0, dtype=torch.float16)
    real_empty = torch.empty
    def empty_in_band(shape, **kw):
        return band[:shape[0]] if isinstance(shape, tuple) and shape[1:] == (4,) else real_empty(shape, **kw)
    triton_impls.torch.empty = empty_in_band
    try:
        bad_run = triton_impls._prepare_two_step(bad)
    finally:
        triton_impls.torch.empty = real_empty
    bad_out = bad_run()
    report["bad_offsets"] = {"accepted": bad_out["accepted_lengths"].tolist(),
                             "written_past": int((band[10:] != -7).any(dim=1).sum())}
    print(json.dumps(report))
""")


def test_triton_pipeline_matches_the_reference_under_the_interpreter():
    pytest.importorskip("triton")
    report = run_interpreted(CHILD)
    assert report["checked"] == 6 and report["failures"] == []
    assert report["bad_offsets"] == {"accepted": [8, 0, 8], "written_past": 0}


def test_sweep_times_the_op_with_its_kv_and_draft_lengths(tmp_path):
    from sdbench.commands import sweep
    from sdbench.measure import results

    spec = sweep.build_spec(op="verify_pack_ragged", impls=["torch_eager"], batch_sizes=[8], gammas=[4], alphas=[0.5],
                            kv_dims=[16], device="cpu", warmup=0, iters=3, out_dir=tmp_path, draft_lengths="bimodal")
    assert sweep.run_sweep(spec).measured == 1
    rows = [row for row in results.read_rows(tmp_path) if row["impl"] == "torch_eager"]
    assert rows and all(row["status"] == "ok" and row["draft_lengths"] == "bimodal" and row["kv_dim"] == 16
                        and row["accepted_kv_bytes"] > 0 for row in rows)
