"""The launch floor: an empty kernel launched the way sdbench's implementations launch theirs.

Every timing row is read against the floor measured in the same run (sdbench.measure.timing times
it like any other callable; it knows no kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sdbench import ext
from sdbench.errors import describe_error
from sdbench.ops import backends


@dataclass(frozen=True)
class LaunchFloor:
    """An empty kernel launch (run is None, with the reason, where none can be launched)."""

    run: Callable[[], None] | None
    backend: str  # cuda (the extension's empty kernel) or triton (fallback: Triton's launcher costs more host time)
    reason: str | None = None


def launch_floor(device: str | torch.device) -> LaunchFloor:
    """The cheapest launch available on device: the CUDA extension's empty kernel, else Triton's."""
    device = torch.device(device)
    if device.type != "cuda":
        return LaunchFloor(None, "cuda", "no kernel launch on a CPU device")
    reasons = []
    try:
        reason = ext.unavailable_reason()
        if reason is None:
            launch_empty = backends.prepare_cuda_empty(device)
            launch_empty()
            torch.cuda.synchronize(device)
            return LaunchFloor(launch_empty, "cuda")
        reasons.append(f"CUDA extension: {reason}")
    except Exception as err:  # the extension is optional: fall back, and say why
        reasons.append(f"CUDA extension: {describe_error(err)}")
    try:
        launch_empty_triton = backends.launch_triton_empty
        launch_empty_triton()
        torch.cuda.synchronize(device)
        return LaunchFloor(launch_empty_triton, "triton", "; ".join(reasons) or None)
    except Exception as err:
        reasons.append(f"Triton: {describe_error(err)}")
    return LaunchFloor(None, "cuda", "no empty kernel could be launched (" + "; ".join(reasons) + ")")
