"""`fused` (verify_pack) picks its one-launch kernel from shapes alone: the single-block kernel for tiny work
(B <= TINY_MAX_BATCH, γ <= TINY_MAX_GAMMA, γ · row bytes <= TINY_MAX_SEQUENCE_BYTES), csrc/fused.cu's replicated
driver up to FUSED_REPLICATED_MAX_BATCH, the single-pass scan kernel above, fused.cu again past the scan's batch
limit. The kernels themselves are checked on a GPU (tests/gpu); here a stand-in for the extension records which
op a prepared run launches, with which state."""

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

    fake = SimpleNamespace(fused=op("fused"), fused_scan=op("fused_scan"), fused_single_block=op("fused_single_block"))
    monkeypatch.setattr(cuda_impls, "cuda_ops", lambda: fake)
    monkeypatch.setattr(scan_impls, "cuda_ops", lambda: fake)
    state = torch.zeros(pack_scan_impls.SCAN_STATE_ELEMS, dtype=torch.int64)
    monkeypatch.setattr(scan_impls, "stream_scan_state", lambda device: state)
    return calls, state


TINY_B, TINY_G, TINY_BYTES = cuda_impls.TINY_MAX_BATCH, cuda_impls.TINY_MAX_GAMMA, cuda_impls.TINY_MAX_SEQUENCE_BYTES


# (batch, γ, kv_dim, kv dtype) -> kernel; fp16 and bf16 rows are 2 bytes an element.
@pytest.mark.parametrize("batch, gamma, kv_dim, kv_dtype, kernel", [
    (1, 8, 16, "float16", "fused_single_block"),
    (TINY_B, TINY_G, TINY_BYTES // (2 * TINY_G), "float16", "fused_single_block"),  # every bound met exactly
    (TINY_B, 4, TINY_BYTES // (2 * 4), "bfloat16", "fused_single_block"),
    (TINY_B + 1, 8, 16, "float16", "fused"),  # one sequence too many
    (1, TINY_G + 1, 8, "float16", "fused"),  # γ past the measured range, however narrow the rows
    (1, 8, TINY_BYTES // (2 * 8) + 8, "float16", "fused"),  # past the bound on KV a sequence
    (1, 4, TINY_BYTES // (2 * 4) + 1, "bfloat16", "fused"),  # one element a row past the bound
    (cuda_impls.FUSED_REPLICATED_MAX_BATCH, 8, 16, "float16", "fused"),
    (cuda_impls.FUSED_REPLICATED_MAX_BATCH + 1, 8, 16, "float16", "fused_scan"),
    (300, 8, 16, "float16", "fused_scan")])
def test_fused_launches_the_kernel_of_its_shape(launched, batch, gamma, kv_dim, kv_dtype, kernel):
    calls, state = launched
    workload = make_workload("verify_pack", VerifyConfig(batch, gamma, 0.5, kv_dim=kv_dim, kv_dtype=kv_dtype), "cpu")
    assert cuda_impls.one_launch_kernel(workload.config) == kernel
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
