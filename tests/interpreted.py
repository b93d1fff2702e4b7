"""Run Python under the Triton interpreter in a child process and read the JSON report it prints last.

Triton reads TRITON_INTERPRET when a kernel is decorated, so a test that must interpret kernels the parent
process already imported runs its checks in a child: `run_interpreted(code)` or `run_interpreted(script=path)`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_interpreted(code: str | None = None, *, script: Path | None = None, timeout: int = 600) -> Any:
    """The JSON value on the child's last stdout line. A child that fails fails the test (with its output's
    tail); a report that names why Triton cannot run here (its "probe" or "reason") skips it."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           # the repository, and tests/ (children import test modules, which import this one)
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(script)] if script is not None else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"interpreter run failed (rc {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    why = (report.get("probe") or report.get("reason")) if isinstance(report, dict) else None
    if why:
        pytest.skip(f"Triton cannot run here: {why}")
    return report
