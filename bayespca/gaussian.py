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
    "capacitance_cholesky",
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


def capacitance_cholesky(g: LowRankGaussian) -> tuple[jax.Array, jax.Array]:
    """Lower Cholesky factor of the capacitance ``M = I + W^T Psi^{-1} W``, and ``Psi^{-1} W``.

    ``M`` is the k x k matrix of the Woodbury identity and the determinant
    lemma, ``C^{-1} = Psi^{-1} - Psi^{-1} W M^{-1} W^T Psi^{-1}``,
    ``log|C| = log|Psi| + log|M|``; its inverse is the posterior covariance of ``z``.

    Returns
    -------
    chol : Array of shape (k, k)
        Lower triangular, ``chol @ chol.T = M``.
    scaled : Array of shape (d, k)
        ``Psi^{-1} W``.

    Examples
    --------
    >>> import numpy as np
    >>> g = LowRankGaussian(np.array([[1.0], [2.0]]), np.array([0.5, 1.0]), np.zeros(2))
    >>> chol, scaled = capacitance_cholesky(g)
    >>> round(float(chol[0, 0] ** 2), 12), np.asarray(scaled).ravel().tolist()  # 1 + 1/0.5 + 4/1
    (7.0, [2.0, 2.0])
    """
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
    chol, scaled = capacitance_cholesky(g)
    resid = jnp.asarray(X) - g.mean
    proj = solve_triangular(chol, (resid @ scaled).T, lower=True)  # (k, n)
    quad = jnp.sum(resid**2 / g.noise, axis=1) - jnp.sum(proj**2, axis=0)
    logdet = jnp.sum(jnp.log(g.noise)) + 2.0 * jnp.sum(jnp.log(jnp.diag(chol)))
    d = resid.shape[1]
    return -0.5 * (d * _LOG_2PI + logdet + quad)


def _symmetric_packing(k: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Indices of the upper triangle of a k x k matrix, and the (k, k) map back to it.

    Sums of many small symmetric matrices are matrix products over their
    ``k (k + 1) / 2`` distinct entries, about half the work of all ``k^2``.
    """
    upper = np.triu_indices(k)
    unpack = np.zeros((k, k), dtype=int)
    unpack[upper] = np.arange(upper[0].size)
    unpack.T[upper] = np.arange(upper[0].size)
    return upper, unpack


def _masked_factors(g: LowRankGaussian, X: jax.Array, observed: jax.Array, inverse: bool = False):
    """Per-row pieces of the observed-block Gaussian.

    Missing coordinates get zero precision and zero residual, which removes
    them from every sum. Returns the lower Cholesky factors ``L_i`` of the
    per-row capacitances ``M_i = I + W^T diag(o_i / psi) W`` (n, k, k),
    ``L_i^{-1} W^T Psi^{-1} r_i`` over observed entries (n, k), ``L_i^{-1}``
    (n, k, k; only when ``inverse``, else None), the masked residuals (n, d)
    and the masked inverse noise (n, d).
    """
    obs = jnp.asarray(observed)
    w = jnp.asarray(g.loadings)
    k = w.shape[1]
    inv_noise = jnp.where(obs, 1.0 / g.noise, 0.0)
    resid = jnp.where(obs, jnp.asarray(X) - g.mean, 0.0)
    # sum_j o_ij / psi_j w_j w_j^T for every row at once is one matrix
    # product (n, d) x (d, k(k+1)/2), the fastest way to form n small matrices.
    upper, unpack = _symmetric_packing(k)
    m = jnp.eye(k, dtype=w.dtype) + (inv_noise @ (w[:, upper[0]] * w[:, upper[1]]))[:, unpack]
    chol = jnp.linalg.cholesky(m)
    rhs = ((resid * inv_noise) @ w)[..., None]
    if inverse:  # one triangular solve for both the projection and L^{-1}
        eye = jnp.broadcast_to(jnp.eye(k, dtype=w.dtype), chol.shape)
        solved = solve_triangular(chol, jnp.concatenate([rhs, eye], axis=2), lower=True)
        proj, chol_inv = solved[..., 0], solved[..., 1:]
    else:
        proj, chol_inv = solve_triangular(chol, rhs, lower=True)[..., 0], None
    return chol, proj, chol_inv, resid, inv_noise


@jax.jit
def _log_prob_masked(g: LowRankGaussian, X: jax.Array, observed: jax.Array) -> jax.Array:
    chol, proj, _, resid, inv_noise = _masked_factors(g, X, observed)
    return _masked_log_prob(g, observed, chol, proj, resid, inv_noise)


def _masked_log_prob(g, observed, chol, proj, resid, inv_noise) -> jax.Array:
    """Per-row observed-block log-density from :func:`_masked_factors` (reused by EM)."""
    quad = jnp.sum(resid**2 * inv_noise, axis=1) - jnp.sum(proj**2, axis=1)
    obs = jnp.asarray(observed)
    logdet = jnp.sum(jnp.where(obs, jnp.log(g.noise), 0.0), axis=1) + 2.0 * jnp.sum(
        jnp.log(jnp.diagonal(chol, axis1=1, axis2=2)), axis=1
    )
    n_obs = jnp.sum(obs, axis=1)
    return -0.5 * (n_obs * _LOG_2PI + logdet + quad)


def _masked_posterior(proj: jax.Array, chol_inv: jax.Array) -> LatentPosterior:
    """``M_i^{-1} = L_i^{-T} L_i^{-1}`` and ``E[z_i] = L_i^{-T} proj_i`` (reused by EM)."""
    mean = jnp.einsum("nji,nj->ni", chol_inv, proj)
    cov = jnp.einsum("nji,njl->nil", chol_inv, chol_inv)
    return LatentPosterior(mean, cov)


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
    chol, scaled = capacitance_cholesky(g)
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
    chol, scaled = capacitance_cholesky(g)
    rhs = (jnp.asarray(X) - g.mean) @ scaled  # (n, k)
    mean = cho_solve((chol, True), rhs.T).T
    cov = cho_solve((chol, True), jnp.eye(chol.shape[0], dtype=chol.dtype))
    return LatentPosterior(mean, cov)


@jax.jit
def _latent_posterior_masked(g: LowRankGaussian, X: jax.Array, observed: jax.Array):
    _, proj, chol_inv, _, _ = _masked_factors(g, X, observed, inverse=True)
    return _masked_posterior(proj, chol_inv)


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
    upper, unpack = _symmetric_packing(w.shape[1])
    # w_j^T Sigma_i w_j for all (i, j): the packed entries of Sigma_i (off-diagonal
    # ones counted twice) against the packed outer products w_j w_j^T.
    twice = np.where(upper[0] == upper[1], 1.0, 2.0)
    packed_cov = post.covariance[:, upper[0], upper[1]] * twice
    var = packed_cov @ (w[:, upper[0]] * w[:, upper[1]]).T + g.noise
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
    chol, scaled = capacitance_cholesky(g)
    inner = cho_solve((chol, True), scaled.T)  # (k, d) = M^{-1} W^T Psi^{-1}
    return jnp.diag(1.0 / jnp.asarray(g.noise)) - scaled @ inner
