"""PyTorch implementations: the eager references as the `torch_eager` peers."""

from __future__ import annotations

from sdbench import reference
from sdbench.registry import Implementation, register
from sdbench.workload import VerifyConfig, VerifyWorkload


def _needs_kv(cfg: VerifyConfig) -> str | None:
    return None if cfg.kv_dim > 0 else "needs draft KV (kv_dim >= 1)"


def _prepare_verify(w: VerifyWorkload):
    return lambda: reference.verify(w.draft_tokens, w.target_tokens)


def _prepare_pack(w: VerifyWorkload):
    return lambda: reference.pack(w.draft_kv, w.accepted_lengths)


def _prepare_verify_pack(w: VerifyWorkload):
    return lambda: reference.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv)


_ANY_DEVICE = ("cpu", "cuda")

register(Implementation(
    op="verify", name="torch_eager", backend="torch", devices=_ANY_DEVICE, peer=True,
    description="eager PyTorch: eq / any / argmax / where / gather (~7 launches)",
    prepare=_prepare_verify,
))
register(Implementation(
    op="pack", name="torch_eager", backend="torch", devices=_ANY_DEVICE, peer=True, sync=True,
    description="eager PyTorch draft_kv[mask] (data-dependent shape: syncs)",
    prepare=_prepare_pack, supports=_needs_kv,
))
register(Implementation(
    op="verify_pack", name="torch_eager", backend="torch", devices=_ANY_DEVICE, peer=True, sync=True,
    description="eager verify, then draft_kv[mask]",
    prepare=_prepare_verify_pack, supports=_needs_kv,
))
