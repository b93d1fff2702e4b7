"""The library API on CPU tensors: reference outputs through torch_eager, caller buffers honoured, and
validation errors that name the bad value and the fix."""

import types

import pytest
import torch

import sdbench
from sdbench import api, registry
from sdbench.errors import SdbenchError
from sdbench.ops.pack import reference as pack_reference
from sdbench.ops.verify import reference as verify_reference
from sdbench.ops.verify_pack import reference as verify_pack_reference
from sdbench.ops.workload import VerifyConfig, make_verify_workload


@pytest.fixture
def workload():
    return make_verify_workload(VerifyConfig(batch_size=5, gamma=9, alpha=0.6, kv_dim=12, token_dtype="int32",
                                             kv_dtype="bfloat16", seed=3), "cpu")


def _packed_equal(out, expected):
    rows = expected["packed_kv"].shape[0]
    assert out["packed_kv"].shape == (5 * 9, 12)
    assert torch.equal(out["packed_kv"][:rows], expected["packed_kv"])
    assert torch.equal(out["packed_offsets"], expected["packed_offsets"])


def test_exports():
    assert sdbench.verify is api.verify and sdbench.pack is api.pack and sdbench.verify_pack is api.verify_pack
    assert sdbench.check is api.check
    from sdbench import verify_pack  # noqa: F401  (module __getattr__ serves from-imports too)


def test_verify_on_cpu_falls_back_to_the_reference(workload):
    out = sdbench.verify(workload.draft_tokens, workload.target_tokens)  # default impl: ballot (CUDA only)
    expected = verify_reference.verify(workload.draft_tokens, workload.target_tokens)
    for name, tensor in expected.items():
        assert torch.equal(out[name], tensor), name
    assert out["next_tokens"].dtype == torch.int32


def test_pack_on_cpu(workload):
    out = sdbench.pack(workload.draft_kv, workload.accepted_lengths)
    _packed_equal(out, pack_reference.pack(workload.draft_kv, workload.accepted_lengths))


@pytest.mark.parametrize("impl", ["auto", "torch_eager", "fused", "ballot+pack_cuda"])
def test_verify_pack_on_cpu(workload, impl):
    out = sdbench.verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv, impl=impl,
                              expected_alpha=0.6 if impl == "auto" else None)
    expected = verify_pack_reference.verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv)
    assert torch.equal(out["accepted_lengths"], workload.accepted_lengths)
    assert torch.equal(out["next_tokens"], expected["next_tokens"])
    _packed_equal(out, expected)


def test_caller_buffers_are_written_and_missing_ones_allocated(workload):
    accepted = torch.full((5,), -1, dtype=torch.int64)
    out = sdbench.verify(workload.draft_tokens, workload.target_tokens, out={"accepted_lengths": accepted})
    assert out["accepted_lengths"] is accepted and torch.equal(accepted, workload.accepted_lengths)
    assert out["has_mismatch"].dtype == torch.bool


def test_direct_cuda_launchers_are_wired_by_name(workload, monkeypatch):
    """The API launches a CUDA entry through the registry straight into the caller's buffers: checked with a
    fake op namespace of CPU launchers (argument order as in csrc/bindings.cpp)."""
    def verify_ballot(draft_tokens, target_tokens, accepted_lengths, has_mismatch, next_tokens):
        result = verify_reference.verify(draft_tokens, target_tokens)
        accepted_lengths.copy_(result["accepted_lengths"])
        has_mismatch.copy_(result["has_mismatch"])
        next_tokens.copy_(result["next_tokens"])

    def pack(draft_kv, accepted_lengths, packed_kv, packed_offsets):
        result = pack_reference.pack(draft_kv, accepted_lengths)
        packed_kv[: result["packed_kv"].shape[0]].copy_(result["packed_kv"])
        packed_offsets.copy_(result["packed_offsets"])

    fake = types.SimpleNamespace(verify_ballot=verify_ballot, pack=pack)
    from sdbench.ops.verify_pack import cuda_impls

    monkeypatch.setattr(cuda_impls, "cuda_ops", lambda: fake)
    entry = registry.get("verify_pack", "ballot+pack_cuda")
    specs = api._output_specs(5, 9, torch.int32, 12, torch.bfloat16, api.VERIFY_OUTPUTS + api.PACK_OUTPUTS)
    buffers = api._outputs(None, specs, torch.device("cpu"))
    out = api._run("verify_pack", entry, draft_tokens=workload.draft_tokens, target_tokens=workload.target_tokens,
                   draft_kv=workload.draft_kv, buffers=buffers)
    assert all(out[name] is buffers[name] for name in buffers)  # written in place, no copy
    _packed_equal(out, verify_pack_reference.verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv))
    assert torch.equal(out["accepted_lengths"], workload.accepted_lengths)


# --- validation -------------------------------------------------------------------------------------
def _bad(call, match):
    with pytest.raises(SdbenchError, match=match):
        call()


def test_tokens_validation(workload):
    draft, target = workload.draft_tokens, workload.target_tokens
    _bad(lambda: sdbench.verify(draft.tolist(), target), r"draft_tokens must be a torch.Tensor, got list")
    _bad(lambda: sdbench.verify(draft[0], target), r"draft_tokens must be 2-D \[batch, gamma\].*got shape \[9\]")
    _bad(lambda: sdbench.verify(draft, target[:, :9]),
         r"target_tokens must be \[batch, gamma \+ 1\] = \[5, 10\] for draft_tokens \[5, 9\].*got \[5, 9\]")
    _bad(lambda: sdbench.verify(draft.float(), target.float()), r"dtype float32 is not a token dtype: use int64 or int32")
    _bad(lambda: sdbench.verify(draft, target.long()), r"target_tokens dtype int64 differs from draft_tokens int32")


def test_kv_and_lengths_validation(workload):
    draft, target, kv = workload.draft_tokens, workload.target_tokens, workload.draft_kv
    _bad(lambda: sdbench.verify_pack(draft, target, kv[:, :4]),
         r"draft_kv must be \[batch, gamma, kv_dim\] = \[5, 9, kv_dim\].*got \[5, 4, 12\]")
    _bad(lambda: sdbench.verify_pack(draft, target, kv[0]), r"draft_kv must be 3-D")
    _bad(lambda: sdbench.verify_pack(draft, target, kv.to(torch.int16)), r"draft_kv dtype int16 is not supported")
    _bad(lambda: sdbench.pack(kv, workload.accepted_lengths.int()), r"accepted_lengths must be int64.*\.long\(\)")
    _bad(lambda: sdbench.pack(kv, workload.accepted_lengths[:3]), r"accepted_lengths must be 1-D \[batch\] = \[5\]")


def test_out_validation(workload):
    draft, target = workload.draft_tokens, workload.target_tokens
    _bad(lambda: sdbench.verify(draft, target, out={"accepted_lengths": torch.empty(5, dtype=torch.int32)}),
         r"out\['accepted_lengths'\] must be int64 \[5\] on cpu, got int32 \[5\]")
    _bad(lambda: sdbench.verify(draft, target, out={"packed_kv": torch.empty(1)}), r"out has unknown keys packed_kv")
    _bad(lambda: sdbench.verify(draft, target, out=[1]), r"out must be a dict")


def test_shape_the_impl_cannot_take(workload):
    with pytest.raises(SdbenchError, match=r"impl 'fused_single_block' cannot run batch=33.*needs B <= 32.*impl='auto'"):
        api._check_supports("verify_pack", registry.get("verify_pack", "fused_single_block"), 33, 8, torch.int64,
                            torch.empty(33, 8, 16, dtype=torch.float16))


def test_impl_and_alpha_validation(workload):
    draft, target, kv = workload.draft_tokens, workload.target_tokens, workload.draft_kv
    _bad(lambda: sdbench.verify(draft, target, impl="balot"), r"unknown implementation 'balot'.*did you mean 'ballot'")
    _bad(lambda: sdbench.verify_pack(draft, target, kv, expected_alpha=1.5), r"expected_alpha must be a number in \[0, 1\]")


def test_auto_decides_from_shapes_and_alpha_only(workload, monkeypatch):
    """The dispatcher is handed shapes, the KV element size and α: nothing that needs the tensors' values."""
    calls = []
    real_choose = api.dispatch.choose

    def spy(device, *shape):
        calls.append(shape)
        return real_choose(device, *shape)

    monkeypatch.setattr(api.dispatch, "choose", spy)
    sdbench.verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv, expected_alpha=0.25)
    assert calls == [(5, 9, 12, 2, 0.25, "bfloat16")]


def test_a_newly_registered_implementation_is_reachable_with_nothing_else_edited(workload, monkeypatch):
    """The registry is the only declaration: one register() call makes an implementation callable by name."""
    calls = []

    def prepare(w):
        calls.append(w.draft_tokens.data_ptr())
        return lambda: verify_reference.verify(w.draft_tokens, w.target_tokens)

    entry = registry.Implementation(op="verify", name="plain_loop_test", backend="torch", devices=("cpu",),
                                    description="test double", prepare=prepare)
    monkeypatch.setitem(registry._REGISTRY, entry.key, entry)
    out = sdbench.verify(workload.draft_tokens, workload.target_tokens, impl="plain_loop_test")
    assert calls == [workload.draft_tokens.data_ptr()]  # launched on the caller's tensors, no copy of inputs
    assert torch.equal(out["accepted_lengths"], workload.accepted_lengths)


# --- one rule each (issue #13, item 5) --------------------------------------------------------------
def test_an_empty_batch_is_an_error_everywhere(workload):
    draft, target, kv = workload.draft_tokens, workload.target_tokens, workload.draft_kv
    _bad(lambda: sdbench.verify(draft[:0], target[:0]), r"draft_tokens must be 2-D \[batch, gamma\] with both >= 1")
    _bad(lambda: sdbench.verify_pack(draft[:0], target[:0], kv[:0]), r"with both >= 1")
    _bad(lambda: sdbench.pack(kv[:0], workload.accepted_lengths[:0]), r"draft_kv must be 3-D .* all three >= 1")
    _bad(lambda: sdbench.pack(kv[:, :0], workload.accepted_lengths), r"all three >= 1")


@pytest.mark.parametrize("alpha", [True, False, "0.5", float("nan")])
def test_expected_alpha_must_be_a_real_number_in_0_1(workload, alpha):
    _bad(lambda: sdbench.verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv,
                                     expected_alpha=alpha), r"expected_alpha must be a number in \[0, 1\]")


def test_numpy_and_integer_alphas_are_numbers(workload):
    import numpy as np

    for alpha in (np.float32(0.5), np.float64(0.25), 1, 0):
        sdbench.verify_pack(workload.draft_tokens, workload.target_tokens, workload.draft_kv, expected_alpha=alpha)


def test_outputs_may_not_alias_inputs_or_each_other(workload):
    draft, target, kv = workload.draft_tokens, workload.target_tokens, workload.draft_kv
    lengths = workload.accepted_lengths
    as_next = target[:, 0].contiguous()  # a separate buffer: fine
    sdbench.verify(draft, target, out={"next_tokens": as_next})
    _bad(lambda: sdbench.verify(draft, target, out={"next_tokens": draft.view(-1)[:5]}),
         r"out\['next_tokens'\] overlaps draft_tokens in memory")
    _bad(lambda: sdbench.verify(draft, target, out={"next_tokens": target.view(-1)[7:12]}), r"overlaps target_tokens")
    _bad(lambda: sdbench.pack(kv, lengths, out={"packed_offsets": lengths}), r"out\['packed_offsets'\] overlaps accepted_lengths")
    shared = torch.empty(10, dtype=torch.int64)
    _bad(lambda: sdbench.verify_pack(draft, target, kv, impl="torch_eager",
                                     out={"accepted_lengths": shared[:5], "packed_offsets": shared[3:8]}),
         r"overlaps out\[")
    disjoint = torch.empty(10, dtype=torch.int64)  # two outputs in one allocation, not overlapping: fine
    sdbench.verify_pack(draft, target, kv, impl="torch_eager",
                        out={"accepted_lengths": disjoint[:5], "packed_offsets": disjoint[5:]})


def test_check_raises_on_flagged_bad_input(workload):
    out = sdbench.pack(workload.draft_kv, torch.tensor([0, 9, 10, -1, 3]))  # γ = 9: two lengths out of range
    with pytest.raises(SdbenchError, match=r"bad input in 2 sequence\(s\) \(2, 3\).*accepted length outside"):
        sdbench.check(out)
    sdbench.check(sdbench.pack(workload.draft_kv, workload.accepted_lengths))  # clean: no error
    sdbench.check(sdbench.verify(workload.draft_tokens, workload.target_tokens))  # no flags at all: passes
    _bad(lambda: sdbench.check([1]), r"check takes the outputs dict")
