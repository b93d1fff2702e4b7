"""What each backend needs before an implementation can run, in one place: the CUDA extension's op
namespace and probe, Triton's probe, and the empty kernels the launch floor is measured with.

On CPU tensors Triton kernels run only in its interpreter, which `triton.jit` picks at decoration time
from TRITON_INTERPRET: the variable must be set before triton is first imported, e.g.
`TRITON_INTERPRET=1 sdbench parity --device cpu --impl serial_triton`.
"""

from __future__ import annotations

import os

import torch

from sdbench import ext
from sdbench.errors import SdbenchError
from sdbench.ops.workload import VerifyConfig

try:
    import triton
except ImportError:  # triton is optional: its implementations say why they cannot run
    triton = None

# Read once, at import, because that is when triton.jit chose between compiler and interpreter.
TRITON_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

ANY_DEVICE = ("cpu", "cuda")

# --- CUDA (csrc/ through torch.ops.sdbench) ----------------------------------------------------------
_namespace = None


def cuda_ops():
    """torch.ops.sdbench, built on first use (SdbenchError when unavailable), then cached."""
    global _namespace
    if _namespace is None:
        _namespace = ext.load()
    return _namespace


def cuda_probe(_device: torch.device) -> str | None:
    return ext.unavailable_reason()


# --- devices -----------------------------------------------------------------------------------------------
def validate_device(device: str | None) -> str:
    """The one device check at the edge: None picks cuda when visible, else cpu; anything but a visible
    cuda or cpu is one SdbenchError saying what to use."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise SdbenchError(f"--device: {device!r} is not a device; use cuda or cpu") from None
    if parsed.type not in ("cuda", "cpu"):
        raise SdbenchError(f"--device: {device!r} is not supported; use cuda or cpu")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise SdbenchError("--device cuda: no CUDA device is visible here; use --device cpu")
    return str(parsed)


# --- Triton --------------------------------------------------------------------------------------------
def triton_probe(device: torch.device) -> str | None:
    """Why Triton cannot run on device (installed? interpreter on CPU, compiler on the GPU), or None."""
    if triton is None:
        return "triton is not installed (pip install triton)"
    if device.type == "cpu" and not TRITON_INTERPRETED:
        return "Triton runs on CPU tensors only in its interpreter: set TRITON_INTERPRET=1 before starting sdbench"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA device"
    if device.type == "cuda" and TRITON_INTERPRETED:
        return "TRITON_INTERPRET=1 is set: Triton would run in its interpreter, not on the GPU"
    return None


# --- what a config must have -----------------------------------------------------------------------------
def needs_kv(cfg: VerifyConfig) -> str | None:
    return None if cfg.kv_dim > 0 else "needs draft KV (kv_dim >= 1)"


# --- empty kernels: the launch floor ------------------------------------------------------------------
def _cuda_device(device: torch.device | str | int | None) -> torch.device:
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def prepare_cuda_empty(device: torch.device | str | int | None = None):
    """The extension's empty kernel with everything bound up front, the way every prepared run binds
    its op and arguments: timing it measures the dispatcher launch path the CUDA ops pay."""
    op, dummy = cuda_ops().empty, torch.empty(1, device=_cuda_device(device))
    return lambda: op(dummy)


if triton is not None:

    @triton.jit
    def _empty_kernel(unused):
        pass


def launch_triton_empty() -> None:
    """One empty Triton kernel on the current stream: the launch floor when the CUDA extension is missing."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    _empty_kernel[(1,)](0)
