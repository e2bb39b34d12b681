"""Factor rotations: varimax, quartimax, promax, oblimin, and orthogonal Procrustes.

A factor model ``x = mu + L z + e`` with ``Cov(z) = I`` has the same covariance
``L L^T + Psi`` for every loading matrix ``L R`` with ``R`` orthogonal, and, if
the factors may correlate, ``(L R) Phi (L R)^T`` with ``Phi = R^{-1} R^{-T}``
for any invertible ``R``. A rotation picks the ``R`` under which the loadings
are simplest to read: each variable loads on few factors, each factor on few
variables. It never changes the fitted covariance or the likelihood.

Orthogonal rotations (``Phi = I``) maximise an orthomax criterion over
orthogonal ``T`` (``L_rot = L T``)::

    Q(L_rot) = 1/4 sum_j [ sum_i l_ij^4 - gamma/d (sum_i l_ij^2)^2 ]

with ``gamma = 1`` for varimax (Kaiser 1958; the variance of the squared
loadings of each factor, times ``d/4``) and ``gamma = 0`` for quartimax.
Oblique rotations let the factors correlate: ``L_rot = L T^{-T}`` and
``Phi = T^T T`` for ``T`` with unit-length columns (Jennrich 2002).
Direct oblimin (Jennrich & Sampson 1966) minimises::

    Q(L_rot) = 1/4 sum_{j != m} sum_i (l_ij^2 - gamma/d sum_h l_hj^2) l_im^2

(``gamma = 0`` is quartimin, ``gamma = 0.5`` biquartimin). Promax
(Hendrickson & White 1964) is not a criterion: from the varimax loadings
``V`` it regresses the target ``V |V|^(power-1)`` on ``V`` and rescales the
columns of the regression matrix so that ``Phi`` has unit diagonal.

Varimax, quartimax and oblimin are solved by the gradient-projection
algorithm of Jennrich (2001, 2002) as in GPArotation (Bernaards & Jennrich
2005): a gradient step on the criterion, projected onto the tangent space of
the set of admissible ``T`` and pulled back onto it, with a step-halving
line search. Its stopping rule is the one optimality condition that holds
for every criterion: the projected gradient is zero.

References
----------
H. F. Kaiser (1958). The varimax criterion for analytic rotation in factor
analysis. Psychometrika 23, 187-200.
R. I. Jennrich, P. F. Sampson (1966). Rotation for simple loadings.
Psychometrika 31, 313-323.
A. E. Hendrickson, P. O. White (1964). Promax: a quick method for rotation to
oblique simple structure. British Journal of Statistical Psychology 17, 65-70.
R. I. Jennrich (2001). A simple general procedure for orthogonal rotation.
Psychometrika 66, 289-306.
R. I. Jennrich (2002). A simple general method for oblique rotation.
Psychometrika 67, 7-19.
C. A. Bernaards, R. I. Jennrich (2005). Gradient projection algorithms and
software for arbitrary rotation criteria in factor analysis. Educational and
Psychological Measurement 65, 676-696.
P. H. Schoenemann (1966). A generalized solution of the orthogonal Procrustes
problem. Psychometrika 31, 1-10.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from bayespca.data import as_float_matrix
from bayespca.messages import warn
from bayespca.params import check_bool, check_choice, check_number
from bayespca.statistics import power_of_two_above

__all__ = ["ROTATIONS", "Rotation", "procrustes", "rotate"]

#: Accepted ``method`` values of :func:`rotate`, with their options and defaults.
ROTATIONS: dict[str, dict[str, float]] = {
    "varimax": {},
    "quartimax": {},
    "promax": {"power": 4.0},
    "oblimin": {"gamma": 0.0},
}

# Step halvings tried per gradient-projection iteration before giving up.
_MAX_HALVINGS = 30


class Rotation(NamedTuple):
    """A rotated loading matrix and the rotation that produced it.

    Attributes
    ----------
    loadings : ndarray of shape (d, k)
        Rotated loadings (the pattern matrix for oblique rotations),
        ``L_rot = L @ matrix``.
    matrix : ndarray of shape (k, k)
        ``R`` with ``L_rot = L @ R``; orthogonal for varimax and quartimax.
    factor_correlation : ndarray of shape (k, k)
        ``Phi = R^{-1} R^{-T}``, the correlation matrix of the rotated
        factors (unit diagonal); the identity for orthogonal rotations. The
        model covariance is unchanged: ``L_rot Phi L_rot^T = L L^T``.
    method : str
        The rotation method.
    n_iter : int
        Gradient-projection iterations (for promax: those of its varimax
        step; 0 when nothing was rotated).
    converged : bool
        Whether the projected gradient fell below ``tol``.
    """

    loadings: np.ndarray
    matrix: np.ndarray
    factor_correlation: np.ndarray
    method: str
    n_iter: int
    converged: bool


def _orthomax(loadings: np.ndarray, gamma: float):
    """Minus the orthomax criterion (minimised here) and its gradient in the loadings."""
    squared = loadings**2
    centred = squared - gamma * squared.mean(axis=0)
    value = -np.sum(squared * centred) / 4.0
    return value, -loadings * centred


def _oblimin(loadings: np.ndarray, gamma: float):
    """The direct oblimin criterion and its gradient with respect to the loadings."""
    squared = loadings**2
    centred = squared - gamma * squared.mean(axis=0)
    # (C L^2 N)_im: sum over the other factors m' != m of the centred squares.
    others = centred.sum(axis=1, keepdims=True) - centred
    return np.sum(squared * others) / 4.0, loadings * others


class _Manifold(NamedTuple):
    """The set of admissible ``T`` in gradient projection."""

    loadings: Callable  # (A, T) -> L_rot
    gradient: Callable  # (T, L_rot, dQ/dL_rot, A) -> dQ/dT
    project: Callable  # (T, G) -> G projected on the tangent space at T
    retract: Callable  # X -> nearest admissible T


def _polar(x: np.ndarray) -> np.ndarray:
    u, _, vt = np.linalg.svd(x)
    return u @ vt


def _orthogonal_project(t: np.ndarray, g: np.ndarray) -> np.ndarray:
    m = t.T @ g
    return g - t @ ((m + m.T) / 2.0)


_ORTHOGONAL_SET = _Manifold(
    loadings=lambda a, t: a @ t,
    gradient=lambda t, lrot, grad, a: a.T @ grad,
    project=_orthogonal_project,
    retract=_polar,
)

_OBLIQUE_SET = _Manifold(
    # L_rot = A T^{-T} and dQ/dT = -T^{-T} (dQ/dL_rot)^T L_rot (Jennrich 2002).
    loadings=lambda a, t: np.linalg.solve(t, a.T).T,
    gradient=lambda t, lrot, grad, a: -np.linalg.solve(t.T, grad.T @ lrot),
    project=lambda t, g: g - t * np.sum(t * g, axis=0),
    retract=lambda x: x / np.linalg.norm(x, axis=0),
)


def _gradient_projection(
    a: np.ndarray, criterion: Callable, manifold: _Manifold, tol: float, max_iter: int
) -> tuple[np.ndarray, int, float]:
    """Minimise ``criterion(L_rot)`` over admissible ``T``, starting at the identity.

    Returns ``(T, n_iter, s)`` with ``s`` the final projected-gradient norm.
    A step of length ``alpha`` is accepted when it decreases the criterion by
    the Armijo amount ``s^2 alpha / 2``, as in GPArotation. Near the optimum
    that decrease falls below the rounding error of the criterion and the
    Armijo test turns into noise; there, a step that changes the criterion by no more than rounding
    is accepted when it shrinks the projected gradient. This lets the
    iteration reach ``tol`` far below ``sqrt(machine epsilon)``, where
    GPArotation stalls.
    """
    d, k = a.shape
    # a has rows of norm <= 1, so the criterion is a sum of d k terms of size <= 1.
    noise = 8.0 * np.finfo(float).eps * d * k

    def evaluate(t):
        lrot = manifold.loadings(a, t)
        value, grad = criterion(lrot)
        projected = manifold.project(t, manifold.gradient(t, lrot, grad, a))
        return value, projected

    t = np.eye(k)
    value, projected = evaluate(t)
    step = 1.0
    n_iter = 0
    while True:
        s = np.linalg.norm(projected)
        if s < tol or n_iter == max_iter:
            return t, n_iter, s
        # Once the Armijo decrease is below rounding, keep the step it last
        # chose (near 1/curvature) instead of growing it again.
        if s * s * step > noise:
            step *= 2.0
        for _ in range(_MAX_HALVINGS):
            t_new = manifold.retract(t - step * projected)
            value_new, projected_new = evaluate(t_new)
            wanted = 0.5 * s * s * step
            if wanted > noise:
                if value_new < value - wanted:
                    break
            elif value_new <= value + noise and np.linalg.norm(projected_new) < s:
                break
            step /= 2.0
        else:  # no step helps: tol is below what rounding allows here
            return t, n_iter, s
        t, value, projected = t_new, value_new, projected_new
        n_iter += 1


def _promax_matrix(varimax_loadings: np.ndarray, power: float) -> np.ndarray:
    """Promax's ``U`` with ``L_promax = V U`` from the varimax loadings ``V``."""
    k = varimax_loadings.shape[1]
    target = varimax_loadings * np.abs(varimax_loadings) ** (power - 1.0)
    u = np.linalg.lstsq(varimax_loadings, target)[0]
    # Scale the columns so that Phi = (U^T U)^{-1} has a unit diagonal;
    # diag((U^T U)^{-1}) is the squared row norms of U^{-1}.
    u_inv = np.linalg.solve(u, np.eye(k))
    return u * np.sqrt(np.sum(u_inv**2, axis=1))


def _canonical(loadings, matrix, phi):
    """Order factors by explained variance, then make each column sum positive.

    The variance explained by factor j is ``diag(L^T L Phi)_j = sum_i l_ij s_ij``
    with ``S = L Phi`` the structure matrix; these add up to the total
    communality ``trace(L Phi L^T)`` and are the column sums of squared
    loadings when ``Phi = I``.
    """
    unit = _power_of_two(loadings)  # the order does not depend on the scale; the squares must not underflow
    explained = np.sum((loadings / unit) * ((loadings / unit) @ phi), axis=0)
    order = np.argsort(-explained, kind="stable")
    loadings, matrix, phi = loadings[:, order], matrix[:, order], phi[np.ix_(order, order)]
    signs = np.where(loadings.sum(axis=0) < 0.0, -1.0, 1.0)
    return loadings * signs, matrix * signs, phi * np.outer(signs, signs)


def _check_finite(arr: np.ndarray, name: str) -> None:
    if not np.isfinite(arr).all():
        raise ValueError(
            f"{name} contains {int(np.isnan(arr).sum())} NaN and {int(np.isinf(arr).sum())} "
            "infinite entries; rotations need finite loadings."
        )


def _check_loadings(loadings: Any, name: str) -> np.ndarray:
    ndim = np.ndim(loadings)
    if ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array of shape (n_features, n_components); got a "
            f"{ndim}-D array with shape {np.shape(loadings)}."
        )
    if np.asarray(loadings).dtype.kind == "f":  # before as_float_matrix's data-matrix wording
        _check_finite(np.asarray(loadings), name)
    arr = as_float_matrix(loadings, name=name, allow_nan=True)
    _check_finite(arr, name)
    return arr


def _check_options(method: str, options: dict[str, Any]) -> dict[str, float]:
    accepted = ROTATIONS[method]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(
            f"rotate(method={method!r}) got unexpected option(s) {unknown}; "
            f"accepted: {sorted(accepted) or 'none'}."
        )
    values = {**accepted, **options}
    for key, value in values.items():
        check_number(value, key, low=1.0 if key == "power" else None, low_open=True)
    return {key: float(value) for key, value in values.items()}


def rotate(
    loadings: Any,
    method: str = "varimax",
    *,
    normalize: bool = True,
    tol: float = 1e-10,
    max_iter: int = 1000,
    **options: float,
) -> Rotation:
    """Rotate a factor loading matrix to simple structure.

    Parameters
    ----------
    loadings : array-like of shape (d, k)
        Unrotated loadings ``L`` (``d`` variables, ``k`` factors), for
        uncorrelated factors: the model covariance is ``L L^T + Psi``.
    method : {"varimax", "quartimax", "promax", "oblimin"}, default="varimax"
        Orthogonal: ``"varimax"``, ``"quartimax"``. Oblique: ``"promax"``,
        ``"oblimin"``. The criteria are in the module docstring.
    normalize : bool, default=True
        Kaiser normalisation: divide each row of ``L`` by its norm (the square
        root of the communality) before rotating and multiply it back after,
        so that every variable has the same weight. It is the default of R's
        ``stats::varimax`` and ``stats::promax`` (for promax it applies to the
        varimax step); GPArotation's ``quartimax`` and ``oblimin`` default to
        ``normalize=FALSE``, and scikit-learn's FactorAnalysis rotations do
        not normalise: pass ``normalize=False`` to reproduce them. Rows of
        zeros are left as they are.
    tol : float, default=1e-10
        Stop when the Frobenius norm of the projected gradient of the
        criterion with respect to ``T`` is below ``tol`` (GPArotation's
        ``eps``, whose default is 1e-5). The criterion is evaluated on the
        (normalised) loadings divided by their largest row norm, which makes
        ``tol`` independent of the scale of ``L``.
    max_iter : int, default=1000
        Maximum number of gradient-projection iterations.
    **options
        ``power`` for promax (default 4, R's ``m``; must be > 1), ``gamma``
        for oblimin (default 0, quartimin).

    Returns
    -------
    Rotation
        ``(loadings, matrix, factor_correlation, method, n_iter, converged)``.
        Factors are ordered by decreasing explained variance
        ``diag(L_rot^T L_rot Phi)`` (the column sums of squared loadings for
        orthogonal rotations; for oblique ones the sum over variables of
        pattern times structure loading, which adds up to the total
        communality), and each column of ``loadings`` sums to a non-negative
        value; ``matrix`` and ``factor_correlation`` are permuted and
        sign-flipped with it. With ``k = 1`` nothing is rotated: the loadings
        come back unchanged with ``R = Phi = [[1]]``.

    Raises
    ------
    ValueError
        ``loadings`` not 2-D, empty, or not finite; unknown ``method``; bad
        ``tol``, ``max_iter`` or option value; ``method="promax"`` with
        loadings of rank below ``k``.
    TypeError
        An option the method does not accept.

    Warns
    -----
    ConvergenceWarning
        When ``tol`` was not reached (``converged`` is then False).

    Notes
    -----
    Each criterion is minimised by gradient projection from ``T = I``
    (Jennrich 2001, 2002); like every rotation algorithm it finds a local
    optimum, the global one for loadings with a clear simple structure.
    Promax follows R's ``stats::promax``: varimax, then the least-squares
    ``U`` of ``V U ~ V |V|^(power-1)``, columns scaled so that ``Phi`` has a
    unit diagonal; ``R = T_varimax U``.

    Examples
    --------
    >>> L = np.array([[0.8, 0.3], [0.7, 0.4], [0.3, 0.8], [0.2, 0.7]])
    >>> rot = rotate(L, "varimax")
    >>> rot.loadings.round(3)
    array([[0.815, 0.257],
           [0.72 , 0.362],
           [0.342, 0.783],
           [0.237, 0.688]])
    >>> bool(np.allclose(rot.loadings @ rot.loadings.T, L @ L.T))
    True
    >>> obl = rotate(L, "oblimin")
    >>> obl.factor_correlation.round(3)
    array([[1.   , 0.661],
           [0.661, 1.   ]])
    >>> bool(np.allclose(obl.loadings @ obl.factor_correlation @ obl.loadings.T, L @ L.T))
    True
    """
    lmat = _check_loadings(loadings, "loadings")
    check_bool(normalize, "normalize")
    check_choice(method, "method", sorted(ROTATIONS))
    values = _check_options(method, options)
    check_number(tol, "tol", low=0.0, low_open=True)
    check_number(max_iter, "max_iter", integer=True, low=1)
    d, k = lmat.shape
    identity = np.eye(k)
    if k == 1:
        return Rotation(lmat.copy(), identity, identity.copy(), method, 0, True)
    if method == "promax" and np.linalg.matrix_rank(lmat) < k:
        raise ValueError(
            f"promax needs loadings of full column rank {k}; got rank "
            f"{np.linalg.matrix_rank(lmat)}."
        )

    # Rotations do not depend on the scale of L: a power of two near its largest entry is divided
    # out first (exactly), so that the row norms neither overflow nor underflow.
    unit = _power_of_two(lmat)
    norms = np.linalg.norm(lmat / unit, axis=1)
    weights = np.where(norms > 0.0, norms, 1.0) if normalize else np.ones(d)
    scaled = lmat / unit / weights[:, None]
    largest = np.max(np.linalg.norm(scaled, axis=1))
    if largest == 0.0:  # all loadings are zero: every rotation is optimal
        return Rotation(lmat.copy(), identity, identity.copy(), method, 0, True)
    scaled /= largest

    if method == "oblimin":
        criterion, manifold = (lambda x: _oblimin(x, values["gamma"])), _OBLIQUE_SET
    else:
        gamma = 0.0 if method == "quartimax" else 1.0
        criterion, manifold = (lambda x: _orthomax(x, gamma)), _ORTHOGONAL_SET
    t, n_iter, gradient_norm = _gradient_projection(scaled, criterion, manifold, tol, max_iter)
    converged = bool(gradient_norm < tol)

    if method == "oblimin":
        matrix = np.linalg.solve(t, identity).T
        phi = t.T @ t
    elif method == "promax":
        matrix = t @ _promax_matrix(lmat / unit @ t, values["power"])
        matrix_inv = np.linalg.solve(matrix, identity)
        phi = matrix_inv @ matrix_inv.T
    else:
        matrix, phi = t, identity
    phi = (phi + phi.T) / 2.0
    rotated, matrix, phi = _canonical(lmat @ matrix, matrix, phi)
    if not converged:
        warn(
            f"{method} rotation did not converge: projected gradient norm "
            f"{gradient_norm:.3g} > tol={tol} after {n_iter} iterations (max_iter={max_iter}); "
            "increase max_iter, or tol if it is below what rounding allows.",
            ConvergenceWarning,
        )
    return Rotation(rotated, matrix, phi, method, n_iter, converged)


def procrustes(source: Any, target: Any) -> tuple[np.ndarray, np.ndarray]:
    """Rotate ``source`` onto ``target`` by the closest orthogonal transformation.

    Solves ``min_R ||source @ R - target||_F`` over orthogonal ``R``
    (Schoenemann 1966): with ``source^T target = U S V^T``, ``R = U V^T``.
    ``R`` may be a reflection, so sign flips of columns are aligned too
    (what aligning posterior draws of loadings needs).

    Parameters
    ----------
    source : array-like of shape (..., d, k)
        One loading matrix, or a stack of them (e.g. posterior draws), each
        aligned separately.
    target : array-like of shape (d, k)
        The reference.

    Returns
    -------
    aligned : ndarray of shape (..., d, k)
        ``source @ R``.
    R : ndarray of shape (..., k, k)
        Orthogonal.

    Examples
    --------
    >>> target = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> c, s = np.cos(0.3), np.sin(0.3)
    >>> aligned, R = procrustes(target @ np.array([[c, -s], [s, c]]), target)
    >>> bool(np.allclose(aligned, target))
    True
    """
    target_arr = _check_loadings(target, "target")
    shape = np.shape(source)
    if len(shape) < 2 or shape[-2:] != target_arr.shape:
        raise ValueError(
            f"source must have shape (..., {target_arr.shape[0]}, {target_arr.shape[1]}) to "
            f"match target; got shape {shape}."
        )
    src = _check_loadings(np.reshape(np.asarray(source), (-1, shape[-1])), "source")
    src = src.reshape(shape)
    # R does not depend on the scales of source and target: powers of two near their largest
    # entries are divided out first (exactly), so that source^T target cannot overflow.
    cross = np.swapaxes(src / _power_of_two(src), -1, -2) @ (target_arr / _power_of_two(target_arr))
    u, _, vt = np.linalg.svd(cross)
    matrix = u @ vt
    return src @ matrix, matrix


def _power_of_two(arr: np.ndarray) -> float:
    """A power of two at or above the largest ``|entry|`` (1 for zeros)."""
    return power_of_two_above(np.abs(arr).max(initial=0.0))
