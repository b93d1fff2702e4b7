"""verify_ragged on the CPU: the reference against a plain per-request loop, the workload's oracle
against the reference, and the Triton kernels under the interpreter (in a subprocess, since triton.jit
reads TRITON_INTERPRET at decoration time)."""

import textwrap

import pytest
import torch
from interpreted import run_interpreted

from sdbench.ops.verify_ragged.reference import verify_ragged
from sdbench.ops.verify_ragged.workload import flatten, make_ragged_workload
from sdbench.ops.workload import VerifyConfig


def _plain_loop(draft: list[list[int]], target: list[list[int]]) -> tuple[list[int], list[bool], list[int]]:
    accepted, mismatch, following = [], [], []
    for d, t in zip(draft, target, strict=True):
        k = 0
        while k < len(d) and d[k] == t[k]:
            k += 1
        accepted.append(k)
        mismatch.append(k < len(d))
        following.append(t[k])
    return accepted, mismatch, following


def _random_requests(lengths: list[int], agree: float, vocab: int, seed: int):
    rng = torch.Generator().manual_seed(seed)
    draft, target = [], []
    for length in lengths:
        d = torch.randint(0, vocab, (length,), generator=rng).tolist()
        t = torch.randint(0, vocab, (length + 1,), generator=rng).tolist()
        for j in range(length):  # agree with probability `agree` per position, independently
            if torch.rand((), generator=rng).item() < agree:
                t[j] = d[j]
        draft.append(d)
        target.append(t)
    return draft, target


@pytest.mark.parametrize("lengths, agree", [
    ([0], 0.5), ([1], 1.0), ([5, 0, 3, 0, 0, 7], 0.8), ([33, 1, 64, 0, 31], 0.97), ([8] * 20, 0.0), ([8] * 20, 1.0),
])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_reference_equals_a_plain_loop(lengths, agree, dtype):
    draft, target = _random_requests(lengths, agree, vocab=5, seed=len(lengths))
    out = verify_ragged(torch.tensor([x for d in draft for x in d], dtype=dtype),
                        torch.tensor([x for t in target for x in t], dtype=dtype),
                        torch.cumsum(torch.tensor(lengths), 0))
    accepted, mismatch, following = _plain_loop(draft, target)
    assert out["accepted_lengths"].tolist() == accepted
    assert out["has_mismatch"].tolist() == mismatch
    assert out["next_tokens"].tolist() == following and out["next_tokens"].dtype == dtype


@pytest.mark.parametrize("cfg", [VerifyConfig(1, 1, 0.5), VerifyConfig(50, 9, 0.7, dist="geometric"),
                                 VerifyConfig(17, 70, 0.95, token_dtype="int32"), VerifyConfig(8, 4, 1.0),
                                 VerifyConfig(8, 4, 0.0)])
def test_workload_oracle_matches_the_reference(cfg):
    w = make_ragged_workload(cfg)
    assert w.draft_tokens.shape[0] == int(w.draft_lengths.sum()) == int(w.cu_num_draft_tokens[-1])
    assert w.target_tokens.shape[0] == w.draft_tokens.shape[0] + cfg.batch_size
    out = verify_ragged(w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens)
    assert torch.equal(out["accepted_lengths"], w.accepted_lengths)
    assert bool((w.draft_lengths >= 0).all()) and bool((w.draft_lengths <= cfg.gamma).all())


def test_given_draft_lengths_include_zero_and_gamma():
    w = make_ragged_workload(VerifyConfig(4, 6, 0.5), draft_lengths=torch.tensor([0, 6, 0, 3]))
    assert w.draft_lengths.tolist() == [0, 6, 0, 3] and w.cu_num_draft_tokens.tolist() == [0, 6, 6, 9]
    assert w.accepted_lengths.tolist()[0] == 0 and w.accepted_lengths.tolist()[2] == 0


def test_flatten_keeps_each_requests_prefix():
    draft = torch.arange(12).view(3, 4)
    target = 100 + torch.arange(15).view(3, 5)
    d, t, cu = flatten(draft, target, torch.tensor([2, 0, 4]))
    assert d.tolist() == [0, 1, 8, 9, 10, 11]
    assert t.tolist() == [100, 101, 102, 105, 110, 111, 112, 113, 114] and cu.tolist() == [2, 2, 6]


CHILD = textwrap.dedent("""
    import json, torch
    from sdbench import parity, registry
    from sdbench.ops.verify_ragged.workload import make_ragged_workload
    from sdbench.ops.workload import VerifyConfig

    report = {"failures": [], "checked": 0, "probe": None}
    cases = [(VerifyConfig(1, 1, 0.0), None), (VerifyConfig(6, 33, 0.9, dist="geometric"), None),
             (VerifyConfig(9, 8, 1.0, token_dtype="int32"), None), (VerifyConfig(5, 8, 0.5), [0, 0, 0, 0, 0]),
             (VerifyConfig(4, 70, 1.0), [70, 0, 1, 69])]
    for name in ("serial_triton", "block_triton"):
        impl = registry.get("verify_ragged", name)
        report["probe"] = report["probe"] or impl.unavailable_reason("cpu")
        for cfg, lengths in cases:
            w = make_ragged_workload(cfg, "cpu", None if lengths is None else torch.tensor(lengths))
            failure = parity.check(impl, w)
            report["checked"] += 1
            if failure:
                report["failures"].append(f"{name} {cfg} {lengths}: {failure}")
    print(json.dumps(report))
""")


def test_triton_kernels_match_the_reference_under_the_interpreter():
    pytest.importorskip("triton")
    report = run_interpreted(CHILD)
    assert report["checked"] == 10 and report["failures"] == []


@pytest.mark.parametrize("kind", ["uniform", "full", "bimodal"])
def test_draft_length_distributions(kind):
    cfg = VerifyConfig(400, 12, 0.7, draft_lengths=kind, seed=3)
    w = make_ragged_workload(cfg)
    lengths = w.draft_lengths
    if kind == "full":
        assert set(lengths.tolist()) == {12}
    elif kind == "bimodal":
        assert set(lengths.tolist()) == {1, 12} and 150 < int((lengths == 12).sum()) < 250
    else:
        assert int(lengths.min()) == 0 and int(lengths.max()) == 12 and len(set(lengths.tolist())) == 13
    out = verify_ragged(w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens)
    assert torch.equal(out["accepted_lengths"], w.accepted_lengths)


def test_unknown_draft_length_distribution_is_an_error():
    from sdbench.errors import SdbenchError

    with pytest.raises(SdbenchError, match="draft lengths must be one of uniform, full, bimodal"):
        VerifyConfig(4, 8, draft_lengths="zipf")


def test_sweep_axis_is_in_the_config_key(tmp_path):
    from sdbench.commands import sweep

    keys = set()
    for kind in ("uniform", "bimodal"):
        spec = sweep.build_spec(op="verify_ragged", impls=["torch_eager"], batch_sizes=[8], gammas=[4], alphas=[0.5],
                                device="cpu", warmup=0, iters=3, out_dir=tmp_path, draft_lengths=kind, resume=True)
        summary = sweep.run_sweep(spec)
        assert summary.measured == 1  # the second kind is a new config, not skipped by --resume
    from sdbench.measure import results

    for row in results.read_rows(tmp_path):
        keys.add(row["draft_lengths"])
    assert keys == {"uniform", "bimodal"}
