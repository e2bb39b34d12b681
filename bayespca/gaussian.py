"""The low-rank-plus-diagonal Gaussian behind PCA, probabilistic PCA and factor analysis.

All of these models share one marginal distribution::

    z ~ N(0, I_k),   x | z ~ N(W z + mu, Psi)   =>   x ~ N(mu, C),  C = W W^T + Psi,

with ``Psi = sigma^2 I`` for pPCA (and PCA, as ``sigma^2`` is the mean discarded
eigenvalue) and ``Psi = diag(psi)`` for factor analysis. Everything a fitted
model answers follows from ``(W, psi, mu)``; this module computes it once, in
pure JAX functions, never forming or inverting a d x d matrix where a k x k one
will do:

* Woodbury identity:
  ``C^{-1} = Psi^{-1} - Psi^{-1} W M^{-1} W^T Psi^{-1}``, with the k x k
  capacitance ``M = I_k + W^T Psi^{-1} W``;
* matrix determinant lemma: ``log|C| = log|M| + sum_j log psi_j``.

One log-density costs O(d k^2 + k^3) once plus O(d k) per row.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_solve, solve_triangular

__all__ = [
    "LowRankGaussian",
    "covariance",
    "log_prob",
    "precision",
]

_LOG_2PI = 1.8378770664093453


class LowRankGaussian(NamedTuple):
    """Parameters of ``N(mean, loadings @ loadings.T + diag(noise))``.

    Attributes
    ----------
    loadings : Array of shape (d, k)
        ``W``; ``k`` may be 0.
    noise : Array of shape (d,)
        Diagonal of ``Psi``, strictly positive.
    mean : Array of shape (d,)
        ``mu``.

    Examples
    --------
    >>> import numpy as np
    >>> g = LowRankGaussian(np.array([[1.0], [1.0]]), np.array([0.5, 0.5]), np.zeros(2))
    >>> np.asarray(covariance(g))
    array([[1.5, 1. ],
           [1. , 1.5]])
    """

    loadings: jax.Array
    noise: jax.Array
    mean: jax.Array


def _capacitance_cholesky(g: LowRankGaussian) -> tuple[jax.Array, jax.Array]:
    """Lower Cholesky factor of ``M = I + W^T Psi^{-1} W`` and ``Psi^{-1} W``."""
    w = jnp.asarray(g.loadings)
    scaled = w / jnp.asarray(g.noise)[:, None]
    m = jnp.eye(w.shape[1], dtype=w.dtype) + w.T @ scaled
    return jnp.linalg.cholesky(m), scaled


@jax.jit
def log_prob(g: LowRankGaussian, X: jax.Array) -> jax.Array:
    """Log-density of each row of ``X``: ``log N(x_i | mu, W W^T + Psi)``.

    Uses ``(x-mu)^T C^{-1} (x-mu) = r^T Psi^{-1} r - |L^{-1} W^T Psi^{-1} r|^2``
    with ``M = L L^T``, and the determinant lemma.

    Parameters
    ----------
    g : LowRankGaussian
    X : Array of shape (n, d)

    Returns
    -------
    Array of shape (n,)

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.stats import multivariate_normal
    >>> g = LowRankGaussian(np.array([[1.0], [2.0]]), np.array([0.5, 0.3]), np.array([0.1, -0.2]))
    >>> x = np.array([[0.3, 0.4]])
    >>> ref = multivariate_normal(g.mean, np.asarray(covariance(g))).logpdf(x)
    >>> bool(np.isclose(log_prob(g, x)[0], ref))
    True
    """
    chol, scaled = _capacitance_cholesky(g)
    resid = jnp.asarray(X) - g.mean
    proj = solve_triangular(chol, (resid @ scaled).T, lower=True)  # (k, n)
    quad = jnp.sum(resid**2 / g.noise, axis=1) - jnp.sum(proj**2, axis=0)
    logdet = jnp.sum(jnp.log(g.noise)) + 2.0 * jnp.sum(jnp.log(jnp.diag(chol)))
    d = resid.shape[1]
    return -0.5 * (d * _LOG_2PI + logdet + quad)


@jax.jit
def covariance(g: LowRankGaussian) -> jax.Array:
    """Model covariance ``W W^T + diag(psi)``, shape (d, d)."""
    w = jnp.asarray(g.loadings)
    return w @ w.T + jnp.diag(jnp.asarray(g.noise))


@jax.jit
def precision(g: LowRankGaussian) -> jax.Array:
    """Inverse covariance by the Woodbury identity, shape (d, d).

    ``C^{-1} = Psi^{-1} - (Psi^{-1} W) M^{-1} (Psi^{-1} W)^T``; only the k x k
    capacitance ``M`` is factorised.
    """
    chol, scaled = _capacitance_cholesky(g)
    inner = cho_solve((chol, True), scaled.T)  # (k, d) = M^{-1} W^T Psi^{-1}
    return jnp.diag(1.0 / jnp.asarray(g.noise)) - scaled @ inner
