"""`fused` (verify_pack) picks its one-launch kernel from the batch size alone: csrc/fused.cu's
replicated driver up to FUSED_REPLICATED_MAX_BATCH, the single-pass scan kernel above, fused.cu again
past the scan's batch limit. The kernels themselves are checked on a GPU (tests/gpu); here a stand-in
for the extension records which op a prepared run launches, with which state."""

from types import SimpleNamespace

import pytest
import torch

from sdbench import registry
from sdbench.ops import make_workload
from sdbench.ops.pack import scan_impls as pack_scan_impls
from sdbench.ops.verify_pack import cuda_impls, scan_impls
from sdbench.ops.workload import VerifyConfig


@pytest.fixture
def launched(monkeypatch):
    calls = []

    def op(name):
        return lambda *args: calls.append((name, args))

    fake = SimpleNamespace(fused=op("fused"), fused_scan=op("fused_scan"))
    monkeypatch.setattr(cuda_impls, "cuda_ops", lambda: fake)
    monkeypatch.setattr(scan_impls, "cuda_ops", lambda: fake)
    state = torch.zeros(pack_scan_impls.SCAN_STATE_ELEMS, dtype=torch.int64)
    monkeypatch.setattr(scan_impls, "stream_scan_state", lambda device: state)
    return calls, state


@pytest.mark.parametrize("batch, kernel", [(1, "fused"), (cuda_impls.FUSED_REPLICATED_MAX_BATCH, "fused"),
                                           (cuda_impls.FUSED_REPLICATED_MAX_BATCH + 1, "fused_scan"), (300, "fused_scan")])
def test_fused_launches_the_kernel_of_its_batch_size(launched, batch, kernel):
    calls, state = launched
    workload = make_workload("verify_pack", VerifyConfig(batch, 8, 0.5, kv_dim=16), "cpu")
    run = registry.get("verify_pack", "fused").prepare(workload)
    run()
    assert [name for name, _ in calls] == [kernel]
    args = calls[0][1]
    assert args[0] is workload.draft_tokens and args[2] is workload.draft_kv
    assert (args[-1] is state) == (kernel == "fused_scan"), "the scan kernel gets the stream's state"


def test_fused_takes_the_callers_buffers(launched):
    calls, _ = launched
    workload = make_workload("verify_pack", VerifyConfig(64, 8, 0.5, kv_dim=16), "cpu")
    out = registry.get("verify_pack", "fused").prepare(workload).outputs
    mine = {name: torch.empty_like(tensor) for name, tensor in out.items()}
    run = registry.get("verify_pack", "fused").prepare(workload, out=mine)
    assert run() is mine
    assert calls[0][1][7] is mine["packed_offsets"]


def test_past_the_scans_batch_limit_fused_uses_its_own_kernel(launched, monkeypatch):
    calls, _ = launched
    monkeypatch.setattr(pack_scan_impls, "SCAN_MAX_BATCH", 40)
    workload = make_workload("verify_pack", VerifyConfig(41, 8, 0.5, kv_dim=16), "cpu")
    registry.get("verify_pack", "fused").prepare(workload)()
    assert [name for name, _ in calls] == ["fused"]
