"""Maximum-likelihood factor analysis of complete data: Newton's method on the profiled likelihood.

For fixed uniquenesses ``Psi`` the best loadings are known in closed form
(Joreskog 1967; Lawley & Maxwell 1971): with ``theta_1 >= ... >= theta_d``
and ``u_i`` the eigenpairs of ``S* = Psi^{-1/2} S Psi^{-1/2}`` (``S`` the
covariance, denominator ``n``),

    W(Psi) = Psi^{1/2} [u_1 .. u_k] diag(sqrt(max(theta_i - 1, 0))),

so the likelihood is a function of ``x = log psi`` alone,

    -2 loglik / n - d log 2 pi = f(x) = sum_j x_j + tr S* - sum_{i<=k} h(theta_i),
    h(theta) = theta - log theta - 1  for theta > 1, else 0,

with gradient ``df/dx_j = (C - S)_jj / psi_j``, ``C = W W^T + Psi``, i.e.
``1 - S*_jj + sum_{i<=k} (theta_i - 1) u_ij^2``, and Hessian (first-order
perturbation of the eigenpairs; A the factors with ``theta_i > 1``)

    d2f/dx_j dx_l = S*_jj [j = l] - sum_{i in A} sum_m c_im (u_ij u_mj)(u_il u_ml),
    c_ii = theta_i,  c_im = (theta_i + theta_m) / 2  (m in A),
    c_im = (theta_i - 1)(theta_i + theta_m) / (theta_i - theta_m)  (m not in A).

This is the objective of R's ``factanal``. It is minimised here by Newton's
method with a backtracking line search, the Hessian made positive definite
where it is not, and bounds ``psi_j >= floor * var_j`` handled as an active
set (Heywood cases; a ``psi_j`` below 1e-8 of its variance goes to the
floor, Bertsekas' epsilon-active set). Newton converges quadratically, so
the reported optimum has a gradient at rounding level; EM and
scikit-learn's alternating iteration converge linearly and stop visibly
short of it on slow problems. Everything runs on the correlation matrix,
where ``f`` is unchanged (factor analysis is equivariant under rescaling
each feature), so the result does not depend on the units of the data.

Accuracy near the floor. ``S*`` has entries ``1 / psi_j``; a plain
``eigh`` loses its small eigenpairs to ``eps * max theta``. They are kept
by sorting the diagonal before ``eigh`` and, when the ``psi_j`` span more
than six decades, by a one-sided Jacobi SVD of the scaled square root of
the correlation (LAPACK ``dgejsv``). Near the optimum, where the change of
``f`` is below its rounding error, Newton steps are judged by the
gradient, which stays accurate.

Starts. The likelihood has local optima (a factor may lock onto one
feature, or a feature be a Heywood case only at the global optimum).
Newton runs from the squared multiple correlations (``factanal``'s start)
and from ``psi = var`` (scikit-learn's, scale-free); when the two agree on
an optimum without a Heywood case, that is the answer (the usual case:
two runs). Otherwise it tries 30 more starts (scikit-learn's alternating
iterations from the first and from principal-component communalities, and
random uniquenesses), 32 in all (when the first run already ends with a
Heywood case, ``psi = var`` is one of the many rather than a run of its
own: 20 -> 17-18 ms on a 100 x 5 problem), together: one projected Newton iteration
moves every start at once (NumPy's batched ``eigh``, one call for all the
``S*``), to a scaled gradient of 1e-6, which tells which optimum each start
heads for; Newton then polishes, best first, each point that is not within
reach of an optimum already found (a run that comes close to one stops
there) and could still end below the best. One start at a time paid NumPy's
call overhead per start and step: the batch made the fits that need the
starts 1.9 times faster (median over 102 such fits on scikit-learn's
datasets; 2.3 times over 121 on random problems with d = 4 to 15 and
n = d + 2 to 6 d + 20), at the same optimum in each. Each start costs eigendecompositions
of a d x d matrix, independent of ``n``. On
scikit-learn's datasets (iris, wine, diabetes, breast cancer, raw and
standardised, k up to the Ledermann bound) this never ends below
scikit-learn's ``FactorAnalysis(tol=1e-8, max_iter=20000)`` and is above it
by up to 750 nats.

References
----------
K. G. Joreskog (1967). Some contributions to maximum likelihood factor
analysis. Psychometrika 32(4), 443-482.
R. I. Jennrich, S. M. Robinson (1969). A Newton-Raphson algorithm for
maximum likelihood factor analysis. Psychometrika 34(1), 111-123.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
from sklearn.exceptions import ConvergenceWarning

from bayespca.gaussian import LowRankGaussian, canonical_loadings, log_likelihood_from_stats, log_prob
from bayespca.inference.closed_form import check_n_components, noise_floor
from bayespca.inference.contract import Fit, ModelSpec
from bayespca.inference.threads import serial_blas
from bayespca.messages import warn
from bayespca.params import as_generator, check_number
from bayespca.statistics import Prepared

__all__ = [
    "DEFAULT_TOL",
    "Correlation",
    "CovarianceFit",
    "Profile",
    "correlation",
    "fit_covariance",
    "fit_factor_analysis",
    "profile",
    "with_hessian",
]

DEFAULT_TOL = 1e-14  # scaled gradient |df/dx_j| / (1 + S*_jj) at which Newton stops
DEFAULT_STARTS = 32  # at most; benign fits stop after 2
_ALTERNATING = 20  # scikit-learn-style iterations before Newton, for two of the starts
_BENIGN = np.log(1e-3)  # an optimum with every psi above this (correlation scale) has no Heywood case
_LOG_2PI = np.log(2.0 * np.pi)
_ARMIJO = 1e-4
_MAX_STEP = 4.0  # largest change of any log psi_j per Newton step
_PIN = np.log(1e-8)  # log psi_j (correlation scale) below which it goes to its floor
_NEAR_FLOOR = 10.0  # log psi_j within this of its floor may be sent there at once
_ENDGAME = 1e-6  # scaled gradient below which Newton steps are judged by the gradient
_LEVEL = 1e-10  # relative change of f within which an endgame step counts as level
_SORT = 1e2  # diagonal spread of S* above which eigh sees it sorted
_GRADED = 1e3  # ratio of the largest to the smallest sqrt(psi_j) above which S* is decomposed by Jacobi
_JOIN_LOW = np.log(1e-4)
_JOIN = 0.1  # a run this close (every log psi_j) to a known optimum stops
_STATIONARY = 1e-7  # scaled gradient below which a stalled Newton run counts as converged
_SCREENED = 1e-6  # scaled gradient at which the screen of many starts leaves a point to Newton
_SCREEN_ITER = 60  # most batched steps of the screen
_SCREEN_HALVINGS = 12  # a screened row that needs a shorter step is left to Newton


class Profile(NamedTuple):
    """The profiled objective at ``x = log psi`` (correlation scale).

    Attributes
    ----------
    value : float
        ``f(x)`` (module notes).
    gradient : ndarray of shape (d,)
    hessian : ndarray of shape (d, d) or None
    loadings : ndarray of shape (d, k)
        ``W(Psi)``, the best loadings for these uniquenesses.
    scaled_diagonal : ndarray of shape (d,)
        ``S*_jj = S_jj / psi_j``, the scale of each gradient entry.
    magnitude : float
        Sum of the magnitudes of the terms of ``f``: its rounding error is
        about ``eps * magnitude``.
    spectrum : tuple
        ``(theta, vectors, a)``: the eigenpairs of ``S*`` and the number of
        factors with ``theta_i > 1``, from which the Hessian is computed when
        it is needed (:func:`with_hessian`).
    """

    value: float
    gradient: np.ndarray
    hessian: np.ndarray | None
    loadings: np.ndarray
    scaled_diagonal: np.ndarray
    magnitude: float
    spectrum: tuple


def profile(x: np.ndarray, corr: np.ndarray, k: int, hessian: bool = False) -> Profile:
    """Profiled FA objective, its gradient and (optionally) Hessian in ``x = log psi``.

    Parameters
    ----------
    x : ndarray of shape (d,)
        Log uniquenesses.
    corr : ndarray of shape (d, d)
        Covariance (denominator ``n``) of the data, usually a correlation matrix.
    k : int
        Number of factors.
    hessian : bool, default=False

    Returns
    -------
    Profile

    Examples
    --------
    One factor, two features with correlation 0.5: the ML uniquenesses are
    0.5, where the gradient vanishes.

    >>> corr = np.array([[1.0, 0.5], [0.5, 1.0]])
    >>> p = profile(np.log([0.5, 0.5]), corr, 1)
    >>> np.abs(p.gradient).max() < 1e-15, p.loadings.ravel().round(6)
    (np.True_, array([0.707107, 0.707107]))
    """
    matrix, factor = corr if isinstance(corr, Correlation) else (corr, None)
    sd = np.exp(0.5 * x)
    inv = 1.0 / sd
    diag = matrix.diagonal() * inv * inv
    if sd.max() > _GRADED * sd.min():
        theta, vectors = _jacobi_eigh(factor if factor is not None else correlation(matrix).factor, sd)
    else:
        theta, vectors = _graded_eigh(matrix * np.multiply.outer(inv, inv), diag)
    terms = _terms(x[None], diag[None], theta[None], vectors[None], k)
    value, gradient, w, magnitude = (float(terms.value[0]), terms.gradient[0], terms.loadings[0],
                                     float(terms.magnitude[0]))
    prof = Profile(value, gradient, None, w, diag, magnitude, (theta, vectors, int(terms.active[0])))
    return with_hessian(prof) if hessian else prof


class _Terms(NamedTuple):
    """:func:`profile`'s quantities for a stack of ``m`` points ``x`` (arrays with a leading axis m)."""

    value: np.ndarray
    gradient: np.ndarray
    loadings: np.ndarray
    magnitude: np.ndarray
    active: np.ndarray  # |A|, the number of factors with theta_i > 1


def _terms(x, diag, theta, vectors, k) -> _Terms:
    """f, its gradient, ``W(psi)`` and f's magnitude at each row of ``x``, from the eigenpairs of ``S*``.

    ``theta`` (m, d) decreasing, ``vectors`` (m, d, d) its columns, ``diag`` (m, d) ``S*_jj``.
    """
    head = theta[:, :k]
    in_a = head > 1.0  # theta decreases: A is the first |A| factors
    ta = np.where(in_a, head, 1.0)
    log_ta = np.log(ta)
    # sum_{i in A} (log theta_i + 1) + sum_{i not in A} theta_i: the huge eigenvalues
    # of a psi_j near 0 enter through their logarithm, not through tr S* - theta_1.
    terms = np.concatenate([x, log_ta, np.where(in_a, 0.0, head), theta[:, k:]], axis=1)
    a = np.count_nonzero(in_a, axis=1)
    value = terms.sum(axis=1) + a
    excess = ta - 1.0  # 0 outside A
    uk = vectors[:, :, :k]
    gradient = 1.0 - diag + ((uk * uk) @ excess[:, :, None])[:, :, 0]
    loadings = np.exp(0.5 * x)[:, :, None] * uk * np.sqrt(excess)[:, None, :]
    magnitude = np.abs(terms).sum(axis=1)
    return _Terms(value, gradient, loadings, magnitude, a)


def with_hessian(prof: Profile) -> Profile:
    """``prof`` with its Hessian (module notes), from the eigenpairs it holds; O(|A| d^3)."""
    if prof.hessian is not None:
        return prof
    theta, vectors, a = prof.spectrum
    hess = _hessians(theta[None], vectors[None], np.array([a]), prof.scaled_diagonal[None])
    return prof._replace(hessian=hess[0])


class Correlation(NamedTuple):
    """A correlation (or covariance) matrix with a square root ``factor^T factor = matrix``."""

    matrix: np.ndarray
    factor: np.ndarray


def correlation(matrix: np.ndarray) -> Correlation:
    """``matrix`` with the factor ``Lambda^{1/2} V^T`` of its eigendecomposition (negative eigenvalues as 0).

    Examples
    --------
    >>> c = correlation(np.array([[1.0, 0.5], [0.5, 1.0]]))
    >>> bool(np.allclose(c.factor.T @ c.factor, c.matrix))
    True
    """
    lam, vec = np.linalg.eigh(matrix)
    return Correlation(matrix, np.sqrt(np.maximum(lam, 0.0))[:, None] * vec.T)


def _jacobi_eigh(factor, sd):
    """Eigenpairs (decreasing) of ``S* = D factor^T factor D``, ``D = diag(1 / sd)``, by one-sided Jacobi.

    When some ``psi_j`` are orders of magnitude below the others, ``S*`` is
    strongly graded: even sorted, ``eigh`` leaves the eigenvectors of the
    small eigenvalues wrong by ``eps * max theta`` (measured: 1e-5 in the
    gradient of the log-likelihood in ``W``), while Jacobi's SVD of the
    column-scaled ``factor D`` (LAPACK ``dgejsv``, Drmac & Veselic 2008) is
    accurate to ``eps`` times the condition of ``factor`` alone (5e-13).
    """
    sva, _, v, work, _, info = scipy.linalg.lapack.dgejsv(factor / sd, joba=0, jobu=3, jobv=0)
    if info != 0:
        raise np.linalg.LinAlgError(f"dgejsv failed (info={info})")
    values = sva * (work[0] / work[1]) if work[0] != work[1] else sva
    order = np.argsort(-values, kind="stable")
    return values[order] ** 2, v[:, order]


def _graded_eigh(a, diag):
    """Eigenpairs of symmetric ``a``, decreasing, accurate when its diagonal is graded.

    ``S* = Psi^{-1/2} S Psi^{-1/2}`` has entries of order ``1 / psi_j``: as a
    ``psi_j`` goes to its floor, a plain ``eigh`` loses the small eigenvalues
    (absolute error ``eps * max theta``, 2e-4 at ``psi_j = 1e-12``).
    LAPACK's Householder tridiagonalisation keeps them when the diagonal
    decreases along the matrix, so the features are sorted that way first
    (measured on breast cancer: 2e-11 relative at ``psi_j = 1e-12`` and ``1e-15``).
    """
    if diag.max() <= _SORT * diag.min():  # hardly graded: nothing to sort
        theta, vectors = np.linalg.eigh(a)
        return theta[::-1], vectors[:, ::-1]
    order = np.argsort(-diag, kind="stable")
    theta, vectors = np.linalg.eigh(a[order][:, order])
    unsorted = np.empty_like(vectors)
    unsorted[order] = vectors
    return theta[::-1], unsorted[:, ::-1]


def _hessians(theta, vectors, a, diag):
    """Hessians of f (module notes) for a stack: ``theta`` (m, d), ``vectors`` (m, d, d), ``a`` (m,) = |A|."""
    m, d = theta.shape
    hess = diag[:, :, None] * np.eye(d)
    if m == 1:  # a single point (Newton's): no grouping
        return hess - _curvature(theta, vectors, int(a[0])) if a[0] > 0 else hess
    for count in np.unique(a[a > 0]):
        rows = a == count
        hess[rows] -= _curvature(theta[rows], vectors[rows], int(count))
    return hess


def _curvature(theta, vectors, a):
    """The eigenvector-perturbation part of the Hessian, for points with the same ``|A| = a > 0``."""
    m, d = theta.shape
    t = theta[:, :a, None]  # the active factors are the first a (theta decreases)
    weights = np.empty((m, a, d))
    weights[:, :, :a] = 0.5 * (t + theta[:, None, :a])
    weights[:, np.arange(a), np.arange(a)] = theta[:, :a]
    # theta_i > 1 >= theta_m here, so the denominators are positive.
    weights[:, :, a:] = (t - 1.0) * (t + theta[:, None, a:]) / (t - theta[:, None, a:])
    products = (vectors[:, :, :a, None] * vectors[:, :, None, :]).reshape(m, d, a * d)  # u_ji u_jm
    return (products * weights.reshape(m, 1, a * d)) @ products.transpose(0, 2, 1)


# --------------------------------------------------------------- Newton
class _Run(NamedTuple):
    x: np.ndarray
    prof: Profile
    trace: list
    n_iter: int
    converged: bool
    joined: bool = False  # stopped on the way to an optimum already found


def _free(x, lower, gradient):
    """Coordinates Newton may move: off their bound, or at it with the gradient pointing inward."""
    return (x > lower + 1e-12) | (gradient < 0)


def _scaled_gradient(prof: Profile, free) -> float:
    g = np.abs(prof.gradient) / (1.0 + prof.scaled_diagonal)
    return float(np.max(g[free], initial=0.0))


def _newton_direction(hess, gradient):
    """``-H^{-1} g`` with ``H`` made positive definite (eigenvalues raised to a fraction of the largest)."""
    if gradient.size == 0:  # every coordinate held at its bound
        return np.zeros(0)
    # the usual case near an optimum, at a third of the cost (LAPACK directly: d is small)
    chol, info = scipy.linalg.lapack.dpotrf(hess, lower=1)
    if info == 0 and np.min(np.diag(chol)) ** 2 > 1e-8 * max(float(np.max(np.diag(hess))), 1.0):
        return -scipy.linalg.lapack.dpotrs(chol, gradient, lower=1)[0]
    lam, vec = np.linalg.eigh(hess)
    top = max(float(np.max(np.abs(lam), initial=0.0)), 1.0)
    lam = np.maximum(np.abs(lam), 1e-8 * top)
    return -vec @ ((vec.T @ gradient) / lam)


def _newton(x, corr, k, lower, *, tol, max_iter, known=()) -> _Run:
    """Projected Newton with line search from ``x``; returns the last point and its trace of f.

    A run that comes within ``_JOIN`` (in every ``log psi_j``) of one of the
    ``known`` optima stops there (``joined``): it would end at that optimum.
    """
    x = np.maximum(x, lower)
    prof = profile(x, corr, k, hessian=True)
    trace = [prof.value]
    stalls = 0
    for it in range(1, max_iter + 1):
        free = _free(x, lower, prof.gradient)
        size = _scaled_gradient(prof, free)
        if size <= tol:
            return _Run(x, prof, trace, it - 1, True)
        found = None
        for step in _steps(x, prof, free, lower):
            found = _line_search(x, step, prof, corr, k, lower, size)
            if found is not None:
                break
        if found is None:  # no progress beyond rounding: stationary to working precision
            return _Run(x, prof, trace, it - 1, size <= _STATIONARY)
        x, gain, prof = found
        if _joins(x, known):
            return _Run(x, prof, trace, it, False, joined=True)
        prof = with_hessian(prof)
        trace.append(min(prof.value, trace[-1]))  # a level step may differ by rounding
        stalls = stalls + 1 if gain > 0.5 else 0
        if stalls >= 3:  # three steps in a row that neither decrease f nor halve the gradient
            size = _scaled_gradient(prof, _free(x, lower, prof.gradient))
            return _Run(x, prof, trace, it, size <= max(tol, _STATIONARY))
    size = _scaled_gradient(prof, _free(x, lower, prof.gradient))
    return _Run(x, prof, trace, max_iter, size <= tol)


def _steps(x, prof: Profile, free, lower):
    """Candidate Newton steps, tried in turn until a line search succeeds.

    Along a ``psi_j`` near 0 (a Heywood case in the making) f is nearly flat,
    ``a + b psi_j``, its gradient ``(C - S)_jj / psi_j`` is a difference of
    numbers ``1 / psi_j`` times larger (rounding noise ``eps / psi_j``,
    larger than the gradient itself below ``psi_j ~ 1e-8``), and the Newton
    system ill-conditioned: such a coordinate, below 1e-8 (correlation
    scale; it changes the likelihood by O(n 1e-8) at most), is sent to the
    floor (Bertsekas' epsilon-active set) while Newton solves for the
    others; only if that fails do all free coordinates move together. Each
    Newton step is first limited coordinate by coordinate (a near-flat one
    must not shrink the others' steps), then, if that turned it uphill,
    shortened as a whole.
    """
    pinned = free & (x < _PIN)
    for fixed in (pinned, np.zeros_like(pinned)) if pinned.any() else (pinned,):
        moving = free & ~fixed
        newton = np.zeros_like(x)
        hess = prof.hessian if moving.all() else prof.hessian[moving][:, moving]
        newton[moving] = _newton_direction(hess, prof.gradient[moving])
        longest = float(np.max(np.abs(newton), initial=0.0))
        boxed = np.clip(newton, -_MAX_STEP, _MAX_STEP)
        for step in (boxed, newton * (_MAX_STEP / longest)) if longest > _MAX_STEP else (boxed,):
            step = step.copy()
            step[fixed] = lower[fixed] - x[fixed]
            yield step


def _trial_points(x, step, prof: Profile, lower):
    """Points along the projected Newton path, longest first.

    A ``psi_j`` that tends to 0 (a Heywood case) changes ``f`` by
    ``O(psi_j)``, so Newton creeps towards the floor one unit of
    ``log psi_j`` per step; the first trial therefore puts every such
    coordinate (small, pushed down, Newton step down) at its floor at once.
    """
    falling = (step < 0) & (prof.gradient > 0) & (x < lower + _NEAR_FLOOR) & (x > lower)
    if falling.any():
        yield np.where(falling, lower, np.maximum(x + step, lower)), True
    t = 1.0
    while t > 1e-10:
        yield np.maximum(x + t * step, lower), t == 1.0
        t *= 0.5


def _line_search(x, step, prof: Profile, corr, k, lower, size):
    """Backtracking (Armijo) along the projected path; ``(x_new, gain, profile)`` or None.

    Near the optimum the change of ``f`` drowns in its rounding error (large
    when a ``psi_j`` sits near a small floor: the eigenvalues of ``S*`` are
    as large as ``1 / psi_j``); a full step (with or without the floor
    trial) is then taken if ``f`` is level within rounding and the gradient,
    which stays accurate, is smaller there; in the quadratic endgame (scaled
    gradient below 1e-6), where a Newton step changes f by ~``g^2``, a full
    step that cuts the gradient tenfold is taken if f rose by at most 1e-10
    relative. ``gain`` is the
    factor by which the scaled gradient shrank (0 after a clear decrease of
    ``f``).
    """
    noise = 64 * np.finfo(float).eps * prof.magnitude
    for x_new, full in _trial_points(x, step, prof, lower):
        cand = profile(x_new, corr, k)
        slope = float(prof.gradient @ (x_new - x))
        if cand.value <= prof.value + _ARMIJO * slope and cand.value < prof.value - noise:
            return x_new, 0.0, cand
        endgame = _LEVEL * (1.0 + abs(prof.value)) if size < _ENDGAME else 0.0
        if full and cand.value <= prof.value + max(noise, endgame):
            smaller = _scaled_gradient(cand, _free(x_new, lower, cand.gradient)) / size
            if smaller < (1.0 if cand.value <= prof.value + noise else 0.1):
                return x_new, smaller, cand
    return None


# --------------------------------------------------------------- many starts at once
class _Stack(NamedTuple):
    """Points ``x`` (m, d) with f, its gradient and what the screen needs, one row per start."""

    x: np.ndarray
    value: np.ndarray
    gradient: np.ndarray
    scaled_diagonal: np.ndarray
    magnitude: np.ndarray
    loadings: np.ndarray
    theta: np.ndarray
    vectors: np.ndarray
    active: np.ndarray
    size: np.ndarray  # largest free scaled gradient (screen only; inf until measured)


def _stack_profile(x, matrix, k) -> _Stack:
    """:func:`profile` at each row of ``x`` (m, d), with LAPACK's batched ``eigh`` of each ``S*``.

    Without :func:`profile`'s Jacobi decomposition of the most strongly
    graded ``S*``: its accuracy matters at the optimum, which :func:`_newton`
    polishes, not on the way to its basin.
    """
    inv = np.exp(-0.5 * x)
    diag = matrix.diagonal() * inv * inv
    if np.all(diag.max(axis=1) <= _SORT * diag.min(axis=1)):  # hardly graded: nothing to sort
        theta, vectors = np.linalg.eigh(matrix * inv[:, :, None] * inv[:, None, :])
        theta, vectors = theta[:, ::-1], vectors[:, :, ::-1]
    else:  # sorted by decreasing diagonal, as in _graded_eigh, which keeps the small eigenpairs
        order = np.argsort(-diag, axis=1, kind="stable")
        inv_sorted = np.take_along_axis(inv, order, axis=1)
        theta, sorted_vectors = np.linalg.eigh(matrix[order[:, :, None], order[:, None, :]]
                                               * inv_sorted[:, :, None] * inv_sorted[:, None, :])
        vectors = np.empty_like(sorted_vectors)
        np.put_along_axis(vectors, order[:, :, None], sorted_vectors[:, :, ::-1], axis=1)
        theta = theta[:, ::-1]
    terms = _terms(x, diag, theta, vectors, k)
    return _Stack(x, terms.value, terms.gradient, diag, terms.magnitude, terms.loadings, theta, vectors,
                  terms.active, np.full(len(x), np.inf))


def _rows(stack: _Stack, rows) -> _Stack:
    """The points ``rows`` (a mask, or increasing indices) of ``stack``; ``stack`` itself if that is all."""
    everything = rows.all() if rows.dtype == bool else rows.size == len(stack.x)
    return stack if everything else _Stack(*(field[rows] for field in stack))


def _put(stack: _Stack, rows, part: _Stack) -> _Stack:
    """``stack`` with its points ``rows`` (increasing indices) replaced by ``part``."""
    if rows.size == len(stack.x):
        return part
    for field, new in zip(stack, part, strict=True):
        field[rows] = new
    return stack


def _screen(xs, matrix, k, lower, max_iter=_SCREEN_ITER) -> _Stack:
    """Projected Newton from every row of ``xs`` at once, to the loose tolerance ``_SCREENED``.

    Tells which optimum each start heads for at the cost of a few batched
    eigendecompositions per step, where one run at a time pays NumPy's call
    overhead per start (a 5 x 5 problem: ~30 us of arithmetic in 150 us).
    Rows stop at the tolerance, when no step decreases f, or after
    ``max_iter`` steps; :func:`_polish` finishes the promising ones.
    """
    stack = _stack_profile(np.maximum(xs, lower), matrix, k)
    running = np.ones(len(xs), bool)
    for _ in range(max_iter):
        free = (stack.x > lower + 1e-12) | (stack.gradient < 0)
        stack.size[:] = np.max(np.where(free, np.abs(stack.gradient) / (1.0 + stack.scaled_diagonal), 0.0),
                               axis=1)
        running &= stack.size > _SCREENED
        rows = np.flatnonzero(running)
        if rows.size == 0:
            break
        part = _rows(stack, rows)
        moved, new = _stack_line_search(part, _stack_steps(part, free[rows], lower), matrix, k, lower)
        running[rows[~moved]] = False
        if moved.any():
            stack = _put(stack, rows[moved], new)
    return stack


def _stack_steps(stack: _Stack, free, lower):
    """Newton steps for each row, the Hessian made positive definite (:func:`_newton_direction`'s rule).

    Coordinates at their bound stay; those below ``_PIN`` go to it
    (:func:`_steps`); each step is limited to ``_MAX_STEP`` per coordinate.
    """
    pinned = free & (stack.x < _PIN)
    held = ~free | pinned
    d = stack.x.shape[1]
    hess = _hessians(stack.theta, stack.vectors, stack.active, stack.scaled_diagonal)
    hess = np.where(held[:, :, None] | held[:, None, :], 0.0, hess) + held[:, :, None] * np.eye(d)
    gradient = np.where(held, 0.0, stack.gradient)
    lam, vec = np.linalg.eigh(hess)
    top = np.maximum(np.abs(lam).max(axis=1, keepdims=True), 1.0)
    lam = np.maximum(np.abs(lam), 1e-8 * top)
    step = -(vec @ ((gradient[:, None, :] @ vec)[:, 0] / lam)[:, :, None])[:, :, 0]
    return np.where(pinned, lower - stack.x, np.clip(step, -_MAX_STEP, _MAX_STEP))


def _stack_line_search(stack: _Stack, step, matrix, k, lower):
    """Armijo backtracking along each row's projected path (:func:`_trial_points`).

    Returns which rows moved and their new points (None if none did).
    """
    m = len(step)
    noise = 64 * np.finfo(float).eps * stack.magnitude
    falling = (step < 0) & (stack.gradient > 0) & (stack.x < lower + _NEAR_FLOOR) & (stack.x > lower)
    # Each point's trials in turn: the floor trial where it has falling coordinates, then
    # steps 1, 1/2, 1/4, ...; one batched evaluation serves every point's next trial.
    floor_first = falling.any(axis=1)
    tried = np.zeros(m, int)
    moved = np.zeros(m, bool)
    found = []  # (rows, their new points) from each evaluation
    while True:
        rows = np.flatnonzero(~moved & (tried < _SCREEN_HALVINGS + floor_first))
        if rows.size == 0:
            break
        x, floor_trial = stack.x[rows], floor_first[rows] & (tried[rows] == 0)
        t = 0.5 ** np.maximum(tried[rows] - floor_first[rows], 0)
        trial = np.maximum(x + t[:, None] * step[rows], lower)
        trial = np.where(floor_trial[:, None] & falling[rows], lower, trial)
        cand = _stack_profile(trial, matrix, k)
        slope = np.sum(stack.gradient[rows] * (trial - x), axis=1)
        before = stack.value[rows]
        ok = (cand.value <= before + _ARMIJO * slope) & (cand.value < before - noise[rows])
        tried[rows] += 1
        if ok.any():
            found.append((rows[ok], _rows(cand, ok)))
            moved[rows[ok]] = True
    if len(found) <= 1:  # the usual case: every point that moves took the same trial
        return moved, found[0][1] if found else None
    order = np.argsort(np.concatenate([r for r, _ in found]))
    parts = [part for _, part in found]
    return moved, _Stack(*(np.concatenate(fields)[order] for fields in zip(*parts, strict=True)))


# --------------------------------------------------------------- starts
def _deterministic_starts(corr, k, lower):
    """Squared multiple correlations (R's ``factanal``) and ``psi = var`` (scikit-learn's, scale-free)."""
    d = corr.shape[0]
    lam, vec = np.linalg.eigh(corr)
    # diag(R^{-1}) through the eigenvalues, guarded for a singular R (n <= d, collinear features)
    inv_diag = (vec**2) @ (1.0 / np.maximum(lam, 1e-8 * max(float(lam[-1]), 1e-300)))
    smc = (1.0 - 0.5 * k / d) / inv_diag
    # principal-component communalities: features the first k components explain
    # best start near 0, where Heywood cases are
    pca = 1.0 - (vec[:, ::-1][:, :k] ** 2) @ lam[::-1][:k]
    return [np.maximum(np.log(np.clip(v, 1e-3, 1.0)), lower) for v in (smc, np.ones(d), pca)]


def _joins(x, known) -> bool:
    """Whether ``x`` is within ``_JOIN`` (every ``log psi_j``) of one of the ``known`` optima.

    All ``psi_j`` below 1e-4 count as equal: a run creeps to a Heywood floor.
    """
    here = np.maximum(x, _JOIN_LOW)
    return any(np.max(np.abs(here - np.maximum(x_known, _JOIN_LOW))) < _JOIN for x_known in known)


def _alternating(x, matrix, k, lower, n_iter=_ALTERNATING):
    """Iterations ``psi <- max(diag(R - W(psi) W(psi)^T), floor)`` on a stack of starts: scikit-learn's.

    They move uphill along a different path than Newton's and often end in
    another basin, which is what a start is for on rugged likelihoods.
    """
    for _ in range(n_iter):
        w = _stack_profile(x, matrix, k).loadings
        x = np.maximum(np.log(np.maximum(1.0 - np.sum(w**2, axis=2), 1e-300)), lower)
    return x


def _multistart(corr, k, lower, n_starts, rng, tol, max_iter):
    """Newton from the default starts; see :func:`fit_factor_analysis`.

    Returns the runs polished by :func:`_newton` and the objective reached
    from each start (in the order of the starts).
    """
    smc, ones, pca = _deterministic_starts(corr.matrix, k, lower)
    runs = [_newton(smc, corr, k, lower, tol=tol, max_iter=max_iter)]
    if n_starts < 2:
        return runs, [runs[0].prof.value]
    # After a Heywood case at the first start the many starts follow in any case, and psi = var
    # joins their screen instead of running on its own.
    first = [ones]
    if n_starts == 2 or np.min(runs[0].x) > _BENIGN:
        runs.append(_newton(ones, corr, k, lower, tol=tol, max_iter=max_iter, known=[runs[0].x]))
        benign = np.min(_best(runs).x) > _BENIGN
        if n_starts == 2 or ((runs[1].joined or _agree(runs[0], runs[1])) and benign):
            return runs, [r.prof.value for r in runs]
        first = []
    reached = [r.prof.value for r in runs]
    m = n_starts - 2
    xs = np.maximum(np.log(rng.uniform(0.05, 1.0, (max(m - 2, 0), lower.size))), lower)
    alternated = _alternating(np.array([smc, pca]), corr.matrix, k, lower)
    xs = np.concatenate([np.reshape(first, (-1, lower.size)), alternated, xs])[:n_starts - len(runs)]
    return runs, reached + _polish(_screen(xs, corr.matrix, k, lower), runs, corr, k, lower, tol, max_iter)


def _polish(screened: _Stack, runs, corr, k, lower, tol, max_iter):
    """Newton from the screened points, best first, skipping optima already found.

    A screened point that met the screen's tolerance and is worse than the
    best optimum so far cannot end below it (its remaining decrease is
    about the squared gradient) and is not polished. Appends the new runs to
    ``runs``; returns the objective reached from each screened start.
    """
    reached = screened.value.copy()
    for i in np.argsort(screened.value, kind="stable"):
        known = [r.x for r in runs if not r.joined]
        lowest = _best(runs).prof.value
        worse = screened.size[i] <= _SCREENED and screened.value[i] > lowest + 1e-9 * (1 + abs(lowest))
        if worse or _joins(screened.x[i], known):
            continue
        runs.append(_newton(screened.x[i], corr, k, lower, tol=tol, max_iter=max_iter, known=known))
        reached[i] = runs[-1].prof.value
    return reached.tolist()


def _agree(a: _Run, b: _Run) -> bool:
    return abs(a.prof.value - b.prof.value) <= 1e-9 * (1.0 + abs(a.prof.value))


def _best(runs):
    """Among the runs that reached the lowest f, the first converged one (else the first); never a joined run.

    Taking the first, not the lowest to the last digit, keeps rounding from
    choosing among starts that ended at the same optimum.
    """
    runs = [r for r in runs if not r.joined]
    lowest = min(r.prof.value for r in runs)
    at_best = [r for r in runs if r.prof.value <= lowest + 1e-9 * (1.0 + abs(lowest))]
    return next((r for r in at_best if r.converged), at_best[0])


class CovarianceFit(NamedTuple):
    """Factor analysis of one covariance matrix (:func:`fit_covariance`).

    Attributes
    ----------
    loadings : ndarray of shape (d, k)
        ``W`` with orthogonal columns of ``Psi^{-1/2} W`` (unsigned).
    noise : ndarray of shape (d,)
        ``psi``.
    objective : ndarray
        ``-2 / n`` times the log-likelihood per row, minus ``d log 2 pi``,
        after each Newton step of the kept start.
    n_iter : int
    converged : bool
    scaled_gradient : float
        Largest free ``|df/d log psi_j| / (1 + S_jj / psi_j)`` at the end.
    start_objectives : list of float
        The objective reached from each start: where Newton ended, or, for a
        start that joined an optimum already found or could not beat the
        best, where it stopped.
    at_floor : ndarray of bool, shape (d,)
    """

    loadings: np.ndarray
    noise: np.ndarray
    objective: np.ndarray
    n_iter: int
    converged: bool
    scaled_gradient: float
    start_objectives: list
    at_floor: np.ndarray


def fit_covariance(
    cov: np.ndarray,
    k: int,
    floor: np.ndarray,
    *,
    starts: list | None = None,
    n_starts: int = DEFAULT_STARTS,
    random_state=0,
    tol: float = DEFAULT_TOL,
    max_iter: int = 500,
) -> CovarianceFit:
    """Maximum-likelihood factor analysis of a covariance matrix (denominator ``n``).

    Parameters
    ----------
    cov : ndarray of shape (d, d)
    k : int
    floor : ndarray of shape (d,)
        Lower bounds of ``psi``. Features whose variance does not exceed
        their bound (constant ones, and ones too small for float64 to hold a
        bound: :func:`~bayespca.inference.closed_form.noise_floor`) get
        ``psi = floor`` and no loading.
    starts : list of ndarray of shape (d,), optional
        Starting ``psi`` (else :func:`fit_factor_analysis`'s default starts).
    n_starts, random_state, tol, max_iter
        As :func:`fit_factor_analysis`.

    Returns
    -------
    CovarianceFit

    Examples
    --------
    >>> cov = np.array([[1.0, 0.5, 0.4], [0.5, 1.0, 0.2], [0.4, 0.2, 1.0]])
    >>> fit = fit_covariance(cov, 1, np.full(3, 1e-6))
    >>> C = fit.loadings @ fit.loadings.T + np.diag(fit.noise)
    >>> bool(np.allclose(C, cov))  # 3 features, 1 factor: an exact fit
    True
    """
    d = cov.shape[0]
    var = np.diag(cov).copy()
    live = var > floor  # the others: no loading, psi at the floor
    sd = np.sqrt(var[live])
    corr = cov[np.ix_(live, live)] / np.outer(sd, sd)
    np.fill_diagonal(corr, 1.0)
    lower = np.log(floor[live] / var[live])
    if not live.any():  # constant data: nothing to explain, every psi at its floor
        psi = np.array(floor, dtype=float)
        shift = float(np.sum(np.log(psi)))  # log|Psi| + tr(Psi^-1 S), S = 0
        return CovarianceFit(np.zeros((d, k)), psi, np.array([shift]), 0, True, 0.0, [shift],
                             np.ones(d, bool))
    corr = correlation(corr)
    if starts is None:
        runs, reached = _multistart(corr, k, lower, n_starts, as_generator(random_state), tol, max_iter)
    else:
        xs = [np.maximum(np.log(np.maximum(s[live], 1e-300) / var[live]), lower) for s in starts]
        runs = [_newton(x0, corr, k, lower, tol=tol, max_iter=max_iter) for x0 in xs]
        reached = [r.prof.value for r in runs]
    best = _best(runs)
    psi = np.array(floor, dtype=float)
    psi[live] = np.exp(best.x) * var[live]
    w = np.zeros((d, k))
    loadings = best.prof.loadings  # fewer than k columns where k exceeds the features that vary
    w[np.ix_(live, np.arange(loadings.shape[1]))] = loadings * sd[:, None]
    at_floor = ~live
    at_floor[live] = best.x <= lower + 1e-9
    # f is on the correlation scale: add back log|diag(S)| and the constant features' log psi.
    shift = float(np.sum(np.log(var[live])) + np.sum(np.log(psi[~live])))
    return CovarianceFit(
        w,
        psi,
        np.asarray(best.trace) + shift,
        best.n_iter,
        best.converged,
        _scaled_gradient(best.prof, _free(best.x, lower, best.prof.gradient)),
        [value + shift for value in reached],
        at_floor,
    )


# --------------------------------------------------------------- driver
def fit_factor_analysis(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    tol: float | None = None,
    max_iter: int = 500,
    floor: float = 1e-9,
    init: LowRankGaussian | None = None,
    n_starts: int = DEFAULT_STARTS,
    random_state=0,
) -> Fit:
    """Maximum-likelihood factor analysis of complete data by Newton's method on ``log psi``.

    Parameters
    ----------
    prepared : Prepared
        Complete data (:func:`bayespca.statistics.prepare`).
    spec : ModelSpec
        ``noise="diagonal"``; ``n_components`` ``k`` in ``[1, d - 1]``.
    tol : float or None, default=None
        Stop when every free ``|df/d log psi_j|`` is at most
        ``tol * (1 + S_jj / psi_j)`` (module notes; ``f`` is ``-2 / n`` times
        the log-likelihood per row, so the test means the same at any ``n``
        and scale). None: 1e-11. With 0, Newton runs until a step no longer
        decreases ``f`` beyond rounding.
    max_iter : int, default=500
        Newton iterations per start.
    floor : float, default=1e-9
        ``psi_j >= floor * var_j`` (:func:`~bayespca.inference.closed_form.noise_floor`).
    init : LowRankGaussian or None
        Start from these uniquenesses (data units) instead of the default starts.
    n_starts : int, default=32
        Most starts tried (module notes); the best optimum is kept.
    random_state : int, Generator or None, default=0
        Seed of the random starts.

    Returns
    -------
    Fit
        In data units, ``method="em"`` (the estimators' name for maximum
        likelihood by iteration); ``W`` in canonical orientation; ``trace``
        the log-likelihood after each Newton step of the kept start;
        ``details`` a dict with the scaled gradient at the optimum and the
        log-likelihood reached from each start.

    Examples
    --------
    >>> from bayespca.statistics import prepare
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((500, 1)) @ [[1.0, 0.8, 0.6]] + rng.standard_normal((500, 3)) * 0.5
    >>> fit = fit_factor_analysis(prepare(X), ModelSpec("diagonal", 1))
    >>> C = fit.gaussian.loadings @ fit.gaussian.loadings.T + np.diag(fit.gaussian.noise)
    >>> bool(fit.converged), bool(np.allclose(np.diag(C), X.var(axis=0)))
    (True, True)
    """
    n, d = prepared.n, prepared.d
    k = check_n_components(spec.n_components, d, "n_features")
    tol = DEFAULT_TOL if tol is None else check_number(tol, "tol", low=0.0)
    max_iter = check_number(max_iter, "max_iter", integer=True, low=1)
    n_starts = check_number(n_starts, "n_starts", integer=True, low=1)
    stats = prepared.stats
    cov = stats.scatter / n
    floor_vec = noise_floor(np.diag(cov), floor)
    starts = None if init is None else [np.asarray(init.noise, dtype=float) / prepared.scale**2]
    with serial_blas(k * d**3):  # the Hessian, the largest product of a Newton step
        res = fit_covariance(
            cov, k, floor_vec, starts=starts, n_starts=n_starts, random_state=random_state, tol=tol,
            max_iter=max_iter,
        )
    g = canonical_loadings(LowRankGaussian(res.loadings, res.noise, stats.mean))
    # From the rows (O(n d k)), the way score_samples computes it: the statistics
    # form loses ~eps * cond(C) when two features are at the floor together.
    if isinstance(prepared.data, np.ndarray):
        ll = float(np.sum(log_prob(g, prepared.X)))
    else:  # rows held by a backend (bayespca.chunked): the statistics form
        ll = float(log_likelihood_from_stats(g, n, stats.mean, stats.scatter))
    # The objective f is -2 / n times the log-likelihood per row, less d log(2 pi).
    trace = -0.5 * n * (d * _LOG_2PI + res.objective)
    to_data = -prepared.total_observed * np.log(prepared.scale)
    starts = -0.5 * n * (d * _LOG_2PI + np.asarray(res.start_objectives)) + to_data
    details = {"scaled_gradient": res.scaled_gradient, "start_log_likelihoods": starts.tolist()}
    _warn(res.converged, max_iter, tol, res.at_floor, floor)
    fit = Fit(g, ll, "em", res.n_iter, res.converged, trace, res.at_floor, details=details)
    return fit.to_data_units(prepared.scale, prepared.total_observed)


def _warn(converged, max_iter, tol, at_floor, floor):
    if not converged:
        warn(
            f"Factor analysis did not converge in max_iter={max_iter} Newton steps (scaled gradient "
            f"above tol={tol:g}); increase max_iter.",
            ConvergenceWarning,
        )
    if at_floor.any():
        warn(
            f"features {np.flatnonzero(at_floor)[:10].tolist()} have noise variance at the lower "
            "bound (Heywood case: they are explained almost exactly by the factors); "
            f"floor = {floor:g} x feature variance.",
            UserWarning,
        )
