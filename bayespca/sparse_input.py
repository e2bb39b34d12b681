"""scipy.sparse input: validation, statistics and products with the implicitly centred matrix.

A sparse ``X`` (any ``scipy.sparse`` matrix or array: CSR, CSC, COO, ...)
is validated once into a CSR float64 copy and never densified as a whole:
centring would fill in every zero. The centred matrix ``Xc = X - 1 m^T``
enters only through

* its scatter ``Xc^T Xc = X^T X - n m m^T`` (d x d, from the sparse product),
* its Gram matrix ``Xc Xc^T = X X^T - (X m) 1^T - 1 (X m)^T + (m^T m) 1 1^T`` (n x n),
* products ``Xc B = X B - 1 (m^T B)`` and ``Xc^T A = X^T A - m (1^T A)``
  (:func:`bayespca.linalg.svd_randomized`),

so memory stays at the nonzeros plus what the solver itself holds. Per-row
work (``transform``, ``score_samples``) densifies one block of rows at a
time (:func:`map_row_blocks`). Sparse input cannot mark missing values:
an implicit zero is an observed zero, and NaN among the stored values is
refused.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse

__all__ = [
    "SPARSE_ESTIMATORS",
    "as_sparse_matrix",
    "choose_sparse_solver",
    "is_sparse",
    "map_row_blocks",
    "prepare_sparse",
    "sparse_means",
    "sparse_working_units",
    "standardized_sparse",
]

#: What accepts sparse input, named in the message that refuses it elsewhere.
SPARSE_ESTIMATORS = (
    "PCA (solvers covariance, gram, randomized), PPCA and FactorAnalysis (methods closed_form, em) "
    "and KernelPCA(kernel='linear')"
)
# Above this smaller side, an integer n_components on sparse input is found by the randomized solver.
_MAX_DENSE_SIDE = 2048
# Rows densified at once by the per-row methods: 512 rows x 10^5 features is 400 MB at most.
_BLOCK_ROWS = 512


def is_sparse(X: Any) -> bool:
    """Whether ``X`` is a scipy sparse matrix or array.

    Examples
    --------
    >>> is_sparse(scipy.sparse.eye(2, format="csr")), is_sparse(np.eye(2))
    (True, False)
    """
    return scipy.sparse.issparse(X)


def as_sparse_matrix(X: Any, name: str = "X", min_columns: int = 1) -> scipy.sparse.csr_array:
    """A validated CSR float64 copy of a sparse ``X`` (duplicates summed).

    Raises
    ------
    ValueError
        Not 2-D, no rows or columns, complex values, infinity, or NaN
        (sparse input has no missing values: an implicit zero is observed).
    TypeError
        A non-numeric dtype.

    Examples
    --------
    >>> X = as_sparse_matrix(scipy.sparse.csc_matrix([[0, 2], [1, 0]]))
    >>> X.format, X.dtype, X.toarray().tolist()
    ('csr', dtype('float64'), [[0.0, 2.0], [1.0, 0.0]])
    """
    kind = X.dtype.kind
    if kind == "c":
        raise ValueError(f"Complex data not supported: {name} has dtype {X.dtype}; accepted: real numbers.")
    if kind not in "biuf":
        raise TypeError(f"{name} is a sparse matrix of dtype {X.dtype}; accepted: a real numeric dtype.")
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features); got a {X.ndim}-D sparse array.")
    for axis, what in enumerate(("sample", "feature") if name == "X" else ("row", "column")):
        if X.shape[axis] < (1 if axis == 0 else min_columns):
            raise ValueError(f"{name} has 0 {what}(s) (shape={X.shape}) while a minimum of 1 is required.")
    csr = scipy.sparse.csr_array(X, dtype=np.float64, copy=True)
    csr.sum_duplicates()
    data = csr.data
    if not np.isfinite(data).all():
        if np.isnan(data).any():
            raise ValueError(
                f"{name} is sparse and stores NaN; sparse input cannot mark missing values (an implicit "
                f"zero is an observed zero). Accepted: finite stored values. Pass a dense array with NaN "
                "for missing entries, or impute first."
            )
        raise ValueError(f"{name} contains infinity (inf); accepted: finite values.")
    return csr


def sparse_means(X: scipy.sparse.csr_array) -> tuple[np.ndarray, float, float]:
    """Column means, ``max|X|`` over all columns and over the varying ones.

    The sparse counterpart of :func:`bayespca.linalg.exact_means`: a
    constant column (its smallest and largest entry agree, implicit zeros
    included) gets its value as its mean, exactly.

    Examples
    --------
    >>> X = as_sparse_matrix(scipy.sparse.csr_matrix([[0.1, 0.0, 3.0], [0.1, 0.0, -1.0]]))
    >>> mean, top, varying = sparse_means(X)
    >>> mean.tolist(), top, varying
    ([0.1, 0.0, 1.0], 3.0, 3.0)
    """
    n = X.shape[0]
    mean = np.asarray(X.sum(axis=0)).ravel() / n
    low = X.min(axis=0).toarray().ravel()
    high = X.max(axis=0).toarray().ravel()
    constant = low == high
    mean[constant] = high[constant]
    magnitude = np.maximum(high, -low)
    top = float(magnitude.max(initial=0.0))
    varying_top = float(magnitude[~constant].max(initial=0.0))
    return mean, top, varying_top


def _centred_sum_squares(X: scipy.sparse.csr_array, mean: np.ndarray) -> np.ndarray:
    """Per-column ``sum_i (x_ij - m_j)^2`` as ``sum x^2 - n m^2`` (clipped at 0)."""
    squares = np.bincount(X.indices, weights=X.data**2, minlength=X.shape[1])
    return np.maximum(squares - X.shape[0] * mean**2, 0.0)


def sparse_working_units(
    X: scipy.sparse.csr_array, mean: np.ndarray, top: float, safe_log2: int | None = None
) -> tuple[scipy.sparse.csr_array, float, np.ndarray]:
    """``(X / unit, unit, mean / unit)``; with ``safe_log2``, only for data outside ``2^+-safe_log2``.

    The sparse counterpart of the dense working units of :class:`bayespca.PCA`:
    ``unit`` a power of two near the root mean square of the centred
    entries (dividing by it is exact); the data stay uncentred (centring
    would fill in the zeros). Data in the safe band come back as they are.
    """
    from bayespca.statistics import check_representable, power_of_two_above

    if top == 0.0 or (safe_log2 is not None and 2.0**-safe_log2 <= top <= 2.0**safe_log2):
        return X, 1.0, mean
    coarse = power_of_two_above(top)
    unit_x, unit_mean = X / coarse, mean / coarse
    rms = math.sqrt(float(_centred_sum_squares(unit_x, unit_mean).sum()) / (X.shape[0] * X.shape[1]))
    unit = coarse if rms == 0.0 else math.ldexp(coarse, round(math.log2(rms)))
    column_top = np.abs(X).max(axis=0).toarray()
    check_representable(column_top.reshape(1, -1), None, unit)
    return X / unit, unit, mean / unit


def choose_sparse_solver(n_samples: int, n_features: int, n_components: int | None) -> str:
    """The solver ``PCA(solver="auto")`` uses on sparse input.

    Randomized (products with the sparse matrix only, O(nnz (k + 10)) per
    pass) for an integer ``k`` with ``k + 10 <= m / 4`` once the smaller
    side ``m = min(n, d)`` exceeds 2048, where an m x m dense matrix would
    cost more than the products; otherwise the eigendecomposition of the
    smaller of the d x d scatter (covariance) and the n x n Gram matrix.
    Never "full": the centred matrix is dense.

    Examples
    --------
    >>> choose_sparse_solver(10**6, 10**5, 5), choose_sparse_solver(10**4, 50, 5)
    ('randomized', 'covariance')
    >>> choose_sparse_solver(50, 10**4, None)
    'gram'
    """
    m = min(n_samples, n_features)
    if n_components is not None and m > _MAX_DENSE_SIDE and n_components + 10 <= m / 4:
        return "randomized"
    return "covariance" if n_features <= n_samples else "gram"


def standardized_sparse(X: scipy.sparse.csr_array, mean: np.ndarray):
    """``(X diag(1/s), mean / s, s, max|Xs - mean / s|)``, ``s`` the column standard deviations (ddof 1).

    Sparsity is kept. Constant columns keep scale 1 and become exactly 0
    (their mean too), as :func:`bayespca.linalg.standardized` makes them;
    the last value is the largest magnitude of the standardized centred
    data (the rounding floor of :func:`bayespca.linalg.drop_rounding`).
    """
    n = X.shape[0]
    std = np.sqrt(_centred_sum_squares(X, mean) / max(n - 1, 1))
    low = X.min(axis=0).toarray().ravel()
    high = X.max(axis=0).toarray().ravel()
    varying = (low != high) & (std > 0)
    scale = np.where(varying, std, 1.0)
    inverse = np.where(varying, 1.0 / scale, 0.0)
    scaled = scipy.sparse.csr_array(X @ scipy.sparse.diags_array(inverse))
    scaled.eliminate_zeros()
    centre = mean * inverse
    magnitude = float(np.max(np.maximum(high * inverse - centre, centre - low * inverse), initial=0.0))
    return scaled, centre, scale, magnitude


def map_row_blocks(fn, X: scipy.sparse.csr_array, block_rows: int = _BLOCK_ROWS) -> np.ndarray:
    """``fn`` on the dense rows of ``X``, one block of ``block_rows`` at a time, results stacked.

    Examples
    --------
    >>> X = scipy.sparse.csr_array(np.arange(6.0).reshape(3, 2))
    >>> map_row_blocks(lambda rows: rows.sum(axis=1), X, block_rows=2).tolist()
    [1.0, 5.0, 9.0]
    """
    parts = [fn(X[start : start + block_rows].toarray()) for start in range(0, X.shape[0], block_rows)]
    return np.concatenate(parts, axis=0)


def prepare_sparse(X: Any, *, estimator: Any = None, min_samples: int = 2):
    """:func:`bayespca.statistics.prepare` for sparse input: statistics from the sparse matrix.

    The :class:`~bayespca.statistics.Prepared` holds the rows as a CSR
    matrix in working units (``missing`` None) and its ``mean`` and
    ``variances`` computed already; ``stats`` (the d x d scatter
    ``X^T X - n m m^T`` from the sparse product, by
    :func:`bayespca.linalg.centred_scatter`) on first use. The closed form
    and EM with ``d <= n`` run from the statistics and never see a dense row.

    Examples
    --------
    >>> from bayespca.statistics import prepare
    >>> X = scipy.sparse.random(50, 4, density=0.3, random_state=0, format="csr")
    >>> p = prepare(X, accept_sparse=True)
    >>> bool(np.allclose(p.stats.scatter, prepare(X.toarray()).stats.scatter, rtol=1e-12))
    True
    """
    from bayespca.data import validate_fit
    from bayespca.statistics import Prepared

    target = estimator if estimator is not None else type("Fitting", (), {})()
    arr = validate_fit(target, X, min_samples=min_samples, accept_sparse=True).X
    n, d = arr.shape
    mean, top, _ = sparse_means(arr)
    # The power of two of bayespca.statistics.power_of_two_scale: rms of the centred entries.
    working, scale, mean = sparse_working_units(arr, mean, top)
    prepared = Prepared(arr, None, scale, None)
    cache = prepared.__dict__  # the cached_property slots of Prepared, filled from the sparse matrix
    cache["X"] = working
    cache["n_observed"] = np.full(d, n)
    cache["mean"] = mean
    cache["variances"] = _centred_sum_squares(working, mean) / n
    return prepared
