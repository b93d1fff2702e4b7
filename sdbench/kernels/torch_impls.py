"""PyTorch implementations: the eager references as the `torch_eager` peers, and torch.compile peers."""

from __future__ import annotations

import importlib.util
import types
from collections.abc import Callable

import torch

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


# --- torch.compile peers -----------------------------------------------------------------------
# What a user gets from torch.compile on the same reference code, so speedups are quoted against it
# too. Verify only: verify_pack's draft_kv[mask] has a data-dependent shape (a graph break and a sync).
COMPILE_WARMUP_CALLS = 3  # compile, then (reduce-overhead) a warm-up run and the graph recording
_COMPILED: dict[tuple, Callable] = {}


def _fresh_function(function: Callable) -> Callable:
    """A copy of function with a code object of its own.

    Dynamo keeps its compile cache on the code object and, past `recompile_limit` (8) shapes, silently
    runs eager: a sweep visits more shapes than that, so every shape gets its own copy and compiles once.
    """
    return types.FunctionType(
        function.__code__.replace(), function.__globals__, function.__name__, function.__defaults__,
        function.__closure__,
    )


def _compiled_verify(mode: str, w: VerifyWorkload) -> Callable:
    """The compiled reference verify for w's shapes (cached: parity and timing prepare the same config)."""
    key = (mode, w.device, tuple(w.draft_tokens.shape), tuple(w.target_tokens.shape), w.draft_tokens.dtype)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(_fresh_function(reference.verify), mode=mode, dynamic=False, fullgraph=True)
    return _COMPILED[key]


def _compile_probe(_: torch.device) -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if importlib.util.find_spec("triton") is None:
        return "torch.compile (inductor) on CUDA needs triton"
    return None


def _prepare_compiled_verify(mode: str) -> Callable[[VerifyWorkload], Callable]:
    def prepare(w: VerifyWorkload):
        compiled = _compiled_verify(mode, w)
        draft, target = w.draft_tokens, w.target_tokens

        if mode == "reduce-overhead":
            def run():
                # Each call is a new step for CUDA-graph trees: outputs of the previous call may be reused.
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(draft, target)

            # Capturing a replay of inductor's own CUDA graph inside ours measures nothing new.
            run.not_capturable = "mode='reduce-overhead' already replays its own CUDA graph"
        else:
            def run():
                return compiled(draft, target)

        for _ in range(COMPILE_WARMUP_CALLS):  # compile time is never timed
            run()
        torch.cuda.synchronize(w.device)
        return run

    return prepare


register(Implementation(
    op="verify", name="torch_compile", backend="torch", peer=True, probe=_compile_probe,
    description="torch.compile (inductor, default mode) of the eager reference",
    prepare=_prepare_compiled_verify("default"),
))
register(Implementation(
    op="verify", name="torch_compile_ro", backend="torch", peer=True, probe=_compile_probe,
    description="torch.compile mode='reduce-overhead' (inductor + CUDA-graph trees) of the eager reference",
    prepare=_prepare_compiled_verify("reduce-overhead"),
))
