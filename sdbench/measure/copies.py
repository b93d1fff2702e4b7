"""The statistics of a config timed on several copies of its workload (`sdbench sweep --placements`).

Each copy (one results row) is one draw of where the workload's buffers landed, and on an H200 that moved a copy
kernel by up to ~9% (docs/results/nvidia-h200/scale-kv/experiments/placement/). So a copy counts once, whatever its
sample count, and an interval must hold the spread between copies, not only the spread within one: pooling every
copy's samples into one list would do neither. With one copy these are the one-level statistics of its samples.

How far to trust them (a helper's simulation, 300 trials a case, copies spread by a 2–4% standard deviation): with
two copies a side, a 95% interval left out the truth 29–33% of the time, with three 6–9%, with five 2–3%. So time
three copies or more (`--placements 3`). The bootstrap errs wide where copies do not differ (up to ~1.8× the true
spread of the median of medians), since a drawn copy's median carries its own sampling noise, and a copy drawn twice
in a replicate shares one resample.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _checked(copies: Sequence[np.ndarray]) -> None:
    if not copies or any(samples.size == 0 for samples in copies):
        raise ValueError("every copy needs at least one sample (a row's samples_us, or its median alone)")


def _medians(copies: Sequence[np.ndarray]) -> np.ndarray:
    _checked(copies)
    return np.array([np.median(samples) for samples in copies])


def median_of_copies(copies: Sequence[np.ndarray]) -> float:
    """The median of each copy's median (one copy: its median)."""
    return float(np.median(_medians(copies)))


def bootstrap_medians(copies: Sequence[np.ndarray], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """n_boot bootstrap replicates of median_of_copies. One copy: its samples drawn with replacement, draw for draw
    the one-level bootstrap. Several: the copies drawn with replacement, each drawn copy standing for a resample of
    its own samples (one resample per copy and replicate, shared when a replicate draws a copy twice: wider, not
    biased)."""
    _checked(copies)
    within = np.stack([np.median(samples[rng.integers(0, samples.size, size=(n_boot, samples.size))], axis=1)
                       for samples in copies])  # [copies, n_boot]
    if len(copies) == 1:
        return within[0]
    picks = rng.integers(0, len(copies), size=(n_boot, len(copies)))
    return np.median(within[picks, np.arange(n_boot)[:, None]], axis=1)


def bootstrap_medians_borrowing(copies: Sequence[np.ndarray], spread_of: Sequence[np.ndarray], n_boot: int,
                                rng: np.random.Generator) -> np.ndarray:
    """bootstrap_medians of a side timed on one copy, beside another timed on several (`spread_of`): its one
    placement's offset is unknown, so each replicate is scaled by a copy of the other side drawn at random (that
    copy's median over the median of their medians). Without it, one copy against several left out the truth in
    about half of a helper's simulated trials."""
    own = bootstrap_medians(copies, n_boot, rng)
    if len(copies) > 1 or len(spread_of) < 2:
        return own
    medians = _medians(spread_of)
    offsets = medians / np.median(medians)
    return own * offsets[rng.integers(0, offsets.size, size=n_boot)]


def relative_error(copies: Sequence[np.ndarray], n_boot: int = 400, seed: int = 0) -> float | None:
    """The relative standard error of median_of_copies, from its bootstrap (seeded: the same rows give the same
    number). None where it cannot be told: one copy of fewer than two samples, a median that is not positive, or no
    spread at all (every replicate equal: the rows' own noise is the better guess)."""
    if not copies or any(samples.size == 0 for samples in copies) or (len(copies) == 1 and copies[0].size < 2):
        return None
    middle = median_of_copies(copies)
    if not middle > 0:
        return None
    error = float(np.std(bootstrap_medians(copies, n_boot, np.random.default_rng(seed))) / middle)
    return error if error > 0 else None
