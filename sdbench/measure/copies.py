"""The statistics of a config timed on several copies of its workload (`sdbench sweep --placements`).

Each copy (one results row) is one draw of where the workload's buffers landed, and on an H200 that moved a copy
kernel by up to ~9% (docs/results/nvidia-h200/scale-kv/experiments/placement/). So a copy counts once, whatever its
sample count, and an interval must hold the spread between copies, not only the spread within one: pooling every
copy's samples into one list would do neither. With one copy these are the one-level statistics of its samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def median_of_copies(copies: Sequence[np.ndarray]) -> float:
    """The median of each copy's median (one copy: its median)."""
    return float(np.median([np.median(samples) for samples in copies]))


def bootstrap_medians(copies: Sequence[np.ndarray], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """n_boot bootstrap replicates of median_of_copies. One copy: its samples drawn with replacement. Several: the
    copies drawn with replacement, each drawn copy standing for a resample of its own samples (one resample per copy
    and replicate, shared when a replicate draws a copy twice)."""
    within = np.stack([np.median(samples[rng.integers(0, samples.size, size=(n_boot, samples.size))], axis=1)
                       for samples in copies])  # [copies, n_boot]
    if len(copies) == 1:
        return within[0]
    picks = rng.integers(0, len(copies), size=(n_boot, len(copies)))
    return np.median(within[picks, np.arange(n_boot)[:, None]], axis=1)


def relative_error(copies: Sequence[np.ndarray], n_boot: int = 400, seed: int = 0) -> float | None:
    """The relative standard error of median_of_copies, from its bootstrap (seeded: the same rows give the same
    number); None where it cannot be told (a copy with fewer than two samples, or a median of 0)."""
    if not copies or any(samples.size < 2 for samples in copies):
        return None
    middle = median_of_copies(copies)
    if not middle > 0:
        return None
    return float(np.std(bootstrap_medians(copies, n_boot, np.random.default_rng(seed))) / middle)
