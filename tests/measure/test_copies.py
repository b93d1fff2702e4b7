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
    assert copies.relative_error([np.full(10, 2.0), np.full(10, 2.0)]) is None  # no spread: the rows' noise is better


def test_copies_of_one_sample_still_give_their_spread():
    """Copies that kept only their median (one sample each) still differ by placement: the error holds that."""
    medians_only = [np.array([10.0]), np.array([10.5]), np.array([11.0])]
    assert copies.relative_error(medians_only) > 0.01


def test_identical_copies_err_wide_never_narrow():
    """Four copies that do not differ, each with wide sampling noise: the bootstrap's interval is at least the true
    spread of the median of their medians (simulated), and at most about twice it (the documented widening)."""
    rng = np.random.default_rng(4)
    same = [rng.normal(10.0, 1.0, 50) for _ in range(4)]

    def width(values):
        return float(np.subtract(*np.percentile(values, [97.5, 2.5])))

    truth = width([np.median(np.median(rng.normal(10.0, 1.0, (4, 50)), axis=1)) for _ in range(4000)])
    booted = width(copies.bootstrap_medians(same, 4000, np.random.default_rng(0)))
    assert 0.9 * truth <= booted <= 2.2 * truth


def test_one_copy_beside_several_borrows_their_spread():
    """One copy at 10.0 (tight) against copies at 9.5, 10.0 and 10.5: the one copy's replicates spread like the
    others' copies, not like its own samples; beside a single copy, nothing is borrowed."""
    rng = np.random.default_rng(6)
    one = [rng.normal(10.0, 0.01, 100)]
    several = [rng.normal(center, 0.01, 100) for center in (9.5, 10.0, 10.5)]
    borrowed = copies.bootstrap_medians_borrowing(one, several, 2000, np.random.default_rng(0))
    low, high = np.percentile(borrowed, [2.5, 97.5])
    assert low < 9.6 and high > 10.4
    alone = copies.bootstrap_medians_borrowing(one, [rng.normal(10.0, 0.01, 100)], 500, np.random.default_rng(0))
    assert np.array_equal(alone, copies.bootstrap_medians(one, 500, np.random.default_rng(0)))


def test_a_copy_without_samples_is_refused():
    with pytest.raises(ValueError, match="at least one sample"):
        copies.median_of_copies([np.array([1.0]), np.array([])])
