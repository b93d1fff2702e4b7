"""verify in PyTorch: the eager reference as the `torch_eager` peer, and the torch.compile peers."""

from __future__ import annotations

import importlib.util
import types
from collections.abc import Callable

import torch

from sdbench.ops.backends import ANY_DEVICE
from sdbench.ops.verify.reference import verify
from sdbench.ops.workload import VerifyWorkload
from sdbench.registry import Implementation, register


def _prepare_eager(w: VerifyWorkload):
    return lambda: verify(w.draft_tokens, w.target_tokens)


register(Implementation(
    op="verify", name="torch_eager", backend="torch", devices=ANY_DEVICE, peer=True,
    description="eager PyTorch: eq / any / argmax / where / gather (~7 launches)",
    prepare=_prepare_eager,
))


# --- torch.compile peers -----------------------------------------------------------------------
# What a user gets from torch.compile on the same reference code, so speedups are quoted against it
# too. Verify only: verify_pack's draft_kv[mask] has a data-dependent shape (a graph break and a sync).
COMPILE_WARMUP_CALLS = 3  # compile, then (reduce-overhead) a warm-up run and the graph recording
_COMPILED: dict[tuple, Callable] = {}
_WARM: set[tuple] = set()  # shapes whose compiled function has been called (compiled, graphs recorded)


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
        _COMPILED[key] = torch.compile(_fresh_function(verify), mode=mode, dynamic=False, fullgraph=True)
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

        else:
            def run():
                return compiled(draft, target)

        key = (mode, w.device, tuple(w.draft_tokens.shape), tuple(w.target_tokens.shape), w.draft_tokens.dtype)
        if key not in _WARM:  # compile time is never timed, and paid once per shape, not per prepare
            for _ in range(COMPILE_WARMUP_CALLS):
                run()
            torch.cuda.synchronize(w.device)
            _WARM.add(key)
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
    # Capturing a replay of inductor's own CUDA graph inside ours measures nothing new.
    not_capturable="mode='reduce-overhead' already replays its own CUDA graph",
    prepare=_prepare_compiled_verify("reduce-overhead"),
))
