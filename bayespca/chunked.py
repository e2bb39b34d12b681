"""Data held in chunks by Dask: statistics by tree reduction, row-level work chunk by chunk.

A ``dask.array`` or ``dask.dataframe`` is prepared (:func:`prepare_chunked`)
into the same :class:`bayespca.statistics.Prepared` as in-memory data, so
every fitter that consumes statistics runs unchanged. Each pass over the
chunks is a tree reduction on whatever scheduler is active (a
``distributed.Client`` if the user made one, the threaded scheduler
otherwise) and brings only small summaries to the client:

1. *extent*: rows, largest magnitude per column (which sets the
   power-of-two scale), column sums (the centre), infinities, and the
   count of each pattern of observed entries;
2. *moments*: raw sums ``n``, ``sum y``, ``sum y y^T`` of the rows about a
   centre, ``y = (x - c) / unit`` (complete data), or of each pattern's
   observed block, and per-column sums of the observed entries. Raw sums
   merge by addition, and ``sum y y^T - n ybar ybar^T`` loses
   ``log10(1 + delta^2)`` digits when ``c`` is ``delta`` sds from the mean.

Complete data take one pass: the moments are summed beside the extent,
about the first block's column means rounded to a power of two at or below
their sd, and kept when no column's centre is more than 64 sds off
(``_CANCELLATION``; at most 3.6 digits lost). Missing values (whose
patterns must be known first) or a centre too far off (a store sorted by
a feature) take a second pass about the data's mean. On data whose sums
are exact (small integers, ``n`` a power of two) every chunking gives the
very bits of the in-memory path.

The rows stay a Dask array (in working units) for the row-level work:
:func:`rowwise` turns an estimator's NumPy method (``transform``,
``score_samples``, ...) into one that returns a lazy Dask array chunked
like its input.

"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from bayespca.messages import warn
from bayespca.statistics import (
    MissingPatterns,
    Prepared,
    SufficientStatistics,
    check_representable,
    power_of_two_above,
)

__all__ = [
    "MAX_IN_MEMORY_BYTES",
    "MAX_SCATTER_FEATURES",
    "Spectrum",
    "as_dask_matrix",
    "draws_log_likelihood",
    "in_memory",
    "is_chunked",
    "lazy_pointwise",
    "pca_spectrum",
    "prepare_chunked",
    "reduce_row_blocks",
    "rowwise",
    "sample_rows",
]

_MAX_PATTERNS = 64
_CANCELLATION = 2.0**12  # n ybar^2 / scatter_jj above which one-pass moments are taken again about the mean
#: Largest Dask array :func:`in_memory` brings to the client (bytes).
MAX_IN_MEMORY_BYTES = 2_000_000_000


def is_chunked(X: Any) -> bool:
    """Whether ``X`` is a Dask collection (checked by module name: Dask is not imported).

    Examples
    --------
    >>> is_chunked(np.zeros((2, 2)))
    False
    """
    return type(X).__module__.split(".")[0] in ("dask", "dask_expr")


def in_memory(X: Any, what: str) -> np.ndarray:
    """The rows as a NumPy array, for work that needs them all at once (``what``, named in messages).

    NumPy input is returned as it is. Dask input is computed (a scipy
    sparse matrix densified), with a ``UserWarning``: the rows then travel to the client, which the
    statistics-based paths avoid; beyond :data:`MAX_IN_MEMORY_BYTES` a
    ``ValueError`` says so instead.
    """
    if isinstance(X, np.ndarray):
        return X
    size = X.shape[0] * X.shape[1] * 8
    if size > MAX_IN_MEMORY_BYTES:
        raise ValueError(
            f"{what} needs all rows in memory, and X ({X.shape[0]} x {X.shape[1]}, {size / 1e9:.1f} GB) "
            f"is above the limit of {MAX_IN_MEMORY_BYTES / 1e9:.1f} GB "
            "(bayespca.chunked.MAX_IN_MEMORY_BYTES). Accepted on Dask input at that size: complete data "
            "with n_features <= n_samples (fitted from the reduced statistics)."
        )

    sparse = hasattr(X, "toarray")  # a scipy sparse matrix: densified, as a Dask array is computed
    warn(
        f"{what} needs all rows in memory: the {'sparse matrix' if sparse else 'Dask array'} "
        f"({X.shape[0]} x {X.shape[1]}) is "
        f"{'densified' if sparse else 'computed and brought to the client'}.",
        UserWarning,
    )
    return X.toarray() if sparse else np.asarray(X.compute(), dtype=float)


def as_dask_matrix(X: Any, name: str = "X") -> tuple[Any, np.ndarray | None]:
    """A float64 Dask array of ``X`` with known row chunks and one chunk of columns, and its column names.

    A ``dask.dataframe`` gives its string column names (numeric columns
    only); a Dask array of another real dtype is converted.
    """
    import dask.array as da

    names = None
    if hasattr(X, "columns") and hasattr(X, "dtypes"):
        from pandas.api.types import is_numeric_dtype

        bad = [str(c) for c, t in zip(X.columns, X.dtypes, strict=True) if not is_numeric_dtype(t)]
        if bad:
            raise TypeError(
                f"{name} has non-numeric columns {bad[:5]}; accepted: a Dask DataFrame of numeric columns. "
                "Encode or drop those columns first."
            )
        columns = list(X.columns)
        if columns and all(isinstance(c, str) for c in columns):
            names = np.asarray(columns, dtype=object)
        X = X.to_dask_array(lengths=True)
    if not isinstance(X, da.Array):
        raise TypeError(
            f"{name} is a {type(X).__name__}; accepted Dask input: a dask.array or dask.dataframe."
        )
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features); got a {X.ndim}-D Dask array.")
    if np.iscomplexobj(np.empty(0, X.dtype)) or X.dtype.kind not in "biuf":
        raise TypeError(f"{name} has dtype {X.dtype}; accepted: a Dask array of real numbers.")
    if any(math.isnan(c) for c in X.chunks[0]):
        X = X.compute_chunk_sizes()
    for axis, what in enumerate(("sample", "feature")):
        if X.shape[axis] == 0:
            raise ValueError(f"{name} has 0 {what}(s) (shape={X.shape}) while a minimum of 1 is required.")
    return X.astype(np.float64).rechunk({1: -1}), names


# ------------------------------------------------------------------ reductions
def _tree(parts: list, merge):
    """Merge delayed summaries pairwise, level by level (depth ``log2(len(parts))``)."""
    import dask

    merge = dask.delayed(merge, pure=True)
    while len(parts) > 1:
        pairs = range(0, len(parts), 2)
        parts = [merge(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in pairs]
    return parts[0]


def _blocks(X) -> list:
    return list(X.to_delayed().ravel())


def _reduce(X, block_fn, merge_fn):
    return reduce_row_blocks(block_fn, merge_fn, X)


def sample_rows(X: Any, size: int, rng: np.random.Generator, blocks: int = 4) -> np.ndarray:
    """``size`` rows of a Dask array drawn uniformly with replacement, computing ``blocks`` chunks at most.

    Chunks are picked with probability proportional to their rows, then
    each row from one of them at random: every row of ``X`` has probability
    ``1 / n`` per draw, and only the picked chunks are computed.
    """
    import dask

    counts = np.asarray(X.chunks[0])
    picked = rng.choice(counts.size, size=min(blocks, counts.size), p=counts / counts.sum())
    arrays = dask.compute(*[X.blocks[int(b), 0] for b in picked])
    which = rng.integers(len(arrays), size=size)
    out = np.empty((size, X.shape[1]))
    for j, block in enumerate(arrays):
        mine = which == j
        out[mine] = block[rng.integers(block.shape[0], size=int(mine.sum()))]
    return out


def reduce_row_blocks(block_fn, merge_fn, *arrays):
    """``block_fn`` of each block of rows, merged pairwise by ``merge_fn`` on the workers, computed.

    ``arrays`` are Dask arrays with the same row chunks and one chunk of
    columns; ``block_fn`` receives their blocks of the same rows, as NumPy
    arrays, and returns a summary that ``merge_fn`` combines (a tree
    reduction: only summaries travel).
    """
    import dask

    blocks = zip(*(_blocks(a) for a in arrays), strict=True)
    return dask.compute(_tree([dask.delayed(block_fn, pure=True)(*b) for b in blocks], merge_fn))[0]


def _add(a, b):
    """Sum of two summaries: numbers and arrays added, dicts merged key by key."""
    if isinstance(a, dict):
        out = dict(a)
        for key, value in b.items():
            out[key] = _add(out[key], value) if key in out else value
        return out
    if isinstance(a, tuple):
        return type(a)(*(_add(x, y) for x, y in zip(a, b, strict=True)))
    return a + b


class _Extent(NamedTuple):
    """Pass 1: what fixes the scale, the centre and the patterns."""

    n: int
    col_max: np.ndarray  # largest finite |x| per column
    n_inf: int
    col_sum: np.ndarray  # of the observed entries
    col_count: np.ndarray
    patterns: dict  # packed observed mask -> rows


def _block_extent(block: np.ndarray) -> _Extent:
    n, d = block.shape
    col_max = np.abs(block).max(axis=0, initial=0.0)
    if np.isfinite(col_max).all():  # the usual block: nothing missing, nothing infinite
        full = np.packbits(np.ones(d, bool)).tobytes()
        return _Extent(n, col_max, 0, block.sum(axis=0), np.full(d, n), {full: n} if n else {})
    nan = np.isnan(block)
    inf = np.isinf(block)
    finite = np.where(nan | inf, 0.0, block)
    col_max = np.abs(finite).max(axis=0, initial=0.0)
    return _Extent(n, col_max, int(inf.sum()), finite.sum(axis=0), n - nan.sum(axis=0), _pattern_counts(~nan))


def _pattern_counts(observed: np.ndarray) -> dict:
    """Rows per pattern of observed entries, keyed by the packed mask.

    The packed rows are compared as one fixed-width byte string each (a 1-D
    sort), which is many times faster than ``np.unique(axis=0)``'s
    lexicographic sort of the columns.
    """
    packed = np.ascontiguousarray(np.packbits(observed, axis=1))
    width = packed.shape[1]
    keys, counts = np.unique(packed.view(np.dtype((np.void, width))).ravel(), return_counts=True)
    return {bytes(k): int(c) for k, c in zip(keys, counts, strict=True)}


def _merge_extent(a: _Extent, b: _Extent) -> _Extent:
    return _add(a._replace(col_max=np.maximum(a.col_max, b.col_max)), b._replace(col_max=0.0))


class _Raw(NamedTuple):
    """Raw sums about a centre: rows, ``sum y``, ``sum y y^T`` (exact in any order for exact data)."""

    n: Any
    total: np.ndarray
    cross: np.ndarray


def _raw(y: np.ndarray) -> _Raw:
    return _Raw(y.shape[0], y.sum(axis=0), y.T @ y)


class _Moments(NamedTuple):
    """Pass 2, in units of ``unit`` about the centre ``c``."""

    columns: _Raw  # per column over its observed entries (cross: sums of squares)
    rows: _Raw | None  # complete data: of the whole rows
    patterns: dict  # packed mask -> _Raw of the observed block


def _block_moments(block: np.ndarray, unit: float, centre: np.ndarray, keys: tuple | None, rows: bool):
    y = (block - centre) / unit
    if keys is None:  # complete data
        n, d = y.shape
        if not rows:
            return _Moments(_Raw(np.full(d, n), y.sum(axis=0), np.einsum("ij,ij->j", y, y)), None, {})
        whole = _raw(y)
        return _Moments(_Raw(np.full(d, n), whole.total, np.diag(whole.cross).copy()), whole, {})
    observed = ~np.isnan(y)
    filled = np.where(observed, y, 0.0)
    columns = _Raw(observed.sum(axis=0), filled.sum(axis=0), np.einsum("ij,ij->j", filled, filled))
    packed = np.packbits(observed, axis=1)
    patterns = {}
    for key in keys:
        rows = np.all(packed == np.frombuffer(key, dtype=np.uint8), axis=1)
        if rows.any():
            cols = np.flatnonzero(observed[np.argmax(rows)])
            patterns[key] = _raw(y[np.ix_(rows, cols)])
    return _Moments(columns, None, patterns)


def _merge_moments(a: _Moments, b: _Moments) -> _Moments:
    return _Moments(_add(a.columns, b.columns), None if a.rows is None else _add(a.rows, b.rows),
                    _add(a.patterns, b.patterns))


def _rough_centre(block: np.ndarray) -> tuple[np.ndarray, float]:
    """A centre and a unit for the one-pass moments, from the first block.

    Each column's mean over the block's finite entries, rounded to a
    multiple of the power of two at or below its sd there (exact data stay
    exact about it), and the power of two above the block's largest finite
    magnitude.
    """
    ok = np.isfinite(block)
    count = np.maximum(ok.sum(axis=0), 1)
    mean = np.where(ok, block, 0.0).sum(axis=0) / count
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        sd = np.sqrt((np.where(ok, block - mean, 0.0) ** 2).sum(axis=0) / count)
        size = np.where(sd > 0, sd, np.abs(mean))
        step = np.exp2(np.floor(np.log2(size)))
        centre = np.round(mean / step) * step
    top = float(np.abs(np.where(ok, block, 0.0)).max(initial=0.0))
    unit = power_of_two_above(top)
    return np.where(np.isfinite(centre), centre, 0.0), unit


def _block_summary(block: np.ndarray, rough: tuple, rows: bool):
    """The extent of a block and, if it misses nothing, its moments about the rough centre."""
    ext = _block_extent(block)
    complete = ext.n_inf == 0 and bool(np.all(ext.col_count == ext.n))
    centre, unit = rough
    return ext, _block_moments(block, unit, centre, None, rows) if complete else None


def _merge_summary(a, b):
    moments = None if a[1] is None or b[1] is None else _merge_moments(a[1], b[1])
    return _merge_extent(a[0], b[0]), moments


def _first_pass(arr, rows: bool):
    """Extent and, for complete data, moments in one pass: ``(extent, moments or None, centre, unit)``."""
    import dask

    blocks = _blocks(arr)
    rough = dask.delayed(_rough_centre, pure=True)(blocks[0])
    parts = [dask.delayed(_block_summary, pure=True)(b, rough, rows) for b in blocks]
    (ext, moments), (centre, unit) = dask.compute(_tree(parts, _merge_summary), rough)
    return ext, moments, centre, unit


def _in_unit(moments: _Moments | None, ratio: float) -> _Moments | None:
    """One-pass moments moved to the final unit (``ratio``, a power of two), or None if they cancel.

    About a centre ``delta`` sds from the mean, ``sum y^2 - n ybar^2`` loses
    ``log10(1 + delta^2)`` digits; above ``_CANCELLATION`` the moments are
    taken again about the mean (as for a constant column the centre misses).
    """
    if moments is None or not 2.0**-500 <= ratio <= 2.0**500:
        return None
    cols = moments.columns
    mean = cols.total / cols.n
    ss = cols.cross - cols.n * mean**2
    with np.errstate(divide="ignore", invalid="ignore"):
        fine = np.where(ss > 0, cols.n * mean**2 <= _CANCELLATION * ss, mean == 0)
    if not (fine.all() and np.isfinite(cols.cross).all()):
        return None

    def scaled(raw):
        return None if raw is None else _Raw(raw.n, raw.total * ratio, raw.cross * ratio**2)

    return _Moments(scaled(cols), scaled(moments.rows), {})


def _centred(raw: _Raw, offset: np.ndarray, factor: float) -> SufficientStatistics:
    """``(n, mean, centred scatter)`` in working units from raw sums about ``-offset`` (``factor``: to them).

    ``scatter = sum y y^T - n ybar ybar^T``, the form of
    :func:`bayespca.linalg.centred_scatter`; about the data's mean (pass 1)
    it does not cancel.
    """
    mean = raw.total / raw.n
    scatter = raw.cross - raw.n * np.outer(mean, mean)
    return SufficientStatistics(raw.n, (offset + mean) * factor, scatter * factor**2)


# ------------------------------------------------------------------ prepare
def _check_extent(ext: _Extent, d: int, allow_nan: bool, min_samples: int, estimator: Any):
    """Named errors for data a NumPy array would be refused for; the ordered pattern keys (None: complete)."""
    if ext.n < min_samples:
        raise ValueError(
            f"X has {ext.n} sample{'s' if ext.n != 1 else ''} (n_samples = {ext.n}); "
            f"{type(estimator).__name__} needs at least {min_samples} samples."
        )
    if ext.n_inf:
        raise ValueError(
            "X contains infinity (inf); accepted: finite values"
            f"{' or NaN for missing entries' if allow_nan else ''}."
        )
    full = np.packbits(np.ones(d, bool)).tobytes()
    if set(ext.patterns) == {full}:
        return None
    if not allow_nan:
        raise ValueError(
            "X contains NaN; this estimator does not accept missing values. "
            "Use bayespca.PPCA or bayespca.FactorAnalysis, which model them, or impute first."
        )
    # The order of missing_patterns: np.unique's (lexicographic in the mask), then by decreasing count.
    keys = sorted(ext.patterns)
    order = np.argsort(-np.array([ext.patterns[k] for k in keys]), kind="stable")
    keys = [keys[i] for i in order]
    masks = np.unpackbits(np.frombuffer(b"".join(keys), np.uint8).reshape(len(keys), -1), axis=1, count=d)
    seen = masks.astype(bool).any(axis=0)
    if not seen.all():
        raise ValueError(
            f"X has features with no observed value (column indices {np.flatnonzero(~seen)[:10].tolist()}); "
            "drop them: nothing can be estimated for a feature that is never observed."
        )
    return np.array(keys, dtype=object)


def prepare_chunked(
    X: Any, *, estimator: Any, allow_nan: bool = True, min_samples: int = 2, scatter: bool = True
) -> Prepared:
    """:func:`bayespca.statistics.prepare` for a Dask array or dataframe: statistics by tree reduction.

    The :class:`~bayespca.statistics.Prepared` holds the rows as a lazy Dask
    array in working units (``missing`` its lazy NaN mask) and its
    statistics computed already: ``n_observed``, ``mean``, ``variances``,
    ``stats`` (complete data, unless ``scatter`` is False: the d x d sums
    are then not formed) and ``patterns`` (up to 64 patterns of
    observed entries; above that, the lazy rows, as
    :func:`bayespca.statistics.missing_patterns` keeps the rows).

    Examples
    --------
    >>> import dask.array as da
    >>> from bayespca.statistics import prepare
    >>> X = np.random.default_rng(0).normal(size=(100, 3))
    >>> p = prepare_chunked(da.from_array(X, chunks=30), estimator=None)
    >>> bool(np.allclose(p.stats.scatter, prepare(X).stats.scatter, rtol=1e-13))
    True
    """
    import dask.array as da

    target = estimator if estimator is not None else type("Fitting", (), {})()
    arr, names = as_dask_matrix(X)
    n, d = arr.shape
    ext, mom, centre, rough_unit = _first_pass(arr, scatter)
    keys = _check_extent(ext, d, allow_nan, min_samples, target)
    top = float(ext.col_max.max())
    unit = power_of_two_above(top)
    mom = _in_unit(mom, rough_unit / unit) if keys is None else None
    few = keys is not None and len(keys) <= _MAX_PATTERNS
    if mom is None:  # missing values, or the rough centre too far from the mean: a pass about the mean
        centre = ext.col_sum / ext.col_count
        # Above 64 patterns only the per-column moments are reduced (keys=()): the rows stay.
        block_keys = None if keys is None else tuple(keys) if few else ()
        block_fn = functools.partial(_block_moments, unit=unit, centre=centre, keys=block_keys, rows=scatter)
        mom = _reduce(arr, block_fn, _merge_moments)
    cols = mom.columns
    col_mean = cols.total / cols.n
    col_ss = cols.cross - cols.n * col_mean**2
    rms = math.sqrt(float(col_ss.sum()) / float(cols.n.sum()))
    scale = math.ldexp(unit, round(math.log2(rms))) if top > 0 and rms > 0 else 1.0
    check_representable(ext.col_max[None, :], None, scale)
    factor = unit / scale  # a power of two: moving the statistics to working units is exact
    offset = centre / unit
    target.n_features_in_ = d
    if names is not None:
        target.feature_names_in_ = names
    elif hasattr(target, "feature_names_in_"):
        del target.feature_names_in_
    missing = None if keys is None else da.isnan(arr)
    prepared = Prepared(arr, missing, scale, names)
    cache = prepared.__dict__  # the cached_property slots of Prepared, filled from the reduction
    cache["n_observed"] = cols.n.astype(int)
    cache["mean"] = (offset + col_mean) * factor
    cache["variances"] = col_ss * factor**2 / cols.n
    if keys is None and scatter:
        cache["stats"] = _centred(mom.rows, offset, factor)
    elif keys is not None and few:
        cache["patterns"] = _patterns(keys, mom.patterns, d, offset, factor)
    elif keys is not None:
        observed = ~missing
        cache["patterns"] = MissingPatterns((), (), d, da.where(observed, prepared.X, 0.0), observed)
    return prepared


def _patterns(keys, raws: dict, d: int, offset: np.ndarray, factor: float) -> MissingPatterns:
    columns, kept = [], []
    for key in keys:
        cols = np.flatnonzero(np.unpackbits(np.frombuffer(key, np.uint8), count=d))
        if cols.size == 0:
            continue  # a row with nothing observed carries no information
        columns.append(cols)
        kept.append(_centred(raws[key], offset[cols], factor))
    return MissingPatterns(tuple(columns), tuple(kept), d)


# ------------------------------------------------------------------ PCA
#: Above this many features PCA(solver="auto") on Dask input does not form the d x d scatter.
MAX_SCATTER_FEATURES = 2048
PCA_SOLVERS = ("auto", "covariance", "full", "randomized")


class Spectrum(NamedTuple):
    """What :func:`pca_spectrum` gives :class:`bayespca.PCA`.

    Attributes
    ----------
    svd : bayespca.linalg.SVD
        Of the centred (standardised) data, ``scores`` None.
    mean, scale : ndarray of shape (d,)
    k : int or None
        ``n_components`` as checked by the estimator.
    solver : str
    shape : tuple of int
    """

    svd: Any
    mean: np.ndarray
    scale: np.ndarray
    k: int | None
    solver: str
    shape: tuple


def pca_spectrum(estimator: Any, X: Any, check_params) -> Spectrum:
    """Principal axes of a Dask array or dataframe for :class:`bayespca.PCA`.

    Solvers: ``"covariance"``, eigenvectors of the d x d scatter from the
    tree reduction of :func:`prepare_chunked` (one pass, the default up to
    :data:`MAX_SCATTER_FEATURES` features); ``"full"``, the exact thin SVD
    by Dask's tall-skinny QR (``dask.array.linalg.svd``; each chunk needs at
    least d rows); ``"randomized"``, Dask's ``svd_compressed`` (power
    iterations, an integer ``n_components``; the default above that many
    features). ``"gram"`` (n x n) is refused. ``check_params(n, d)``
    validates the estimator's parameters against the shape first.
    """
    import dask
    import dask.array as da

    from bayespca.linalg import SVD, flip_signs
    from bayespca.params import check_choice
    from bayespca.statistics import scatter_spectrum

    arr, _ = as_dask_matrix(X)
    n, d = arr.shape
    k = check_params(n, d)
    solver = check_choice(estimator.solver, "solver (on Dask input)", PCA_SOLVERS)
    if solver == "auto":
        solver = "covariance" if d <= MAX_SCATTER_FEATURES else "randomized" if k else "full"
    if solver == "randomized" and not k:
        raise ValueError(
            f"solver='randomized' needs an integer n_components >= 1; got {estimator.n_components!r}. "
            "Use solver='covariance' or 'full'."
        )
    prepared = prepare_chunked(X, estimator=estimator, allow_nan=False, scatter=solver == "covariance")
    s = prepared.scale
    mean = prepared.mean * s
    scale = np.ones(d)
    if estimator.standardize:
        std = np.sqrt(prepared.variances * n / (n - 1)) * s
        scale = np.where(std > 0, std, 1.0)
    total_ss = float(np.sum(prepared.variances * n * s**2 / scale**2))
    centred = (arr - mean) / scale
    if solver == "covariance":
        stats = prepared.stats
        scatter = stats.scatter * s**2 / np.outer(scale, scale)
        svd = scatter_spectrum(SufficientStatistics(n, mean, scatter), k)
    else:
        if solver == "full":
            _, values, axes = da.linalg.svd(centred.rechunk({0: max(max(arr.chunks[0]), d)}))
        else:
            depth = estimator.n_power_iter
            if depth is None:
                depth = 3 if k < 0.1 * min(n, d) else 2
            seed = np.random.default_rng(estimator.random_state).integers(2**31)
            _, values, axes = da.linalg.svd_compressed(
                centred, k, n_power_iter=depth, n_oversamples=estimator.n_oversamples,
                seed=int(seed),
            )
        values, axes = dask.compute(values, axes)
        axes, _ = flip_signs(np.asarray(axes))
        svd = SVD(np.asarray(values), axes, None, total_ss)
    return Spectrum(svd, mean, scale, k, solver, (n, d))


# ------------------------------------------------------------------ posterior
def draws_log_likelihood(draws: Any, prepared: Prepared) -> np.ndarray:
    """Total log-likelihood of the data per posterior draw, shape (chain, draw), from the statistics.

    ``sum_i log p(x_i | W_s, Psi_s, mu_s)`` by
    :func:`bayespca.models.marginal_log_likelihood` on ``prepared.stats``
    (or its patterns), O(d^2 k) per draw whatever ``n``; draws in data
    units, moved to working units and back (``-n_obs log(scale)``).
    """
    from bayespca.models import draws_marginal_log_likelihood
    from bayespca.statistics import log_scale_correction

    stats = prepared.stats if prepared.missing is None else prepared.patterns
    s = prepared.scale
    g = draws.gaussians()
    working = (np.asarray(g.loadings) / s, np.asarray(g.noise) / s**2, np.asarray(g.mean) / s)
    totals = draws_marginal_log_likelihood(working, stats)
    totals = np.asarray(totals) + log_scale_correction(prepared.total_observed, s)
    return totals.reshape(draws.loadings.shape[:2])


def lazy_pointwise(draws: Any, X: Any) -> Any:
    """``log p(x_i | theta_s)`` per draw and row as a lazy Dask array (chain, draw, n), chunked like ``X``."""
    import dask
    import dask.array as da

    from bayespca.posterior import pointwise_log_likelihood

    arr, _ = as_dask_matrix(X)
    lead = draws.loadings.shape[:2]
    parts = [
        da.from_delayed(dask.delayed(pointwise_log_likelihood, pure=True)(draws, b), (*lead, rows), float)
        for b, rows in zip(_blocks(arr), arr.chunks[0], strict=True)
    ]
    return da.concatenate(parts, axis=2)


# ------------------------------------------------------------------ row-level work
def rowwise(*, width: str | None, named: bool = True, draws: bool = False, pair: str | None = None):
    """Decorate an estimator method ``method(self, X, ...)`` so that Dask input gives a lazy Dask result.

    The NumPy method runs on each chunk of rows (the fitted estimator
    travels with the task); the results are concatenated along the rows,
    chunked like ``X``. NumPy input runs the method as it is.

    Parameters
    ----------
    width : {"in", "out", None}
        The trailing dim of the result: ``"in"`` the fitted features
        (``n_features_in_``), ``"out"`` the estimator's output features, None
        one value per row.
    named : bool, default=True
        ``X`` has the fitted features (their names, if any, are checked once
        on the client and given to each chunk).
    draws : bool, default=False
        The method is ``sample_latent(X, num_samples, random_state)``: the
        result has a leading ``num_samples`` dim, and each chunk draws with
        its own stream spawned from ``random_state`` (so chunks are
        independent; each picks its own posterior draws of the parameters).
    pair : str or None
        A keyword which, when true, makes the method return two arrays of
        the result's shape (``impute``'s ``return_variance``).
    """

    def wrap(method):
        @functools.wraps(method)
        def run(self, X, *args, **kwargs):
            if not is_chunked(X):
                return method(self, X, *args, **kwargs)
            return _map_rows(method, self, X, (width, named, draws, pair), args, kwargs)

        return run

    return wrap


def _map_rows(method, estimator, X, how, args, kwargs):
    import dask
    import dask.array as da

    from bayespca.data import check_is_fitted
    from bayespca.params import as_generator

    width, named, draws, pair = how
    check_is_fitted(estimator)
    arr, names = as_dask_matrix(X)
    fitted = getattr(estimator, "feature_names_in_", None) if named else None
    if names is not None and fitted is not None and list(names) != list(fitted):
        raise ValueError(
            f"The feature names should match those that were passed during fit; got {list(names)[:5]}, "
            f"fitted {list(fitted)[:5]}."
        )
    cols = {"in": getattr(estimator, "n_features_in_", 0), "out": None, None: None}[width]
    if width == "out":
        cols = estimator.get_feature_names_out().size
    shape_lead, streams = (), None
    if draws:
        num_samples = kwargs.get("num_samples", args[0] if args else 100)
        shape_lead = (int(num_samples),)
        rng = as_generator(kwargs.pop("random_state", args[1] if len(args) > 1 else None))
        args = args[:1]
        streams = np.random.SeedSequence(int(rng.integers(2**63))).spawn(len(arr.chunks[0]))
    n_out = 2 if pair is not None and kwargs.get(pair, False) else 1

    def block(x, i):
        if fitted is not None:
            import pandas as pd

            x = pd.DataFrame(x, columns=fitted)
        extra = {} if streams is None else {"random_state": np.random.default_rng(streams[i])}
        out = method(estimator, x, *args, **kwargs, **extra)
        return out if n_out == 2 else (out,)

    parts = []
    for i, (part, rows) in enumerate(zip(_blocks(arr), arr.chunks[0], strict=True)):
        shape = (*shape_lead, rows) + (() if cols is None else (cols,))
        result = dask.delayed(block, pure=True, nout=n_out)(part, i)
        parts.append([da.from_delayed(result[j], shape, float) for j in range(n_out)])
    out = [da.concatenate([p[j] for p in parts], axis=len(shape_lead)) for j in range(n_out)]
    return tuple(out) if n_out == 2 else out[0]
