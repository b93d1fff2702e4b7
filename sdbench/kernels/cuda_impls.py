"""CUDA implementations (csrc/ through torch.ops.sdbench): registry entries and plain launchers.

Importing this module builds nothing: the extension is built on the first probe (`available`) or
prepare, by sdbench.ext. The launchers below take caller-provided output tensors (the ops mutate
them) and are what other modules call; `launch_empty` is the launch-floor kernel of the timing engine.
"""

from __future__ import annotations

import torch

from sdbench import ext
from sdbench.registry import BufferedRun, Implementation, Outputs, register
from sdbench.workload import VerifyConfig, VerifyWorkload

SINGLE_BLOCK_MAX_BATCH = 32  # fused_single_block: one warp per sequence, one block of 32 warps


# --- launchers ---------------------------------------------------------------------------------------
_namespace = None


def _ops():
    """torch.ops.sdbench, built on first use (SdbenchError when unavailable), then cached."""
    global _namespace
    if _namespace is None:
        _namespace = ext.load()
    return _namespace


_empty_dummies: dict[torch.device, torch.Tensor] = {}


def launch_empty(device: torch.device | str | int | None = None) -> None:
    """Launch the empty kernel on `device` (default: the current CUDA device), on its current stream.

    It goes through the same dispatcher path as the real ops (a dummy tensor picks the CUDA kernel),
    so the launch floor it measures is comparable with theirs.
    """
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dummy = _empty_dummies.get(device)
    if dummy is None:
        dummy = _empty_dummies[device] = torch.empty(1, device=device)
    _ops().empty(dummy)


def prepare_empty(device: torch.device | str | int | None = None):
    """launch_empty with everything bound up front, the way every prepared run binds its op and
    arguments: timing this measures exactly the launch path the real implementations pay."""
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    op, dummy = _ops().empty, torch.empty(1, device=device)
    return lambda: op(dummy)


def verify_naive(draft_tokens, target_tokens, accepted_lengths, has_mismatch, next_tokens) -> None:
    _ops().verify_naive(draft_tokens, target_tokens, accepted_lengths, has_mismatch, next_tokens)


def verify_ballot(draft_tokens, target_tokens, accepted_lengths, has_mismatch, next_tokens) -> None:
    _ops().verify_ballot(draft_tokens, target_tokens, accepted_lengths, has_mismatch, next_tokens)


def pack_naive(draft_kv, accepted_lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed_kv [sum k, kv_dim], packed_offsets [B]): allocates, and syncs the host for sum k."""
    return _ops().pack_naive(draft_kv, accepted_lengths)


def pack(draft_kv, accepted_lengths, packed_kv, packed_offsets) -> None:
    """packed_kv must be [B*gamma, kv_dim]; rows past sum k are left as they were."""
    _ops().pack(draft_kv, accepted_lengths, packed_kv, packed_offsets)


def fused_single_block(draft_tokens, target_tokens, draft_kv, accepted_lengths, has_mismatch, next_tokens,
                       packed_kv, packed_offsets) -> None:
    """Verify and pack with one block (B <= 32)."""
    _ops().fused_single_block(draft_tokens, target_tokens, draft_kv, accepted_lengths, has_mismatch, next_tokens,
                              packed_kv, packed_offsets)


def fused(draft_tokens, target_tokens, draft_kv, accepted_lengths, has_mismatch, next_tokens, packed_kv,
          packed_offsets) -> None:
    """Verify and pack in one launch, any B; packed_kv must be [B*gamma, kv_dim]."""
    _ops().fused(draft_tokens, target_tokens, draft_kv, accepted_lengths, has_mismatch, next_tokens, packed_kv,
                 packed_offsets)


# --- output buffers ----------------------------------------------------------------------------------
def verify_outputs(w: VerifyWorkload) -> Outputs:
    batch, device = w.config.batch_size, w.device
    return {
        "accepted_lengths": torch.empty(batch, dtype=torch.int64, device=device),
        "has_mismatch": torch.empty(batch, dtype=torch.bool, device=device),
        "next_tokens": torch.empty(batch, dtype=w.target_tokens.dtype, device=device),
    }


def pack_outputs(w: VerifyWorkload) -> Outputs:
    """packed_kv sized for the worst case (every draft row accepted), so no launch needs a sync."""
    batch, gamma, kv_dim = w.draft_kv.shape
    return {
        "packed_kv": torch.empty((batch * gamma, kv_dim), dtype=w.draft_kv.dtype, device=w.device),
        "packed_offsets": torch.empty(batch, dtype=torch.int64, device=w.device),
    }


def _verify_args(w: VerifyWorkload, out: Outputs) -> tuple:
    return (w.draft_tokens, w.target_tokens, out["accepted_lengths"], out["has_mismatch"], out["next_tokens"])


# --- prepare functions -------------------------------------------------------------------------------
# Each binds the op itself (no wrapper call) so the timed closure is one dispatcher call.
def _prepare_verify(op_name: str):
    def prepare(w: VerifyWorkload) -> BufferedRun:
        op = getattr(_ops(), op_name)
        out = verify_outputs(w)
        args = _verify_args(w, out)
        return BufferedRun(lambda: op(*args), out)

    return prepare


def _prepare_pack_naive(w: VerifyWorkload):
    op = _ops().pack_naive

    def run() -> Outputs:
        packed_kv, packed_offsets = op(w.draft_kv, w.accepted_lengths)
        return {"packed_kv": packed_kv, "packed_offsets": packed_offsets}

    return run


def _prepare_pack(w: VerifyWorkload) -> BufferedRun:
    op = _ops().pack
    out = pack_outputs(w)
    args = (w.draft_kv, w.accepted_lengths, out["packed_kv"], out["packed_offsets"])
    return BufferedRun(lambda: op(*args), out)


def _prepare_fused(op_name: str):
    def prepare(w: VerifyWorkload) -> BufferedRun:
        op = getattr(_ops(), op_name)
        out = {**verify_outputs(w), **pack_outputs(w)}
        args = (w.draft_tokens, w.target_tokens, w.draft_kv, out["accepted_lengths"], out["has_mismatch"],
                out["next_tokens"], out["packed_kv"], out["packed_offsets"])
        return BufferedRun(lambda: op(*args), out)

    return prepare


def _prepare_ballot_pack_torch(w: VerifyWorkload) -> BufferedRun:
    """ballot, then the eager mask-and-gather: draft_kv[mask] allocates and syncs for its shape."""
    ballot = _ops().verify_ballot
    out = {**verify_outputs(w), "packed_offsets": torch.empty(w.config.batch_size, dtype=torch.int64,
                                                              device=w.device)}
    verify_args = _verify_args(w, out)
    positions = torch.arange(w.config.gamma, device=w.device)
    accepted_lengths, packed_offsets = out["accepted_lengths"], out["packed_offsets"]

    def launch() -> None:
        ballot(*verify_args)
        torch.cumsum(accepted_lengths, 0, out=packed_offsets)
        packed_offsets.sub_(accepted_lengths)
        out["packed_kv"] = w.draft_kv[positions[None, :] < accepted_lengths[:, None]]

    return BufferedRun(launch, out)


def _prepare_ballot_pack_cuda(w: VerifyWorkload) -> BufferedRun:
    ops = _ops()
    ballot, pack_op = ops.verify_ballot, ops.pack
    out = {**verify_outputs(w), **pack_outputs(w)}
    verify_args = _verify_args(w, out)
    pack_args = (w.draft_kv, out["accepted_lengths"], out["packed_kv"], out["packed_offsets"])

    def launch() -> None:
        ballot(*verify_args)
        pack_op(*pack_args)

    return BufferedRun(launch, out)


# --- registry entries --------------------------------------------------------------------------------
def _probe(_device: torch.device) -> str | None:
    return ext.unavailable_reason()


def _needs_kv(cfg: VerifyConfig) -> str | None:
    return None if cfg.kv_dim > 0 else "needs draft KV (kv_dim >= 1)"


def _single_block_supports(cfg: VerifyConfig) -> str | None:
    if cfg.batch_size > SINGLE_BLOCK_MAX_BATCH:
        return f"one block of 32 warps: needs B <= {SINGLE_BLOCK_MAX_BATCH}"
    return _needs_kv(cfg)


def _cuda(**fields) -> Implementation:
    return register(Implementation(backend="cuda", probe=_probe, **fields))


_cuda(op="verify", name="naive", launches=1, prepare=_prepare_verify("verify_naive"),
      description="one thread per sequence, serial scan to the first mismatch (divergent baseline)")
_cuda(op="verify", name="ballot", launches=1, prepare=_prepare_verify("verify_ballot"),
      description="one warp per sequence, __ballot_sync + __ffs per 32-position chunk, flat in alpha")
_cuda(op="pack", name="pack_cuda_naive", sync=True, supports=_needs_kv, prepare=_prepare_pack_naive,
      description="published packer: host cumsum + .item() sync, one 256-thread block per sequence, 2-byte copies")
_cuda(op="pack", name="pack_cuda", launches=1, supports=_needs_kv, prepare=_prepare_pack,
      description="sync-free: device-side scan, whole-GPU grid over the accepted bytes, 16-byte vectors")
_cuda(op="verify_pack", name="fused_single_block", launches=1, supports=_single_block_supports,
      prepare=_prepare_fused("fused_single_block"),
      description="published fused kernel: one block, warp i verifies and copies sequence i (B <= 32)")
_cuda(op="verify_pack", name="fused", launches=1, supports=_needs_kv, prepare=_prepare_fused("fused"),
      description="verify + pack in one launch over the whole GPU, any B and kv_dim, no host sync")
_cuda(op="verify_pack", name="ballot+pack_torch", sync=True, supports=_needs_kv,
      prepare=_prepare_ballot_pack_torch,
      description="ballot kernel, then eager draft_kv[mask] (data-dependent shape: syncs)")
_cuda(op="verify_pack", name="ballot+pack_cuda", launches=2, supports=_needs_kv, prepare=_prepare_ballot_pack_cuda,
      description="ballot kernel, then the pack_cuda kernel: two launches, no host sync")
