"""`pack_cuda` picks its kernel from shapes alone, as `fused` does: csrc/pack.cu's drivers up to
PACK_REPLICATED_MAX_BATCH, the single-pass scan kernel (pack_scan's) above, pack.cu again past the scan's batch
limit. The kernels themselves are checked on a GPU (tests/gpu/test_cuda_parity.py); here a stand-in for the
extension records which op a prepared run launches, with which buffers and state."""

from types import SimpleNamespace

import pytest
import torch

from sdbench import registry
from sdbench.ops import make_workload
from sdbench.ops.pack import cuda_impls, scan_impls
from sdbench.ops.workload import VerifyConfig


@pytest.fixture
def launched(monkeypatch):
    calls = []

    def op(name):
        return lambda *args: calls.append((name, args))

    fake = SimpleNamespace(pack_flagged=op("pack_cuda"), pack_scan=op("pack_scan"))
    monkeypatch.setattr(cuda_impls, "cuda_ops", lambda: fake)
    monkeypatch.setattr(scan_impls, "cuda_ops", lambda: fake)
    state = torch.zeros(scan_impls.SCAN_STATE_ELEMS, dtype=torch.int64)
    monkeypatch.setattr(scan_impls, "stream_scan_state", lambda device: state)
    return calls, state


@pytest.mark.parametrize("batch, kernel", [
    (1, "pack_cuda"),
    (cuda_impls.PACK_REPLICATED_MAX_BATCH, "pack_cuda"),
    (cuda_impls.PACK_REPLICATED_MAX_BATCH + 1, "pack_scan"),
    (300, "pack_scan")])
def test_pack_cuda_launches_the_kernel_of_its_shape(launched, batch, kernel):
    calls, state = launched
    workload = make_workload("pack", VerifyConfig(batch, 8, 0.5, kv_dim=16), "cpu")
    assert cuda_impls.pack_kernel(workload.config) == kernel
    run = registry.get("pack", "pack_cuda").prepare(workload)
    out = run()
    assert [name for name, _ in calls] == [kernel]
    args = calls[0][1]
    assert args[0] is workload.draft_kv and args[1] is workload.accepted_lengths
    assert args[2] is out["packed_kv"] and args[3] is out["packed_offsets"] and args[4] is out["error_flags"]
    assert (args[-1] is state) == (kernel == "pack_scan"), "the scan kernel gets the stream's state"


@pytest.mark.parametrize("batch", [4, 300])  # pack.cu, the scan kernel
def test_pack_cuda_takes_the_callers_buffers_and_adds_the_flags(launched, batch):
    """The API's buffers hold packed_kv and packed_offsets; the error flags are added to what the call returns."""
    calls, _ = launched
    workload = make_workload("pack", VerifyConfig(batch, 8, 0.5, kv_dim=16), "cpu")
    mine = {"packed_kv": torch.empty(batch * 8, 16, dtype=workload.draft_kv.dtype),
            "packed_offsets": torch.empty(batch, dtype=torch.int64)}
    out = registry.get("pack", "pack_cuda").prepare(workload, out=mine)()
    assert out["packed_kv"] is mine["packed_kv"] and out["packed_offsets"] is mine["packed_offsets"]
    assert out["error_flags"].shape == (batch,) and calls[0][1][4] is out["error_flags"]


def test_past_the_scans_batch_limit_pack_cuda_uses_its_own_kernel(launched, monkeypatch):
    calls, _ = launched
    above = cuda_impls.PACK_REPLICATED_MAX_BATCH + 2
    monkeypatch.setattr(scan_impls, "SCAN_MAX_BATCH", above - 1)
    workload = make_workload("pack", VerifyConfig(above, 8, 0.5, kv_dim=16), "cpu")
    registry.get("pack", "pack_cuda").prepare(workload)()
    assert [name for name, _ in calls] == ["pack_cuda"]
    calls.clear()
    workload = make_workload("pack", VerifyConfig(above - 1, 8, 0.5, kv_dim=16), "cpu")  # the scan's last B
    registry.get("pack", "pack_cuda").prepare(workload)()
    assert [name for name, _ in calls] == ["pack_scan"]
