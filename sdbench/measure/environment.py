"""The environment every results row carries: device, software versions, host, clocks.

Each field is read independently and becomes None when it cannot be read; nothing here raises.
Keys are the results-schema column names (docs/results-schema.md).
"""

from __future__ import annotations

import functools
import hashlib
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch

import sdbench

ENV_COLUMNS = (
    "gpu_name", "gpu_cc", "gpu_sms", "gpu_memory_gb", "driver", "gpu_uuid",
    "cuda_version", "torch_version", "triton_version", "sdbench_version", "git_sha", "hostname", "python_version",
    "sm_clock_mhz", "mem_clock_mhz",
)
_COMMAND_TIMEOUT_S = 5


def _safe(read, *args):
    try:
        return read(*args)
    except Exception:
        return None


def _run_bytes(command: list[str], cwd: Path | None = None) -> bytes | None:
    """stdout exactly as written (a diff's bytes), or None when the command fails or cannot run."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, timeout=_COMMAND_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    out = _run_bytes(command, cwd)
    return None if out is None else out.decode(errors="replace").strip()


def _triton_version() -> str | None:
    import triton

    return triton.__version__


DIFF_DIGEST_CHARS = 12


def _git_sha(root: Path | None = None) -> str | None:
    """HEAD of the checkout sdbench runs from; when tracked files differ from it, '-dirty+' and a digest of
    those differences, so two runs of different edits on one commit never share a sha. A checkout copied
    to a GPU host can keep an old HEAD under newer files (seen in session 20): the digest still names the
    code. It is the first DIFF_DIGEST_CHARS hex digits of the SHA-256 of `git diff --full-index --binary
    HEAD`; the same digits from `git diff --full-index --binary <sha> <commit>` show a commit holds that code."""
    root = root or Path(sdbench.__file__).resolve().parent.parent
    sha = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if not sha:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    if not dirty:
        return sha
    diff = _run_bytes(["git", "diff", "--full-index", "--binary", "HEAD"], cwd=root)
    return f"{sha}-dirty+{hashlib.sha256(diff).hexdigest()[:DIFF_DIGEST_CHARS]}" if diff is not None else f"{sha}-dirty"


@functools.cache
def software() -> dict[str, Any]:
    """Versions and host: fixed for the life of the process."""
    return {
        "cuda_version": torch.version.cuda,
        "torch_version": torch.__version__,
        "triton_version": _safe(_triton_version),
        "sdbench_version": sdbench.__version__,
        "git_sha": _safe(_git_sha),
        "hostname": _safe(socket.gethostname),
        "python_version": platform.python_version(),
    }


def _pci_bus_id(index: int) -> str | None:
    props = torch.cuda.get_device_properties(index)
    domain, bus, dev = (getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if bus is None:
        return None
    return f"{domain or 0:08X}:{bus:02X}:{dev or 0:02X}.0"


def _nvml_query(index: int) -> dict[str, Any]:
    """Driver and clocks through NVML (pynvml), located by PCI bus id so CUDA_VISIBLE_DEVICES cannot mislead."""
    import pynvml

    pynvml.nvmlInit()
    try:
        bus_id = _pci_bus_id(index)
        handle = (
            pynvml.nvmlDeviceGetHandleByPciBusId(bus_id) if bus_id else pynvml.nvmlDeviceGetHandleByIndex(index)
        )
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "sm_clock_mhz": int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
        }
    finally:
        pynvml.nvmlShutdown()


def _smi_query(index: int) -> dict[str, Any]:
    target = _pci_bus_id(index) or str(index)
    line = _run([
        "nvidia-smi", f"--id={target}", "--query-gpu=driver_version,clocks.sm,clocks.mem",
        "--format=csv,noheader,nounits",
    ])
    if not line:
        return {}
    driver, sm_clock, mem_clock = (field.strip() for field in line.splitlines()[0].split(","))
    return {"driver": driver, "sm_clock_mhz": _safe(int, sm_clock), "mem_clock_mhz": _safe(int, mem_clock)}


def clocks_and_driver(device: str | torch.device) -> dict[str, Any]:
    """Driver version and current SM / memory clocks (read again per config: clocks move)."""
    empty = {"driver": None, "sm_clock_mhz": None, "mem_clock_mhz": None}
    device = torch.device(device)
    if device.type != "cuda":
        return empty
    index = device.index if device.index is not None else _safe(torch.cuda.current_device)
    if index is None:
        return empty
    found = _safe(_nvml_query, index) or _safe(_smi_query, index) or {}
    return {**empty, **found}


@functools.cache
def gpu_uuid(index: int) -> str | None:
    """Which physical GPU: two machines of one kind may differ, and nothing else in a row says which ran. Read once a
    process (scan_tiles asks for every row, between timed rotations)."""
    return _safe(lambda: str(torch.cuda.get_device_properties(index).uuid))


def _gpu(index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    return {
        "gpu_name": props.name,
        "gpu_cc": f"{props.major}.{props.minor}",
        "gpu_sms": int(props.multi_processor_count),
        "gpu_memory_gb": round(props.total_memory / 1e9, 3),
        "gpu_uuid": gpu_uuid(index),
    }


def collect(device: str | torch.device) -> dict[str, Any]:
    """Every environment column for rows measured on device (GPU columns null on the CPU)."""
    device = torch.device(device)
    gpu = {"gpu_name": None, "gpu_cc": None, "gpu_sms": None, "gpu_memory_gb": None, "gpu_uuid": None}
    if device.type == "cuda":
        index = device.index if device.index is not None else _safe(torch.cuda.current_device)
        gpu = (_safe(_gpu, index) if index is not None else None) or gpu
    return {**gpu, **software(), **clocks_and_driver(device)}
