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


def log_prob(g: LowRankGaussian, X: jax.Array, observed: jax.Array | None = None) -> jax.Array:
    """Log-density of each row of ``X``: ``log N(x_i | mu, W W^T + Psi)``.

    Uses ``(x-mu)^T C^{-1} (x-mu) = r^T Psi^{-1} r - |L^{-1} W^T Psi^{-1} r|^2``
    with ``M = L L^T``, and the determinant lemma.

    With missing values, row ``i`` contributes the density of its observed
    block only, ``log N(x_{i,O} | mu_O, W_O W_O^T + Psi_O)``: this is the
    likelihood of data missing at random. It is computed by giving the missing
    coordinates zero loadings, zero residual and unit noise (so they add a
    known ``-log(2 pi)/2`` each, which is removed), at O(d k^2) per row.

    Parameters
    ----------
    g : LowRankGaussian
    X : Array of shape (n, d)
        Missing entries may hold any value (NaN included) when ``observed``
        is given.
    observed : Array of bool, shape (n, d), optional
        True where an entry is observed; all observed when None.

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
    >>> part = log_prob(g, np.array([[0.3, np.nan]]), np.array([[True, False]]))[0]
    >>> bool(np.isclose(part, multivariate_normal(0.1, 1.5).logpdf(0.3)))
    True
    """
    if observed is None:
        return _log_prob_complete(g, X)
    return _log_prob_masked(g, X, observed)


@jax.jit
def _log_prob_complete(g: LowRankGaussian, X: jax.Array) -> jax.Array:
    chol, scaled = _capacitance_cholesky(g)
    resid = jnp.asarray(X) - g.mean
    proj = solve_triangular(chol, (resid @ scaled).T, lower=True)  # (k, n)
    quad = jnp.sum(resid**2 / g.noise, axis=1) - jnp.sum(proj**2, axis=0)
    logdet = jnp.sum(jnp.log(g.noise)) + 2.0 * jnp.sum(jnp.log(jnp.diag(chol)))
    d = resid.shape[1]
    return -0.5 * (d * _LOG_2PI + logdet + quad)


@jax.jit
def _log_prob_masked(g: LowRankGaussian, X: jax.Array, observed: jax.Array) -> jax.Array:
    obs = jnp.asarray(observed)
    w = jnp.asarray(g.loadings)
    inv_noise = jnp.where(obs, 1.0 / g.noise, 0.0)  # (n, d)
    resid = jnp.where(obs, jnp.asarray(X) - g.mean, 0.0)
    k = w.shape[1]
    # Per-row capacitance I + W_O^T Psi_O^{-1} W_O, shape (n, k, k).
    m = jnp.eye(k, dtype=w.dtype) + jnp.einsum("dk,nd,dl->nkl", w, inv_noise, w)
    chol = jnp.linalg.cholesky(m)
    rhs = (resid * inv_noise) @ w  # (n, k)
    proj = solve_triangular(chol, rhs[..., None], lower=True)[..., 0]
    quad = jnp.sum(resid**2 * inv_noise, axis=1) - jnp.sum(proj**2, axis=1)
    logdet = jnp.sum(jnp.where(obs, jnp.log(g.noise), 0.0), axis=1) + 2.0 * jnp.sum(
        jnp.log(jnp.diagonal(chol, axis1=1, axis2=2)), axis=1
    )
    n_obs = jnp.sum(obs, axis=1)
    return -0.5 * (n_obs * _LOG_2PI + logdet + quad)


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
