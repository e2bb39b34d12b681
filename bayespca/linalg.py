"""Dense linear algebra for PCA: the four SVD solvers, the choice among them, and the sign convention.

Each solver returns the leading singular triplets of the *centred* data
matrix ``Xc = X - 1 mean^T`` without forming it when it does not have to:

========== ========================================= ==========================
solver     computes                                  cost (flops, leading term)
========== ========================================= ==========================
full       thin SVD of ``Xc`` (LAPACK gesdd)         ~ 4 n d min(n, d)
covariance eigh of the scatter ``Xc^T Xc`` (d x d)   n d^2 + ~4 d^3
gram       eigh of the Gram matrix ``Xc Xc^T`` (n x n) n^2 d + ~4 n^3
randomized block Krylov (Musco & Musco) of depth q     2 (3q + 2) n d (k + p)
           on a Gaussian sketch, then a small SVD
========== ========================================= ==========================

The covariance and Gram solvers square the condition number: an eigenvalue
``lambda_j`` of the scatter matrix is accurate to about ``eps * lambda_1``
in absolute terms, so singular values far below ``sqrt(eps) * s_1`` lose
relative accuracy (the full SVD keeps ``eps * s_1``). The randomized solver is
accurate to machine precision when the spectrum decays well past ``k + p``;
on flat spectra its error shrinks geometrically with the depth ``q``
(Halko et al. 2011; Musco & Musco 2015).

All solvers finish with :func:`flip_signs`, so their output is the same up
to rounding whichever one ran. They run on NumPy's LAPACK and BLAS only:
NumPy and SciPy each load their own OpenBLAS with its own thread pool, and a
fit that alternates between them (a matrix product in one, an
eigendecomposition in the other) leaves one pool's threads spinning while
the other's work, which on a small machine made PCA several times slower.

:func:`choose_solver` picks the cheapest solver by a flop count,
:func:`decompose` runs the one chosen, and :func:`drop_rounding`
sets singular values that are rounding noise to exactly zero, with a fixed
orthonormal completion as their directions, so that rank-deficient and
constant data have one answer whichever solver ran.

References
----------
N. Halko, P.-G. Martinsson, J. A. Tropp (2011). Finding structure with
randomness: probabilistic algorithms for constructing approximate matrix
decompositions. SIAM Review 53(2), 217-288.
C. Musco, C. Musco (2015). Randomized block Krylov methods for stronger and
faster approximate singular value decomposition. NeurIPS 28.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg
import scipy.sparse

from bayespca.params import as_generator
from bayespca.sparse_input import choose_sparse_solver, sparse_means, standardized_sparse

__all__ = [
    "SOLVERS",
    "SVD",
    "Decomposition",
    "centred_gram",
    "centred_scatter",
    "centred_sum_squares",
    "choose_solver",
    "column_scales",
    "complete_basis",
    "decompose",
    "drop_rounding",
    "eigh_top",
    "exact_means",
    "flip_signs",
    "standardized",
    "svd_covariance",
    "svd_full",
    "svd_gram",
    "svd_randomized",
]

#: Solver names accepted by :func:`decompose` (and ``PCA(solver=...)``).
SOLVERS = ("auto", "full", "covariance", "gram", "randomized")

# Rows per block when forming the centred scatter matrix: the centred block
# stays in cache, so centring costs no extra pass over X in memory.
_BLOCK_ROWS = 4096

# Relative speeds of the kernels behind each solver, in flops per second
# relative to a matrix product (measured with benchmarks/bench_pca.py on the
# 2-core reference machine; only their ratios matter).
_EIGH_COST = 6.0  # full symmetric eigendecomposition, per size^3
_RANDOMIZED_MIN_SIZE = 500
# Above this size, a few leading eigenpairs are computed alone (see _eigh_descending).
_SUBSET_MIN_SIZE = 1000


class SVD(NamedTuple):
    """Leading singular triplets of a centred data matrix.

    Attributes
    ----------
    singular_values : ndarray of shape (r,)
        Descending, non-negative.
    components : ndarray of shape (r, d)
        Right singular vectors as rows (orthonormal).
    scores : ndarray of shape (n, r) or None
        ``U * singular_values`` (the projected data) when the solver gets it
        for free, else None.
    total_ss : float
        Total sum of squares of the centred data, ``|Xc|_F^2`` (the sum of
        all squared singular values, including those not returned).
    """

    singular_values: np.ndarray
    components: np.ndarray
    scores: np.ndarray | None
    total_ss: float


def flip_signs(components: np.ndarray, scores: np.ndarray | None = None):
    """Make the largest-magnitude entry of each component positive.

    This is scikit-learn's ``svd_flip(u_based_decision=False)`` rule, and it
    makes every solver give the same signs. Entries within ``1e-9`` (relative)
    of the largest count as tied and the first of them decides: axes such as
    ``(1, -1) / sqrt(2)`` would otherwise take their sign from rounding, and
    differ between solvers, scales and calls.

    Parameters
    ----------
    components : ndarray of shape (r, d)
    scores : ndarray of shape (n, r), optional
        Flipped together with the components so that ``scores @ components``
        is unchanged.

    Returns
    -------
    components, scores : ndarrays (scores is None if not given)

    Examples
    --------
    >>> flip_signs(np.array([[0.6, -0.8]]))[0]
    array([[-0.6,  0.8]])
    >>> flip_signs(np.array([[-0.7071067811865475, 0.7071067811865476]]))[0]  # tied: the first decides
    array([[ 0.70710678, -0.70710678]])
    """
    if components.shape[0] == 0 or components.shape[1] == 0:
        return components, scores
    magnitude = np.abs(components)
    idx = np.argmax(magnitude >= (1.0 - 1e-9) * magnitude.max(axis=1, keepdims=True), axis=1)
    signs = np.sign(components[np.arange(components.shape[0]), idx])
    signs[signs == 0] = 1.0
    components = components * signs[:, None]
    if scores is not None:
        scores = scores * signs[None, :]
    return components, scores


def _cancels(centred_sq: np.ndarray, mean_sq: np.ndarray) -> bool:
    """Whether ``sum x^2 - n mean^2`` lost more than 3 digits (centred part < 1e-3 of the mean part)."""
    return bool(np.any(centred_sq < 1e-3 * mean_sq))


def _centred_block(X, start: int, mean: np.ndarray) -> np.ndarray:
    """Rows ``start .. start + _BLOCK_ROWS`` of ``X - mean``, dense (one block of a sparse X at a time)."""
    block = X[start : start + _BLOCK_ROWS]
    return (block.toarray() if scipy.sparse.issparse(block) else block) - mean


def centred_scatter(X, mean: np.ndarray) -> np.ndarray:
    """Scatter matrix ``(X - mean)^T (X - mean)`` of shape (d, d); ``X`` dense or scipy sparse.

    Computed as ``X^T X - n mean mean^T`` (one BLAS ``syrk``, no copy of X)
    unless that cancels or overflows: when a feature's spread is below ~3%
    of its mean (more than 3 of 16 digits lost), or ``X^T X`` exceeds
    float64, the data are centred block by block instead, which is as
    accurate as centring X first without copying it. A sparse ``X`` gives
    ``X^T X`` from the sparse product (implicit centring).

    Examples
    --------
    >>> X = np.array([[1.0, 2.0], [3.0, 6.0]])
    >>> centred_scatter(X, X.mean(0))
    array([[2., 4.],
           [4., 8.]])
    """
    n, d = X.shape
    with np.errstate(over="ignore", invalid="ignore"):
        scatter = X.T @ X
        scatter = scatter.toarray(order="C") if scipy.sparse.issparse(scatter) else scatter
        scatter -= n * np.outer(mean, mean)
    if np.all(np.isfinite(scatter)) and not _cancels(np.diag(scatter), n * mean**2):
        return scatter
    scatter = np.zeros((d, d))
    for start in range(0, n, _BLOCK_ROWS):
        block = _centred_block(X, start, mean)
        scatter += block.T @ block
    return scatter


def centred_gram(X, mean: np.ndarray) -> np.ndarray:
    """Gram matrix ``(X - mean)(X - mean)^T`` of shape (n, n) of a scipy sparse ``X``, implicitly centred.

    ``X X^T - (X m) 1^T - 1 (X m)^T + (m^T m) 1 1^T`` from the sparse
    product; when that cancels (a row's spread below ~3% of the mean's
    part, as :func:`centred_scatter` judges) one side is centred a block
    of rows at a time instead: ``G[:, b] = X C_b^T - 1 (C_b m)^T``.

    Examples
    --------
    >>> X = scipy.sparse.csr_array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    >>> bool(np.allclose(centred_gram(X, np.array([1.0, 2.0]) / 3), (X - X.mean(0)) @ (X - X.mean(0)).T))
    True
    """
    n = X.shape[0]
    xm = X @ mean
    mm = float(mean @ mean)
    with np.errstate(over="ignore", invalid="ignore"):
        gram = (X @ X.T).toarray(order="C")
        gram -= xm[:, None]
        gram -= xm[None, :]
        gram += mm
    if np.all(np.isfinite(gram)) and not _cancels(np.diag(gram), np.full(n, mm)):
        return gram
    for start in range(0, n, _BLOCK_ROWS):
        block = _centred_block(X, start, mean)
        gram[:, start : start + _BLOCK_ROWS] = X @ block.T - (block @ mean)[None, :]
    return gram


def centred_sum_squares(X, mean: np.ndarray) -> float:
    """``|X - mean|_F^2`` without copying X (block-wise centring only when the fast form cancels).

    Examples
    --------
    >>> centred_sum_squares(np.array([[1.0, 2.0], [3.0, 6.0]]), np.array([2.0, 4.0]))
    10.0
    """
    n = X.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        squares = float(X.data @ X.data) if scipy.sparse.issparse(X) else float(np.einsum("ij,ij->", X, X))
        total = squares - n * float(mean @ mean)
    if np.isfinite(total) and not _cancels(np.array([total]), np.array([n * float(mean @ mean)])):
        return total
    total = 0.0
    for start in range(0, n, _BLOCK_ROWS):
        block = _centred_block(X, start, mean)
        total += float(np.einsum("ij,ij->", block, block))
    return total


def complete_basis(rows: np.ndarray, n_missing: int) -> np.ndarray:
    """``n_missing`` orthonormal rows orthogonal to the orthonormal ``rows`` (shape (r, d)).

    The directions of zero singular values (or eigenvalues) are arbitrary;
    they are taken from a Gaussian matrix with a fixed seed, projected off
    ``rows`` and orthonormalised, so that the same ``rows`` always get the
    same completion, on any solver and any call.

    Examples
    --------
    >>> rows = np.array([[1.0, 0.0, 0.0]])
    >>> extra = complete_basis(rows, 2)
    >>> bool(np.allclose(np.vstack([rows, extra]) @ np.vstack([rows, extra]).T, np.eye(3)))
    True
    """
    d = rows.shape[1]
    # Drawn row by row, so the first m rows do not depend on n_missing >= m: completing
    # 2 or 4 directions gives the same first 2 (QR keeps the span of leading columns).
    gauss = np.random.default_rng(0).standard_normal((n_missing, d)).T
    gauss -= rows.T @ (rows @ gauss)
    q, _ = np.linalg.qr(gauss)
    q -= rows.T @ (rows @ q)  # one re-orthogonalisation pass
    q, _ = np.linalg.qr(q)
    return q.T


def svd_full(X: np.ndarray, mean: np.ndarray) -> SVD:
    """Thin SVD of the centred data (all ``min(n, d)`` triplets, most accurate).

    Examples
    --------
    >>> X = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    >>> svd_full(X, X.mean(0)).singular_values.round(6)
    array([2., 0.])
    """
    u, s, vt = np.linalg.svd(X - mean, full_matrices=False)
    vt, scores = flip_signs(vt, u * s)
    return SVD(s, vt, scores, float(np.sum(s**2)))


def eigh_top(matrix: np.ndarray, n_components: int | None, *, clip: bool = True, overwrite: bool = False):
    """Leading eigenpairs of a symmetric matrix, descending, eigenvalues clipped at zero if ``clip``.

    Clipping is for PSD matrices, whose negative eigenvalues are rounding.
    Only the requested ``n_components`` pairs are computed (LAPACK ``evr``).
    ``matrix`` is left as it is unless ``overwrite`` (then LAPACK may use it
    as work space: only for a temporary; a column-major matrix is otherwise
    overwritten in place). ``evr`` can return fewer pairs than asked (it
    does on matrices with a highly multiple eigenvalue, such as a centred
    identity); the full divide-and-conquer ``evd`` then runs on a copy.

    Examples
    --------
    >>> eigh_top(np.diag([1.0, 3.0, 2.0]), 2)[0]
    array([3., 2.])
    """
    size = matrix.shape[0]
    if n_components == 0:
        return np.zeros(0), np.zeros((size, 0))
    if n_components is None or n_components >= size:
        evals, evecs = scipy.linalg.eigh(matrix, check_finite=False, overwrite_a=overwrite, driver="evd")
    else:
        saved = matrix.copy() if overwrite else matrix
        evals, evecs = scipy.linalg.eigh(
            matrix,
            subset_by_index=(size - n_components, size - 1),
            check_finite=False,
            overwrite_a=overwrite,
            driver="evr",
        )
        if evals.shape[0] < n_components:
            evals, evecs = scipy.linalg.eigh(saved, check_finite=False, overwrite_a=True, driver="evd")
            evals, evecs = evals[size - n_components :], evecs[:, size - n_components :]
    evals = evals[::-1]
    return (np.clip(evals, 0.0, None) if clip else evals), evecs[:, ::-1]


def _eigh_descending(matrix: np.ndarray, r: int):
    """The ``r`` leading eigenpairs of a PSD matrix, descending.

    By NumPy's LAPACK (see the module docstring), except for a few pairs of
    a large matrix: there computing only those (SciPy's ``evr``,
    :func:`eigh_top`) saves more than a second thread pool costs.
    """
    size = matrix.shape[0]
    if size > _SUBSET_MIN_SIZE and r < size // 4:
        return eigh_top(matrix, r)
    evals, evecs = np.linalg.eigh(matrix)
    return np.clip(evals[::-1][:r], 0.0, None), evecs[:, ::-1][:, :r]


def svd_covariance(X: np.ndarray, mean: np.ndarray, n_components: int | None = None) -> SVD:
    """Leading triplets from the eigendecomposition of the d x d scatter matrix.

    Fast when ``n >> d``; the scores are not computed.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    mean : ndarray of shape (d,)
    n_components : int, optional
        Number of triplets; all ``min(n, d)`` when None.

    Examples
    --------
    >>> X = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    >>> svd_covariance(X, X.mean(0), 1).singular_values.round(6)
    array([2.])
    """
    n, d = X.shape
    r = min(n, d) if n_components is None else n_components
    scatter = centred_scatter(X, mean)
    total_ss = float(np.trace(scatter))
    evals, evecs = _eigh_descending(scatter, r)
    components, _ = flip_signs(evecs.T)
    return SVD(np.sqrt(evals), components, None, total_ss)


def svd_gram(X: np.ndarray, mean: np.ndarray, n_components: int | None = None) -> SVD:
    """Leading triplets from the eigendecomposition of the n x n Gram matrix.

    Fast when ``d >> n`` (the "snapshot" trick): with ``G = Xc Xc^T = U S^2 U^T``
    the right singular vectors are ``V = Xc^T U S^{-1}``. Directions of zero
    singular values are completed to an orthonormal set.

    Examples
    --------
    >>> X = np.array([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [2.0, 2.0, 1.0]])
    >>> svd_gram(X, X.mean(0), 1).components.round(6) + 0.0
    array([[0.707107, 0.707107, 0.      ]])
    """
    n, d = X.shape
    r = min(n, d) if n_components is None else n_components
    sparse = scipy.sparse.issparse(X)
    xc = None if sparse else X - mean  # a sparse X stays sparse: centred inside the products
    gram = centred_gram(X, mean) if sparse else xc @ xc.T
    total_ss = float(np.trace(gram))
    evals, evecs = _eigh_descending(gram, r)
    s = np.sqrt(evals)
    # Singular values below this are numerically zero: their V column would
    # be noise divided by noise.
    positive = s > max(n, d) * np.finfo(float).eps * (s[0] if s.size else 0.0)
    components = np.zeros((r, d))
    u = evecs[:, positive]
    xc_t_u = X.T @ u - np.multiply.outer(mean, u.sum(axis=0)) if sparse else xc.T @ u
    components[positive] = (xc_t_u / s[positive]).T
    n_null = int((~positive).sum())
    if n_null:
        components[~positive] = complete_basis(components[positive], n_null)
    scores = evecs * s
    components, scores = flip_signs(components, scores)
    return SVD(s, components, scores, total_ss)


def svd_randomized(
    X,
    mean: np.ndarray,
    n_components: int,
    *,
    n_oversamples: int = 10,
    n_power_iter: int | None = None,
    random_state=None,
    basis: str | None = None,
) -> SVD:
    """Randomized block Krylov SVD of the centred data, without centring X.

    A Gaussian sketch ``Y_0 = Xc Omega`` (``l = k + p`` columns) is expanded
    into the block Krylov space ``[Y_0, (Xc Xc^T) Y_0, ..., (Xc Xc^T)^q Y_0]``
    (each block re-orthonormalised by QR), and the SVD of ``Q^T Xc`` on an
    orthonormal basis ``Q`` of that space gives the triplets (Rayleigh-Ritz).
    Keeping every block, instead of only the last as plain subspace
    iteration does, gives the same accuracy with about half the passes over X
    (Musco & Musco 2015): depth ``q = 3`` matches or beats the 7 power
    iterations of scikit-learn's randomized solver at 70% of its cost.

    Products with ``Xc`` use ``Xc B = X B - 1 (mean^T B)``, so X is never
    copied (nor, when scipy sparse, densified). A dense ``X`` is sketched on
    its smaller side and the basis lives on the larger (``n x L`` when
    ``n >= d``): the products, O(n d L), dominate. For a sparse ``X`` they
    cost O(nnz L) and orthonormalising the basis, O(size L^2), dominates,
    so the basis lives on the smaller side.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    mean : ndarray of shape (d,)
    n_components : int
        Number of triplets ``k``.
    n_oversamples : int, default=10
        Extra random directions ``p``; each Krylov block has ``k + p`` columns.
    n_power_iter : int, optional
        Krylov depth ``q``; by default 3 when ``k < 0.1 min(n, d)`` and 2
        otherwise.
    random_state : None, int >= 0, Generator or RandomState
        Seed of the Gaussian sketch (the rule of :mod:`bayespca.params`).
    basis : {"columns", "rows"} or None, default=None
        Where the Krylov basis lives: ``"columns"`` in the column space of
        ``Xc`` (n x L), ``"rows"`` in its row space (d x L); None: the rule
        above.

    References
    ----------
    C. Musco, C. Musco (2015). Randomized block Krylov methods for stronger and
    faster approximate singular value decomposition. NeurIPS 28.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((50, 3)) @ rng.standard_normal((3, 40))
    >>> s_exact = svd_full(X, X.mean(0)).singular_values[:3]
    >>> s_rand = svd_randomized(X, X.mean(0), 3, random_state=0).singular_values
    >>> bool(np.allclose(s_exact, s_rand))
    True
    """
    n, d = X.shape
    k = n_components
    if n_power_iter is None:
        n_power_iter = 3 if k < 0.1 * min(n, d) else 2
    rng = as_generator(random_state)
    width = min(k + n_oversamples, min(n, d))
    # The rank-one corrections are broadcast, not BLAS calls: every BLAS call may hand work to
    # its thread pool, and on a busy machine each hand-over costs more than these products.
    def times(b):  # Xc @ b, b of shape (d, l)
        out = X @ b
        out -= np.einsum("i,ij->j", mean, b)
        return out

    def times_t(a):  # Xc^T @ a, a of shape (n, l)
        out = X.T @ a
        out -= np.multiply.outer(mean, a.sum(axis=0))
        return out

    sparse = scipy.sparse.issparse(X)
    if basis is None:
        basis = "columns" if (n >= d) != sparse else "rows"
    if basis == "columns":
        q = _krylov_basis(times, times_t, d, width, n_power_iter, rng)  # (n, L), in col(Xc)
        if sparse:  # Xc^T Q is (d, L) with d the larger side: Ritz pairs from its L x L Gram
            s, w, vs = _ritz(times_t(q), k)  # vs = V S
            vt = np.divide(vs, s, out=np.zeros_like(vs), where=s > 0).T
            scores = (q @ w) * s
        else:
            ub, s, vt = np.linalg.svd(times_t(q).T, full_matrices=False)  # of Q^T Xc, (L, d)
            s, vt, scores = s[:k], vt[:k], (q @ ub[:, :k]) * s[:k]
    else:
        q = _krylov_basis(times_t, times, n, width, n_power_iter, rng)  # (d, L), in row(Xc)
        if sparse:  # Xc Q is (n, L) with n the larger side: Ritz pairs from its L x L Gram
            s, w, scores = _ritz(times(q), k)
            vt = (q @ w).T
        else:
            u, s, wt = np.linalg.svd(times(q), full_matrices=False)  # of Xc Q, (n, L)
            s, vt, scores = s[:k], (wt @ q.T)[:k], u[:, :k] * s[:k]
    vt, scores = flip_signs(vt, scores)
    return SVD(s, vt, scores, centred_sum_squares(X, mean))


def _ritz(tall: np.ndarray, k: int):
    """``(s, W, tall W)``: the ``k`` leading singular values of a tall matrix and its right vectors.

    From the eigendecomposition of the small Gram ``tall^T tall``: a thin
    SVD of the tall matrix costs an orthogonalisation of it, which on sparse
    input takes longer than all the products. Singular values carry absolute
    errors of about ``sqrt(eps) s_1`` (the rounding floor of an
    eigendecomposition, which :func:`decompose` applies).
    """
    evals, w = _eigh_descending(tall.T @ tall, k)
    return np.sqrt(evals), w, tall @ w


def _krylov_basis(apply, apply_t, size, width, depth, rng):
    """Orthonormal basis of the block Krylov space of ``apply apply_t`` started at a Gaussian sketch."""
    block, _ = np.linalg.qr(apply(rng.standard_normal((size, width))))
    blocks = [block]
    for _ in range(depth):
        block, _ = np.linalg.qr(apply(apply_t(block)))
        blocks.append(block)
    basis, _ = np.linalg.qr(np.hstack(blocks))
    return basis[:, : min(basis.shape)]


def choose_solver(n_samples: int, n_features: int, n_components: int | None) -> str:
    """The solver ``PCA(solver="auto")`` uses.

    With ``m = min(n, d)`` and ``k`` the requested number of components
    (``None`` when the whole spectrum is needed: ``n_components`` None, a
    fraction or a selection rule), the estimated costs in flops are

    * covariance: ``n d^2 + 6 d^3``  (scatter matrix, then eigh)
    * gram: ``n^2 d + 6 n^3``        (Gram matrix, then eigh)
    * randomized: ``2 (3q + 2) n d (k + 10)``, block Krylov depth ``q = 3``
      (2 when ``k >= 0.1 m``)
    * full: ``6 n d m``              (thin SVD)

    The rule takes the cheapest of covariance and Gram; it takes randomized
    instead only for an integer ``k`` with ``k + 10 <= m / 4``, ``m >= 500``
    and a cost at most half the exact solver's (randomized is approximate, so
    it must win clearly); and it takes full when the problem is tiny
    (``n d <= 10^4``), where everything takes microseconds and the thin SVD
    is the most accurate.

    Examples
    --------
    >>> choose_solver(20000, 100, 10), choose_solver(500, 20000, 10), choose_solver(2000, 2000, 10)
    ('covariance', 'gram', 'randomized')
    """
    n, d = n_samples, n_features
    m = min(n, d)
    if n * d <= 10_000:
        return "full"
    cov = n * d * d + _EIGH_COST * d**3
    gram = n * n * d + _EIGH_COST * n**3
    exact, name = (cov, "covariance") if cov <= gram else (gram, "gram")
    if n_components is not None and m >= _RANDOMIZED_MIN_SIZE and n_components + 10 <= m / 4:
        q = 3 if n_components < 0.1 * m else 2
        randomized = 2 * (3 * q + 2) * n * d * (n_components + 10)
        if 2 * randomized <= exact:
            return "randomized"
    return name


class Decomposition(NamedTuple):
    """What :func:`decompose` found.

    Attributes
    ----------
    svd : SVD
        Leading triplets of the centred (and, if asked, standardized) data,
        with rounding-level singular values set to 0 (:func:`drop_rounding`).
    solver : str
        The solver that ran.
    scale : ndarray of shape (d,)
        Column scales divided out: the standard deviations (``ddof=1``, 1
        for constant columns) with ``standardize=True``, else ones.
    """

    svd: SVD
    solver: str
    scale: np.ndarray


def decompose(
    X: np.ndarray,
    mean: np.ndarray,
    n_components: int | None,
    solver: str = "auto",
    *,
    standardize: bool = False,
    magnitudes: tuple[float, float] | None = None,
    n_oversamples: int = 10,
    n_power_iter: int | None = None,
    random_state=None,
) -> Decomposition:
    """Leading singular triplets of ``X - mean`` (standardized if asked) by the named solver.

    Parameters
    ----------
    X : ndarray or scipy sparse matrix of shape (n, d)
        A sparse ``X`` is centred implicitly, inside the products (not
        with solver "full"); its "auto" is
        :func:`bayespca.sparse_input.choose_sparse_solver`.
    mean : ndarray of shape (d,)
    n_components : int or None
        Number of triplets; None for all ``min(n, d)`` (not with "randomized").
    solver : {"auto", "full", "covariance", "gram", "randomized"}, default="auto"
        "auto" is :func:`choose_solver`.
    standardize : bool, default=False
        Divide each centred column by its standard deviation
        (:func:`column_scales`); constant columns become exactly 0.
    magnitudes : (float, float) or None, default=None
        ``max|X|`` over all columns and over the varying columns of the
        data before any centring, in the units of ``X``, when the caller
        has them and has already passed ``mean`` through
        :func:`exact_means`; else both are done here. They set the
        rounding floor of :func:`drop_rounding` (all columns for the
        randomized solver, which never centres X; varying ones otherwise).
    n_oversamples, n_power_iter, random_state
        Options of :func:`svd_randomized`.

    Returns
    -------
    Decomposition

    Examples
    --------
    >>> X = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    >>> dec = decompose(X, X.mean(0), None)
    >>> dec.solver, dec.svd.singular_values.round(6).tolist()
    ('full', [2.0, 0.0])
    """
    n, d = X.shape
    sparse = scipy.sparse.issparse(X)
    if sparse and solver == "full":
        raise ValueError(
            "solver='full' needs the centred data as a dense matrix, which would fill in every zero of "
            "the sparse X; accepted on sparse input: 'auto', 'covariance', 'gram' or 'randomized'."
        )
    if solver == "auto":
        solver = (choose_sparse_solver if sparse else choose_solver)(n, d, n_components)
    if solver == "randomized" and n_components is None:
        raise ValueError(
            "solver='randomized' needs an integer n_components; the whole spectrum was asked for. "
            "Use solver='auto', 'full', 'covariance' or 'gram'."
        )
    if magnitudes is None:
        mean, *magnitudes = sparse_means(X) if sparse else exact_means(X, mean)
    magnitude = magnitudes[0] if solver == "randomized" else magnitudes[1]
    scale = np.ones(d)
    if standardize and sparse:
        X, mean, scale, magnitude = standardized_sparse(X, mean)
    elif standardize:
        X, scale = standardized(X, mean)
        mean = np.zeros(d)
        magnitude = float(np.max(np.abs(X), initial=0.0))
    if solver == "full":
        svd = svd_full(X, mean)
    elif solver == "covariance" or (n_components == 0 and d <= n):
        svd = svd_covariance(X, mean, n_components)
    elif solver == "gram" or n_components == 0:
        svd = svd_gram(X, mean, n_components)
    else:
        svd = svd_randomized(X, mean, n_components, n_oversamples=n_oversamples,
                             n_power_iter=n_power_iter, random_state=random_state)
    # Sparse randomized takes its Ritz values from a Gram matrix: the floor of an eigendecomposition.
    floor_of = "covariance" if sparse and solver == "randomized" else solver
    return Decomposition(drop_rounding(svd, floor_of, (n, d), magnitude), solver, scale)


def drop_rounding(svd: SVD, solver: str, shape: tuple[int, int], magnitude: float) -> SVD:
    """Set singular values that are rounding noise to exactly 0 and give them fixed directions.

    A singular value is noise below the larger of two floors:

    * the data's: ``4 n sqrt(d) eps max|X|`` (``magnitude = max|X|``), a
      bound on what the rounding of the column means leaves in the
      centred data (each mean is a sum of n terms); constant data lie
      entirely below it;
    * the solver's: ``max(n, d) eps s_1`` for an SVD (full, randomized),
      ``sqrt(max(n, d) eps) s_1`` for an eigendecomposition of ``Xc^T Xc``
      or ``Xc Xc^T`` (covariance, gram), whose eigenvalues carry absolute
      errors of about ``eps s_1^2``.

    Their directions become :func:`complete_basis` of the others, and the
    total sum of squares drops what is left of the rounding noise, so
    rank-deficient data give the same answer on every solver and every call.

    Examples
    --------
    >>> X = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]) * 0.1  # constant rows
    >>> svd = drop_rounding(svd_full(X, X.mean(0)), "full", X.shape, 0.2)
    >>> svd.singular_values.tolist(), svd.total_ss
    ([0.0, 0.0], 0.0)
    """
    s = svd.singular_values
    if s.size == 0:
        return svd
    n, d = shape
    eps = np.finfo(float).eps
    size = max(n, d)
    relative = size * eps if solver in ("full", "randomized") else np.sqrt(size * eps)
    floor = max(relative * s[0], 4 * n * np.sqrt(d) * eps * magnitude)
    zero = s <= floor
    kept_ss = float(np.sum(s[~zero] ** 2))
    # What the returned values leave of the total is noise when below the floor in every direction.
    noise_only = np.sqrt(max(svd.total_ss - kept_ss, 0.0)) <= np.sqrt(min(n, d)) * floor
    total_ss = kept_ss if noise_only else svd.total_ss
    if not zero.any():
        return svd._replace(total_ss=total_ss)
    components = svd.components.copy()
    components[zero] = complete_basis(components[~zero], int(zero.sum()))
    scores = None if svd.scores is None else np.where(zero, 0.0, svd.scores)
    components, scores = flip_signs(components, scores)
    return SVD(np.where(zero, 0.0, s), components, scores, total_ss)


def column_scales(X: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Sample standard deviations (``ddof=1``) of the columns of ``X``; exactly 0 for constant columns.

    A column is constant when its deviation is at the rounding level of its
    values (``<= 8 eps max|x|``): centring a constant column leaves rounding
    noise of that size, which dividing by its own deviation would blow up
    to unit variance.

    Examples
    --------
    >>> X = np.array([[1.0, 1.26736591], [2.0, 1.26736591], [4.0, 1.26736591]])
    >>> column_scales(X, X.mean(0)).round(6).tolist()
    [1.527525, 0.0]
    """
    n = X.shape[0]
    centred = X - mean
    std = np.sqrt(np.einsum("ij,ij->j", centred, centred) / max(n - 1, 1))
    constant = std <= 8 * np.finfo(float).eps * np.abs(X).max(axis=0, initial=0.0)
    return np.where(constant, 0.0, std)


def standardized(X: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``((X - mean) / scale, scale)`` with ``scale`` the :func:`column_scales`; constant columns 0.

    A constant column keeps scale 1 and becomes exactly 0 (centring leaves
    only rounding of it, which must not count as variance).

    Examples
    --------
    >>> X = np.array([[1.0, 5.0], [3.0, 5.0]])
    >>> Xs, scale = standardized(X, X.mean(0))
    >>> Xs.round(6).tolist(), scale.round(6).tolist()
    ([[-0.707107, 0.0], [0.707107, 0.0]], [1.414214, 1.0])
    """
    std = column_scales(X, mean)
    varying = std > 0
    scale = np.where(varying, std, 1.0)
    return np.where(varying, (X - mean) / scale, 0.0), scale


def exact_means(X: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, float, float]:
    """``mean`` with each constant column's mean set to its value; ``max|X|`` over all columns and
    over the columns that vary.

    A column mean is a sum of n terms over n and carries up to about
    ``n eps`` of relative rounding; for a constant column that rounding is
    all its centred values would hold (a spurious variance, blown up to 1
    by standardizing). Taking the value itself makes the centred column
    exactly 0, so only the varying columns leave rounding in the centred
    data. Cost: one pass over X for its largest and smallest entry, and one
    over the few columns whose first, middle and last entries agree.

    Examples
    --------
    >>> X = np.c_[np.full(3000, 0.1), np.arange(3000.0)]
    >>> mean, top, varying = exact_means(X, X.mean(axis=0))
    >>> float(X.mean(axis=0)[0]) == 0.1, float(mean[0]) == 0.1, top, varying
    (False, True, 2999.0, 2999.0)
    """
    if X.size == 0:
        return mean, 0.0, 0.0
    top = max(float(X.max()), -float(X.min()))
    first = X[0]
    candidates = np.flatnonzero((X[-1] == first) & (X[X.shape[0] // 2] == first))
    if candidates.size == 0:
        return mean, top, top
    constant = candidates[np.all(X[:, candidates] == first[candidates], axis=0)]
    if constant.size == 0:
        return mean, top, top
    mean = mean.copy()
    mean[constant] = first[constant]
    varying = np.ones(X.shape[1], dtype=bool)
    varying[constant] = False
    varying_top = float(np.abs(X[:, varying]).max(initial=0.0)) if varying.any() else 0.0
    return mean, top, varying_top
