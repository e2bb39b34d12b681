"""Probabilistic PCA and factor analysis as NumPyro model functions, written once.

Both models share one generative story (see :mod:`bayespca.gaussian`)::

    W ~ p(W),  noise ~ p(noise),  mu ~ p(mu)
    z_i ~ N(0, I_k),   x_i | z_i ~ N(W z_i + mu, Psi),   i = 1..n

with ``Psi = sigma^2 I`` for :func:`ppca` and ``Psi = diag(psi)`` for
:func:`factor_analysis`. Integrating ``z_i`` out gives the *marginal* model
``x_i ~ N(mu, W W^T + Psi)``: no per-row latent variables, no funnel, and
its per-row log-density is the pointwise log-likelihood that LOO needs.

Every inference in the package runs these functions: NUTS takes its
potential energy from them (:mod:`bayespca.inference.nuts`), SVI its ELBO
(:mod:`bayespca.inference.svi`), and ``Predictive`` its draws. A NumPyro
user gets the same posterior with NumPyro's own MCMC::

    model = functools.partial(ppca, n_components=3)
    MCMC(NUTS(model), num_warmup=500, num_samples=500).run(key, suff_stats=sufficient_statistics(X))

Identification. ``W`` is identified only up to ``W R`` (``R`` orthogonal).
``identification`` picks the coordinates the model samples ``W`` in:

``"polar"`` (the default)
    ``W = D U diag(l)``, ``U = Z L^{-T}`` with ``Z^T Z = L L^T`` the
    orthonormal factor of an unconstrained ``d x k`` site ``"Z"`` whose
    density depends on ``Z^T Z`` only (concentrated near the Stiefel
    manifold, :func:`expansion_log_density`), so ``U`` is uniform on the Stiefel
    manifold, and ``l_1 > ... > l_k > 0`` from the site ``"log_gaps"``
    (``l_j = sum_{i >= j} exp(g_i)``). ``U diag(l) V^T`` is the SVD of an
    unconstrained ``W`` whose ``V`` is integrated out: for a rotation-
    invariant prior (the default) the SVD's volume element
    ``prod_j l_j^(d-k) prod_{i<j} (l_i^2 - l_j^2)`` is included, so the
    posterior of ``W W^T`` is exactly that of the unconstrained model. For
    other priors (ARD, :class:`bayespca.priors.Custom`) the density is
    ``p(U diag(l))`` with respect to Haar measure and Lebesgue measure on ``l``.
    ``D`` is fixed: ``I`` for pPCA (``l^2`` are then the eigenvalues of
    ``W W^T``), ``diag(s_j)`` (the features' standard deviations) for FA, so
    that the map is the SVD of ``D^{-1} W`` (its Jacobian ``|D|^k`` a
    constant) and the sampler sees the same geometry in any units of the
    features (unscaled, ``U`` follows the feature of largest raw variance).
    For FA it mixes better than ``"lower_triangular"`` (benchmarks/bench_nuts_real.py,
    diabetes and wine, k = 1 and 4, 5 seeds: 23 of 25 fits with R-hat < 1.01 and
    bulk ESS > 400 against 18, 0 divergent transitions against 430). The
    map is singular where two scales meet and at ``l_k = 0``; where FA's
    posterior reaches there, the NUTS runner samples ``"none"`` instead
    (:mod:`bayespca.inference.nuts`, "Weak factors"). ``last_column_scale``
    removes the singularity at ``l_k = 0``: the last column becomes a
    Cartesian vector in the complement of the others' span (:func:`ppca`'s
    parameters), the NUTS runner's second chart for pPCA where polar chains
    fail on the smallest eigenvalue of ``W W^T``.
``"lower_triangular"``
    ``W_jl = 0`` for ``l > j`` and ``W_jj > 0`` (sites ``"W_lower"`` and
    ``"W_log_diag"``). ``W = L Q`` with ``Q`` orthogonal has volume element
    ``prod_j L_jj^(k-1-j)`` (0-based ``j``), included for rotation-invariant
    priors, so the posterior of ``W W^T`` is that of the unconstrained model.
    For a prior that samples ``W``'s entries itself (the horseshoe, whose
    default this is) it is a constraint of the model instead: ``W_{p_i l} =
    0`` for ``l > i``, with anchor features ``p = anchors`` (default the
    first ``k``; the runners pass :func:`pivot_anchors` of the
    maximum-likelihood loadings) and the prior on the other entries.
``"none"`` and ``"procrustes"``
    ``W`` sampled from its prior in the prior's own coordinates (site
    ``"W"``, or the horseshoe's sites); ``"procrustes"`` only tells the NUTS
    runner to align draws afterwards. With a rotation-invariant prior the
    posterior is constant along each orbit ``W R`` (``R`` orthogonal), over
    which chains wander; ``gauge`` holds them near one orientation without
    changing the posterior of anything rotation-invariant
    (:func:`gauge_log_density`).

In every case ``"W"`` is recorded (a deterministic site when built by an
identified map). Without data (prior predictive) ``W`` is drawn from its
prior directly: the identified maps have improper coordinate sites, and
the prior predictive of ``X`` does not depend on the coordinates.

Data. ``X`` (rows; NaN marks a missing entry) enters through the plate
``"obs"``, one log-likelihood value per row. ``suff_stats`` instead (a
:class:`bayespca.statistics.SufficientStatistics`, or the per-pattern
:class:`bayespca.statistics.MissingPatterns` with missing values) enters as
one factor site ``"X"`` holding the total log-likelihood, computed at
O(d^2 k) per pattern whatever n (:func:`marginal_log_likelihood`).

Shape-defining integers (``n_components``, ``n_samples``, ``n_features``)
are keyword-only Python ints; with ``jit_model_args=True`` every call
argument is traced, so bind them with :func:`functools.partial`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from bayespca import priors as prior_classes
from bayespca.gaussian import (
    LowRankGaussian,
    array_namespace,
    cholesky,
    draws_log_likelihood_from_stats,
    log_likelihood_from_stats,
    log_prob,
    tri_solve,
)
from bayespca.inference.contract import IDENTIFICATIONS
from bayespca.params import check_anchors
from bayespca.statistics import MissingPatterns, StackedPatterns, SufficientStatistics, stack_patterns

__all__ = [
    "DEFAULT_IDENTIFICATION",
    "EXPANSION_CONCENTRATION",
    "GAUGE_CONCENTRATION",
    "IDENTIFICATIONS",
    "factor_analysis",
    "gauge_log_density",
    "identification_for",
    "initial_values",
    "lower_entries",
    "lower_triangular",
    "pivot_anchors",
    "polar_trace",
    "draws_marginal_log_likelihood",
    "marginal_log_likelihood",
    "ppca",
    "expansion_log_density",
]

# The data reach compiled samplers as arguments: one compilation serves every data set with the
# same number and sizes of missing patterns.
jax.tree_util.register_dataclass(
    MissingPatterns, data_fields=["columns", "stats", "X", "observed"], meta_fields=["n_features"]
)

DEFAULT_IDENTIFICATION = {"isotropic": "polar", "diagonal": "polar"}
_LOG_2PI = float(np.log(2.0 * np.pi))
_LATENTS = ("marginal", "explicit")
_NOISE_SITE = {"isotropic": "sigma", "diagonal": "psi"}
# Concentration c of the density of the polar expansion (see expansion_log_density): alone, it gives
# Z's entries a variance of 1 / (2 c) about the Stiefel manifold.
EXPANSION_CONCENTRATION = 8.0
# Concentration kappa of the gauge on W's orientation (see gauge_log_density): the angle of a rotation in
# one plane of columns has standard deviation about 1 / sqrt(2 kappa) = 0.25 rad where the data leave it
# free. Breast cancer, standardised, FA k = 19 sampled in W's coordinates (2 chains x 300 + 100, seed 0):
# 511 leapfrog steps a draw without it (the chains turned 160-180 degrees), 255 at kappa = 2, 127 at 8.
GAUGE_CONCENTRATION = 8.0


def identification_for(identification: str | None, noise: str, loadings: Any) -> str:
    """The identification to sample with: the requested one, checked, or the default for the model.

    Priors that sample ``W``'s entries themselves (the horseshoe) take the
    first identification they list; asking them for one they do not list is
    a ValueError.

    Examples
    --------
    >>> identification_for(None, "diagonal", prior_classes.Normal())
    'polar'
    """
    if identification is not None and identification not in IDENTIFICATIONS:
        raise ValueError(
            f"identification must be None or one of {list(IDENTIFICATIONS)}; got {identification!r}."
        )
    allowed = getattr(loadings, "identifications", IDENTIFICATIONS)
    if identification is None:
        default = DEFAULT_IDENTIFICATION[noise]
        return default if default in allowed else allowed[0]
    if identification not in allowed:
        raise ValueError(
            f"identification must be None or one of {list(allowed)} with the {type(loadings).__name__} "
            f"prior (it samples W's entries itself); got {identification!r}."
        )
    return identification


def expansion_log_density(chol: jax.Array) -> jax.Array:
    """Log-density of the expanded matrix ``Z`` of the polar identification, up to a constant.

    ``chol`` is the Cholesky factor ``L`` of ``G = Z^T Z``. Any density of
    the form ``g(G)`` is invariant under ``Z -> Q Z`` (``Q`` orthogonal), so
    ``U = Z L^{-T}`` is uniform on the Stiefel manifold and independent of
    ``G``; ``g`` only sets how the redundant, data-free ``G`` moves:

        log g(G) = -c (tr G - log det G - k),   c = 8.

    Each eigenvalue ``g_i`` of ``G`` feels ``-c (g_i - log g_i - 1)``: zero
    at ``G = I``, a log barrier as ``Z`` loses rank (where ``U`` would turn
    fast in ``Z`` coordinates: a funnel) and quadratic growth outwards. (A
    thin shell ``-|G - I|^2 / (8 * 0.2^2)`` charged 3.1 nats for a collapsed
    eigenvalue and grew quartically; on iris, k=3, the divergent transitions
    sat at eigenvalues of ``G`` from 0.03 to 670.) With respect to Lebesgue
    measure on ``Z``, ``G`` is Wishart with ``d + 2c`` degrees of freedom and
    scale ``I / (2c)``.

    Examples
    --------
    >>> abs(float(expansion_log_density(jnp.eye(2))))
    0.0
    """
    k = chol.shape[-1]
    return -EXPANSION_CONCENTRATION * (jnp.sum(chol * chol) - 2.0 * jnp.sum(jnp.log(jnp.diag(chol))) - k)


@jax.custom_jvp
def polar_trace(m: jax.Array) -> jax.Array:
    """``tr Q``, ``Q`` the orthogonal factor of the polar decomposition ``M = Q P`` (``M`` square).

    ``Q = U V^T`` for the SVD ``M = U S V^T`` (the orthogonal matrix nearest ``M``). Its derivative is
    written out rather than left to the SVD's, which divides by differences of singular values (they
    meet where factors are weak): with ``X = U^T dM V`` and ``C = V^T U``,

        d tr Q = sum_ij X_ij (C_ji - C_ij) / (s_i + s_j),

    finite wherever ``M`` is nonsingular. One k x k SVD a gradient. NaN where ``M`` is singular.

    Examples
    --------
    >>> m = jnp.array([[2.0, 1.0], [0.0, 1.0]])  # Q = [[c, s], [-s, c]], tan(angle) = 1 / 3
    >>> round(float(polar_trace(m)), 12) == round(2 * 3 / 10 ** 0.5, 12)
    True
    """
    u, _, vt = jnp.linalg.svd(m)
    return jnp.trace(u @ vt)


@polar_trace.defjvp
def _polar_trace_jvp(primals, tangents):
    (m,), (dm,) = primals, tangents
    u, s, vt = jnp.linalg.svd(m)
    c = vt @ u
    weights = (c.T - c) / (s[:, None] + s[None, :])
    return jnp.trace(u @ vt), jnp.sum((u.T @ dm @ vt.T) * weights)


def gauge_log_density(w: jax.Array, reference: jax.Array) -> jax.Array:
    """``kappa tr Q(W^T B)``: a log density on ``W``'s orientation relative to ``B``, exact for its
    invariants.

    ``Q`` is the orthogonal polar factor (:func:`polar_trace`), ``B`` (d, k) the ``reference``
    loadings and ``kappa`` :data:`GAUGE_CONCENTRATION`. Since ``Q((W R)^T B) = R^T Q(W^T B)`` for
    orthogonal ``R``, the average of its exponential over the orbit ``{W R}`` under Haar measure
    is ``E_R[exp(kappa tr R)]``, the same constant for every ``W``. Multiplied into a density
    invariant under ``W -> W R``, it leaves the marginal of every rotation-invariant quantity
    (``W W^T``, the noise, the mean) exactly as it was, and only holds the draws near ``B``'s
    orientation (a von Mises-Fisher density on the orbit, largest where ``W^T B`` is symmetric
    positive definite). For k = 2 the constant is ``(I_0(2 kappa) + 1) / 2``. ``Q`` jumps between
    the rotations and the reflections where ``det(W^T B)`` changes sign (a step of up to
    ``2 kappa`` in the log density, which chains started near ``B`` do not cross: the average over
    the half orbit of positive determinant is constant too).

    Examples
    --------
    >>> b = jnp.array([[1.0, 0.0], [0.0, 0.5], [0.2, 0.1]])
    >>> round(float(gauge_log_density(b, b)), 10), 2 * GAUGE_CONCENTRATION  # Q(B^T B) = I
    (16.0, 16.0)
    """
    return GAUGE_CONCENTRATION * polar_trace(w.T @ reference)


def lower_triangular(w: np.ndarray, anchors: Any = None) -> np.ndarray:
    """``W Q`` (same ``W W^T``) whose anchor rows (None: the first ``k``) form a lower-triangular
    block with positive diagonal, from the QR of their transpose.

    Examples
    --------
    >>> lt = lower_triangular(np.array([[0.0, 1.0], [1.0, 1.0], [2.0, 0.0]]))
    >>> bool(np.allclose(lt @ lt.T, [[1, 1, 0], [1, 2, 2], [0, 2, 4]])), abs(float(lt[0, 1]))
    (True, 0.0)
    """
    w = np.asarray(w)
    rows = np.arange(w.shape[1]) if anchors is None else np.asarray(anchors, dtype=int)
    q, r = np.linalg.qr(w[rows].T)
    return (w @ q) * np.where(np.diag(r) < 0, -1.0, 1.0)


def lower_entries(d: int, k: int, anchors: Any = None) -> np.ndarray:
    """The entries of a (d, k) ``W`` the lower-triangular identification leaves free: all but
    ``(p_i, l)``, ``l > i``, for the anchors ``p`` (None: ``0..k-1``, so ``j >= l``).

    Examples
    --------
    >>> lower_entries(3, 2).astype(int).tolist()
    [[1, 0], [1, 1], [1, 1]]
    >>> lower_entries(3, 2, anchors=(2, 0)).astype(int).tolist()
    [[1, 1], [1, 1], [1, 0]]
    """
    free = np.ones((d, k), bool)
    for i, row in enumerate(range(k) if anchors is None else anchors):
        free[int(row), i + 1:] = False
    return free


def pivot_anchors(w: np.ndarray, noise: np.ndarray) -> tuple[int, ...]:
    """The anchor features of the triangular identification: QR with column pivoting of ``(Psi^{-1/2} W)^T``.

    The first anchor is the row of ``Psi^{-1/2} W`` with the largest norm,
    each next one the row with the largest part orthogonal to those before:
    the rows that pin the rotation of ``W`` best, in units of the noise.
    The choice does not change under ``W -> W R`` (``R`` orthogonal).

    Examples
    --------
    >>> pivot_anchors(np.array([[0.1, 0.0], [3.0, 0.0], [1.0, 1.0]]), np.ones(3))
    (1, 2)
    """
    from scipy.linalg import qr

    scaled = np.asarray(w) / np.sqrt(np.asarray(noise, dtype=float))[:, None]
    return tuple(int(j) for j in qr(scaled.T, pivoting=True)[2][: scaled.shape[1]])


def _polar_loadings(prior, d, k, noise, n, row_scale, active, last_scale):
    z = numpyro.sample("Z", dist.ImproperUniform(constraints.real, (), (d, k)))
    log_gaps = numpyro.sample("log_gaps", dist.ImproperUniform(constraints.real, (), (k,)))
    if last_scale is not None:
        frame, log_volume = _cartesian_last(z, log_gaps, last_scale, d)
        w = row_scale[:, None] * frame
        numpyro.factor("W_volume", log_volume)
        numpyro.factor("W_prior", prior.log_density(w, noise, n))
        return w
    on = jnp.ones(k, bool) if active is None else jnp.arange(k) < active
    # Inactive columns (see active_components) are standard normal sites that reach nothing: their
    # block of Z^T Z is replaced by I, so U's inactive columns are Z's and its active ones those of
    # the model with `active` columns, whatever Z's inactive columns are.
    chol = cholesky(jnp.where(on[:, None] & on, z.T @ z, jnp.eye(k)))
    u = tri_solve(chol, z.T).T  # Z L^{-T}: orthonormal active columns
    # Decreasing positive scales as a reversed cumulative sum of exponentials; 0 where inactive.
    scales = jnp.cumsum(jnp.where(on, jnp.exp(log_gaps), 0.0)[::-1])[::-1]
    log_volume = jnp.sum(jnp.where(on, log_gaps, -0.5 * log_gaps**2)) + expansion_log_density(chol)
    log_volume -= 0.5 * jnp.sum(jnp.where(on, 0.0, z * z))
    if prior.rotation_invariant:
        i, j = np.triu_indices(k, 1)
        log_volume += (d - jnp.sum(on)) * jnp.sum(jnp.log(jnp.where(on, scales, 1.0)))
        pair = on[i] & on[j]
        squares = (scales[i] - scales[j]) * (scales[i] + scales[j])
        log_volume += jnp.sum(jnp.log(jnp.where(pair, squares, 1.0)))
    w = row_scale[:, None] * (u * scales)
    numpyro.factor("W_volume", log_volume)
    numpyro.factor("W_prior", prior.log_density(w, noise, n))
    return w


def _cartesian_last(z, log_gaps, tau, d):
    """``U diag(l)`` with its last column ``tau r_k`` in Cartesian form, and the chart's log-volume.

    ``r_k`` is ``z_k``'s part orthogonal to ``z_1 .. z_{k-1}`` (whose
    polar frame gives ``u_1 .. u_{k-1}``), so the last column passes
    smoothly through 0 where the polar scale ``log l_k`` has a long tail.
    The other scales are ordered by their squares, ``l_j^2 = l_k^2 + sum_{i
    = j}^{k-1} exp(g_i)``, smooth in ``l_k^2 = tau^2 |r_k|^2``; the last gap
    ``g_k`` reaches nothing (a standard normal site). Lebesgue measure on
    ``z_k`` supplies ``|r_k|^{d-k}`` (the QR Jacobian), the SVD volume's
    ``l_k^{d-k}``, so the volume below holds only the other scales' powers,
    their pairs and the Jacobian of ``g -> l``; the expansion density covers
    every entry of ``Z^T Z``'s Cholesky factor but ``|r_k|``.
    """
    k = z.shape[1]
    head, last = z[:, : k - 1], z[:, k - 1]
    chol = cholesky(head.T @ head)
    u = tri_solve(chol, head.T).T
    along = u.T @ last
    residual = last - u @ along
    tail = jnp.cumsum(jnp.exp(log_gaps[: k - 1])[::-1])[::-1]  # l_j^2 - l_k^2, j < k
    scales = jnp.sqrt(tau**2 * jnp.sum(residual**2) + tail)
    frame = jnp.concatenate([u * scales, tau * residual[:, None]], axis=1)
    squares = jnp.append(tail, 0.0)
    i, j = np.triu_indices(k, 1)
    log_volume = (
        jnp.sum(log_gaps[: k - 1] - jnp.log(2.0 * scales)) + (d - k) * jnp.sum(jnp.log(scales))
        + jnp.sum(jnp.log(squares[i] - squares[j])) - 0.5 * log_gaps[k - 1] ** 2
        + expansion_log_density(chol) - EXPANSION_CONCENTRATION * jnp.sum(along**2)
    )
    return frame, log_volume


def _lower_triangular_loadings(prior, d, k, noise, n):
    rows, cols = np.tril_indices(d, -1, k)
    lower = numpyro.sample("W_lower", dist.ImproperUniform(constraints.real, (), (rows.size,)))
    log_diag = numpyro.sample("W_log_diag", dist.ImproperUniform(constraints.real, (), (k,)))
    w = jnp.zeros((d, k)).at[rows, cols].set(lower)
    w = w.at[jnp.arange(k), jnp.arange(k)].set(jnp.exp(log_diag))
    log_volume = jnp.sum(log_diag)  # the Jacobian of exp
    if prior.rotation_invariant:
        log_volume += jnp.sum((k - 1 - jnp.arange(k)) * log_diag)
    numpyro.factor("W_volume", log_volume)
    numpyro.factor("W_prior", prior.log_density(w, noise, n))
    return w


def initial_values(
    identification: str, prior: Any, g: LowRankGaussian, noise: str, n: int, row_scale: Any = None,
    active: int | None = None, last_scale: float | None = None, reparam: Any = None, anchors: Any = None,
) -> dict:
    """Constrained values of every latent site that give the parameters ``g`` (a start for NUTS or SVI).

    Parameters
    ----------
    identification : str
    prior : LoadingsPrior
        Resolved (its own sites' start comes from :meth:`LoadingsPrior.start`).
    g : LowRankGaussian
        ``(W, noise variances, mu)``, NumPy.
    noise : {"isotropic", "diagonal"}
    n : int
    row_scale : array of shape (d,), optional
        ``D`` of the polar map (FA: the features' standard deviations, as
        the model computes them from its data); None: ``I``.
    active : int, optional
        The model's ``active_components`` (polar only): ``g``'s loadings
        have 0 in the columns from ``active`` on, whose sites start at 0,
        their density's mode.
    last_scale : float, optional
        The model's ``last_column_scale`` (polar only): the last column's
        Cartesian start ``l_k u_k / tau`` and the gaps of the squared scales.
    reparam : bayespca.priors.HorseshoeReparam, optional
        The model's ``reparam``: the entries it samples centred start at
        ``W / standard_error``.
    anchors : sequence of int, optional
        The model's ``anchors`` (the horseshoe's triangle).

    Returns
    -------
    dict
        Site name -> value.
    """
    w, psi, mu = (np.asarray(a, dtype=float) for a in g)
    values = {"mu": mu, _NOISE_SITE[noise]: np.sqrt(psi[0]) if noise == "isotropic" else psi}
    if identification == "polar":
        row_scale = np.ones(w.shape[0]) if row_scale is None else np.asarray(row_scale, dtype=float)
        # D^{-1} W = U diag(l) V^T: the polar coordinates of W V, which has the same W W^T.
        u, scales, vt = np.linalg.svd(w / row_scale[:, None], full_matrices=False)
        # Signs such that orthogonal columns (V a permutation) keep theirs.
        flip = np.where(vt[np.arange(len(vt)), np.argmax(np.abs(vt), axis=1)] < 0, -1.0, 1.0)
        u, vt = u * flip, vt * flip[:, None]
        w = w @ vt.T
        values["Z"] = u
        gaps = -np.diff(np.append(scales, 0.0))  # l_j - l_{j+1}, with l_{k+1} = 0
        values["log_gaps"] = np.log(np.maximum(gaps, 1e-3 * max(scales[0], 1e-12)))
        if last_scale is not None:  # the chart of _cartesian_last: gaps of the squares, z_k = l_k u_k / tau
            values["Z"][:, -1] *= scales[-1] / last_scale
            squares = -np.diff(scales**2)
            values["log_gaps"] = np.append(np.log(np.maximum(squares, 1e-6 * scales[0] ** 2)), 0.0)
        if active is not None:  # the standard normal sites of the inactive columns, at their mode
            values["Z"][:, active:] = 0.0
            values["log_gaps"][active:] = 0.0
    elif identification == "lower_triangular" and prior.samples_entries:
        w = lower_triangular(w, anchors)
        values.update(prior.start(w, psi, n, reparam, free=lower_entries(*w.shape, anchors)))
        return values
    elif identification == "lower_triangular":
        w = lower_triangular(w)
        d, k = w.shape
        values["W_lower"] = w[np.tril_indices(d, -1, k)]
        values["W_log_diag"] = np.log(np.maximum(np.diag(w), 1e-6))
    if identification in ("polar", "lower_triangular"):
        values.update({name: v for name, v in prior.start(w, psi, n).items() if name != "W"})
    elif prior.samples_entries:
        values.update(prior.start(w, psi, n, reparam))
    else:
        values.update(prior.start(w, psi, n))
    return values


def draws_marginal_log_likelihood(draws: tuple, stats: Any) -> Any:
    """:func:`marginal_log_likelihood` of each draw ``(W, noise, mu)`` (leading axis), shape (m,).

    Complete-data statistics and draws in NumPy are scored in NumPy, by
    blocks of draws (:func:`bayespca.gaussian.draws_log_likelihood_from_stats`),
    compiling nothing; otherwise compiled once per shape of the draws and of
    the statistics, which do not depend on the number of rows, with grouped
    missing patterns stacked once, outside the loop over draws.
    """
    if isinstance(stats, SufficientStatistics) and array_namespace(tuple(draws), stats)[0] is np:
        return draws_log_likelihood_from_stats(LowRankGaussian(*draws), stats.n, stats.mean, stats.scatter)
    return _compiled_draws_marginal_log_likelihood(tuple(draws), stats)


@jax.jit
def _compiled_draws_marginal_log_likelihood(draws: tuple, stats: Any) -> jax.Array:
    if isinstance(stats, MissingPatterns) and stats.X is None:
        stats = stack_patterns(stats)
    return jax.lax.map(lambda a: marginal_log_likelihood(LowRankGaussian(*a), stats), draws)


def marginal_log_likelihood(g: LowRankGaussian, stats: Any, *, refine: bool = True) -> jax.Array:
    """Total marginal log-likelihood ``sum_i log N(x_{i,O_i} | mu_O, W_O W_O^T + Psi_O)`` from statistics.

    ``stats`` is a :class:`~bayespca.statistics.SufficientStatistics`
    (complete data), :class:`~bayespca.statistics.MissingPatterns` or
    :class:`~bayespca.statistics.StackedPatterns`: each pattern contributes
    :func:`bayespca.gaussian.log_likelihood_from_stats` of its observed
    block (rows themselves when there are too many patterns), all patterns
    in one vectorized operation: the block is the full ``d``-dimensional
    Gaussian with the unobserved coordinates given no loading, unit
    variance and the padded statistics' zeros, so that they add only their
    ``-1/2 log 2 pi`` per row, taken back. Traceable and differentiable.
    On JAX input it is compiled, one program per shape of the parameters
    and statistics: run operation by operation (NumPyro's and SVI's
    initialisation evaluate the model and its gradient eagerly), its ~140
    operations each compiled a program of their own in every new process
    (3 s of a first SVI fit). Complete-data statistics and parameters in
    NumPy are scored in NumPy, compiling nothing. ``refine``: that of
    :func:`~bayespca.gaussian.log_likelihood_from_stats`.

    Examples
    --------
    >>> from bayespca.statistics import missing_patterns
    >>> X = np.array([[0.0, 1.0], [1.0, 3.0], [2.0, np.nan]])
    >>> g = LowRankGaussian(np.array([[0.8], [0.6]]), np.array([0.4, 0.7]), np.array([1.0, 2.0]))
    >>> total = marginal_log_likelihood(g, missing_patterns(X))
    >>> bool(np.isclose(total, log_prob(g, np.nan_to_num(X), ~np.isnan(X)).sum()))
    True
    """
    if isinstance(stats, MissingPatterns) and stats.X is None:
        stats = stack_patterns(stats)  # before jit: the grouping is NumPy work on concrete columns
    if isinstance(stats, SufficientStatistics) and array_namespace(g, stats)[0] is np:
        # NumPy: nothing to compile
        return log_likelihood_from_stats(g, stats.n, stats.mean, stats.scatter, refine=refine)
    return _compiled_marginal_log_likelihood(LowRankGaussian(*g), stats, refine)


@functools.partial(jax.jit, static_argnums=2)
def _compiled_marginal_log_likelihood(g: LowRankGaussian, stats: Any, refine: bool) -> jax.Array:
    if isinstance(stats, SufficientStatistics):
        return log_likelihood_from_stats(g, stats.n, stats.mean, stats.scatter, refine=refine)
    if isinstance(stats, MissingPatterns):
        return jnp.sum(log_prob(g, stats.X, stats.observed))
    w, noise, mean = (jnp.asarray(a) for a in g)
    d = w.shape[0]

    def one(observed, n, block_mean, scatter):
        block = LowRankGaussian(jnp.where(observed[:, None], w, 0.0), jnp.where(observed, noise, 1.0),
                                jnp.where(observed, mean, 0.0))
        unobserved = d - jnp.sum(observed)
        log_lik = log_likelihood_from_stats(block, n, block_mean, scatter, refine=refine)
        return log_lik + 0.5 * n * unobserved * _LOG_2PI

    return jnp.sum(jax.vmap(one)(*(jnp.asarray(a) for a in stats)))


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{name} is a traced JAX value, but it defines a shape and must be a Python int. "
            "With jit_model_args=True every model argument is traced: bind shape arguments "
            f"first, e.g. functools.partial(model, {name}={name})."
        )
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}.")
    return int(value)


class _LowRankNormal(dist.Distribution):
    """``N(mu, W W^T + diag(psi))`` per row, optionally restricted to observed entries.

    The log-density is :func:`bayespca.gaussian.log_prob`, so every model,
    fit and score in the package shares one implementation. With a mask
    ``observed`` (batch shape + (d,)), the density of row ``i`` is that of its
    observed block (the likelihood of data missing at random), one value per
    row. Draws are complete rows.
    """

    arg_constraints = {}
    support = constraints.real_vector
    pytree_data_fields = ("loc", "cov_factor", "cov_diag", "observed")

    def __init__(self, loc, cov_factor, cov_diag, observed=None):
        self.loc = loc
        self.cov_factor = cov_factor
        self.cov_diag = cov_diag
        self.observed = observed
        batch_shape = () if observed is None else jnp.shape(observed)[:-1]
        super().__init__(batch_shape=batch_shape, event_shape=jnp.shape(loc)[-1:])

    def sample(self, key, sample_shape=()):
        full = dist.LowRankMultivariateNormal(self.loc, self.cov_factor, self.cov_diag)
        return full.sample(key, tuple(sample_shape) + tuple(self.batch_shape))

    def log_prob(self, value):
        g = LowRankGaussian(self.cov_factor, self.cov_diag, self.loc)
        shape = jnp.shape(value)
        rows = jnp.reshape(value, (-1, shape[-1]))
        observed = None
        if self.observed is not None:
            observed = jnp.reshape(jnp.broadcast_to(self.observed, shape), (-1, shape[-1]))
        return jnp.reshape(_compiled_log_prob(g, rows, observed), shape[:-1])


# Compiled for the eager evaluations of the model (see marginal_log_likelihood).
_compiled_log_prob = jax.jit(log_prob)


def _observed_mask(X: jax.Array, has_missing: bool | None) -> jax.Array | None:
    """Mask of observed entries, or None to use the complete-data density.

    A concrete X is inspected once; a traced X (``jit_model_args=True``)
    cannot be, so unless told ``has_missing=False`` the masked density, which
    equals the complete one when nothing is missing, is used.
    """
    if has_missing is None:
        has_missing = isinstance(X, jax.core.Tracer) or bool(np.isnan(np.asarray(X)).any())
    return ~jnp.isnan(X) if has_missing else None


def _shape(X, suff_stats, n_samples, n_features, latent, subsample_size):
    """``(n, d)`` of the data (n None with statistics), with named errors for inconsistent arguments."""
    if suff_stats is not None:
        if X is not None:
            raise ValueError("Pass either X or suff_stats, not both.")
        if latent != "marginal" or subsample_size is not None:
            raise ValueError(
                "suff_stats needs latent='marginal' and subsample_size=None; got "
                f"latent={latent!r}, subsample_size={subsample_size!r}."
            )
        if not isinstance(suff_stats, SufficientStatistics | MissingPatterns | StackedPatterns):
            raise TypeError(
                "suff_stats must be a bayespca.statistics.SufficientStatistics, MissingPatterns or "
                f"StackedPatterns; got {type(suff_stats).__name__}."
            )
        if not isinstance(suff_stats, MissingPatterns):
            return None, jnp.shape(suff_stats.mean)[-1]
        return None, suff_stats.n_features
    if X is not None:
        if jnp.ndim(X) != 2:
            raise ValueError(f"X must be 2-D (n_samples, n_features); got shape {jnp.shape(X)}.")
        n, d = jnp.shape(X)
        for value, name, size in ((n_samples, "n_samples", n), (n_features, "n_features", d)):
            if value is not None and value != size:
                raise ValueError(f"{name}={value!r} does not match X of shape {jnp.shape(X)}.")
        return n, d
    if n_samples is None or n_features is None:
        raise ValueError(
            "Without X (prior predictive), both n_samples and n_features are needed; got "
            f"n_samples={n_samples!r}, n_features={n_features!r}."
        )
    return _check_positive_int(n_samples, "n_samples"), _check_positive_int(n_features, "n_features")


def _low_rank_model(
    X, *, noise, n_components, n_samples, n_features, latent, prior, identification, subsample_size,
    suff_stats, has_missing, reparam, refine_precision, active_components, last_column_scale, anchors, gauge,
):
    """The model behind :func:`ppca` (isotropic noise) and :func:`factor_analysis`."""
    if latent not in _LATENTS:
        raise ValueError(f"latent must be one of {_LATENTS}; got {latent!r}.")
    k = _check_positive_int(n_components, "n_components")
    n, d = _shape(X, suff_stats, n_samples, n_features, latent, subsample_size)
    if k > d:
        raise ValueError(f"n_components must be at most n_features={d}; got {k}.")
    given = prior_classes.as_priors(prior)
    residual = noise == "diagonal" and given.noise is None  # u_j: only FA's default noise prior reads it
    scales = prior_classes.data_scales(X, suff_stats, d, residual=residual)
    p = prior_classes.resolve(given, noise, scales)
    ident = identification_for(identification, noise, p.loadings)
    _check_gauge(gauge, ident, p.loadings, (d, k))
    if X is None and suff_stats is None:
        ident = "none"  # prior predictive: W from its prior (see the module docstring)
    _check_chart(ident, p.loadings, (d, k), active_components, last_column_scale, anchors)
    if noise == "isotropic":
        sigma = numpyro.sample("sigma", p.noise)
        psi = jnp.full(d, sigma**2)
    else:
        psi = numpyro.sample("psi", p.noise)
    chart = (active_components, last_column_scale, anchors)
    W = _loadings(p.loadings, ident, d, k, psi, scales, noise == "isotropic", reparam, chart)
    if gauge is not None:
        numpyro.factor("gauge", gauge_log_density(W, jnp.asarray(gauge)))
    g = LowRankGaussian(W, psi, numpyro.sample("mu", p.mean))
    if suff_stats is not None:
        numpyro.factor("X", marginal_log_likelihood(g, suff_stats, refine=refine_precision))
    else:
        _rows_likelihood(X, g, n, k, latent, subsample_size, has_missing)


def _loadings(prior, ident, d, k, psi, scales, isotropic, reparam, chart):
    """``W`` (d, k) in the chart ``ident``: a deterministic site of the polar and triangular charts."""
    if ident == "polar":
        row_scale = jnp.ones(d) if isotropic else scales.sd
        return numpyro.deterministic("W", _polar_loadings(prior, d, k, psi, scales.n, row_scale, *chart[:2]))
    if ident == "lower_triangular" and prior.samples_entries:
        return prior.sample(d, k, psi, scales.n, reparam, free=lower_entries(d, k, chart[2]))
    if ident == "lower_triangular":
        return numpyro.deterministic("W", _lower_triangular_loadings(prior, d, k, psi, scales.n))
    return prior.sample(d, k, psi, scales.n, reparam)


def _check_chart(ident, loadings, shape, active_components, last_column_scale, anchors):
    """A ValueError where ``active_components`` or ``last_column_scale`` is set outside the polar chart,
    or ``anchors`` outside the horseshoe's triangle or not ``k`` distinct features."""
    d, k = shape
    if anchors is not None and (ident != "lower_triangular" or not loadings.samples_entries):
        raise ValueError(
            "anchors needs identification='lower_triangular' and a prior that samples W's entries "
            f"(Horseshoe); got identification={ident!r}, prior {type(loadings).__name__}."
        )
    check_anchors(anchors, d, k)
    if active_components is not None and (ident != "polar" or not loadings.rotation_invariant):
        raise ValueError(
            "active_components needs identification='polar' and a rotation-invariant loadings prior "
            f"(Normal, Flat) on data; got identification={ident!r}, prior {type(loadings).__name__}."
        )
    if last_column_scale is not None and (ident != "polar" or not loadings.rotation_invariant or k < 2
                                          or active_components is not None):
        raise ValueError(
            "last_column_scale needs identification='polar', a rotation-invariant loadings prior, "
            f"n_components >= 2 and no active_components; got identification={ident!r}, prior "
            f"{type(loadings).__name__}, n_components={k}, active_components={active_components}."
        )


def _check_gauge(gauge, ident, loadings, shape):
    """A ValueError where ``gauge`` is set outside ``W``'s own coordinates or a rotation-invariant prior, or
    is not (d, k)."""
    if gauge is None:
        return
    if ident not in ("none", "procrustes") or not loadings.rotation_invariant:
        raise ValueError(
            "gauge needs identification='none' or 'procrustes' and a rotation-invariant loadings prior "
            f"(Normal, Flat) on data; got identification={ident!r}, prior {type(loadings).__name__}."
        )
    if np.shape(gauge) != shape:
        raise ValueError(f"gauge must be reference loadings of shape {shape}; got shape {np.shape(gauge)}.")


def _rows_likelihood(X, g, n, k, latent, subsample_size, has_missing):
    """The observed site ``"X"``, row by row (``X`` None: the prior predictive draws it)."""
    W, psi, mu = g
    observed = None if X is None else _observed_mask(X, has_missing)
    with numpyro.plate("obs", n, subsample_size=subsample_size):
        x = None if X is None else numpyro.subsample(jnp.asarray(X), event_dim=1)
        if observed is not None:
            observed = numpyro.subsample(observed, event_dim=1)
            # Zeros, not NaN, in unobserved entries: NaN would leak into
            # gradients through the masked branch.
            x = jnp.where(observed, x, 0.0)
        if latent == "explicit":
            z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand((k,)).to_event(1))
            likelihood = dist.Normal(mu + z @ W.T, jnp.sqrt(psi))
            if observed is not None:
                likelihood = likelihood.mask(observed)
            numpyro.sample("X", likelihood.to_event(1), obs=x)
        else:
            numpyro.sample("X", _LowRankNormal(mu, W, psi, observed), obs=x)


_MODEL_PARAMETERS = """
    Parameters
    ----------
    X : array of shape (n, d), optional
        Data; NaN marks a missing entry (missing at random), and only the
        observed entries of each row enter the likelihood. None samples
        from the prior predictive (then ``n_samples`` and ``n_features`` are
        required) or uses ``suff_stats``.
    n_components : int, keyword-only
        Number of latent dimensions k, ``1 <= k <= d``.
    n_samples, n_features : int, optional
        Shape of the data; required without ``X``, checked against it otherwise.
    latent : {"marginal", "explicit"}, default="marginal"
        ``"marginal"`` integrates z out: each row of the observed site ``"X"``
        has density ``N(x_i | mu, W W^T + Psi)`` (or that of its observed
        block), so ``numpyro.infer.log_likelihood`` gives one value per row.
        ``"explicit"`` samples ``z_i`` (site ``"z"``, (n, k)) and observes
        ``x_i | z_i ~ N(W z_i + mu, Psi)``; its per-row log-likelihood is
        conditional on ``z_i``.
    prior : None, "flat", "ard", "horseshoe", a bayespca.priors prior, Priors or dict, optional
        Read by :func:`bayespca.priors.as_priors`; None: the scale-aware
        defaults of :mod:`bayespca.priors`, computed from the data (or from
        ``suff_stats``).
    identification : {None, "polar", "lower_triangular", "procrustes", "none"}, optional
        Coordinates of ``W`` (module docstring); None: ``"polar"``, and
        ``"lower_triangular"`` for the horseshoe.
    subsample_size : int, optional
        Minibatch size for SVI: the plate ``"obs"`` subsamples rows and
        scales their log-likelihood by ``n / subsample_size``.
    suff_stats : SufficientStatistics, MissingPatterns or StackedPatterns, optional
        Instead of ``X`` (marginal model only): the log-likelihood from
        ``(n, xbar, S)`` per pattern, O(d^2 k) each, whatever n, as one
        factor site ``"X"`` holding the total.
    has_missing : bool, optional
        Whether ``X`` has NaN entries. None inspects a concrete ``X``; a
        traced ``X`` (``jit_model_args=True``) cannot be, so the masked
        density is then used unless ``has_missing=False`` is bound.
    reparam : bayespca.priors.HorseshoeReparam, optional
        For the horseshoe: which loadings to sample centred (same
        posterior, better geometry for NUTS; set by the NUTS runner).
    refine_precision : bool, default=True
        With ``suff_stats``: refine ``C^{-1}`` where its Woodbury form loses
        digits (:func:`bayespca.gaussian.log_likelihood_from_stats`). The
        NUTS runner passes False where the posterior's signal-to-noise
        ratios are far from that (a smaller compiled program).
    active_components : int or None, default=None
        With ``identification="polar"`` and a rotation-invariant prior: only
        the first ``active_components`` columns of ``W`` are free, the others
        0, and the inactive columns of ``"Z"`` and entries of ``"log_gaps"``
        are independent standard normal sites. The density of the active
        sites is then that of the model with ``n_components=active_components``,
        and, as data rather than code, one compiled program serves every
        number of components up to ``n_components``
        (:func:`bayespca.comparison.compare_n_components`).
    last_column_scale : float or None, default=None
        With ``identification="polar"``, a rotation-invariant prior and
        ``n_components >= 2``: sample the last column of ``W`` as ``tau``
        (this value) times the part of ``Z``'s last column orthogonal to
        the others, Cartesian coordinates that pass smoothly through 0,
        instead of its polar scale ``l_k`` (same posterior; the NUTS
        runner's choice where the polar chains fail on the smallest
        eigenvalue of ``W W^T``). The last entry of ``"log_gaps"`` is then
        a standard normal site that reaches nothing.
    anchors : sequence of int or None, default=None
        With ``identification="lower_triangular"`` and the horseshoe: the
        ``k`` distinct features ``p_1..p_k`` with ``W_{p_i l} = 0`` for
        ``l > i``; None: the first ``k``.
    gauge : array of shape (d, k) or None, default=None
        With ``identification="none"`` or ``"procrustes"`` and a
        rotation-invariant prior: reference loadings ``B``; the factor site
        ``"gauge"`` adds :func:`gauge_log_density`, which holds ``W``'s
        orientation near ``B``'s and leaves the posterior of ``W W^T``, the
        noise and the mean exactly as it was. The NUTS runner sets it where
        it samples FA in ``W``'s own coordinates.
"""


def ppca(
    X=None, *, n_components, n_samples=None, n_features=None, latent="marginal", prior=None,
    identification=None, subsample_size=None, suff_stats=None, has_missing=None, reparam=None,
    refine_precision=True, active_components=None, last_column_scale=None, anchors=None, gauge=None,
):
    """Probabilistic PCA (Tipping & Bishop, 1999) as a NumPyro model.

    ``z_i ~ N(0, I_k)``, ``x_i | z_i ~ N(W z_i + mu, sigma^2 I_d)``, hence
    ``x_i ~ N(mu, W W^T + sigma^2 I_d)``. Sites: ``"sigma"`` (noise standard
    deviation), the coordinates of ``W`` (module docstring) with ``"W"``
    (d, k) recorded, ``"mu"`` (d,), ``"z"`` (explicit only), and the
    observed ``"X"``.
    {parameters}
    Examples
    --------
    >>> import functools, jax, numpy as np
    >>> from numpyro.infer import Predictive
    >>> model = functools.partial(ppca, n_components=2, n_samples=5, n_features=4)
    >>> draws = Predictive(model, num_samples=3)(jax.random.key(0))
    >>> draws["X"].shape, draws["W"].shape, draws["sigma"].shape
    ((3, 5, 4), (3, 4, 2), (3,))

    References
    ----------
    M. E. Tipping and C. M. Bishop (1999). Probabilistic principal component
    analysis. JRSS B 61(3), 611-622.
    """
    _low_rank_model(
        X, noise="isotropic", n_components=n_components, n_samples=n_samples, n_features=n_features,
        latent=latent, prior=prior, identification=identification, subsample_size=subsample_size,
        suff_stats=suff_stats, has_missing=has_missing, reparam=reparam,
        refine_precision=refine_precision, active_components=active_components,
        last_column_scale=last_column_scale, anchors=anchors, gauge=gauge,
    )


def factor_analysis(
    X=None, *, n_components, n_samples=None, n_features=None, latent="marginal", prior=None,
    identification=None, subsample_size=None, suff_stats=None, has_missing=None, reparam=None,
    refine_precision=True, active_components=None, last_column_scale=None, anchors=None, gauge=None,
):
    """Factor analysis as a NumPyro model.

    ``z_i ~ N(0, I_k)``, ``x_i | z_i ~ N(W z_i + mu, diag(psi))``, hence
    ``x_i ~ N(mu, W W^T + diag(psi))``. Sites: ``"psi"`` (noise variances,
    (d,)), the coordinates of ``W`` with ``"W"`` (d, k) recorded, ``"mu"``
    (d,), ``"z"`` (explicit only), and the observed ``"X"``.
    {parameters}
    Examples
    --------
    >>> import functools, jax, numpy as np
    >>> from numpyro.infer import log_likelihood
    >>> X = np.random.default_rng(0).normal(size=(6, 3))
    >>> X[0, 1] = np.nan
    >>> model = functools.partial(factor_analysis, n_components=1, identification="none")
    >>> params = {{"W": np.ones((1, 3, 1)), "psi": np.ones((1, 3)), "mu": np.zeros((1, 3))}}
    >>> log_likelihood(model, params, X)["X"].shape
    (1, 6)
    """
    _low_rank_model(
        X, noise="diagonal", n_components=n_components, n_samples=n_samples, n_features=n_features,
        latent=latent, prior=prior, identification=identification, subsample_size=subsample_size,
        suff_stats=suff_stats, has_missing=has_missing, reparam=reparam,
        refine_precision=refine_precision, active_components=active_components,
        last_column_scale=last_column_scale, anchors=anchors, gauge=gauge,
    )


MODELS = {"isotropic": ppca, "diagonal": factor_analysis}
ppca.__doc__ = ppca.__doc__.format(parameters=_MODEL_PARAMETERS)
factor_analysis.__doc__ = factor_analysis.__doc__.format(parameters=_MODEL_PARAMETERS)


# ---------------------------------------------------------------------------
# Robust pPCA and mixtures of pPCA (issue 17). Both are pPCA's model above
# with its likelihood site "X" replaced (robust) or captured per cluster
# (mixture) by an effect handler, so the parameterisations, priors, data
# scales and missing-value masks are those of :func:`ppca`, written once.

# Default prior of the Student-t degrees of freedom (Juarez & Steel 2010):
# mode 10, mean 20, a heavy right tail that lets the data ask for nu -> inf.
_NU_PRIOR = (2.0, 0.1)


class _LowRankStudentT(dist.Distribution):
    """``t_nu(mu, W W^T + diag(psi))`` per row, optionally restricted to observed entries.

    The log-density is the t of the base Gaussian's
    (:func:`bayespca.robust.student_t_from_gaussian`). Draws are
    complete rows ``mu + (W z + eps) / sqrt(u)``, ``u ~ Gamma(nu / 2, nu / 2)``.
    """

    arg_constraints = {}
    support = constraints.real_vector
    pytree_data_fields = ("base", "df")

    def __init__(self, base: _LowRankNormal, df):
        self.base = base
        self.df = df
        super().__init__(batch_shape=base.batch_shape, event_shape=base.event_shape)

    def sample(self, key, sample_shape=()):
        key_x, key_u = jax.random.split(key)
        shape = tuple(sample_shape) + tuple(self.batch_shape)
        centred = self.base.sample(key_x, sample_shape) - self.base.loc
        u = jax.random.gamma(key_u, self.df / 2.0, shape) / (self.df / 2.0)
        return self.base.loc + centred / jnp.sqrt(u)[..., None]

    def log_prob(self, value):
        from bayespca.robust import student_t_from_gaussian

        base = self.base
        if base.observed is None:  # one log|C| for every row
            at_mean, n_observed = base.log_prob(base.loc), jnp.shape(value)[-1]
        else:
            at_mean = base.log_prob(jnp.broadcast_to(base.loc, jnp.shape(value)))
            n_observed = jnp.sum(jnp.broadcast_to(base.observed, jnp.shape(value)), axis=-1)
        return student_t_from_gaussian(base.log_prob(value), at_mean, n_observed, self.df)


def _low_rank_likelihood(fn) -> tuple[_LowRankNormal, tuple]:
    """The :class:`_LowRankNormal` of pPCA's site ``"X"`` and the batch shape a plate expanded it to."""
    batch = tuple(fn.batch_shape)
    while isinstance(fn, dist.ExpandedDistribution):
        fn = fn.base_dist
    if not isinstance(fn, _LowRankNormal):
        raise ValueError("The robust and mixture models need pPCA's marginal likelihood (latent='marginal').")
    return fn, batch


class _StudentTLikelihood(numpyro.primitives.Messenger):
    """Replace the Gaussian of pPCA's observed site ``"X"`` by the t with ``df`` degrees of freedom."""

    def __init__(self, df):
        self.df = df
        super().__init__()

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] == "X":
            base, batch = _low_rank_likelihood(msg["fn"])
            t = _LowRankStudentT(base, self.df)
            msg["fn"] = t.expand(batch) if batch != tuple(t.batch_shape) else t


def robust_ppca(
    X=None, *, n_components, nu=None, nu_prior=None, n_samples=None, n_features=None, prior=None,
    identification=None, subsample_size=None, has_missing=None,
):
    """Robust probabilistic PCA: pPCA with multivariate Student-t rows, as a NumPyro model.

    ``x_i ~ t_nu(mu, W W^T + sigma^2 I)`` (see :mod:`bayespca.robust`): the
    sites of :func:`ppca` (``"sigma"``, the coordinates of ``W`` with
    ``"W"`` recorded, ``"mu"``), ``"nu"`` when estimated, and the observed
    ``"X"`` whose density per row is the marginal t of its observed block
    (z and the row scales integrated out). It is :func:`ppca` run under an
    effect handler that swaps its likelihood, so every option of
    :func:`ppca` means the same here; there are no sufficient statistics
    (each row has its own scale), so a gradient costs O(n d k + d k^2).

    Parameters
    ----------
    X, n_components, n_samples, n_features, prior, identification, subsample_size, has_missing
        As in :func:`ppca` (``latent="marginal"``).
    nu : float, optional
        Fixed degrees of freedom (``inf``: :func:`ppca` itself); None samples
        the site ``"nu"``.
    nu_prior : numpyro Distribution, optional
        Prior of ``nu`` (positive support); None: ``Gamma(2, 0.1)``.

    Examples
    --------
    >>> import functools
    >>> from numpyro.infer import Predictive
    >>> model = functools.partial(robust_ppca, n_components=1, n_samples=4, n_features=3)
    >>> draws = Predictive(model, num_samples=2)(jax.random.key(0))
    >>> draws["X"].shape, draws["nu"].shape
    ((2, 4, 3), (2,))
    """
    kwargs = {"n_components": n_components, "n_samples": n_samples, "n_features": n_features,
              "prior": prior, "identification": identification, "subsample_size": subsample_size,
              "has_missing": has_missing}
    if nu is not None and not isinstance(nu, jax.core.Tracer) and np.isinf(nu):
        ppca(X, **kwargs)
        return
    if nu is None:
        nu = numpyro.sample("nu", nu_prior if nu_prior is not None else dist.Gamma(*_NU_PRIOR))
    with _StudentTLikelihood(nu):
        ppca(X, **kwargs)


class _CapturedLikelihood(numpyro.primitives.Messenger):
    """Record the distribution of pPCA's observed site ``"X"`` and keep it out of the joint density."""

    likelihood = None

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] == "X":
            self.likelihood, batch = _low_rank_likelihood(msg["fn"])
            msg["stop"] = True  # outer handlers (trace, substitute, seed) never see it
            if msg["value"] is None:  # prior predictive: the mixture draws X, not each cluster
                msg["value"] = jnp.zeros(batch + tuple(self.likelihood.event_shape))


class _LowRankMixture(dist.Distribution):
    """``sum_c weights_c N(mu_c, W_c W_c^T + Psi_c)`` per row (observed blocks), from pPCA likelihoods."""

    arg_constraints = {}
    support = constraints.real_vector
    pytree_data_fields = ("weights", "components")

    def __init__(self, weights, components, batch_shape=()):
        self.weights = weights
        self.components = components
        super().__init__(batch_shape=batch_shape, event_shape=components[0].event_shape)

    def sample(self, key, sample_shape=()):
        shape = tuple(sample_shape) + tuple(self.batch_shape)
        key_c, *keys = jax.random.split(key, len(self.components) + 1)
        rows = jnp.stack([c.sample(k, shape) for c, k in zip(self.components, keys, strict=True)])
        label = jax.random.categorical(key_c, jnp.log(self.weights), shape=shape)
        return jnp.take_along_axis(rows, label[None, ..., None], axis=0)[0]

    def log_prob(self, value):
        terms = jnp.stack([c.log_prob(value) for c in self.components])
        log_weights = jnp.log(self.weights).reshape((-1,) + (1,) * (terms.ndim - 1))
        return jax.scipy.special.logsumexp(terms + log_weights, axis=0)


def mixture_ppca(
    X=None, *, n_mixtures, n_components, n_samples=None, n_features=None, prior=None,
    identification=None, has_missing=None, concentration=1.0,
):
    """Mixture of probabilistic PCA (Tipping & Bishop 1999) as a NumPyro model.

    ``x_i ~ sum_c pi_c N(mu_c, W_c W_c^T + sigma_c^2 I)``: cluster ``c`` is a
    :func:`ppca` model whose sites are prefixed ``"c{c}/"`` (``"c0/sigma"``,
    ``"c0/W"``, ``"c0/mu"``, ... with the same priors, identification and
    missing-value handling), its likelihood captured rather than observed;
    ``"weights"`` ``pi ~ Dirichlet(concentration)``; the observed ``"X"``
    has the mixture density per row (labels summed out), the pointwise
    log-likelihood LOO needs.

    Labels. The density is invariant under permutations of the clusters:
    the posterior has ``K!`` symmetric modes and this model does not break
    the symmetry. :class:`bayespca.mixture.MixturePPCA` starts every chain
    at the EM fit and relabels each draw to it (see
    :func:`bayespca.mixture.fit_mixture_nuts`).

    Parameters
    ----------
    X, n_components, n_samples, n_features, prior, identification, has_missing
        As in :func:`ppca` (``latent="marginal"``), for every cluster.
    n_mixtures : int
        Number of clusters ``K``.
    concentration : float, default=1.0
        Of the symmetric Dirichlet prior of the weights (1: uniform on the simplex).

    Examples
    --------
    >>> import functools
    >>> from numpyro.infer import Predictive
    >>> model = functools.partial(mixture_ppca, n_mixtures=2, n_components=1, n_samples=5, n_features=3)
    >>> draws = Predictive(model, num_samples=2)(jax.random.key(0))
    >>> draws["X"].shape, draws["c1/W"].shape, draws["weights"].shape
    ((2, 5, 3), (2, 3, 1), (2, 2))
    """
    K = _check_positive_int(n_mixtures, "n_mixtures")
    n, d = _shape(X, None, n_samples, n_features, "marginal", None)
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.full(K, float(concentration))))
    components = []
    for c in range(K):
        capture = _CapturedLikelihood()
        with numpyro.handlers.scope(prefix=f"c{c}"), capture:
            ppca(X, n_components=n_components, n_samples=n_samples, n_features=n_features, prior=prior,
                 identification=identification, has_missing=has_missing)
        components.append(capture.likelihood)
    x = None if X is None else jnp.asarray(X)
    if x is not None and components[0].observed is not None:
        x = jnp.where(components[0].observed, x, 0.0)  # zeros, not NaN: see _low_rank_model
    with numpyro.plate("obs", n):
        numpyro.sample("X", _LowRankMixture(weights, components, (n,)), obs=x)
