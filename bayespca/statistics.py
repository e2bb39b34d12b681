"""Data reduced once to what every fitter consumes: the seam between data and inference.

The Gaussian models of this package (pPCA, factor analysis) see complete
data only through ``(n, mean, scatter)`` and data with missing values
through the same statistics of each pattern of observed entries. A
:class:`Prepared` holds those, computed once from validated data, together
with the rows themselves for the per-row work (transform, pointwise
log-likelihood, imputation, EM with many missing patterns).

Scale. Fitters work in *working units* ``X / scale``, ``scale`` a power of
two near the spread of the centred data: dividing by a power of two is
exact, so a fit of ``c X`` is the fit of ``X`` with every result scaled by
``c`` (exactly when ``c`` is a power of two, to rounding otherwise), and
tolerances, floors and step sizes mean the same at 1e-150 as at 1. Results
go back to data units through :meth:`Prepared.to_data_units` for parameters
and :func:`log_scale_correction` for log-densities. Data whose squares
cannot be represented in float64 are refused by :func:`check_representable`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from bayespca.linalg import centred_scatter

__all__ = [
    "PATTERN_MULTIPLE",
    "MissingPatterns",
    "Prepared",
    "SufficientStatistics",
    "check_representable",
    "columns_divided",
    "log_scale_correction",
    "missing_patterns",
    "pooled_statistics",
    "power_of_two_above",
    "power_of_two_scale",
    "prepare",
    "scatter_spectrum",
    "StackedPatterns",
    "stack_patterns",
    "sufficient_statistics",
]

#: Missing patterns reach compiled code (NUTS, SVI) stacked, their count padded to a multiple of
#: this: data sets with 1-8, 9-16, ... patterns share a compiled program.
PATTERN_MULTIPLE = 8

# Largest spread whose square (a variance) is a normal float64 with room for
# sums over features: 2^505 ~ 1e152 (and 2^-505 ~ 1e-152 for the smallest).
_MAX_LOG2_SPREAD = 505
_MAX_PATTERNS = 64


class SufficientStatistics(NamedTuple):
    """What complete Gaussian data tell about ``(W, Psi, mu)``.

    Attributes
    ----------
    n : int
        Number of rows.
    mean : ndarray of shape (d,)
        Column means ``xbar``.
    scatter : ndarray of shape (d, d)
        Centred scatter ``sum_i (x_i - xbar)(x_i - xbar)^T``.
    """

    n: Any
    mean: Any
    scatter: Any


def pooled_statistics(a: SufficientStatistics, b: SufficientStatistics) -> SufficientStatistics:
    """The statistics of two sets of rows together (Chan et al.'s pairwise update).

    ``mean = mean_a + (n_b / n) delta`` and
    ``scatter = scatter_a + scatter_b + (n_a n_b / n) delta delta^T`` with
    ``delta = mean_b - mean_a``: no raw moments, so no cancellation.

    Examples
    --------
    >>> X = np.array([[0.0, 1.0], [2.0, 5.0], [4.0, 3.0]])
    >>> pooled = pooled_statistics(sufficient_statistics(X[:1]), sufficient_statistics(X[1:]))
    >>> bool(np.allclose(pooled.scatter, sufficient_statistics(X).scatter)), pooled.mean.tolist()
    (True, [2.0, 3.0])
    """
    n = a.n + b.n
    delta = np.asarray(b.mean) - np.asarray(a.mean)
    mean = a.mean + delta * (b.n / n)
    return SufficientStatistics(n, mean, a.scatter + b.scatter + np.outer(delta, delta) * (a.n * b.n / n))


def columns_divided(stats: Any, factor: np.ndarray, shift: np.ndarray | None = None) -> Any:
    """The statistics of the data with column ``j`` divided by ``factor[j]`` (after subtracting ``shift[j]``).

    ``(mean - c) / f`` and ``scatter / (f f^T)`` for complete data
    (:class:`SufficientStatistics`) and for each missing pattern's observed
    block (:class:`MissingPatterns`, its rows too when it keeps them;
    :class:`StackedPatterns`, whose padding stays 0). Powers of two as
    factors divide exactly.

    Examples
    --------
    >>> X = np.array([[1.0, 2.0], [3.0, 6.0]])
    >>> s = columns_divided(sufficient_statistics(X), np.array([1.0, 2.0]))
    >>> s.mean.tolist(), s.scatter.tolist() == sufficient_statistics(X / [1.0, 2.0]).scatter.tolist()
    ([2.0, 2.0], True)
    """
    factor = np.asarray(factor, dtype=float)
    shift = np.zeros(factor.shape[-1]) if shift is None else np.asarray(shift, dtype=float)
    if isinstance(stats, SufficientStatistics):
        mean = (np.asarray(stats.mean) - shift) / factor
        return SufficientStatistics(stats.n, mean, np.asarray(stats.scatter) / np.outer(factor, factor))
    if isinstance(stats, StackedPatterns):
        mean = np.where(stats.observed, (stats.mean - shift) / factor, 0.0)
        return stats._replace(mean=mean, scatter=stats.scatter / np.outer(factor, factor))
    pairs = zip(stats.columns, stats.stats, strict=True)
    parts = tuple(columns_divided(s, factor[cols], shift[cols]) for cols, s in pairs)
    rows = None if stats.X is None else np.where(stats.observed, (np.asarray(stats.X) - shift) / factor, 0.0)
    return MissingPatterns(stats.columns, parts, stats.n_features, rows, stats.observed)


def sufficient_statistics(X: Any) -> SufficientStatistics:
    """Row count, column means and centred scatter matrix of complete data.

    Parameters
    ----------
    X : array-like of shape (n, d)
        No missing values (the Gaussian likelihood of data with missing
        entries does not reduce to one scatter matrix; see
        :func:`missing_patterns`).

    Returns
    -------
    SufficientStatistics

    Examples
    --------
    >>> stats = sufficient_statistics([[1.0, 2.0], [3.0, 6.0]])
    >>> int(stats.n), stats.mean.tolist(), stats.scatter.tolist()
    (2, [2.0, 4.0], [[2.0, 4.0], [4.0, 8.0]])
    """
    from bayespca.data import as_float_matrix

    arr = as_float_matrix(X, name="X")
    mean = arr.mean(axis=0)
    return SufficientStatistics(arr.shape[0], mean, centred_scatter(arr, mean))


@dataclass(frozen=True)
class MissingPatterns:
    """Rows grouped by their pattern of observed entries, as sufficient statistics.

    Attributes
    ----------
    columns : tuple of ndarray of int
        Observed columns of each pattern (largest group first).
    stats : tuple of SufficientStatistics
        ``(n_p, mean_p, scatter_p)`` of the observed block of the rows with
        that pattern.
    n_features : int
        ``d``.
    X, observed : ndarray or None
        The rows (NaN replaced by 0) and their mask, kept instead of the
        groups when there are more than ``max_patterns`` patterns (the
        likelihood is then a sum over rows).

    :mod:`bayespca.models` registers it as a JAX pytree whose numbers
    (``columns`` included) are leaves: compiled code that takes it as an
    argument serves every data set with the same number and sizes of
    patterns.
    """

    columns: tuple
    stats: tuple
    n_features: int
    X: np.ndarray | None = None
    observed: np.ndarray | None = None


class StackedPatterns(NamedTuple):
    """The statistics of :class:`MissingPatterns` padded to ``d`` features and stacked.

    ``observed[p]`` marks the columns of pattern ``p``; ``mean[p]`` and
    ``scatter[p]`` are its statistics there and 0 elsewhere. Code over the
    patterns is then one vectorized operation, whatever their number: a
    loop over a tuple of differently sized patterns compiles each
    pattern's code anew (a NUTS sampler took 22 s to compile with 13
    patterns, 51 s with 33).

    Attributes
    ----------
    observed : ndarray of bool, shape (P, d)
    n : ndarray of shape (P,)
        Rows per pattern (0 for padding).
    mean : ndarray of shape (P, d)
    scatter : ndarray of shape (P, d, d)
    """

    observed: Any
    n: Any
    mean: Any
    scatter: Any


def stack_patterns(patterns: MissingPatterns, multiple: int = 1) -> StackedPatterns:
    """:class:`StackedPatterns` of grouped patterns, their count padded up to a multiple of ``multiple``.

    Padding patterns have no rows and no observed column (they add 0 to
    every sum), so data sets whose pattern counts round to the same number
    share compiled code. NumPy in, NumPy out; traceable (JAX arrays in,
    ``columns`` included, give JAX arrays).

    Examples
    --------
    >>> p = stack_patterns(missing_patterns([[1.0, 2.0], [3.0, np.nan], [5.0, 6.0]]), multiple=4)
    >>> p.observed.tolist(), p.n.tolist(), p.mean[1].tolist()
    ([[True, True], [True, False], [False, False], [False, False]], [2.0, 1.0, 0.0, 0.0], [3.0, 0.0])
    """
    if patterns.X is not None:
        raise ValueError("The patterns keep their rows (too many to group): there is nothing to stack.")
    leaves = [*patterns.columns, *(a for s in patterns.stats for a in s)]
    xp = np
    if any(type(a).__module__.startswith("jax") for a in leaves):
        import jax.numpy as xp
    d, count = patterns.n_features, len(patterns.columns)
    size = max(multiple, -(-count // multiple) * multiple)
    # Pattern p's block goes to its columns through the rows of the identity that pick them.
    picks = [xp.eye(d)[cols] for cols in patterns.columns]
    empty = xp.zeros((size - count, d))
    observed = xp.concatenate([*(e.sum(axis=0) for e in picks), *empty]).reshape(size, d) > 0
    n = xp.concatenate([xp.asarray([s.n for s in patterns.stats], dtype=float), xp.zeros(size - count)])
    mean = xp.stack([*(s.mean @ e for s, e in zip(patterns.stats, picks, strict=True)), *empty])
    scatter = xp.stack([*(e.T @ s.scatter @ e for s, e in zip(patterns.stats, picks, strict=True)),
                        *xp.zeros((size - count, d, d))])
    return StackedPatterns(observed, n, mean, scatter)


def missing_patterns(X: Any, max_patterns: int = _MAX_PATTERNS) -> MissingPatterns:
    """Group the rows of ``X`` by which entries are observed (not NaN).

    Parameters
    ----------
    X : array-like of shape (n, d)
    max_patterns : int, default=64
        Above this many distinct patterns, keep the rows themselves.

    Returns
    -------
    MissingPatterns

    Examples
    --------
    >>> p = missing_patterns([[1.0, 2.0], [3.0, np.nan], [5.0, 6.0]])
    >>> [c.tolist() for c in p.columns], [int(s.n) for s in p.stats]
    ([[0, 1], [0]], [2, 1])
    """
    from bayespca.data import as_float_matrix

    arr = as_float_matrix(X, name="X", allow_nan=True)
    observed = ~np.isnan(arr)
    keys, inverse = np.unique(observed, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    d = arr.shape[1]
    if len(keys) > max_patterns:
        return MissingPatterns((), (), d, np.where(observed, arr, 0.0), observed)
    columns, stats = [], []
    for p in np.argsort(-np.bincount(inverse), kind="stable"):
        cols = np.flatnonzero(keys[p])
        if cols.size == 0:
            continue  # a row with nothing observed carries no information
        rows = arr[np.ix_(inverse == p, cols)]
        mean = rows.mean(axis=0)
        columns.append(cols)
        stats.append(SufficientStatistics(rows.shape[0], mean, centred_scatter(rows, mean)))
    return MissingPatterns(tuple(columns), tuple(stats), d)


def scatter_spectrum(stats: SufficientStatistics, n_components: int | None = None):
    """Leading singular triplets of the centred data from its scatter matrix alone.

    The right singular vectors and squared singular values of ``Xc`` are the
    eigenvectors and eigenvalues of ``Xc^T Xc``: what a backend that keeps
    the rows elsewhere (:mod:`bayespca.chunked`) can give the solvers.

    Returns
    -------
    bayespca.linalg.SVD
        ``scores`` None; signs by :func:`bayespca.linalg.flip_signs`.

    Examples
    --------
    >>> X = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    >>> scatter_spectrum(sufficient_statistics(X), 1).singular_values.round(6)
    array([2.])
    """
    from bayespca.linalg import SVD, eigh_top, flip_signs

    scatter = np.array(stats.scatter, dtype=float)
    r = min(int(stats.n), scatter.shape[0]) if n_components is None else n_components
    total_ss = float(np.trace(scatter))
    evals, evecs = eigh_top(scatter, r)
    components, _ = flip_signs(evecs[:, :r].T)
    return SVD(np.sqrt(evals[:r]), components, None, total_ss)


def power_of_two_above(top: float) -> float:
    """The smallest power of two above ``|top|`` (at most ``2^1023``, the largest finite one); 1 for 0.

    Dividing by it is exact and brings ``|top|`` into ``[0.5, 1)``: the
    coarse unit every working-unit computation starts from.

    Examples
    --------
    >>> power_of_two_above(3.0), power_of_two_above(4.0), power_of_two_above(0.0)
    (4.0, 8.0, 1.0)
    """
    top = abs(float(top))
    return math.ldexp(1.0, min(math.frexp(top)[1], 1023)) if top > 0 else 1.0


def power_of_two_scale(X: np.ndarray, observed: np.ndarray | None = None) -> float:
    """A power of two near the root mean square of the centred (observed) entries of ``X``.

    Computed without overflow or underflow for any finite data: ``X`` is
    first brought to ``[-1, 1]`` by the power of two above its largest
    magnitude. Constant data give 1 (nothing to scale).

    Examples
    --------
    >>> power_of_two_scale(np.array([[0.0], [3e-200], [6e-200]])) == 2.0**-663  # rms 2.45e-200
    True
    """
    values = X if observed is None else X[observed]
    top = float(np.max(np.abs(values))) if values.size else 0.0
    if top == 0.0:
        return 1.0
    coarse = power_of_two_above(top)
    counts = X.shape[0] if observed is None else np.maximum(observed.sum(axis=0), 1)
    centred = X / coarse if observed is None else np.where(observed, X / coarse, 0.0)
    # Centred twice (in place: one copy of X in all): the rounding of one pass's mean would read as
    # the spread of a constant column.
    for _ in range(2):
        centred -= centred.sum(axis=0) / counts
        if observed is not None:
            centred[~observed] = 0.0
    rms = math.sqrt(float(np.einsum("ij,ij->", centred, centred)) / max(values.size, 1))
    if rms == 0.0:
        return 1.0
    return math.ldexp(coarse, round(math.log2(rms)))


def check_representable(X: np.ndarray, observed: np.ndarray | None, scale: float, name: str = "X") -> None:
    """Refuse data whose variances overflow or underflow float64 (a ``ValueError`` naming a column).

    The fitted noise variances and covariances are in squared data units;
    outside ``2^-505 .. 2^505`` (about 1e-152 to 1e152) in spread, they are
    not representable, so no result in data units could be returned.
    """
    exponent = math.frexp(scale)[1] - 1
    if -_MAX_LOG2_SPREAD <= exponent <= _MAX_LOG2_SPREAD:
        return
    values = np.abs(np.where(observed, X, 0.0) if observed is not None else X)
    column = int(np.argmax(values.max(axis=0)))
    raise ValueError(
        f"{name} has a spread of about {scale:.3g} (e.g. column {column}); variances in these "
        f"units are not representable in float64. Accepted: data whose centred spread lies between "
        f"{math.ldexp(1.0, -_MAX_LOG2_SPREAD):.1e} and {math.ldexp(1.0, _MAX_LOG2_SPREAD):.1e}; "
        f"rescale {name} (the fitted model of X / c is that of X, with loadings and means divided "
        "by c and variances by c^2)."
    )


def log_scale_correction(n_observed: Any, scale: float) -> Any:
    """What to add to a log-density in working units to get it in data units: ``-n_obs log(scale)``.

    ``p_data(x) = p_working(x / s) / s^m`` for ``m`` observed entries.

    Examples
    --------
    >>> float(log_scale_correction(3, 2.0)) == -3 * math.log(2.0)
    True
    """
    return -np.asarray(n_observed, dtype=float) * math.log(scale)


@dataclass(frozen=True, eq=False)
class Prepared:
    """Validated data in working units, with the statistics fitters consume.

    Build it with :func:`prepare`. Statistics are computed on first use and
    kept.

    Attributes
    ----------
    data : ndarray of shape (n, d)
        The rows in data units (dense NumPy, Dask or scipy sparse); NaN
        marks a missing entry.
    missing : ndarray of bool (n, d) or None
        True where an entry is missing; None when nothing is.
    scale : float
        A power of two: data units = ``scale`` x working units.
    feature_names : ndarray of str or None
    """

    data: Any
    missing: np.ndarray | None
    scale: float = 1.0
    feature_names: np.ndarray | None = None

    @cached_property
    def X(self) -> Any:
        """The rows in working units ``data / scale`` (formed on first use: a fit from the
        statistics alone never copies the rows)."""
        return self.data if self.scale == 1.0 else self.data / self.scale

    @property
    def n(self) -> int:
        """Number of rows."""
        return int(self.data.shape[0])

    @property
    def d(self) -> int:
        """Number of features."""
        return int(self.data.shape[1])

    @property
    def observed(self) -> np.ndarray | None:
        """Mask of observed entries, or None when nothing is missing."""
        return None if self.missing is None else ~self.missing

    @cached_property
    def n_observed(self) -> np.ndarray:
        """Observed entries per column, shape (d,)."""
        if self.missing is None:
            return np.full(self.d, self.n)
        return self.n - self.missing.sum(axis=0)

    @cached_property
    def mean(self) -> np.ndarray:
        """Column means of the observed entries, shape (d,).

        Two passes: the second adds the mean of what the first leaves, so a
        constant column's mean is its value exactly and centring leaves 0
        (not its rounding, which far from 0 can exceed the spread of the data).
        """
        observed = None if self.missing is None else ~self.missing
        first = _observed_mean(self.X, observed, self.n_observed)
        with np.errstate(over="ignore", invalid="ignore"):
            if observed is None:
                return first + _centred_sum(self.X, first) / self.n
            return first + _observed_mean(self.X - first, observed, self.n_observed)

    @cached_property
    def variances(self) -> np.ndarray:
        """Column variances of the observed entries (denominator: observed count), shape (d,)."""
        centred = self.X - self.mean
        if self.missing is not None:
            centred = np.where(self.missing, 0.0, centred)
        return np.einsum("ij,ij->j", centred, centred) / self.n_observed

    @cached_property
    def stats(self) -> SufficientStatistics:
        """``(n, mean, scatter)`` of complete data (a ``ValueError`` with missing values)."""
        if self.missing is not None:
            raise ValueError(
                "The data have missing values: their likelihood does not reduce to one scatter "
                "matrix (use Prepared.patterns)."
            )
        return SufficientStatistics(self.n, self.mean, centred_scatter(self.X, self.mean))

    @cached_property
    def patterns(self) -> MissingPatterns:
        """Per-pattern statistics (:func:`missing_patterns`); one pattern for complete data."""
        if self.missing is None:
            return MissingPatterns((np.arange(self.d),), (self.stats,), self.d)
        return missing_patterns(self.X)

    @property
    def total_observed(self) -> int:
        """Number of observed entries."""
        return int(self.n_observed.sum())

    def to_data_units(self, loadings=None, noise=None, mean=None):
        """Map working-unit ``W`` (x scale), noise variances (x scale^2) and ``mu`` (x scale) back.

        Any argument may be None (returned as None); leading batch axes are kept.
        """
        s = self.scale
        return (
            None if loadings is None else np.asarray(loadings) * s,
            None if noise is None else np.asarray(noise) * s**2,
            None if mean is None else np.asarray(mean) * s,
        )


# Entries per block of rows when summing centred data: small enough to stay in a core's cache.
_CACHE_ENTRIES = 32_768


def _centred_sum(X: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Column sums of ``X - centre`` by blocks of rows (no centred copy of ``X``: at 100000 x 100
    the copy and the second pass over it cost as much as the scatter)."""
    rows = max(1, _CACHE_ENTRIES // max(1, X.shape[1]))
    total = np.zeros(X.shape[1])
    for start in range(0, X.shape[0], rows):
        total += (X[start : start + rows] - centre).sum(axis=0)
    return total


def _observed_mean(X: np.ndarray, observed: np.ndarray | None, counts: np.ndarray) -> np.ndarray:
    if observed is None:
        return X.mean(axis=0)
    return np.where(observed, X, 0.0).sum(axis=0) / counts


def prepare(
    X: Any,
    *,
    estimator: Any = None,
    allow_nan: bool = True,
    min_samples: int = 2,
    accept_sparse: bool = False,
) -> Prepared:
    """Validate training data once and bring it to working units.

    Validation is :func:`bayespca.data.validate_fit` (with an ``estimator``
    it records ``n_features_in_`` and ``feature_names_in_`` on it); then the
    power-of-two ``scale`` of :func:`power_of_two_scale` is divided out,
    after :func:`check_representable`.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        NaN marks a missing value (when ``allow_nan``). A Dask array is
        reduced by :func:`bayespca.chunked.prepare_chunked`, a scipy sparse
        matrix by :func:`bayespca.sparse_input.prepare_sparse` (no missing
        values; never densified).
    estimator : object, optional
        The estimator being fitted (named in messages, given the fitted
        feature attributes).
    allow_nan : bool, default=True
    min_samples : int, default=2
    accept_sparse : bool, default=False
        Whether scipy sparse input is taken (by the fitters that read only
        the statistics); otherwise it is a ``TypeError`` naming the estimator.

    Returns
    -------
    Prepared

    Examples
    --------
    >>> p = prepare([[1e-140, 3e-140], [2e-140, 1e-140], [4e-140, 2e-140]])
    >>> bool(0.5 <= np.sqrt(p.variances.mean()) <= 2), p.scale == 2.0 ** round(np.log2(p.scale))
    (True, True)
    """
    from bayespca.chunked import is_chunked

    if is_chunked(X):
        from bayespca.chunked import prepare_chunked

        return prepare_chunked(X, estimator=estimator, allow_nan=allow_nan, min_samples=min_samples)
    from bayespca.sparse_input import is_sparse, prepare_sparse

    if is_sparse(X) and accept_sparse:  # statistics from the sparse matrix, implicitly centred
        return prepare_sparse(X, estimator=estimator, min_samples=min_samples)
    from bayespca.data import validate_fit

    # Without an estimator, messages name the activity ("Fitting needs at least 2 samples").
    target = estimator if estimator is not None else type("Fitting", (), {})()
    data = validate_fit(target, X, allow_nan=allow_nan, min_samples=min_samples)
    arr, missing = data
    observed = None if missing is None else ~missing
    names = getattr(target, "feature_names_in_", None)
    quick = _moderate_statistics(arr, data.column_sums) if missing is None else None
    if quick is not None:
        scale, mean, stats = quick
        prepared = Prepared(arr, None, scale, names)
        prepared.__dict__.update(mean=mean, stats=stats)  # the cached properties, computed already
        return prepared
    scale = power_of_two_scale(arr, observed)
    check_representable(arr, observed, scale)
    return Prepared(arr, missing, scale, names)


# Mean squares of centred data within 2^-200 .. 2^200 (scales within 2^-100 .. 2^100): dividing
# by the scale then moves no value of the computation into or out of float64's subnormal or
# overflow range, so statistics computed in data units are those of the working units times
# powers of two, exactly.
_MODERATE = (math.ldexp(1.0, -200), math.ldexp(1.0, 200))


# A column whose sd is below this fraction of its mean's magnitude gets the second pass of the
# mean: the rounding of a one-pass mean (~1e-16 of it) then nears its spread (a constant column's
# centred values must be 0, not that rounding). Above, the second pass moves the scatter by less
# than 1e-26 of itself and costs a pass over X (100000 x 100: 11 ms of a 45 ms pPCA fit).
_SPREAD_BESIDE_MEAN = 1e-3


def _moderate_statistics(
    X: np.ndarray, column_sums: np.ndarray
) -> tuple[float, np.ndarray, SufficientStatistics] | None:
    """``(scale, mean, stats)`` in working units from one scatter of complete data in data units.

    The mean is ``column_sums / n`` (the validation's finiteness check
    formed the sums), refined by a second pass (:attr:`Prepared.mean`'s) for
    columns whose spread is small beside their mean. Scaling by a power of
    two commutes with every rounding, so the mean and scatter of ``X``
    divided by ``scale`` and ``scale^2`` are bit for bit those of
    ``X / scale``, and the scatter gives the root mean square of the centred
    entries that fixes ``scale``: no copy of ``X``, and most fits need the
    scatter anyway. None when ``d > n`` (the d x d scatter would cost more
    than the fit), or when the spread is 0 or extreme
    (:func:`power_of_two_scale` then scales first).
    """
    n, d = X.shape
    if d > n:
        return None
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        mean = column_sums / n
        scatter = centred_scatter(X, mean) if np.all(np.isfinite(mean)) else np.full((d, d), np.inf)
        if np.any(np.diag(scatter) < n * (_SPREAD_BESIDE_MEAN * mean) ** 2):
            mean = mean + _centred_sum(X, mean) / n
            scatter = centred_scatter(X, mean)
        mean_square = float(np.trace(scatter)) / X.size
    if not _MODERATE[0] < mean_square < _MODERATE[1]:  # constant data included (0 is not moderate)
        return None
    scale = math.ldexp(1.0, round(0.5 * math.log2(mean_square)))
    return scale, mean / scale, SufficientStatistics(n, mean / scale, scatter / scale**2)
