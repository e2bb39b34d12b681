"""Sparse principal component analysis: the elastic-net SPCA of Zou, Hastie & Tibshirani (2006).

The criterion, with ``Xc`` the centred (optionally standardised) data of
shape ``(n, d)``, ``A`` and ``B`` of shape ``(d, k)``:

    minimise_{A, B}  1/(2n) ||Xc - Xc B A^T||_F^2
                     + alpha * l1_ratio * sum_j ||b_j||_1
                     + alpha * (1 - l1_ratio) / 2 * ||B||_F^2      subject to A^T A = I_k.

Multiplied by ``2n`` this is ZHT's SPCA criterion
``sum_i ||x_i - A B^T x_i||^2 + lambda sum_j ||b_j||^2 + sum_j lambda_1 ||b_j||_1``
with ``lambda = n alpha (1 - l1_ratio)`` and ``lambda_1 = 2 n alpha l1_ratio``
(the same for every component). The penalties thus grow with ``n`` in ZHT's
units, so that ``alpha`` is on the scale of a covariance and a given ``alpha``
means the same thing at any sample size.

It is solved by alternating two exact steps (ZHT's general SPCA algorithm):

* B-step (``A`` fixed): ``k`` independent elastic nets,
  ``b_j = argmin 1/(2n) ||Xc a_j - Xc b||^2 + alpha l1_ratio |b|_1 + alpha (1 - l1_ratio)/2 |b|^2``,
  i.e. ``sklearn.linear_model.ElasticNet(alpha, l1_ratio=l1_ratio,
  fit_intercept=False).fit(Xc, Xc @ A)``. They depend on the data only through
  ``S = Xc^T Xc / n``, so after one ``O(n d^2)`` pass no step depends on ``n``.
  Each is solved exactly by feature-sign search (sign guess, linear solve on
  the active set, KKT check over all features), warm started from the
  previous B. When ``d > n`` the ``d x d`` matrix is never formed: the columns
  of ``S`` that an active set needs are computed from ``Xc``.
* A-step (``B`` fixed): reduced-rank Procrustes, ``A = U W^T`` from the thin
  SVD ``S B = U D W^T`` (ZHT's reduced-rank Procrustes rotation).

The plain alternation crawls when the penalty is small against the
eigenvalues; safeguarded Anderson mixing of the A-iterates cuts the number
of iterations several-fold while keeping the criterion decreasing at every
step (see ``_alternate``).

References
----------
H. Zou, T. Hastie, R. Tibshirani (2006). Sparse principal component analysis.
Journal of Computational and Graphical Statistics 15(2), 265-286.

H. Lee, A. Battle, R. Raina, A. Y. Ng (2007). Efficient sparse coding
algorithms. Advances in Neural Information Processing Systems 19.

H. F. Walker, P. Ni (2011). Anderson acceleration for fixed-point
iterations. SIAM Journal on Numerical Analysis 49(4), 1715-1735.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import scipy.linalg
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import ConvergenceWarning

from bayespca.data import as_float_matrix, validate_scores, validate_transform
from bayespca.linalg import (
    centred_scatter,
    eigh_top,
    exact_means,
    flip_signs,
    standardized,
    svd_covariance,
    svd_gram,
)
from bayespca.messages import warn
from bayespca.params import as_generator, check_bool, check_choice, check_number, check_seed
from bayespca.statistics import prepare

__all__ = ["Scatter", "SparsePCA", "adjusted_variance", "elastic_net_step", "sparse_pca_path"]

SOLVERS = ("auto", "covariance", "data")

# ------------------------------------------------------------------ functional core
class Scatter:
    """Columns and products of ``S = Xc^T Xc / n``, from the dense matrix or from the data.

    ``dense`` holds ``S`` (``d <= n``: one ``O(n d^2)`` pass, after which no
    step depends on ``n``). Otherwise ``root = Xc / sqrt(n)`` is kept and a
    column of ``S`` is computed (``O(n d)``) the first time its feature enters
    an active set, so the ``d x d`` matrix is never formed.

    Examples
    --------
    >>> Xc = np.array([[1.0, 0.0], [-1.0, 2.0], [0.0, -2.0]])
    >>> a, b = Scatter(dense=Xc.T @ Xc / 3), Scatter(root=Xc / np.sqrt(3))
    >>> bool(np.allclose(a.columns(np.array([1])), b.columns(np.array([1]))))
    True
    """

    def __init__(self, *, dense: np.ndarray | None = None, root: np.ndarray | None = None):
        self.dense, self.root = dense, root
        self.diag = np.diag(dense).copy() if dense is not None else np.einsum("ij,ij->j", root, root)
        self._cache: dict[int, np.ndarray] = {}
        self._spectrum: tuple[np.ndarray, np.ndarray] | None = None

    def spectrum(self) -> tuple[np.ndarray, np.ndarray]:
        """``(e, Q)`` with ``S = Q diag(e) Q^T``, ``Q`` of shape (d, r), ``e >= 0``; computed once.

        From ``eigh(S)`` (dense) or the thin SVD of ``root``, so ``r <= min(n, d)``
        in the second case.
        """
        if self._spectrum is None:
            if self.dense is not None:
                e, Q = scipy.linalg.eigh(self.dense, check_finite=False)
                self._spectrum = np.clip(e, 0.0, None), Q
            else:
                _, sv, vt = scipy.linalg.svd(self.root, full_matrices=False, check_finite=False)
                self._spectrum = sv**2, vt.T
        return self._spectrum

    def columns(self, idx: np.ndarray) -> np.ndarray:
        """``S[:, idx]``, shape (d, len(idx))."""
        if self.dense is not None:
            return self.dense[:, idx]
        new = [int(i) for i in idx if int(i) not in self._cache]
        if new:
            for i, col in zip(new, (self.root.T @ self.root[:, new]).T, strict=True):
                self._cache[i] = col
        if len(idx) == 0:
            return np.zeros((self.root.shape[1], 0))
        return np.stack([self._cache[int(i)] for i in idx], axis=1)

    def times(self, M: np.ndarray) -> np.ndarray:
        """``S @ M``."""
        if self.dense is not None:
            return self.dense @ M
        return self.root.T @ (self.root @ M)


def _singular(Q) -> bool:
    """Whether a positive semi-definite ``Q`` is singular to working precision (Cholesky pivots)."""
    try:
        pivots = np.diag(np.linalg.cholesky(Q)) ** 2
    except np.linalg.LinAlgError:
        return True
    return bool(pivots.min() <= 1e-12 * np.diag(Q).max())


def _null_step(Q, x):
    """Move ``x`` along a null direction of a singular ``Q`` until a coefficient reaches zero.

    ``Q`` is singular only without ridge, when the active features are
    collinear (always once there are ``n`` of them). Along a null direction
    ``z`` of ``Q`` the smooth part is flat (``Q z = 0`` and ``c^T z = 0``, since
    ``c`` is in the range of ``S``) and the lasso term is linear, ``l1 sign(x)^T z``;
    going the way that does not increase it, the first coefficient to reach
    zero leaves the active set, as in the lasso modification of LARS.
    """
    z = np.linalg.eigh(Q)[1][:, 0]
    if np.sign(x) @ z > 0:
        z = -z
    shrinking = x * z < 0
    if not shrinking.any():  # sign(x)^T z = 0 with z >= 0 on sign(x): go the other way
        z, shrinking = -z, x * z > 0
    times = -x[shrinking] / z[shrinking]
    first = np.flatnonzero(shrinking)[np.argmin(times)]
    x = x + times.min() * z
    x[first] = 0.0
    return x


def _elastic_net(scatter, c, b, l1, l2, max_rounds) -> tuple[np.ndarray, bool]:
    """Exact ``argmin_b f(b) = 1/2 b^T S b - c^T b + l2/2 |b|^2 + l1 |b|_1`` by feature-sign search.

    Feature-sign search (Lee, Battle, Raina & Ng 2007) guesses the signs of
    the non-zero coefficients, solves the resulting linear system exactly on
    that active set, and repairs a wrong guess by a discrete line search over
    the points where coefficients change sign; at a consistent active set it
    adds the feature whose KKT condition ``|c_l - (S b)_l| <= l1`` is most
    violated. Every step lowers ``f``, so it ends at the exact minimiser.
    Without ridge an active block can be singular; a null step (see
    :func:`_null_step`) then shrinks the active set. Warm started from the
    previous B-step the signs are usually right and a single solve suffices,
    which is what makes the alternation cheap.

    In exact arithmetic ``f`` falls at every step, so no active set and
    signs can come back; when rounding makes them come back (an
    ill-conditioned active block with a penalty far below the rounding of
    ``S b``) the point reached is the minimiser to rounding and is returned.
    Returns ``(b, finished)``; ``finished`` is False only when
    ``max_rounds`` ran out first.
    """
    active = np.flatnonzero(b)
    b = b.copy()
    slack = 1e-12 * (np.abs(c).max(initial=0.0) + l1)  # KKT violations below this are rounding
    seen = set()
    for _ in range(max_rounds):
        cols = scatter.columns(active)
        if active.size:
            Q = cols[active] + l2 * np.eye(active.size)
            x = b[active]
            if _singular(Q):
                b[active] = _null_step(Q, x)
                active = active[b[active] != 0.0]
                continue
            # NumPy rather than SciPy: these systems are small and solved thousands of
            # times, where SciPy's per-call checks would dominate.
            x_new = np.linalg.solve(Q, c[active] - l1 * np.sign(x))
            if np.any(np.sign(x_new) != np.sign(x)):
                x_new = _line_search(Q, c[active], l1, x, x_new)
                if x_new is None:  # no lower point: the minimiser, up to rounding
                    b[active] = np.where(np.abs(x) > np.finfo(float).tiny, x, 0.0)
                    return b, True
                b[active] = x_new
                active = active[x_new != 0.0]
                continue  # re-solve on the repaired active set before adding features
            b[active] = x_new
        residual = c - cols @ b[active]
        residual[active] = 0.0
        worst = int(np.argmax(np.abs(residual)))
        pattern = (active.tobytes(), np.sign(b[active]).tobytes())
        if np.abs(residual[worst]) <= l1 + slack or pattern in seen:
            return b, True
        seen.add(pattern)
        # From the optimum on the current active set the added coefficient
        # moves in the direction of its residual: a tiny seed fixes its sign.
        b[worst] = np.sign(residual[worst]) * np.finfo(float).tiny
        active = np.sort(np.append(active, worst))
    return b, False


def _line_search(Q, c, l1, x, x_new):
    """The lowest of ``x_new`` and the sign changes on the segment from ``x``, if lower than ``x``.

    At a sign-change point the coefficient that changes sign is set to
    exactly zero. Returns None when no candidate lowers the objective.
    """

    def objective(points):
        return 0.5 * np.einsum("ti,ij,tj->t", points, Q, points) - points @ c + l1 * np.abs(points).sum(1)

    crossing = (np.sign(x_new) != np.sign(x)) & (x != 0.0)
    times = np.append(x[crossing] / (x[crossing] - x_new[crossing]), 1.0)
    points = x[None, :] + times[:, None] * (x_new - x)[None, :]
    points[np.arange(times.size - 1), np.flatnonzero(crossing)] = 0.0
    values = objective(points)
    best = int(np.argmin(values))
    if values[best] >= objective(x[None, :])[0]:
        return None
    return points[best]


def elastic_net_step(scatter: Scatter, A: np.ndarray, B: np.ndarray, l1: float, l2: float):
    """The B-step: for each column j, ``argmin_b 1/2 b^T S b - (S a_j)^T b + l2/2 |b|^2 + l1 |b|_1``.

    This is the elastic net of ``Xc a_j`` on ``Xc`` with scikit-learn's
    scaling, warm started from ``B``. The ridge-only problem has the closed
    form ``B = Q diag(e / (e + l2)) Q^T A`` on the spectrum of ``S``, exact
    for any ``l2 > 0`` however small against ``S``; the others are solved by
    feature-sign search.

    Returns
    -------
    B, SB : ndarrays of shape (d, k)
        The solution and ``S B``.
    finished : bool
        False when a feature-sign search ran out of rounds (its last point is kept).

    Examples
    --------
    >>> S = np.array([[2.0, 0.0], [0.0, 1.0]])
    >>> B, _, _ = elastic_net_step(Scatter(dense=S), np.eye(2), np.zeros((2, 2)), 0.5, 0.0)
    >>> B  # soft-thresholded: (S a_j - l1 sign) / S_jj
    array([[0.75, 0.  ],
           [0.  , 0.5 ]])
    """
    d, k = A.shape
    if l1 == 0.0 and l2 == 0.0:  # no penalty: b_j = a_j (the only minimiser when S is regular)
        return A.copy(), scatter.times(A), True
    C = scatter.times(A)
    if l1 == 0.0:
        e, Q = scatter.spectrum()
        B = Q @ ((e / (e + l2))[:, None] * (Q.T @ A))
        return B, C - l2 * B, True  # (S + l2 I) B = C
    max_rounds = 10 * d + 100
    columns, finished = [], True
    for j in range(k):
        b, done = _elastic_net(scatter, C[:, j], B[:, j], l1, l2, max_rounds)
        columns.append(b)
        finished &= done
    B = np.column_stack(columns)
    support = np.flatnonzero(np.any(B != 0.0, axis=1))
    return B, scatter.columns(support) @ B[support], finished


def _procrustes_step(M, A_old):
    """The A-step: ``argmax_A tr(A^T M)`` over ``A^T A = I``, ``A = U W^T`` from ``M = U D W^T``.

    When ``M`` has rank ``r < k`` (a component with all-zero loadings), the
    maximiser is not unique: the ``k - r`` free directions are taken as close
    as possible to ``A_old``'s (so a component whose loadings are all zero
    keeps its direction instead of jumping to an arbitrary one).
    """
    k = M.shape[1]
    u, s, wt = scipy.linalg.svd(M, full_matrices=False, check_finite=False)
    rank = int(np.sum(s > max(M.shape) * np.finfo(float).eps * s[0])) if s[0] > 0 else 0
    if rank == k:
        return u @ wt
    u_r, w_r, w_free = u[:, :rank], wt[:rank].T, wt[rank:].T
    free = A_old @ w_free
    free -= u_r @ (u_r.T @ free)
    p, _, qt = scipy.linalg.svd(free, full_matrices=False, check_finite=False)
    return u_r @ w_r.T + (p @ qt) @ w_free.T


class _Solution(NamedTuple):
    A: np.ndarray  # (d, k) orthonormal directions
    B: np.ndarray  # (d, k) elastic-net coefficients
    n_iter: int
    converged: bool
    exact_steps: bool  # every B-step kept finished its feature-sign search


def _objective(scatter, A, B, SB, l1, l2) -> float:
    """The criterion at ``(A, B)`` given ``SB = S B``.

    ``1/(2n) |Xc - Xc B A^T|_F^2 = 1/2 tr(S) - tr(A^T S B) + 1/2 tr(B^T S B)`` when ``A^T A = I``.
    """
    fit = 0.5 * scatter.diag.sum() - np.sum(SB * A) + 0.5 * np.sum(SB * B)
    return float(fit + l1 * np.abs(B).sum() + 0.5 * l2 * np.sum(B**2))


def _polar(M):
    """The orthonormal factor of the polar decomposition (nearest matrix with orthonormal columns)."""
    u, _, vt = scipy.linalg.svd(M, full_matrices=False, check_finite=False)
    return u @ vt


def _alternate(scatter, A, B, l1, l2, tol, max_iter, memory=5):
    """ZHT's alternation from ``(A, B)`` until ``|B_new - B|_F <= tol |B|_F``, Anderson-accelerated.

    The plain iteration ``A <- Procrustes(S B(A))`` can crawl: the fit and
    the ridge are unchanged by rotating ``(A, B)`` to ``(A R, B R)``, only the
    lasso term is not, so the rotation within the span converges at a rate
    set by ``l1`` against the eigenvalues (thousands of iterations). Anderson
    mixing of the last ``memory`` iterates (Walker & Ni 2011), mapped back to
    orthonormal columns, is a cheap quasi-Newton step on that fixed-point map.
    A mixed step is kept only when the criterion ``F(A) = min_B f(A, B)``
    does not rise, so it decreases at every iteration as ZHT's does;
    otherwise the plain step is taken and the history cleared.

    Returns the last ``A`` with ``B = B(A)``, its elastic-net solution.
    """
    B, SB, exact = elastic_net_step(scatter, A, B, l1, l2)
    value = _objective(scatter, A, B, SB, l1, l2)
    iterates, images = [], []
    for it in range(1, max_iter + 1):
        plain = _procrustes_step(SB, A)
        iterates = [*iterates[-memory:], A.ravel()]
        images = [*images[-memory:], plain.ravel()]
        step = None
        if len(iterates) > 1:
            residuals = np.array(images) - np.array(iterates)
            weights = np.linalg.lstsq(np.diff(residuals, axis=0).T, residuals[-1], rcond=None)[0]
            mixed = images[-1] - np.diff(np.array(images), axis=0).T @ weights
            A_try = _polar(mixed.reshape(A.shape))
            B_try, SB_try, done = elastic_net_step(scatter, A_try, B, l1, l2)
            value_try = _objective(scatter, A_try, B_try, SB_try, l1, l2)
            if value_try <= value:
                step = A_try, B_try, SB_try, value_try, done
            else:
                iterates, images = [], []
        if step is None:
            B_plain, SB_plain, done = elastic_net_step(scatter, plain, B, l1, l2)
            step = plain, B_plain, SB_plain, _objective(scatter, plain, B_plain, SB_plain, l1, l2), done
        change, size = np.linalg.norm(step[1] - B), np.linalg.norm(B)
        A, B, SB, value, done = step
        exact &= done
        if change <= tol * size or change == 0.0:
            return _Solution(A, B, it, True, exact)
    return _Solution(A, B, max_iter, False, exact)


def _normalise(B):
    """Unit-length loadings from the columns of B (zero columns stay zero), and the column norms."""
    norms = np.linalg.norm(B, axis=0)
    V = np.divide(B, norms, out=np.zeros_like(B), where=norms > 0)
    return V, norms


def adjusted_variance(scores: np.ndarray) -> np.ndarray:
    """ZHT's adjusted variance of correlated component scores, ``R_jj^2 / (n - 1)``.

    With the QR decomposition ``Z = Q R`` of the (centred) scores, ``R_jj^2`` is
    the part of component j's sum of squares not explained by components
    ``1..j-1`` (ZHT section 3.4), so it depends on the order of the
    components. It equals the ordinary variance when the scores are
    uncorrelated; otherwise the ordinary variances would count the shared
    part twice. Their sum is ZHT's adjusted total variance.

    Parameters
    ----------
    scores : ndarray of shape (n_samples, k)
        Centred scores ``Xc V^T``.

    Returns
    -------
    ndarray of shape (k,)

    Examples
    --------
    >>> Z = np.array([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])
    >>> adjusted_variance(Z)  # uncorrelated: ordinary variances
    array([1.33333333, 1.33333333])
    >>> adjusted_variance(np.c_[Z[:, 0], Z[:, 0] + Z[:, 1]])  # second one less its overlap
    array([1.33333333, 1.33333333])
    """
    n = scores.shape[0]
    if scores.shape[1] == 0:
        return np.zeros(0)
    r = np.linalg.qr(scores, mode="r")
    return np.diag(r) ** 2 / (n - 1)


# ------------------------------------------------------------------ estimator
class _Problem(NamedTuple):
    """A validated fitting problem, shared by the estimator and the path."""

    Xw: np.ndarray  # data in working units (standardised when asked), not centred
    centre: np.ndarray  # mean to subtract from Xw
    mean: np.ndarray
    scale: np.ndarray
    scatter: Scatter
    total_variance: float  # trace of the sample covariance (ddof = 1)
    A0: np.ndarray  # initial directions (d, k)
    solver: str
    unit: float  # data units (or 1 when standardized) = unit x working units


class SparsePCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Sparse PCA by the elastic-net criterion of Zou, Hastie & Tibshirani (2006).

    Minimises, over ``A`` (``d x k``, orthonormal columns) and ``B`` (``d x k``)::

        1/(2n) ||Xc - Xc B A^T||_F^2 + alpha l1_ratio sum_j |b_j|_1 + alpha (1 - l1_ratio)/2 ||B||_F^2

    where ``Xc`` is the centred data (standardised with ``standardize=True``)
    and ``n = n_samples``. This is ZHT's SPCA criterion divided by ``2n``: their
    ridge ``lambda = n alpha (1 - l1_ratio)`` and lasso ``lambda_1 = 2 n alpha l1_ratio``
    (common to all components). For a fixed ``A`` the problem in ``b_j`` is
    exactly ``ElasticNet(alpha=alpha, l1_ratio=l1_ratio, fit_intercept=False)``
    regressing ``Xc a_j`` on ``Xc``. The sparse loadings are ``b_j / |b_j|``.

    ``alpha`` is on the scale of the covariance: loading ``l`` of component
    ``j`` is zero exactly when ``|(S (a_j - b_j))_l| <= alpha l1_ratio``, with
    ``S = Xc^T Xc / n``, so every loading is zero once ``alpha l1_ratio``
    exceeds ``max |S A|``. With ``l1_ratio = 0`` (ridge only) the loadings are
    the principal axes (ZHT Theorem 3); see :func:`sparse_pca_path` to choose
    ``alpha``.

    Parameters
    ----------
    n_components : int or None, default=None
        Number of sparse components ``k``, in ``[1, min(n_samples, n_features)]``;
        None for ``min(n_samples, n_features)``.
    alpha : float, default=0.1
        Overall penalty, ``>= 0``.
    l1_ratio : float, default=0.9
        Share of the lasso in the penalty, in ``[0, 1]``; ``0`` is ridge only
        (no sparsity), ``1`` lasso only, which keeps at most ``n_samples - 1``
        loadings per component (with ``n_features > n_samples`` ZHT advise a
        ridge part).
    solver : {"auto", "covariance", "data"}, default="auto"
        ``"covariance"`` forms ``S`` (``d x d``) once and never touches the
        data again; ``"data"`` multiplies by ``Xc`` instead (``O(n d k)`` per
        iteration, no ``d x d`` matrix); ``"auto"`` takes ``"covariance"``
        when ``n_features <= n_samples``.
    standardize : bool, default=False
        Scale features to unit variance (``ddof=1``) first, i.e. sparse PCA of
        the correlation matrix. Constant features keep scale 1.
    init : {"pca", "random"} or array-like of shape (n_components, n_features), default="pca"
        Starting directions ``A``: the leading principal axes (ZHT's choice),
        a random orthonormal set, or given rows (made orthonormal by their
        polar factor).
    max_iter : int, default=1000
        Maximum number of alternations (A-step plus B-step).
    tol : float, default=1e-6
        Stop when ``||B_new - B||_F <= tol ||B||_F``. Each B-step is solved
        exactly (to rounding).
    random_state : None, int >= 0, numpy Generator or RandomState, default=None
        Seed of ``init="random"`` (checked whatever ``init`` is;
        :mod:`bayespca.params`).

    Attributes
    ----------
    components_ : ndarray of shape (n_components_, n_features)
        Sparse loadings, rows of unit length (``b_j / |b_j|``), or zero rows
        for components whose loadings are all zero. Each row's
        largest-magnitude entry is positive (:func:`bayespca.linalg.flip_signs`).
    coef_ : ndarray of shape (n_components_, n_features)
        The elastic-net coefficients ``B^T`` before normalising.
    directions_ : ndarray of shape (n_components_, n_features)
        The orthonormal ``A^T`` that ``coef_`` regresses on.
    explained_variance_ : ndarray of shape (n_components_,)
        ZHT's adjusted variance ``R_jj^2 / (n - 1)`` from the QR decomposition
        of the scores ``Xc components_^T`` (see :func:`adjusted_variance`).
    explained_variance_ratio_ : ndarray of shape (n_components_,)
        ``explained_variance_`` over the total variance.
    n_nonzero_ : ndarray of int, shape (n_components_,)
        Non-zero loadings per component.
    objective_ : float
        The criterion above at the solution.
    mean_, scale_ : ndarray of shape (n_features,)
    n_components_, n_samples_, n_features_in_, n_iter_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a DataFrame with string column names.
    solver_ : str

    See Also
    --------
    sparse_pca_path : non-zeros against adjusted explained variance over a grid of ``alpha``.
    bayespca.PCA : the ``alpha = 0`` / ridge-only limit.

    Notes
    -----
    ``transform`` gives the least-squares coordinates on the (generally
    non-orthogonal) loadings, ``Z = argmin ||Xc - Z V||_F``, i.e.
    ``Xc pinv(V)``; they equal the projections ``Xc V^T`` when the loadings are
    orthonormal, and ``inverse_transform(transform(X)) == X`` for ``X`` in
    their span. Components with all-zero loadings get zero scores.
    (scikit-learn's ``SparsePCA.transform`` is the same regression with a
    ridge, ``ridge_alpha=0.01`` by default, so it is not exact on the span.)
    ``explained_variance_`` uses ZHT's scores ``Xc V^T`` instead.

    The data are fitted in power-of-two units (:func:`bayespca.statistics.prepare`),
    with ``alpha`` divided alike, so ``SparsePCA(alpha=a c^2).fit(c X)`` is
    ``SparsePCA(alpha=a).fit(X)`` with variances and the criterion times ``c^2``
    (with ``standardize=True`` the data have no units and ``alpha=a`` fits both).
    When a feature-sign search comes back to a sign pattern it has left (only
    rounding can do that: a penalty far below the rounding of ``S b``), its
    point is the minimiser to rounding; should one ever run out of rounds, a
    ``ConvergenceWarning`` says so.

    The criterion is not convex: the solution is a stationary point reached
    from ``init``, each iteration lowering the criterion. ZHT's principal-axes
    start makes the ridge-only fit exact.

    References
    ----------
    H. Zou, T. Hastie, R. Tibshirani (2006). Sparse principal component
    analysis. J. Comput. Graph. Stat. 15(2), 265-286.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> factors = rng.standard_normal((500, 2)) * [3.0, 2.0]
    >>> X = np.c_[factors[:, [0, 0, 0]], factors[:, [1, 1, 1]], np.zeros((500, 4))]
    >>> X += 0.3 * rng.standard_normal(X.shape)
    >>> spca = SparsePCA(2, alpha=0.5).fit(X)
    >>> spca.n_nonzero_
    array([3, 3])
    >>> spca.components_[:, :6].round(2)
    array([[0.6 , 0.56, 0.57, 0.  , 0.  , 0.  ],
           [0.  , 0.  , 0.  , 0.6 , 0.55, 0.57]])
    >>> spca.explained_variance_ratio_.round(3)
    array([0.684, 0.297])
    """

    def __init__(
        self,
        n_components=None,
        *,
        alpha=0.1,
        l1_ratio=0.9,
        solver="auto",
        standardize=False,
        init="pca",
        max_iter=1000,
        tol=1e-6,
        random_state=None,
    ):
        self.n_components = n_components
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.solver = solver
        self.standardize = standardize
        self.init = init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    # ------------------------------------------------------------ validation
    def _check_params(self) -> None:
        """Validate the hyper-parameters that do not depend on the data."""
        check_number(self.n_components, "n_components", integer=True, low=1, allow_none=True)
        _check_penalty(self.alpha, self.l1_ratio)
        check_choice(self.solver, "solver", SOLVERS)
        check_bool(self.standardize, "standardize")
        check_number(self.max_iter, "max_iter", integer=True, low=1)
        check_number(self.tol, "tol", low=0.0, low_open=True)
        check_seed(self.random_state)
        if isinstance(self.init, str):
            check_choice(self.init, "init", ("pca", "random"))

    def _n_components(self, n: int, d: int) -> int:
        m = min(n, d)
        k = m if self.n_components is None else int(self.n_components)
        if k > m:
            raise ValueError(
                f"n_components must be None or an int in [1, min(n_samples, n_features)] = [1, {m}]; "
                f"got {k}."
            )
        return k

    def _initial_directions(self, Xw, centre, scatter, k) -> np.ndarray:
        n, d = Xw.shape
        init = self.init
        if isinstance(init, str):
            if init == "pca":
                if scatter.dense is not None:
                    _, evecs = eigh_top(scatter.dense.copy(), k)
                    return flip_signs(evecs[:, :k].T)[0].T
                svd = svd_gram(Xw, centre, k) if n < d else svd_covariance(Xw, centre, k)
                return svd.components.T
            if init == "random":
                gauss = as_generator(self.random_state).standard_normal((d, k))
                return np.linalg.qr(gauss)[0]
            raise ValueError(f"init must be 'pca', 'random' or an array of shape ({k}, {d}); got {init!r}.")
        given = as_float_matrix(init, name="init")
        if given.shape != (k, d):
            raise ValueError(
                f"init must be 'pca', 'random' or an array of shape (n_components, n_features) = "
                f"({k}, {d}); got an array of shape {given.shape}."
            )
        s = np.linalg.svd(given, compute_uv=False)
        if s[-1] <= max(k, d) * np.finfo(float).eps * s[0]:
            raise ValueError("init has linearly dependent rows; give n_components independent directions.")
        u, _, vt = np.linalg.svd(given.T, full_matrices=False)
        return u @ vt

    def _prepare(self, X) -> tuple[_Problem, int]:
        self._check_params()
        data = prepare(X, estimator=self, allow_nan=False)
        n, d = data.n, data.d
        k = self._n_components(n, d)
        Xw, unit = data.X, data.scale
        mean = exact_means(Xw, data.mean)[0]
        centre, scale = mean, np.ones(d)
        if self.standardize:
            Xw, std = standardized(Xw, centre)
            scale, centre, unit = std * unit, np.zeros(d), 1.0  # standardized data have no units
        solver = self.solver if self.solver != "auto" else ("covariance" if d <= n else "data")
        if solver == "covariance":
            scatter = Scatter(dense=centred_scatter(Xw, centre) / n)
        else:
            scatter = Scatter(root=(Xw - centre) / np.sqrt(n))
        total_variance = float(scatter.diag.sum()) * n / (n - 1)
        A0 = self._initial_directions(Xw, centre, scatter, k)
        return _Problem(Xw, centre, mean * data.scale, scale, scatter, total_variance, A0, solver, unit), k

    def _penalties(self, alpha: float, unit: float) -> tuple[float, float]:
        """Lasso and ridge weights in working units (``S`` there is ``S_data / unit^2``)."""
        return alpha * self.l1_ratio / unit**2, alpha * (1.0 - self.l1_ratio) / unit**2

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None):
        """Fit the sparse loadings.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self
        """
        problem, k = self._prepare(X)
        l1, l2 = self._penalties(self.alpha, problem.unit)
        d = problem.Xw.shape[1]
        solution = _alternate(problem.scatter, problem.A0, np.zeros((d, k)), l1, l2, self.tol, self.max_iter)
        if not solution.converged:
            warn(
                f"SparsePCA did not converge in max_iter={self.max_iter} iterations (tol={self.tol}); "
                "increase max_iter or tol.",
                ConvergenceWarning,
            )
        _warn_inexact(solution, [self.alpha])
        self._store(problem, solution, l1, l2)
        return self

    def _store(self, problem: _Problem, solution: _Solution, l1: float, l2: float) -> None:
        V, norms = _normalise(solution.B)
        V, signs = flip_signs(V.T, np.ones((1, V.shape[1])))
        signs = signs[0]
        empty = np.flatnonzero(norms == 0)
        if empty.size:
            warn(
                f"SparsePCA components {empty.tolist()} have all-zero loadings at alpha={self.alpha}, "
                f"l1_ratio={self.l1_ratio}; their rows of components_ are zero. Lower alpha or "
                "n_components.",
                UserWarning,
            )
        scores = (problem.Xw - problem.centre) @ V.T
        ev = adjusted_variance(scores)
        n = problem.Xw.shape[0]
        unit2 = problem.unit**2
        self.components_ = V
        self.coef_ = solution.B.T * signs[:, None]
        self.directions_ = solution.A.T * signs[:, None]
        self.explained_variance_ = ev * unit2
        total = problem.total_variance
        self.explained_variance_ratio_ = ev / total if total > 0 else np.zeros_like(ev)
        self.n_nonzero_ = np.count_nonzero(V, axis=1)
        SB = problem.scatter.times(solution.B)
        self.objective_ = _objective(problem.scatter, solution.A, solution.B, SB, l1, l2) * unit2
        self.mean_ = problem.mean
        self.scale_ = problem.scale
        self.n_components_ = V.shape[0]
        self.n_samples_ = n
        self.n_iter_ = solution.n_iter
        self.solver_ = problem.solver

    # ------------------------------------------------------------ transforms
    def transform(self, X):
        """Least-squares coordinates of ``X`` on the sparse loadings.

        ``Z = ((X - mean_) / scale_) @ pinv(components_)``, the minimiser of
        ``||(X - mean_) / scale_ - Z components_||_F``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_components_)
        """
        X = validate_transform(self, X).X
        return ((X - self.mean_) / self.scale_) @ np.linalg.pinv(self.components_)

    def inverse_transform(self, X):
        """Map scores back to feature space: ``(Z @ components_) * scale_ + mean_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components_)

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        Z = validate_scores(self, X)
        return (Z @ self.components_) * self.scale_ + self.mean_

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64"]
        return tags


def _warn_inexact(solution: _Solution, alphas) -> None:
    if not solution.exact_steps:
        warn(
            f"SparsePCA's elastic-net steps at alpha={alphas} ran out of feature-sign rounds; the "
            "loadings are the last point reached, not an exact minimiser. This happens when the "
            "penalty is far below the rounding of X's covariance: raise alpha or add a ridge part "
            "(l1_ratio < 1).",
            ConvergenceWarning,
        )


def _check_penalty(alpha: Any, l1_ratio: Any) -> None:
    check_number(alpha, "alpha", low=0.0)
    check_number(l1_ratio, "l1_ratio", low=0.0, high=1.0)


# ------------------------------------------------------------------ path
def sparse_pca_path(
    X,
    n_components=2,
    *,
    alphas=None,
    n_alphas=20,
    alpha_min_ratio=1e-2,
    l1_ratio=0.9,
    solver="auto",
    standardize=False,
    max_iter=1000,
    tol=1e-6,
):
    """Sparse PCA over a grid of penalties: non-zero loadings against adjusted variance explained.

    Fits :class:`SparsePCA` at each ``alpha`` from the largest to the
    smallest, each fit starting from the previous solution (warm start).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    n_components : int, default=2
    alphas : array-like of float or None, default=None
        Penalties (any order; fitted in decreasing order). By default
        ``n_alphas`` values evenly spaced on a log scale from
        ``alpha_max = max |S A_0| / l1_ratio``, where every loading is zero,
        down to ``alpha_min_ratio * alpha_max`` (``A_0``: the principal axes).
    n_alphas : int, default=20
    alpha_min_ratio : float, default=1e-2
    l1_ratio, solver, standardize, max_iter, tol
        As in :class:`SparsePCA`. ``l1_ratio`` must be > 0 for the default grid.

    Returns
    -------
    pandas.DataFrame
        One row per ``(alpha, component)``, alphas decreasing, with columns
        ``alpha``, ``component`` (0-based), ``n_nonzero``,
        ``explained_variance`` (adjusted), ``explained_variance_ratio``,
        ``cumulative_explained_variance_ratio`` (adjusted variance of
        components ``0..j`` over the total variance) and ``n_iter``.
        A ``ConvergenceWarning`` lists the alphas whose fit reached ``max_iter``.

    Examples
    --------
    >>> from sklearn.datasets import load_diabetes
    >>> path = sparse_pca_path(load_diabetes().data, 2, n_alphas=6, standardize=True)
    >>> path.groupby("alpha", sort=False)["n_nonzero"].sum().tolist()
    [0, 4, 9, 10, 13, 16]
    >>> path.groupby("alpha", sort=False)["explained_variance_ratio"].sum().round(2).tolist()
    [0.0, 0.23, 0.41, 0.44, 0.45, 0.46]
    """
    import pandas as pd  # a dependency, only needed for the table

    estimator = SparsePCA(
        n_components, l1_ratio=l1_ratio, solver=solver, standardize=standardize, max_iter=max_iter, tol=tol
    )
    if alphas is None:
        check_number(n_alphas, "n_alphas", integer=True, low=1)
        check_number(alpha_min_ratio, "alpha_min_ratio", low=0.0, high=1.0, low_open=True, high_open=True)
        check_number(l1_ratio, "l1_ratio", low=0.0, high=1.0)
        if l1_ratio == 0:
            raise ValueError("l1_ratio=0 has no L1 penalty, so no alpha makes loadings zero; pass alphas.")
    else:
        alphas = np.sort(np.asarray(alphas, dtype=float).ravel())[::-1]
        if alphas.size == 0:
            raise ValueError("alphas is empty; give at least one penalty.")
        for a in alphas:
            _check_penalty(float(a), l1_ratio)
    problem, k = estimator._prepare(X)
    if alphas is None:
        # The largest |S A_0| in working units, back in the units of alpha.
        alpha_max = np.abs(problem.scatter.times(problem.A0)).max() / l1_ratio * problem.unit**2
        alphas = np.geomspace(alpha_max, alpha_max * alpha_min_ratio, n_alphas) if alpha_max > 0 else [0.0]
    d = problem.Xw.shape[1]
    A, B = problem.A0, np.zeros((d, k))
    rows, unconverged, inexact = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # all-zero components are expected at large alpha
        for a in alphas:
            l1, l2 = estimator._penalties(a, problem.unit)
            solution = _alternate(problem.scatter, A, B, l1, l2, tol, max_iter)
            A, B = solution.A, solution.B
            if not solution.converged:
                unconverged.append(float(a))
            if not solution.exact_steps:
                inexact.append(float(a))
            estimator.set_params(alpha=a)._store(problem, solution, l1, l2)
            ratio = estimator.explained_variance_ratio_
            for j in range(k):
                rows.append({
                    "alpha": a,
                    "component": j,
                    "n_nonzero": int(estimator.n_nonzero_[j]),
                    "explained_variance": estimator.explained_variance_[j],
                    "explained_variance_ratio": ratio[j],
                    "cumulative_explained_variance_ratio": ratio[: j + 1].sum(),
                    "n_iter": solution.n_iter,
                })
    if inexact:
        _warn_inexact(solution._replace(exact_steps=False), inexact)
    if unconverged:
        warn(
            f"sparse_pca_path: the fits at alphas {unconverged} did not converge in max_iter={max_iter} "
            f"iterations (tol={tol}); increase max_iter or tol.",
            ConvergenceWarning,
        )
    return pd.DataFrame(rows)
