"""The dense Laplace preconditioner of the NUTS runner (:mod:`bayespca.inference.nuts`).

NUTS moves ``xi`` with ``theta = theta_0 + S xi``, ``S S^T`` the inverse of
the potential's Hessian ``H`` at the mode ``theta_0``. This module builds
``S`` from ``H``: its eigenvalues modified so that no variance exceeds 10
and rounding is not taken for curvature (:func:`modified_eigen`, also the
Newton steps of the mode search), and, for pPCA and FA in polar
coordinates, the coordinates of ``Z`` whose directions the data leave free
or loose given the expansion density's own scale
(:func:`localized_factor`). pPCA's ``O(d^2 k)`` alternative to a dense
``S`` is :mod:`bayespca.inference.rotated_factor`.
"""

from __future__ import annotations

import numpy as np

from bayespca.gaussian import LowRankGaussian
from bayespca.models import EXPANSION_CONCENTRATION

__all__ = ["free_columns", "laplace_factor", "localized_factor", "loose_rotations", "modified_eigen"]


def laplace_factor(hessian: np.ndarray) -> np.ndarray:
    """``S`` (p, p) with ``S S^T`` the inverse of ``hessian`` (p, p), its variances capped at 10.

    Flat or curved-down directions (should Newton stop short of the mode, or
    a start be the ML point rather than the posterior's mode) get a standard
    deviation of at most ``sqrt(10)`` (:func:`modified_eigen`).

    Examples
    --------
    >>> S = laplace_factor(np.diag([4.0, 0.0]))
    >>> np.round(S @ S.T, 3).tolist()
    [[0.25, 0.0], [0.0, 10.0]]
    """
    vals, vecs = modified_eigen(hessian, absolute=False)
    return vecs / np.sqrt(vals)


# The inverse's variances at most this (units of theta), and an eigenvalue below this fraction of the
# largest is taken for rounding: a double's eigendecomposition resolves the rest.
_MAX_VARIANCE, _RESOLVED = 10.0, 1e-8


def modified_eigen(hessian: np.ndarray, absolute: bool) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (p,) and orthonormal eigenvectors (p, p) of ``hessian``, modified to be inverted.

    Eigenvalues ``lambda`` become ``max(lambda, 0.1)`` (``absolute``:
    ``max(|lambda|, 0.1)``, Newton's choice at a saddle), so no variance of
    the inverse exceeds 10. Eigenvalues below ``1e-8`` of the largest are
    rounding to a double's eigendecomposition. When ``hessian``'s spectrum
    spans more than that, the parameters' scales are the likely cause, and
    its eigendecomposition is taken of ``D^-1/2 H D^-1/2``, ``D`` the
    diagonal (:func:`_equilibrated_eigen`). Raw breast cancer, pPCA k = 22:
    eigenvalues from 1e-3 to 2e13, 566 of 713 floored at ``1e-8`` of the
    largest when taken as they are, Newton stopped 1e5 nats short of the
    mode and NUTS took 511 leapfrog steps a draw; equilibrated, they span
    2e7, and NUTS takes 31. A resolved spectrum is modified as it stands.

    Examples
    --------
    Variances ``1e-12`` and ``1000``: the first resolved, the second cut to 10.

    >>> vals, vecs = modified_eigen(np.diag([1e12, 1e-3]), absolute=False)
    >>> np.round(((vecs / vals) @ vecs.T).diagonal() / [1e-12, 1.0], 6).tolist()
    [1.0, 10.0]
    """
    vals, vecs = np.linalg.eigh(hessian)
    floor = _RESOLVED * np.abs(vals).max()
    if np.abs(vals).min() < floor:
        return _equilibrated_eigen(hessian, absolute)
    magnitude = np.abs(vals) if absolute else vals
    return np.maximum(magnitude, max(floor, 1.0 / _MAX_VARIANCE)), vecs


def _equilibrated_eigen(hessian: np.ndarray, absolute: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`modified_eigen` through ``D^-1/2 H D^-1/2``, ``D = |diag(H)|`` (zeros taken for 1).

    Its eigenvalues are modified as the plain ones are (floored at ``1e-8``
    of the largest, or their magnitudes taken), then the variances of the
    inverse, mapped back, are cut to 10 along the inverse's own axes.
    """
    diag = np.abs(np.diag(hessian))
    scale = np.sqrt(np.where(diag > 0, diag, 1.0))
    vals, vecs = np.linalg.eigh(hessian / np.outer(scale, scale))
    magnitude = np.abs(vals) if absolute else vals
    factor = vecs / np.sqrt(np.maximum(magnitude, _RESOLVED * np.abs(vals).max())) / scale[:, None]
    left, singular, _ = np.linalg.svd(factor)
    return 1.0 / np.minimum(singular, np.sqrt(_MAX_VARIANCE)) ** 2, left


# A component whose ML signal-to-noise eigenvalue is below this multiple of the noise bulk's edge
# (Marchenko-Pastur, see free_columns) is taken for noise. Synthetic n=1000, d=20, rank 3: the
# components beyond it at 0.95-1.0 times the edge. The weakest ML component of scikit-learn's
# iris, wine, diabetes and breast cancer (raw and standardised, pPCA and FA, k <= 6): 1.25 times
# it or more; within 1.2 only wine from k = 7 (FA) or 8 (pPCA) and diabetes FA k = 8.
_BULK_MARGIN = 1.2


def free_columns(g: LowRankGaussian, n: int) -> int:
    """How many (0..k) of the ML fit ``g``'s k components lie within the noise's bulk: unoriented by the data.

    With ``Psi``-whitened loadings ``A = Psi^{-1/2} W``, the fit's
    covariance has eigenvalues ``1 + eig(A^T A)`` against the noise. Pure
    noise of ``n`` rows in ``d`` features puts sample eigenvalues up to the
    bulk's edge ``(1 + sqrt(d / n))^2``, and a component at or below it
    has a sample direction unrelated to any population one (the BBP phase
    transition of spiked covariance models): the posterior of its
    direction spreads over its sphere.

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[3.0, 0.0], [0.0, 0.1], [0.0, 0.0]]), np.ones(3), np.zeros(3))
    >>> free_columns(g, 100)
    1
    """
    w = np.asarray(g.loadings) / np.sqrt(np.asarray(g.noise))[:, None]
    d = w.shape[0]
    ratios = 1.0 + np.linalg.eigvalsh(w.T @ w)
    return int(np.sum(ratios <= _BULK_MARGIN * (1.0 + np.sqrt(d / n)) ** 2))


def localized_factor(
    hessian: np.ndarray, index: np.ndarray, z: np.ndarray, oriented: int, free: int
) -> np.ndarray:
    """:func:`laplace_factor`, with the expansion's scale where the data leave polar directions loose.

    ``hessian`` (p, p) is the potential's at the mode, ``index`` (d, width)
    where ``Z[i, j]`` sits among its p parameters and ``z`` (d, width) the
    value of ``Z`` at the mode; the first ``oriented`` columns are polar and
    active, of which the last ``free`` (``0 <= free <= oriented``) lie within
    the noise. Column ``j`` of
    ``U`` is column ``j`` of ``Z`` made orthogonal to the ones before and
    normalised. Where the data orient it (a component of signal) the
    Laplace approximation at the mode describes how it turns. It does not
    in two cases, where the preconditioner instead takes the curvature of
    the expansion density alone, ``2 c``
    (:func:`bayespca.models.expansion_log_density`: where ``U`` is uniform,
    ``Z``'s entries have variance about ``1 / (2 c)``), uncoupled from the
    other parameters. Both are affine maps: the posterior is unchanged.

    * The last ``free`` active columns lie within the noise
      (:func:`free_columns`): their directions roam their spheres, which
      no Gaussian in ``Z`` describes (synthetic n=1000, d=20, rank 3, k=4:
      the fourth direction's cosine with the mode's averages 0.58 over the
      posterior, and NUTS takes 31 leapfrog steps a draw instead of 15).
      All of their block is reset.
    * Two oriented components whose relative rotation the data leave loose
      (:func:`loose_rotations`): ``u_a`` and ``u_b`` turn into each other
      where their scales' gap reaches 0, so the posterior of the angle is a
      funnel in the gap, and at large angles ``Z``'s columns move around a
      circle that the Laplace frame's fixed axes cross through ``Z``'s
      rank-deficient centre. Only the coordinates of ``z_a`` and ``z_b``
      in the plane of ``u_a`` and ``u_b`` are reset, so the frame is the
      same whatever the angle. (Diabetes, standardised, pPCA k=6, 16 seeds:
      NUTS adapted inverse masses of 13-37 to those coordinates, and the
      divergent transitions followed them into the expansion's barrier:
      1 in all, 14 with the expansion's ``c`` at 4; with the reset 0, and
      1 at ``c = 4``, at the same 31 steps a draw.)

    Examples
    --------
    ``Z`` of 2 x 2 (``Z[i, j]`` the parameter ``2 i + j``), curvature 100
    everywhere; the second column lies within the noise, and its two
    coordinates get the expansion's variance ``1 / (2 c)``:

    >>> from bayespca.models import EXPANSION_CONCENTRATION as c
    >>> s = localized_factor(100.0 * np.eye(4), np.arange(4).reshape(2, 2), np.eye(2), 2, 1)
    >>> np.round(np.diag(s @ s.T) * [100.0, 2 * c, 100.0, 2 * c], 12).tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    hessian = np.array(hessian, dtype=float)
    if free:
        cols = index[:, oriented - free : oriented].ravel()
        hessian[cols, :] = 0.0
        hessian[:, cols] = 0.0
        hessian[cols, cols] = 2.0 * EXPANSION_CONCENTRATION
    basis = loose_rotations(hessian, index, z, oriented - free)
    if basis.shape[1]:
        # (I - P) H (I - P) + 2 c P, with P = B B^T the projection on the planes' coordinates.
        hb = hessian @ basis
        hessian += basis @ (basis.T @ hb + 2.0 * EXPANSION_CONCENTRATION * np.eye(basis.shape[1])) @ basis.T
        hessian -= basis @ hb.T + hb @ basis.T
    return laplace_factor(hessian)


# The data's standard error of the angle (radians) between two components' directions above which
# their relative rotation is taken for loose (loose_rotations). At 0.2 the scales' gap, whose
# relative standard error is about twice the angle's, is within 2.5 standard errors of 0.
# Diabetes, standardised, pPCA k=6, plain Laplace factor: the pairs at 0.21 and 0.37 rad (at the
# mode) got adapted inverse masses of 13-37 on one coordinate of each column (seeds 0 and 14),
# every other coordinate at most 7.
_LOOSE_ANGLE = 0.2


def loose_rotations(hessian: np.ndarray, index: np.ndarray, z: np.ndarray, oriented: int) -> np.ndarray:
    """An orthonormal basis (p, m) of the coordinates of ``Z`` in the planes of loosely oriented pairs.

    At the mode ``Z^T Z = I`` (the expansion's mode; the data see only
    ``U``), so ``Z = U``, and moving ``z_a`` by ``t`` along ``u_b``
    (``a < b``) turns ``u_a`` towards ``u_b`` by the angle ``t``. The
    Hessian's curvature along that move is ``2 c`` (the expansion's: ``tr
    G`` grows by ``t^2``, ``det G`` is unchanged) plus the data's precision
    of the angle; for pPCA at the ML point the latter is Anderson's (1963)
    ``n (l_a - l_b)^2 / (l_a l_b)``, ``l`` the covariance's eigenvalues. A
    pair whose precision is below ``_LOOSE_ANGLE^-2`` contributes ``z_a``'s
    and ``z_b``'s coordinates along ``u_a`` and ``u_b``.

    Examples
    --------
    Two columns in d = 2 whose rotation has only the expansion's curvature:

    >>> h = 16.0 * np.eye(4)
    >>> loose_rotations(h, np.arange(4).reshape(2, 2), np.eye(2), 2).shape
    (4, 4)
    >>> loose_rotations(h + 100.0 * np.eye(4), np.arange(4).reshape(2, 2), np.eye(2), 2).shape
    (4, 0)
    """
    u, _ = np.linalg.qr(z[:, :oriented])
    vectors = {}
    for a in range(oriented):
        block = hessian[np.ix_(index[:, a], index[:, a])]
        for b in range(a + 1, oriented):
            precision = u[:, b] @ block @ u[:, b] - 2.0 * EXPANSION_CONCENTRATION
            if precision < _LOOSE_ANGLE**-2:
                vectors.update({(i, j): None for i in (a, b) for j in (a, b)})
    basis = np.zeros((hessian.shape[0], len(vectors)))
    for m, (i, j) in enumerate(vectors):
        basis[index[:, i], m] = u[:, j]
    return basis
