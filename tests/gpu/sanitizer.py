"""compute-sanitizer around a script run in a fresh process: the harness the GPU test files share."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sdbench import ext

REPO = Path(__file__).resolve().parents[2]


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    nvcc = ext.nvcc_path()
    candidate = Path(nvcc).parent / "compute-sanitizer" if nvcc else None
    return str(candidate) if candidate is not None and candidate.is_file() else None


def run_sanitizer(tool: str, extra: list[str], script: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "TORCH_EXTENSIONS_DIR": str(ext.cache_root()),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if os.environ.get("TORCH_CUDA_ARCH_LIST") is None and ext.arch_list():
        env["TORCH_CUDA_ARCH_LIST"] = ext.arch_list()  # the same build folder as this process's
    command = [find_sanitizer(), "--tool", tool, "--error-exitcode", "99", "--print-limit", "10", *extra,
               sys.executable, "-c", script]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=500)


def sanitizer_report(tool: str, extra: list[str], script: str) -> subprocess.CompletedProcess:
    """The run, retried without kernel filters on an older sanitizer that does not know them."""
    done = run_sanitizer(tool, extra, script)
    output = done.stderr + done.stdout
    if done.returncode != 0 and extra and "kernel-name" in output and "option" in output.lower():
        done = run_sanitizer(tool, [], script)  # check everything instead
    return done


def assert_sanitizer_clean(tool: str, script: str, extra: list[str] | tuple[str, ...] = ()) -> None:
    """The GPU test files' check: `script` under `tool` exits 0 (skipped, with the reason, without the tool)."""
    if find_sanitizer() is None:
        pytest.skip("compute-sanitizer not found")
    done = sanitizer_report(tool, list(extra), script)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
