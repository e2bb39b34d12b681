"""Maximum-likelihood pPCA from weighted rows: the M-step of the Student-t and mixture EMs.

Given per-row weights ``w_i >= 0`` and a total ``a > 0``, both EMs maximise

    Q(mu, C) = -(a / 2) log|C| - (1 / 2) sum_i w_i (x_i - mu)^T C^{-1} (x_i - mu),
    C = W W^T + sigma^2 I,

over ``(W, sigma^2, mu)``: the Student-t EM with ``w_i = E[u_i | x_i]``
(the expected precision scale of row ``i``) and ``a = n``; the mixture EM,
for cluster ``c``, with the responsibilities ``w_i = R_ic`` and
``a = sum_i R_ic``. For every ``C`` the best ``mu`` is the weighted mean
``sum_i w_i x_i / sum_i w_i``, and then ``Q`` is the pPCA log-likelihood of
the weighted covariance ``S = sum_i w_i r_i r_i^T / a``, maximised in closed
form (Tipping & Bishop 1999): with the eigenvalues ``l_1 >= ... >= l_d`` of
``S`` and eigenvectors ``U``,

    sigma^2 = (l_{k+1} + ... + l_d) / (d - k),    W = U_k (L_k - sigma^2 I)^{1/2}.

So the M-step is exact (no inner iterations) and costs O(n d^2 + d^3).
"""

from __future__ import annotations

import numpy as np

from bayespca.gaussian import LowRankGaussian
from bayespca.linalg import eigh_top, flip_signs

__all__ = ["weighted_ppca"]


def weighted_ppca(X: np.ndarray, weights: np.ndarray, total: float, n_components: int,
                  floor: float) -> LowRankGaussian:
    """The pPCA ``(W, sigma^2, mu)`` maximising the weighted objective ``Q`` of the module docstring.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Complete rows.
    weights : ndarray of shape (n,)
        Non-negative, not all zero.
    total : float
        ``a``, the weight of the log-determinant.
    n_components : int
        ``k`` in ``[1, d]``.
    floor : float
        Lower bound on ``sigma^2`` (in the units of ``X`` squared): keeps a
        cluster of a few rows, or ``k = d``, from an infinite likelihood.

    Returns
    -------
    LowRankGaussian
        ``W`` with orthogonal columns of decreasing norm, each with its
        largest-magnitude entry positive; ``noise`` the repeated ``sigma^2``.

    Examples
    --------
    Unit weights and ``a = n`` give the closed-form pPCA of the data:

    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((400, 1)) @ [[2.0, 1.0, 0.0]] + 0.5 * rng.standard_normal((400, 3))
    >>> g = weighted_ppca(X, np.ones(400), 400.0, 1, 1e-12)
    >>> lam = np.linalg.eigvalsh(np.cov(X.T, bias=True))
    >>> bool(np.isclose(g.noise[0], lam[:2].mean())), bool(np.isclose(g.loadings[:, 0] @ g.loadings[:, 0],
    ...                                                               lam[2] - lam[:2].mean()))
    (True, True)
    """
    w = np.asarray(weights, dtype=float)
    mean = w @ X / w.sum()
    resid = X - mean
    scatter = (resid * w[:, None]).T @ resid / total
    d = X.shape[1]
    k = int(n_components)
    trace = float(np.trace(scatter))
    evals, evecs = eigh_top(scatter, k)
    sigma2 = (trace - evals.sum()) / (d - k) if k < d else 0.0
    sigma2 = max(sigma2, floor)
    loadings = evecs * np.sqrt(np.maximum(evals - sigma2, 0.0))
    loadings = flip_signs(loadings.T)[0].T
    return LowRankGaussian(loadings, np.full(d, sigma2), mean)
