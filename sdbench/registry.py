"""The one registry of every implementation sdbench can run, keyed by (operation, name).

Adding a kernel means adding one `register(Implementation(...))` call in a `*_impls.py` module of its
operation's folder under `sdbench/ops/`; every such module is imported on first use, so `list`,
`parity`, `sweep`, `profile` and the API all see it from here.

`prepare(workload)` does every allocation up front and returns a zero-argument callable that runs
the implementation once and returns its outputs as a dict (names in each op's reference.py), so timing
never includes allocation (except where allocation is the method, e.g. `draft_kv[mask]`). Entries with
`writes_into=True` also take `prepare(workload, out=buffers)` and write into the caller's buffers: that
is how the public API launches them, with no copy.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sdbench.errors import SdbenchError, closest
from sdbench.ops import OPERATIONS
from sdbench.ops.workload import VerifyConfig, VerifyWorkload

BACKENDS = ("torch", "cuda", "triton")
BACKEND_MODULE_ORDER = ("torch_impls", "cuda_impls", "triton_impls")  # then any other *_impls, by name


def implementation_modules() -> list[str]:
    """Every module under sdbench/ops/<op>/ whose name ends in `_impls`: op by op, backends in order."""
    modules = []
    for op in OPERATIONS:
        package = importlib.import_module(f"sdbench.ops.{op}")
        names = [info.name for info in pkgutil.iter_modules(package.__path__) if info.name.endswith("_impls")]
        names.sort(key=lambda name: (BACKEND_MODULE_ORDER.index(name) if name in BACKEND_MODULE_ORDER
                                     else len(BACKEND_MODULE_ORDER), name))
        modules.extend(f"sdbench.ops.{op}.{name}" for name in names)
    return modules

Outputs = dict[str, torch.Tensor]
PreparedRun = Callable[[], Outputs]


class BufferedRun:
    """A prepared run that writes into preallocated output buffers.

    `outputs` is exposed so parity can poison the buffers before a run; calling it launches the
    implementation and returns those same buffers.
    """

    def __init__(self, launch: Callable[[], None], outputs: Outputs) -> None:
        self.launch = launch
        self.outputs = outputs

    def __call__(self) -> Outputs:
        self.launch()
        return self.outputs


BACKEND_LAUNCH_PATHS = {"cuda": "custom_op", "triton": "triton", "torch": "torch_eager"}


def _no_reason(_: object) -> str | None:
    return None


@dataclass(frozen=True)
class Implementation:
    op: str
    name: str
    backend: str
    description: str
    prepare: Callable[[VerifyWorkload], PreparedRun]
    devices: tuple[str, ...] = ("cuda",)  # device types it runs on
    probe: Callable[[torch.device], str | None] = _no_reason  # why it cannot run on this device
    supports: Callable[[VerifyConfig], str | None] = _no_reason  # why it cannot run this config
    sync: bool = False  # syncs the host (data-dependent shape, .item()): never graph-captured
    peer: bool = False  # a baseline a user would pick instead of sdbench's kernels
    launches: int | None = None  # kernel launches per call, where known
    not_capturable: str | None = None  # why a CUDA graph of it would measure nothing new (it syncs: see sync)
    writes_into: bool = False  # prepare(workload, out=buffers) writes into the given output buffers
    # How its first kernel is launched, for the launch floor of its own path (sdbench.ops.launch_floor):
    # custom_op (torch.ops dispatcher), triton (Triton's Python launcher), triton_bound (a BoundLaunch that
    # skips it), torch_eager (an ATen op). None: from the backend.
    launch_path: str | None = None

    @property
    def capture_refusal(self) -> str | None:
        """Why this implementation is never captured in a CUDA graph, or None when it can be."""
        if self.sync:
            return "syncs the host (data-dependent shape or .item()): cannot be captured"
        return self.not_capturable

    @property
    def path(self) -> str:
        """The launch path whose empty launch is this implementation's floor."""
        return self.launch_path or BACKEND_LAUNCH_PATHS.get(self.backend, "custom_op")

    @property
    def key(self) -> tuple[str, str]:
        return (self.op, self.name)

    def unavailable_reason(self, device: str | torch.device, config: VerifyConfig | None = None) -> str | None:
        """None when it can run here (and on config, if given); else a human reason."""
        device = torch.device(device)
        if device.type not in self.devices:
            if self.devices == ("cuda",):
                return "needs a CUDA device" if device.type == "cuda" or not torch.cuda.is_available() else (
                    "runs on CUDA only (use --device cuda)"
                )
            return f"runs on {'/'.join(self.devices)} only"
        reason = self.probe(device)
        if reason is None and config is not None:
            reason = self.supports(config)
        return reason


_REGISTRY: dict[tuple[str, str], Implementation] = {}
_loaded = False


def register(impl: Implementation) -> Implementation:
    if impl.op not in OPERATIONS:
        raise ValueError(f"unknown operation {impl.op!r}")
    if impl.backend not in BACKENDS:
        raise ValueError(f"unknown backend {impl.backend!r}")
    if impl.key in _REGISTRY:
        raise ValueError(f"implementation {impl.key} registered twice")
    _REGISTRY[impl.key] = impl
    return impl


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in implementation_modules():
        importlib.import_module(module)  # a module that fails to import is a bug: let it say so


def implementations(op: str | None = None) -> list[Implementation]:
    """Every registered implementation (of op, if given), in registration order."""
    _load()
    return [impl for impl in _REGISTRY.values() if op is None or impl.op == op]


def get(op: str, name: str) -> Implementation:
    _load()
    if op not in OPERATIONS:
        raise SdbenchError(f"unknown operation {op!r}{closest(op, list(OPERATIONS))}; choose one of {', '.join(OPERATIONS)}")
    impl = _REGISTRY.get((op, name))
    if impl is None:
        names = [i.name for i in implementations(op)]
        raise SdbenchError(
            f"unknown implementation {name!r} for operation {op!r}{closest(name, names)}; "
            f"known: {', '.join(names)}"
        )
    return impl


def select(op: str, names: list[str] | None) -> list[Implementation]:
    """The named implementations of op (all of them when names is None or empty)."""
    if not names:
        return implementations(op)
    return [get(op, name) for name in names]
