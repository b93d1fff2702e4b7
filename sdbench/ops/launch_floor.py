"""The launch floor: an empty kernel launched the way sdbench's implementations launch theirs.

Every timing row is read against the floor measured in the same run (sdbench.measure.timing times
it like any other callable; it knows no kernel).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


# --- one floor per launch path ------------------------------------------------------------------------
# An implementation's floor is an empty launch through its own path (registry.Implementation.path): the
# torch.ops dispatcher costs tens of µs of wall time more than a BoundLaunch of a Triton kernel on the H100
# host, so one floor for everything put Triton rows "below the floor". The custom-op floor stays the
# `launch_floor` row of every config; the others are measured beside it and carried on the rows they serve.
LAUNCH_PATHS = ("custom_op", "triton", "triton_bound", "torch_eager")


def _triton_bound_empty(device: torch.device) -> Callable[[], None]:
    from sdbench.ops.prob_verify.triton_kernels import BoundLaunch

    launch = BoundLaunch(backends._empty_kernel, (1,), (0,), {}, device)
    return launch


def _torch_eager_empty(device: torch.device) -> Callable[[], None]:
    dummy = torch.empty(1, device=device)
    return dummy.zero_  # one ATen op, one kernel


def path_floor(path: str, device: str | torch.device) -> LaunchFloor:
    """The empty launch of one path on device (run None, with the reason, where it cannot launch)."""
    device = torch.device(device)
    if path == "custom_op":
        return launch_floor(device)
    if device.type != "cuda":
        return LaunchFloor(None, path, "no kernel launch on a CPU device")
    try:
        if path == "triton":
            run = backends.launch_triton_empty
        elif path == "triton_bound":
            run = _triton_bound_empty(device)
        elif path == "torch_eager":
            run = _torch_eager_empty(device)
        else:
            return LaunchFloor(None, path, f"unknown launch path {path!r}; paths are {', '.join(LAUNCH_PATHS)}")
        run()
        torch.cuda.synchronize(device)
        return LaunchFloor(run, path)
    except Exception as err:  # a path that cannot launch here: its rows fall back to the custom-op floor
        return LaunchFloor(None, path, describe_error(err))


# How far below its own floor a row may sit and still read as "at the floor", per view, beyond its noise.
# Wall: two custom ops of the same path differ in host cost by up to ~1 µs of ~16-35 (their arguments;
# measured on the H100, 2026-11-24: ballot's wall median at 0.96-0.99x the empty op's in 11 of 36 main
# configs, same distribution otherwise), the same 5% the wall view reproduces to between runs.
FLOOR_TOLERANCE = {"wall": 0.05}


def rows_below_own_floor(rows: list[dict], tolerance: float = 0.0) -> list[dict]:
    """The ok rows whose median is below their own path's floor by more than the two medians' noise (the
    relative standard errors recorded per row), the view's FLOOR_TOLERANCE and `tolerance`: none may exist
    in a committed report."""
    floors = {}
    for row in rows:
        if str(row.get("impl", "")).startswith("launch_floor") and row.get("status") == "ok":
            floors[(row.get("run_id"), _config_of(row), row.get("view"))] = row
    below = []
    for row in rows:
        if row.get("status") != "ok" or str(row.get("impl", "")).startswith("launch_floor"):
            continue
        floor_us = row.get("launch_floor_us")
        median = row.get("median_us")
        if floor_us is None or median is None:
            continue
        floor_row = floors.get((row.get("run_id"), _config_of(row), row.get("view")), {})
        noise = ((row.get("noise") or 0.0) + (floor_row.get("noise") or 0.0) + tolerance
                 + FLOOR_TOLERANCE.get(row.get("view"), 0.0))
        if median < floor_us * (1.0 - noise):
            below.append(row)
    return below


# The columns that say which launch_floor row of a run a row is read against (with run_id and view): the copy of the
# workload too (sweep --placements times each copy beside a floor of its own).
FLOOR_KEY_COLUMNS = ("op", "batch_size", "gamma", "alpha", "kv_dim", "vocab_size", "dist", "token_dtype", "kv_dtype",
                     "seed", "cold_l2", "placement")


def _config_of(row: dict) -> tuple:
    return tuple(row.get(name) for name in FLOOR_KEY_COLUMNS)


# --- the host's state, read from the wall floor -------------------------------------------------------
# The wall view times the host's launch path, and a virtualised host has more than one state: on the H200
# host (a Firecracker VM, 2026-11-25) whole configs ran in a slow state where the empty launch of a path read
# 29-38 µs against 17-18 µs, steady within the config (low noise, no floor_drift). Rows do not slow by the
# floor's factor in that state (wall ≈ s·host work + fixed device and driver time), so their ratio to the floor
# moved 5-23% against the same config in the fast state. A path's wall floor is the probe of that state: two
# floors of one path more than HOST_STATE_TOLERANCE apart were measured in different host states, and rows read
# against them do not compare. Within one state the floors of a quick sweep spread by up to ~9% (17.4-18.9 µs).
HOST_STATE_TOLERANCE = 0.15
HOST_STATE_VIEW = "wall"


def host_state_differs(floor_us: float, other_us: float, tolerance: float = HOST_STATE_TOLERANCE) -> bool:
    """Whether two wall floors of one launch path are more than tolerance apart (the larger over the smaller):
    the host was in another state for one of them."""
    low, high = sorted((floor_us, other_us))
    return low > 0 and high > low * (1.0 + tolerance)


def lowest_wall_floors(rows: Iterable[dict]) -> dict[str, float]:
    """The lowest wall floor of each launch path among rows: the fastest host state a sweep saw on that path."""
    lowest: dict[str, float] = {}
    for row in rows:
        floor_us = row.get("launch_floor_us")
        if row.get("view") != HOST_STATE_VIEW or floor_us is None or not floor_us > 0:
            continue
        path = row.get("launch_path") or "custom_op"
        lowest[path] = min(floor_us, lowest.get(path, floor_us))
    return lowest


def host_slowed(row: dict, lowest: dict[str, float]) -> float | None:
    """A wall row's own floor over the lowest wall floor of its path (1.0: measured in the fastest state seen);
    None for other views and rows without a floor."""
    floor_us = row.get("launch_floor_us")
    lowest_us = lowest.get(row.get("launch_path") or "custom_op")
    if row.get("view") != HOST_STATE_VIEW or floor_us is None or not lowest_us:
        return None
    return floor_us / lowest_us


def config_host_slowed(rows: Iterable[dict], lowest: dict[str, float]) -> float | None:
    """How much slower than its fastest state the host launched while a config's wall view was measured: the
    largest host_slowed of its rows (None when none has a floor)."""
    return max((ratio for row in rows if (ratio := host_slowed(row, lowest)) is not None), default=None)
