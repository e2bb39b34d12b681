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

One log-density costs O(d k^2 + k^3) once plus O(d k) per row; the
log-likelihood of a whole data set from its sufficient statistics (n, mean,
scatter) costs O(d^2 k).

Rows with missing entries (``observed`` masks) are handled exactly: row ``i``
is the Gaussian of its observed block ``O_i``, with its own capacitance
``M_i = I + W_O^T Psi_O^{-1} W_O``, so its cost is O(d k^2).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular

from bayespca.linalg import flip_signs

__all__ = [
    "LatentPosterior",
    "LowRankGaussian",
    "MissingConditional",
    "canonical_loadings",
    "conditional_missing",
    "covariance",
    "latent_posterior",
    "log_likelihood_from_stats",
    "log_prob",
    "precision",
    "sample",
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


def _masked_factors(g: LowRankGaussian, X: jax.Array, observed: jax.Array):
    """Per-row pieces of the observed-block Gaussian.

    Missing coordinates get zero precision and zero residual, which removes
    them from every sum. Returns the lower Cholesky factors of the per-row
    capacitances ``M_i = I + W^T diag(o_i / psi) W`` (n, k, k), the
    right-hand sides ``W^T Psi^{-1} r_i`` restricted to observed entries
    (n, k), the masked residuals (n, d) and masked inverse noise (n, d).
    """
    obs = jnp.asarray(observed)
    w = jnp.asarray(g.loadings)
    d, k = w.shape
    inv_noise = jnp.where(obs, 1.0 / g.noise, 0.0)
    resid = jnp.where(obs, jnp.asarray(X) - g.mean, 0.0)
    # sum_j o_ij / psi_j w_j w_j^T for every row at once is one (n, d) x (d, k^2)
    # matrix product, the fastest way to form n small matrices.
    outer = (w[:, :, None] * w[:, None, :]).reshape(d, k * k)
    m = jnp.eye(k, dtype=w.dtype) + (inv_noise @ outer).reshape(-1, k, k)
    chol = jnp.linalg.cholesky(m)
    rhs = (resid * inv_noise) @ w
    return chol, rhs, resid, inv_noise


@jax.jit
def _log_prob_masked(g: LowRankGaussian, X: jax.Array, observed: jax.Array) -> jax.Array:
    return _masked_log_prob(g, observed, _masked_factors(g, X, observed))


def _masked_log_prob(g: LowRankGaussian, observed: jax.Array, factors) -> jax.Array:
    """Per-row observed-block log-density from :func:`_masked_factors` (reused by EM)."""
    chol, rhs, resid, inv_noise = factors
    proj = solve_triangular(chol, rhs[..., None], lower=True)[..., 0]
    quad = jnp.sum(resid**2 * inv_noise, axis=1) - jnp.sum(proj**2, axis=1)
    obs = jnp.asarray(observed)
    logdet = jnp.sum(jnp.where(obs, jnp.log(g.noise), 0.0), axis=1) + 2.0 * jnp.sum(
        jnp.log(jnp.diagonal(chol, axis1=1, axis2=2)), axis=1
    )
    n_obs = jnp.sum(obs, axis=1)
    return -0.5 * (n_obs * _LOG_2PI + logdet + quad)


def _stats_log_likelihood(g, chol, scaled, n, mean, diag_scatter, scatter_scaled):
    """Total log-likelihood from the sufficient statistics and ``scatter @ Psi^{-1} W``.

    ``sum_i log N(x_i) = n log N(xbar | mu, C) - tr(C^{-1} scatter) / 2`` with
    ``tr(C^{-1} scatter) = sum_j scatter_jj / psi_j - tr(M^{-1} W^T Psi^{-1} scatter Psi^{-1} W)``.
    Fitting code that already holds ``scatter @ Psi^{-1} W`` (EM) gets the
    log-likelihood for O(d k^2) more.
    """
    inner = scaled.T @ scatter_scaled
    trace = jnp.sum(diag_scatter / g.noise) - jnp.trace(cho_solve((chol, True), inner))
    return n * _log_prob_complete(g, mean[None, :])[0] - 0.5 * trace


@jax.jit
def log_likelihood_from_stats(
    g: LowRankGaussian, n_samples: int, mean: jax.Array, scatter: jax.Array
) -> jax.Array:
    """Total log-likelihood ``sum_i log N(x_i | mu, C)`` from sufficient statistics.

    With ``xbar`` the sample mean and ``scatter = sum_i (x_i - xbar)(x_i - xbar)^T``,

        sum_i log N(x_i) = -n/2 [d log(2 pi) + log|C| + (xbar - mu)^T C^{-1} (xbar - mu)]
                           - tr(C^{-1} scatter) / 2,

    evaluated with the Woodbury identity in O(d^2 k): no d x d matrix is
    inverted or factorised.

    Parameters
    ----------
    g : LowRankGaussian
    n_samples : int
    mean : Array of shape (d,)
        Sample mean.
    scatter : Array of shape (d, d)
        Centred scatter matrix (a sum, not divided by ``n``), e.g.
        :func:`bayespca.linalg.centred_scatter`.

    Returns
    -------
    Array, scalar

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0, 1.0], [1.0, 3.0], [2.0, 2.0]])
    >>> g = LowRankGaussian(np.array([[0.8], [0.6]]), np.array([0.4, 0.7]), np.array([1.0, 2.0]))
    >>> xbar = X.mean(0)
    >>> total = log_likelihood_from_stats(g, 3, xbar, (X - xbar).T @ (X - xbar))
    >>> bool(np.isclose(total, log_prob(g, X).sum()))
    True
    """
    chol, scaled = _capacitance_cholesky(g)
    scatter = jnp.asarray(scatter)
    return _stats_log_likelihood(
        g, chol, scaled, n_samples, jnp.asarray(mean), jnp.diag(scatter), scatter @ scaled
    )


class LatentPosterior(NamedTuple):
    """Gaussian posterior of the latent ``z`` given rows of ``X``.

    Attributes
    ----------
    mean : Array of shape (n, k)
        ``E[z_i | x_i] = M^{-1} W^T Psi^{-1} (x_i - mu)``.
    covariance : Array of shape (k, k) or (n, k, k)
        ``Cov[z_i | x_i] = M^{-1}``: one matrix shared by all rows when every
        entry is observed, else one per row (it depends on which entries are
        observed).
    """

    mean: jax.Array
    covariance: jax.Array


def latent_posterior(
    g: LowRankGaussian, X: jax.Array, observed: jax.Array | None = None
) -> LatentPosterior:
    """Posterior of ``z`` given each row: ``N(M^{-1} W^T Psi^{-1} (x - mu), M^{-1})``.

    With ``M = I + W^T Psi^{-1} W``. With missing values row ``i`` conditions on
    its observed entries only, ``M_i = I + W_O^T Psi_O^{-1} W_O`` (Tipping &
    Bishop 1999, appendix; Ilin & Raiko 2010); a row with nothing observed
    gets the prior ``N(0, I)``.

    Parameters
    ----------
    g : LowRankGaussian
    X : Array of shape (n, d)
    observed : Array of bool, shape (n, d), optional
        True where observed; all observed when None.

    Returns
    -------
    LatentPosterior
        ``covariance`` has shape (k, k) when ``observed`` is None, else (n, k, k).

    Examples
    --------
    >>> import numpy as np
    >>> g = LowRankGaussian(np.array([[1.0], [1.0]]), np.array([1.0, 1.0]), np.zeros(2))
    >>> post = latent_posterior(g, np.array([[3.0, 3.0]]))
    >>> np.asarray(post.mean), np.asarray(post.covariance)
    (array([[2.]]), array([[0.33333333]]))
    """
    if observed is None:
        return _latent_posterior_complete(g, X)
    return _latent_posterior_masked(g, X, observed)


@jax.jit
def _latent_posterior_complete(g: LowRankGaussian, X: jax.Array) -> LatentPosterior:
    chol, scaled = _capacitance_cholesky(g)
    rhs = (jnp.asarray(X) - g.mean) @ scaled  # (n, k)
    mean = cho_solve((chol, True), rhs.T).T
    cov = cho_solve((chol, True), jnp.eye(chol.shape[0], dtype=chol.dtype))
    return LatentPosterior(mean, cov)


@jax.jit
def _latent_posterior_masked(g: LowRankGaussian, X: jax.Array, observed: jax.Array):
    chol, rhs, _, _ = _masked_factors(g, X, observed)
    mean = cho_solve((chol, True), rhs[..., None])[..., 0]
    eye = jnp.broadcast_to(jnp.eye(chol.shape[-1], dtype=chol.dtype), chol.shape)
    return LatentPosterior(mean, cho_solve((chol, True), eye))


class MissingConditional(NamedTuple):
    """Conditional distribution of the missing entries given the observed ones.

    Attributes
    ----------
    mean : Array of shape (n, d)
        ``E[x_ij | x_{i,O}]`` at missing entries; the data themselves at
        observed entries.
    variance : Array of shape (n, d)
        ``Var[x_ij | x_{i,O}]`` at missing entries; 0 at observed entries.
    """

    mean: jax.Array
    variance: jax.Array


@jax.jit
def conditional_missing(
    g: LowRankGaussian, X: jax.Array, observed: jax.Array
) -> MissingConditional:
    """Mean and variance of each missing entry given the observed entries of its row.

    Through the latent posterior ``z | x_O ~ N(m, Sigma)``: a missing entry is
    ``x_j = w_j^T z + mu_j + eps_j``, so

        E[x_j | x_O] = mu_j + w_j^T m,    Var[x_j | x_O] = w_j^T Sigma w_j + psi_j,

    which equals Gaussian conditioning on the d x d covariance at O(d k^2)
    per row.

    Parameters
    ----------
    g : LowRankGaussian
    X : Array of shape (n, d)
        Missing entries may hold anything (NaN included).
    observed : Array of bool, shape (n, d)

    Returns
    -------
    MissingConditional

    Examples
    --------
    >>> import numpy as np
    >>> g = LowRankGaussian(np.array([[1.0], [1.0]]), np.array([1.0, 1.0]), np.zeros(2))
    >>> cond = conditional_missing(g, np.array([[2.0, np.nan]]), np.array([[True, False]]))
    >>> np.asarray(cond.mean), np.asarray(cond.variance)
    (array([[2., 1.]]), array([[0. , 1.5]]))
    """
    post = _latent_posterior_masked(g, X, observed)
    w = jnp.asarray(g.loadings)
    d, k = w.shape
    outer = (w[:, :, None] * w[:, None, :]).reshape(d, k * k)
    var = post.covariance.reshape(-1, k * k) @ outer.T + g.noise
    mean = post.mean @ w.T + g.mean
    obs = jnp.asarray(observed)
    return MissingConditional(jnp.where(obs, X, mean), jnp.where(obs, 0.0, var))


def sample(g: LowRankGaussian, key: jax.Array, n_samples: int) -> jax.Array:
    """Draw ``n_samples`` rows ``x = W z + mu + eps``, ``z ~ N(0, I)``, ``eps ~ N(0, Psi)``.

    Parameters
    ----------
    g : LowRankGaussian
    key : jax.random key
    n_samples : int

    Returns
    -------
    Array of shape (n_samples, d)

    Examples
    --------
    >>> import numpy as np
    >>> g = LowRankGaussian(np.array([[2.0], [0.0]]), np.array([1.0, 4.0]), np.zeros(2))
    >>> x = np.asarray(sample(g, jax.random.key(0), 100_000))
    >>> np.round(np.var(x, axis=0), 1)
    array([5., 4.])
    """
    w = jnp.asarray(g.loadings)
    d, k = w.shape
    key_z, key_eps = jax.random.split(key)
    z = jax.random.normal(key_z, (n_samples, k), dtype=w.dtype)
    eps = jax.random.normal(key_eps, (n_samples, d), dtype=w.dtype)
    return z @ w.T + g.mean + eps * jnp.sqrt(jnp.asarray(g.noise))


def canonical_loadings(g: LowRankGaussian) -> LowRankGaussian:
    """The same Gaussian with ``W`` in its canonical orientation (NumPy, not jit-able).

    ``W`` is identified only up to ``W R`` with ``R`` orthogonal. The
    canonical choice makes ``W^T Psi^{-1} W`` diagonal with decreasing
    entries (for pPCA: orthogonal columns of decreasing norm, the
    Tipping-Bishop closed form; for FA: the unrotated loadings of R's
    ``factanal`` and scikit-learn), each column signed as
    :func:`bayespca.linalg.flip_signs` (largest-magnitude entry positive).
    It is ``Psi^{1/2} U S`` from the SVD ``Psi^{-1/2} W = U S V^T``.

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[0.0, -1.0], [2.0, 0.0]]), np.ones(2), np.zeros(2))
    >>> np.asarray(canonical_loadings(g).loadings) + 0.0
    array([[0., 1.],
           [2., 0.]])
    """
    w = np.asarray(g.loadings, dtype=float)
    noise = np.asarray(g.noise, dtype=float)
    sd = np.sqrt(noise)
    u, s, _ = np.linalg.svd(w / sd[:, None], full_matrices=False)
    columns, _ = flip_signs((sd[:, None] * (u * s)).T)
    return LowRankGaussian(columns.T, noise, np.asarray(g.mean, dtype=float))


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
