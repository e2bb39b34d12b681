"""bayespca.statistics: working units, representable data, statistics against NumPy."""

import numpy as np
import pytest

from bayespca.linalg import centred_scatter, eigh_top
from bayespca.statistics import (
    columns_divided,
    missing_patterns,
    power_of_two_scale,
    prepare,
    stack_patterns,
    sufficient_statistics,
)


def test_scale_is_a_power_of_two_within_sqrt2_of_the_spread():
    rng = np.random.default_rng(0)
    for c in (1e-150, 1e-8, 1.0, 3.0, 1e8, 1e150):
        X = c * rng.normal(size=(200, 5)) + 7 * c
        s = power_of_two_scale(X)
        rms = np.sqrt(np.mean((X / c - (X / c).mean(0)) ** 2)) * c
        assert s == 2.0 ** round(np.log2(s))
        assert 2**-0.5 <= s / rms <= 2**0.5


def test_constant_data_far_from_zero_have_no_spread():
    # One centring pass leaves the rounding of the mean, which would read as a spread of 1e184.
    assert power_of_two_scale(np.full((50, 2), 3.7e200)) == 1.0


def test_working_units_are_exactly_the_data_over_a_power_of_two():
    X = np.random.default_rng(1).normal(size=(40, 3))
    a, b = prepare(X), prepare(X * 2.0**70)
    np.testing.assert_array_equal(a.X, b.X)
    assert b.scale == a.scale * 2.0**70


def test_unrepresentable_variances_are_refused_naming_a_column():
    X = np.random.default_rng(2).normal(size=(30, 3))
    X[:, 1] *= 1e170
    with pytest.raises(ValueError, match="column 1.*not representable"):
        prepare(X)


def test_moments_and_patterns_equal_numpy():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 4)) + [1.0, 2.0, 3.0, 4.0]
    X[rng.random(X.shape) < 0.1] = np.nan
    p = prepare(X)
    np.testing.assert_allclose(p.mean * p.scale, np.nanmean(X, 0), rtol=1e-13)
    np.testing.assert_allclose(p.variances * p.scale**2, np.nanvar(X, 0), rtol=1e-12)
    patterns = missing_patterns(X)
    for cols, stats in zip(patterns.columns, patterns.stats, strict=True):
        rows = X[(~np.isnan(X) == np.isin(np.arange(4), cols)).all(1)][:, cols]
        assert stats.n == len(rows)
        np.testing.assert_allclose(
            stats.scatter,
            np.cov(rows.T, bias=True).reshape(stats.scatter.shape) * len(rows),
            rtol=1e-12,
            atol=1e-12,
        )


def test_sufficient_statistics_refuse_missing_values():
    with pytest.raises(ValueError, match="NaN"):
        sufficient_statistics([[1.0, np.nan], [2.0, 3.0]])


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("k", [2, None])
def test_eigenpairs_leave_the_scatter_as_it_was(order, k):
    # LAPACK works in place on a column-major matrix it may overwrite: the scatter of
    # cached statistics must survive the solvers that read it (EM, closed form).
    X = np.random.default_rng(0).normal(size=(50, 6)) @ np.diag([3.0, 2.0, 1.0, 1.0, 0.5, 0.5])
    scatter = np.array(sufficient_statistics(X).scatter, order=order)
    kept = scatter.copy()
    evals, _ = eigh_top(scatter, k)
    np.testing.assert_array_equal(scatter, kept)
    s = np.linalg.svd(X - X.mean(0), compute_uv=False)[: evals.size]
    np.testing.assert_allclose(np.sqrt(evals), s, rtol=1e-12)


@pytest.mark.parametrize(("offset", "spread"), [(0.0, 1.0), (3e5, 7.0), (-2.0, 3e-9), (1e12, 1e10)])
def test_statistics_from_data_units_equal_those_of_the_working_units_bit_for_bit(offset, spread):
    # prepare takes the mean and scatter of complete data in data units and divides by powers of
    # two; the reference scales first (power_of_two_scale) and computes in working units: the
    # column sums' mean, with a second pass where the spread is below 1e-3 of the mean (the
    # cases 3e5 +- 7 and -2 +- 3e-9).
    rng = np.random.default_rng(4)
    signal = rng.standard_normal((500, 3)) @ rng.standard_normal((3, 12))
    X = offset + spread * (signal + rng.random((500, 12)))
    p = prepare(X)
    scale = power_of_two_scale(X)
    working = X / scale
    mean = np.ones(500) @ working / 500
    if spread < 1e-3 * abs(offset):
        mean = mean + (working - mean).sum(axis=0) / 500
    assert p.scale == scale
    np.testing.assert_array_equal(p.X, working)
    np.testing.assert_array_equal(p.mean, mean)
    np.testing.assert_array_equal(p.stats.scatter, centred_scatter(working, mean))


@pytest.mark.parametrize("shift", [None, np.array([0.3, -4.0, 0.05, 1.5])])
@pytest.mark.parametrize("max_patterns", [64, 1])
def test_columns_divided_are_the_statistics_of_the_divided_data(max_patterns, shift):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 4)) * [1.0, 10.0, 0.1, 3.0]
    X[rng.random(X.shape) < 0.2] = np.nan
    factor = np.array([0.5, 8.0, 0.125, 2.0])
    got = columns_divided(missing_patterns(X, max_patterns), factor, shift)
    want = missing_patterns((X - (0.0 if shift is None else shift)) / factor, max_patterns)
    assert [c.tolist() for c in got.columns] == [c.tolist() for c in want.columns]
    for a, b in zip(got.stats, want.stats, strict=True):
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(a.scatter, b.scatter, rtol=1e-12, atol=1e-12 * np.abs(b.scatter).max())
    if max_patterns == 1:  # the rows are kept instead of groups
        np.testing.assert_allclose(got.X, want.X, rtol=1e-15, atol=1e-15)
        np.testing.assert_array_equal(got.observed, want.observed)
    else:  # stacked: the same statistics, the padding left at 0
        stacked = columns_divided(stack_patterns(missing_patterns(X), multiple=8), factor, shift)
        expected = stack_patterns(want, multiple=8)
        np.testing.assert_allclose(stacked.mean, expected.mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(stacked.scatter, expected.scatter, rtol=1e-12, atol=1e-12)
