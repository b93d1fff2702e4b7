"""The statistics of several copies of a workload (sdbench.measure.copies), against plain computations."""

import numpy as np
import pytest

from sdbench.measure import copies


def test_each_copy_counts_once_whatever_its_sample_count():
    many = np.full(400, 11.0)  # a copy that took four times the samples
    assert copies.median_of_copies([np.full(100, 10.0), np.full(100, 10.3), many]) == pytest.approx(10.3)
    assert np.median(np.concatenate([np.full(100, 10.0), np.full(100, 10.3), many])) == pytest.approx(11.0)  # pooled


def test_one_copy_is_the_one_level_bootstrap_of_its_samples():
    samples = np.random.default_rng(1).normal(10.0, 0.5, 200)
    got = copies.bootstrap_medians([samples], 300, np.random.default_rng(7))
    rng = np.random.default_rng(7)
    want = np.median(samples[rng.integers(0, samples.size, size=(300, samples.size))], axis=1)
    assert np.array_equal(got, want)


def test_the_spread_between_copies_widens_the_interval():
    """Copies whose medians differ by 10% but whose samples are tight: pooled, the interval is narrow; by copy it holds
    the spread between them."""
    rng = np.random.default_rng(3)
    spread = [rng.normal(center, 0.01, 100) for center in (10.0, 10.5, 11.0)]
    boot = copies.bootstrap_medians(spread, 2000, np.random.default_rng(0))
    low, high = np.percentile(boot, [2.5, 97.5])
    assert low < 10.2 and high > 10.8  # the copies' own spread, within sampling
    pooled = np.concatenate(spread)
    one_level = np.median(pooled[rng.integers(0, pooled.size, size=(2000, pooled.size))], axis=1)
    assert np.percentile(one_level, 97.5) - np.percentile(one_level, 2.5) < 0.3 * (high - low)
    assert copies.relative_error(spread) > 5 * copies.relative_error([pooled])


def test_relative_error_says_when_it_cannot_tell():
    assert copies.relative_error([np.array([1.0])]) is None
    assert copies.relative_error([]) is None
    assert copies.relative_error([np.zeros(10)]) is None
    assert copies.relative_error([np.full(10, 2.0), np.full(10, 2.0)]) == 0.0
