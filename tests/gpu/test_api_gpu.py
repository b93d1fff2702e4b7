"""The library API on CUDA tensors: every implementation gives the reference outputs through the caller's
buffers, and impl="auto" adds no host sync (torch.cuda.set_sync_debug_mode("error") around it).

Exact comparisons: every output is integer or copied KV, so bit-exact is the only right tolerance.
"""

import contextlib

import pytest
import torch

import sdbench
from sdbench import api, dispatch, thresholds
from sdbench.errors import SdbenchError
from sdbench.ops.pack import reference as pack_reference
from sdbench.ops.verify import reference as verify_reference
from sdbench.ops.verify_pack import reference as verify_pack_reference
from sdbench.ops.workload import VerifyConfig, make_verify_workload
from sdbench.thresholds import Profile

SHAPES = [(1, 8, 128), (4, 33, 120), (32, 128, 2048), (33, 64, 512), (256, 8, 128)]


def _workload(batch, gamma, kv_dim, alpha=0.7, token_dtype="int64", kv_dtype="float16"):
    config = VerifyConfig(batch_size=batch, gamma=gamma, alpha=alpha, kv_dim=kv_dim, token_dtype=token_dtype,
                          kv_dtype=kv_dtype, seed=batch + gamma)
    return make_verify_workload(config, "cuda")


def _assert_matches(out, expected):
    for name, want in expected.items():
        got = out[name]
        if name == "packed_kv":
            got = got[: want.shape[0]]
        assert torch.equal(got, want), name


@contextlib.contextmanager
def sync_debug_error():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("impl", ["naive", "ballot", "torch_eager"])
@pytest.mark.parametrize("batch, gamma, kv_dim", SHAPES)
@pytest.mark.parametrize("token_dtype", ["int64", "int32"])
def test_verify(impl, batch, gamma, kv_dim, token_dtype):
    w = _workload(batch, gamma, kv_dim, token_dtype=token_dtype)
    out = sdbench.verify(w.draft_tokens, w.target_tokens, impl=impl)
    _assert_matches(out, verify_reference.verify(w.draft_tokens, w.target_tokens))


@pytest.mark.parametrize("impl", ["pack_cuda", "pack_cuda_naive", "torch_eager"])
@pytest.mark.parametrize("batch, gamma, kv_dim", SHAPES)
@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_pack(impl, batch, gamma, kv_dim, kv_dtype):
    w = _workload(batch, gamma, kv_dim, kv_dtype=kv_dtype)
    out = sdbench.pack(w.draft_kv, w.accepted_lengths, impl=impl)
    assert out["packed_kv"].shape == (batch * gamma, kv_dim)
    _assert_matches(out, pack_reference.pack(w.draft_kv, w.accepted_lengths))


@pytest.mark.parametrize("impl", ["fused_single_block", "fused", "ballot+pack_torch", "ballot+pack_cuda", "auto"])
@pytest.mark.parametrize("batch, gamma, kv_dim", SHAPES)
def test_verify_pack(impl, batch, gamma, kv_dim):
    w = _workload(batch, gamma, kv_dim)
    expected = verify_pack_reference.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv)
    if impl == "fused_single_block" and batch > 32:
        with pytest.raises(SdbenchError, match="needs B <= 32"):
            sdbench.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv, impl=impl)
        return
    out = sdbench.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv, impl=impl, expected_alpha=0.7)
    _assert_matches(out, expected)


def test_caller_buffers_are_the_outputs():
    w = _workload(32, 128, 512)
    out = {"packed_kv": torch.empty((32 * 128, 512), dtype=torch.float16, device="cuda"),
           "accepted_lengths": torch.empty(32, dtype=torch.int64, device="cuda")}
    result = sdbench.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv, impl="fused", out=out)
    assert result["packed_kv"] is out["packed_kv"] and result["accepted_lengths"] is out["accepted_lengths"]
    _assert_matches(result, verify_pack_reference.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv))


def test_device_mismatch_is_a_clear_error():
    w = _workload(4, 8, 16)
    with pytest.raises(SdbenchError, match="target_tokens is on cpu but draft_tokens on cuda"):
        sdbench.verify(w.draft_tokens, w.target_tokens.cpu())


@pytest.fixture
def sync_free_profile(tmp_path, monkeypatch):
    """A profile for this GPU whose two sides are both sync-free: τ = 1 MB between fused_single_block and
    ballot+pack_cuda (ballot+pack_torch would sync by design: draft_kv[mask] has a data-dependent shape)."""
    monkeypatch.setenv(thresholds.PROFILES_ENV, str(tmp_path))
    major, minor = torch.cuda.get_device_capability()
    thresholds.write_profile(Profile(gpu_name=torch.cuda.get_device_name(), gpu_cc=f"{major}.{minor}", tau_bytes=1e6,
                                   small_impl="fused_single_block", large_impl="ballot+pack_cuda"), tmp_path)
    dispatch.reset()
    yield
    dispatch.reset()


@pytest.mark.parametrize("batch, gamma, kv_dim, side", [
    (4, 8, 128, "fused_single_block"),  # ~6 KB
    (32, 128, 2048, "ballot+pack_cuda"),  # ~12 MB
    (64, 8, 128, "ballot+pack_cuda"),  # small but B > 32: the single block cannot take it
])
def test_auto_adds_no_host_sync(sync_free_profile, batch, gamma, kv_dim, side):
    w = _workload(batch, gamma, kv_dim)
    element = w.draft_kv.element_size()
    assert dispatch.choose(w.device, batch, gamma, kv_dim, element, 0.7, "float16").impl == side
    sdbench.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv, expected_alpha=0.7)  # warm: build, probes
    buffers = {name: torch.empty(shape, dtype=dtype, device="cuda") for name, (shape, dtype) in api._output_specs(
        batch, gamma, w.draft_tokens.dtype, kv_dim, w.draft_kv.dtype, api.VERIFY_OUTPUTS + api.PACK_OUTPUTS).items()}
    with sync_debug_error():
        out = sdbench.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv, expected_alpha=0.7, out=buffers)
        # expected_alpha=None: the previous step's mean, tracked with an async copy and an event query
        sdbench.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv, out=buffers)
    _assert_matches(out, verify_pack_reference.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv))


def test_previous_step_mean_becomes_the_expected_alpha(sync_free_profile):
    w = _workload(32, 128, 256, alpha=0.5)
    sdbench.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv)
    torch.cuda.synchronize()
    alpha = api.previous_step_alpha(w.device)
    assert alpha == pytest.approx(float(w.accepted_lengths.double().mean()) / 128)
