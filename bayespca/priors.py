"""Priors of the Bayesian pPCA and factor-analysis models, one class per loadings prior.

A model (:mod:`bayespca.models`) has three priors: on the loadings ``W``
(d, k), on the noise (pPCA: the standard deviation ``sigma``; FA: the
variances ``psi``, (d,)) and on the mean ``mu`` (d,). They travel together
as :class:`Priors`. Each loadings prior is a small class that owns
everything about itself:

* its resolution from the data's scales (:meth:`LoadingsPrior.resolve`,
  traceable, so the same compiled sampler serves every data set),
* its change of units (:meth:`LoadingsPrior.to_units`),
* its NumPyro sites: :meth:`LoadingsPrior.sample` draws ``W`` in its own
  coordinates, :meth:`LoadingsPrior.log_density` scores a ``W`` built by an
  identified parameterisation (and samples the prior's own hyper-parameters),
* its start (:meth:`LoadingsPrior.start`) and its post-fit summaries
  (:meth:`LoadingsPrior.summaries`).

==================  ==========================================================
class               prior on ``W``
==================  ==========================================================
:class:`Normal`     ``W_jl ~ N(0, s^2)`` (pPCA) or ``N(0, s_j^2)`` (FA): the
                    scale-aware default
:class:`Flat`       improper uniform (the MAP is the maximum likelihood)
:class:`ARD`        Bishop's Bayesian PCA: column ``l`` is ``N(0, I / alpha_l)``,
                    ``alpha_l s^2 ~ Gamma(a, b)``
:class:`Horseshoe`  the regularised horseshoe on each entry (sparse loadings)
:class:`Custom`     any NumPyro distribution broadcasting to (d, k)
==================  ==========================================================

``s_j`` is the standard deviation of feature ``j``, ``m_j`` its mean,
``s = sqrt(mean_j s_j^2)`` and ``u_j = s_j^2 / (R^{-1})_jj`` the variance of
feature ``j`` that the other features do not explain (``R`` the data's
correlation matrix; :func:`data_scales`). The default noise and mean priors
are ``sigma ~ HalfNormal(s)`` (pPCA), ``psi_j ~ InvGamma(2.5, 1.5 u_j)``
(FA; mean ``u_j``) and ``mu_j ~ N(m_j, (10 s_j)^2)``: weakly informative
whatever the units, and equivariant (the posterior of ``c X`` is that of
``X`` scaled).

FA's uniquenesses get an inverse gamma rather than a half-normal because a
half-normal is largest at ``psi_j = 0``, where a Heywood case keeps the
likelihood finite while the loadings' posterior width shrinks like
``sqrt(psi_j / n)``: a funnel in which NUTS chains stick. The inverse gamma
vanishes faster than any power at 0, is centred on ``u_j`` (which bounds
``psi_j`` in any exact factor decomposition ``S = W W^T + Psi``) and has a
``psi^-3.5`` right tail, so the data can put ``psi_j`` far above ``u_j`` (as
they do at small ``k``). Shape 2.5 follows Frühwirth-Schnatter and Lopes
(2018), Sparse Bayesian factor analysis when the number of factors is unknown.

Adding a prior means adding one class here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import AffineTransform

from bayespca.statistics import MissingPatterns, StackedPatterns, SufficientStatistics, stack_patterns

__all__ = [
    "ARD",
    "Custom",
    "DataScales",
    "Flat",
    "Horseshoe",
    "LoadingsPrior",
    "Normal",
    "PRIOR_NAMES",
    "Priors",
    "as_priors",
    "data_scales",
    "pushforward",
    "resolve",
    "resolve_at_data",
    "to_units",
]

PRIOR_NAMES = ("flat", "ard", "horseshoe")
# Prior sd of mu in units of the column sd: wide enough that the data, not the
# prior, locate the mean, yet proper so that the prior predictive exists.
_MEAN_PRIOR_WIDTH = 10.0
# Equal-tailed posterior interval behind the horseshoe's loadings_interval_ and support_.
_SUPPORT_PROB = 0.9
# FA's default psi_j ~ InvGamma(a, (a - 1) u_j), prior mean u_j: a = 2.5 keeps psi_j off 0.
_UNIQUENESS_SHAPE = 2.5
# Eigenvalue floor of the correlation matrix behind u_j, so u_j >= 0.01 s_j^2 (also when n <= d).
_CORRELATION_FLOOR = 0.01


class DataScales(NamedTuple):
    """The data's numbers behind the default priors: ``m_j``, ``s_j``, ``s``, ``n`` and ``u_j``.

    Column means ``m_j``, standard deviations ``s_j``, root mean variance
    ``s``, row count ``n`` and residual variances ``u_j`` (:func:`data_scales`).

    Zero ``s_j`` (constant or unobserved columns) are replaced by ``s``, and
    a zero ``s`` by 1; without data, ``m = 0``, ``s_j = s = u_j = 1`` and
    ``n = 1``. ``residual`` is None when :func:`data_scales` was told not to compute it.
    """

    mean: Any
    sd: Any
    overall: Any
    n: Any
    residual: Any = None


def _pooled_moments(patterns: MissingPatterns | StackedPatterns):
    """Row count, and column means and variances pooled over missing patterns (traceable)."""
    if isinstance(patterns, MissingPatterns) and patterns.X is not None:
        x, obs = jnp.asarray(patterns.X), jnp.asarray(patterns.observed)
        count = obs.sum(axis=0)
        mean = jnp.sum(jnp.where(obs, x, 0.0), axis=0) / count
        var = jnp.sum(jnp.where(obs, (x - mean) ** 2, 0.0), axis=0) / count
        return x.shape[0], mean, var
    if isinstance(patterns, MissingPatterns):
        patterns = stack_patterns(patterns)
    observed, n, means, scatter = (jnp.asarray(a) for a in patterns)
    # A pattern's statistics are 0 outside its columns.
    count = n @ observed
    mean = n @ means / count
    square = jnp.diagonal(scatter, axis1=1, axis2=2).sum(axis=0) + n @ means**2
    return n.sum(), mean, square / count - mean**2


def _pairwise_covariance(X: Any, suff_stats: Any, mean: jax.Array) -> jax.Array:
    """Covariances around the column means ``mean``, each over the rows where both entries are observed.

    Pairs never observed together get 0. Traceable.
    """
    if isinstance(suff_stats, SufficientStatistics):
        return jnp.asarray(suff_stats.scatter) / suff_stats.n
    if isinstance(suff_stats, MissingPatterns) and suff_stats.X is None:
        suff_stats = stack_patterns(suff_stats)
    if isinstance(suff_stats, StackedPatterns):
        observed, n, means, scatter = (jnp.asarray(a) for a in suff_stats)
        # A pattern's rows contribute its scatter plus n_p times the outer product of its mean's offset.
        offset = jnp.where(observed, means - mean, 0.0)
        present = observed.astype(float)
        count = jnp.einsum("p,pi,pj->ij", n, present, present)
        cross = scatter.sum(axis=0) + jnp.einsum("p,pi,pj->ij", n, offset, offset)
        return cross / jnp.maximum(count, 1.0)
    if isinstance(suff_stats, MissingPatterns):
        x, observed = jnp.asarray(suff_stats.X), jnp.asarray(suff_stats.observed)
    else:
        x = jnp.asarray(X)
        observed = ~jnp.isnan(x)
    centred = jnp.where(observed, x - mean, 0.0)
    mask = observed.astype(centred.dtype)
    return (centred.T @ centred) / jnp.maximum(mask.T @ mask, 1.0)


def _residual_variances(cov: jax.Array, sd: jax.Array) -> jax.Array:
    """``u_j = s_j^2 / (R^{-1})_jj``, ``R = cov / (s s^T)`` with unit diagonal and eigenvalues floored."""
    corr = cov / jnp.outer(sd, sd)
    # A constant or unobserved column has a zero row: uncorrelated with the others, u_j = s_j^2.
    corr = corr.at[jnp.diag_indices(corr.shape[0])].set(1.0)
    vals, vecs = jnp.linalg.eigh(corr)
    inverse_diagonal = jnp.sum(vecs**2 / jnp.maximum(vals, _CORRELATION_FLOOR), axis=1)
    return sd**2 / inverse_diagonal


def data_scales(
    X: Any = None, suff_stats: Any = None, n_features: int | None = None, residual: bool = True
) -> DataScales:
    """The data-dependent numbers of the scale-aware priors (NaN ignored; works on traced arrays).

    ``u_j = s_j^2 / (R^{-1})_jj`` is the variance of feature ``j`` that the
    others do not explain: ``R`` is the correlation matrix, each entry over
    the rows where both features are observed (pooled over missing
    patterns), around the column means, with its eigenvalues floored at
    0.01. On complete data with well-conditioned ``R`` it is the residual
    variance of the least-squares regression of column ``j`` on the others
    (with intercept), since ``1 / (S^{-1})_jj`` is that variance for a
    covariance ``S``. A column uncorrelated with the rest (also a constant or
    unobserved one) gets ``u_j = s_j^2``.

    Parameters
    ----------
    X : array of shape (n, d), optional
    suff_stats : SufficientStatistics, MissingPatterns or StackedPatterns, optional
        Used instead of ``X``.
    n_features : int, optional
        ``d`` when there are no data.
    residual : bool, default=True
        Compute ``u_j`` (FA's default noise prior needs it; ``O(n d^2 + d^3)``
        work that a caller without that need skips with False).

    Returns
    -------
    DataScales

    Examples
    --------
    >>> s = data_scales(np.array([[0.0, 1.0], [2.0, 5.0]]))
    >>> np.asarray(s.sd).tolist(), float(s.overall) == float(np.sqrt((1 + 4) / 2))
    ([1.0, 2.0], True)
    >>> X = np.array([[0.0, 1.0], [2.0, 5.0], [1.0, 0.0], [3.0, 2.0]])
    >>> u = X.var(0) * (1 - np.corrcoef(X.T)[0, 1] ** 2)  # each column's residual on the other
    >>> bool(np.allclose(data_scales(X).residual, u))
    True
    """
    if isinstance(suff_stats, SufficientStatistics):
        n = suff_stats.n
        mean, var = jnp.asarray(suff_stats.mean), jnp.diag(jnp.asarray(suff_stats.scatter)) / n
    elif isinstance(suff_stats, MissingPatterns | StackedPatterns):
        n, mean, var = _pooled_moments(suff_stats)
    elif X is not None:
        X = jnp.asarray(X)
        n, mean, var = X.shape[0], jnp.nanmean(X, axis=0), jnp.nanvar(X, axis=0)
    else:
        d = n_features
        return DataScales(jnp.zeros(d), jnp.ones(d), jnp.ones(()), jnp.ones(()), jnp.ones(d))
    sd = jnp.sqrt(jnp.maximum(var, 0.0))
    overall = jnp.sqrt(jnp.nanmean(sd**2))
    overall = jnp.where(overall > 0, overall, 1.0)
    sd = jnp.where(sd > 0, sd, overall)  # also replaces the NaN of an unobserved column
    mean = jnp.where(jnp.isnan(mean), 0.0, mean)
    u = _residual_variances(_pairwise_covariance(X, suff_stats, mean), sd) if residual else None
    return DataScales(mean, sd, overall, jnp.asarray(n, dtype=float), u)


def as_site(prior: dist.Distribution, shape: tuple, field: str) -> dist.Distribution:
    """Broadcast a distribution to a parameter of the given shape, as one event.

    Raises a ValueError when its event shape is not a suffix of ``shape`` or
    its batch shape does not broadcast to the rest.

    Examples
    --------
    >>> as_site(dist.Normal(0.0, 1.0), (3, 2), "loadings").event_shape
    (3, 2)
    """
    event = tuple(prior.event_shape)
    if event and tuple(shape[len(shape) - len(event) :]) != event:
        raise ValueError(
            f"priors.{field} has event shape {event}, which is not a suffix of the parameter "
            f"shape {shape}."
        )
    batch = tuple(shape[: len(shape) - len(event)])
    try:
        broadcast = np.broadcast_shapes(tuple(prior.batch_shape), batch)
    except ValueError:
        broadcast = None
    if broadcast != batch:
        raise ValueError(
            f"priors.{field} has batch shape {tuple(prior.batch_shape)}, which does not broadcast "
            f"to the parameter shape {shape}."
        )
    if tuple(prior.batch_shape) != batch:
        prior = prior.expand(batch)
    return prior.to_event(len(batch)) if batch else prior


def pushforward(prior: dist.Distribution, factor: float, loc: Any = 0.0) -> dist.Distribution:
    """The distribution of ``loc + factor * theta`` for ``theta ~ prior``, its support kept.

    Improper flat priors stay as they are. The affine map's domain is the
    prior's support (positive for noise parameters), so a constrained
    parameter stays constrained.

    Examples
    --------
    >>> p = pushforward(dist.HalfNormal(2.0), 0.5)
    >>> bool(np.isclose(p.log_prob(1.0), dist.HalfNormal(1.0).log_prob(1.0)))
    True
    """
    if isinstance(prior, dist.ImproperUniform):
        return prior
    support = prior.support
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    domain = constraints.positive if isinstance(support, constraints.greater_than) else constraints.real
    return dist.TransformedDistribution(prior, AffineTransform(loc, factor, domain=domain))


class LoadingsPrior:
    """What every loadings prior provides (see the module docstring); the defaults of a plain density.

    A subclass is a frozen dataclass of its hyper-parameters, registered as
    a JAX pytree (the numbers reach compiled code as arguments), with
    ``distribution`` defined, or with :meth:`sample` and :meth:`log_density`
    overridden.
    """

    #: Whether ``p(W R) = p(W)`` for orthogonal ``R``: identified
    #: parameterisations then add the volume element of their map, so that
    #: the posterior of ``W W^T`` is that of unconstrained ``W``.
    rotation_invariant = True
    #: Identifications of ``W`` this prior can be sampled with.
    identifications = ("polar", "lower_triangular", "procrustes", "none")
    #: Whether :meth:`sample` draws ``W``'s entries in every identification, the triangular one
    #: then only fixing its upper entries at 0 (``free``), with no density of ``W`` of its own.
    samples_entries = False

    def resolve(self, scales: DataScales, noise_kind: str):
        """Fill data-dependent defaults from ``scales`` (traceable)."""
        return self

    def to_units(self, scale: float):
        """The prior of ``W / scale`` (hyper-parameters given in data units)."""
        return self

    def distribution(self, d: int, k: int) -> dist.Distribution:
        """The density of ``W`` as one (d, k) event."""
        raise NotImplementedError

    def sample(self, d: int, k: int, noise: Any, n: Any, reparam: Any = None) -> jax.Array:
        """Sample site(s) giving ``W`` in the prior's own coordinates; returns ``W``."""
        return numpyro.sample("W", self.distribution(d, k))

    def log_density(self, w: jax.Array, noise: Any, n: Any) -> jax.Array:
        """``log p(W)`` for a ``W`` built by an identified map (may sample hyper-parameter sites)."""
        d, k = jnp.shape(w)
        return self.distribution(d, k).log_prob(w)

    def start(self, w: np.ndarray, noise: np.ndarray, n: int) -> dict:
        """Values of the prior's own sites that go with loadings ``w`` (NumPy)."""
        return {"W": np.asarray(w)}

    def site_units(self, d: int, k: int) -> int:
        """Power of the data's unit carried by the prior's sampled sites (``W``: ``d k``).

        Rescaling the data by ``s`` multiplies the density of those sites by
        ``s^-site_units`` (and a proper prior's density likewise): what
        converts a log density between working and data units.
        """
        return d * k

    @property
    def proper(self) -> bool:
        """Whether the prior is a normalised density (an improper one carries no Jacobian)."""
        return True

    def summaries(self, loadings: np.ndarray, extra: dict, noise: np.ndarray, n: int) -> dict:
        """Fitted attributes this prior adds (from draws with leading dims (chain, draw))."""
        return {}


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Normal(LoadingsPrior):
    """The scale-aware default: ``W_jl ~ N(0, scale^2)``.

    Attributes
    ----------
    scale : float, array of shape (d, 1), or None
        None: ``s`` for pPCA and ``s_j`` (per row of ``W``) for FA. A scale
        that varies across columns breaks the rotation invariance this class
        declares: use :class:`Custom` for that.
    """

    scale: Any = None

    def resolve(self, scales, noise_kind):
        if self.scale is not None:
            return self
        return Normal(scales.overall if noise_kind == "isotropic" else scales.sd[:, None])

    def to_units(self, scale):
        return self if self.scale is None else Normal(jnp.asarray(self.scale) / scale)

    def distribution(self, d, k):
        return as_site(dist.Normal(0.0, self.scale), (d, k), "loadings")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Flat(LoadingsPrior):
    """Improper uniform loadings: the posterior mode is then the maximum likelihood."""

    def distribution(self, d, k):
        return dist.ImproperUniform(constraints.real, (), (d, k))

    def log_density(self, w, noise, n):
        return jnp.zeros(())

    @property
    def proper(self):
        return False


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Custom(LoadingsPrior):
    """Any NumPyro distribution of ``W`` whose batch and event shapes broadcast to (d, k).

    Treated as not rotation invariant unless it is (then use :class:`Normal`
    for iid entries), so identified maps add no volume element for it.
    """

    prior: Any

    rotation_invariant = False

    def to_units(self, scale):
        return Custom(pushforward(self.prior, 1.0 / scale))

    def distribution(self, d, k):
        return as_site(self.prior, (d, k), "loadings")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ARD(LoadingsPrior):
    """Automatic relevance determination (Bishop's Bayesian PCA).

    Column ``l`` of ``W`` is ``N(0, I_d / alpha_l)`` with a precision per
    column, ``alpha_l s^2 ~ Gamma(a, b)`` (shape, rate): columns the data do
    not need get a large ``alpha_l`` and shrink to 0, so a model fitted with
    too many components keeps only those it needs. Sites: ``"alpha"`` (k,).
    Not rotation invariant (the precision belongs to a column).

    Attributes
    ----------
    a, b : float, default=1.0, 0.01

    References
    ----------
    C. M. Bishop (1999). Bayesian PCA. NIPS 11, 382-388.
    """

    a: Any = 1.0
    b: Any = 1e-2
    overall: Any = None

    rotation_invariant = False

    def resolve(self, scales, noise_kind):
        return self if self.overall is not None else replace(self, overall=scales.overall)

    def _alpha(self, k):
        return numpyro.sample("alpha", dist.Gamma(self.a, self.b * self.overall**2).expand((k,)).to_event(1))

    def sample(self, d, k, noise, n, reparam=None):
        alpha = self._alpha(k)
        return numpyro.sample("W", dist.Normal(0.0, 1.0 / jnp.sqrt(alpha)).expand((d, k)).to_event(2))

    def log_density(self, w, noise, n):
        d, k = jnp.shape(w)
        alpha = self._alpha(k)
        return dist.Normal(0.0, 1.0 / jnp.sqrt(alpha)).expand((d, k)).to_event(2).log_prob(w)

    def site_units(self, d, k):
        return d * k - 2 * k  # alpha is a precision of W: units of 1 / x^2

    def start(self, w, noise, n):
        # A column's precision at its empirical value, kept finite for columns near 0.
        alpha = 1.0 / (np.mean(np.asarray(w) ** 2, axis=0) + 1e-3 * float(self.overall) ** 2)
        return {"W": np.asarray(w), "alpha": alpha}

    def summaries(self, loadings, extra, noise, n):
        """``n_effective_components_``: components whose variance stands out of the noise.

        Component ``l`` is active when the posterior mean of its eigenvalue of
        ``W W^T`` exceeds ``mean(psi) (2 sqrt(g) + g)``, ``g = d / n``: the
        excess over the noise variance of the largest eigenvalue of a
        pure-noise sample covariance (the Marchenko-Pastur edge
        ``psi (1 + sqrt(g))^2``). ARD shrinks unused components far below it.
        """
        d = loadings.shape[-2]
        eig = (np.linalg.svd(loadings, compute_uv=False) ** 2).reshape(-1, loadings.shape[-1]).mean(0)
        ratio = d / n
        edge = float(np.mean(noise)) * (2 * np.sqrt(ratio) + ratio)
        return {"n_effective_components_": int(np.sum(eig > edge))}


def horseshoe_loadings(z, local, global_, slab, noise, prior: Horseshoe, n_samples):
    """Loadings and shrinkage factors of the regularised horseshoe, from unit-free variables.

    The non-centred form of :class:`Horseshoe`: ``W = tau lambda~ z`` with
    ``tau = tau_0 global_``, ``c^2 = s_slab^2 slab`` and
    ``lambda~^2 = c^2 lambda^2 / (c^2 + tau^2 lambda^2)``.

    Parameters
    ----------
    z, local : array (..., d, k)
        ``N(0, 1)`` draws and ``lambda_jl ~ C+(0, 1)``.
    global_, slab : array (...)
        ``tau / tau_0 ~ C+(0, 1)`` and ``c^2 / s_slab^2 ~ InvGamma(nu / 2, nu / 2)``.
    noise : array (..., d)
        Noise variances ``psi`` (pPCA: ``sigma^2`` repeated).
    prior : Horseshoe
        Resolved (``p0`` and ``slab_scale`` set).
    n_samples : int or array

    Returns
    -------
    W : array (..., d, k)
    kappa : array (..., d, k)
        ``1 / (1 + n psi_j^{-1} tau^2 lambda~_jl^2)``: near 1 for a loading
        shrunk to 0, near 0 for one left alone.

    Examples
    --------
    >>> w, kappa = horseshoe_loadings(
    ...     np.ones((4, 1)), np.full((4, 1), 1e6), 1.0, 1.0, np.ones(4), Horseshoe(2, 1.0), 100
    ... )
    >>> np.round(np.asarray(w[:, 0]), 6).tolist()  # lambda -> infinity: W -> c z
    [1.0, 1.0, 1.0, 1.0]
    """
    noise = jnp.asarray(noise)
    d = jnp.shape(noise)[-1]
    sigma = jnp.sqrt(jnp.mean(noise, axis=-1))
    tau = prior.p0 / (d - prior.p0) * sigma / jnp.sqrt(n_samples) * global_
    c2 = prior.slab_scale**2 * slab
    tau, c2 = tau[..., None, None], jnp.asarray(c2)[..., None, None]
    # c^2 lambda^2 / (c^2 + tau^2 lambda^2), without overflow for huge lambda.
    tilde2 = c2 / (c2 / jnp.asarray(local) ** 2 + tau**2)
    w = tau * jnp.sqrt(tilde2) * z
    kappa = 1.0 / (1.0 + n_samples * tau**2 * tilde2 / noise[..., :, None])
    return w, kappa


class HorseshoeReparam(NamedTuple):
    """Which loadings the sampler sees centred, and their unit (see :meth:`Horseshoe.sample`).

    Attributes
    ----------
    centred : bool array (d, k)
    standard_error : array (d, 1)
        ``sqrt(psi_j / n)`` at the start: the unit of a centred loading.
    """

    centred: Any
    standard_error: Any


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Horseshoe(LoadingsPrior):
    """Regularised horseshoe prior on the entries of ``W`` (Piironen & Vehtari, 2017).

    Each loading is a scale mixture of normals with a global scale ``tau``,
    a local scale ``lambda_jl`` per entry and a slab width ``c``::

        W_jl ~ N(0, tau^2 lambda~_jl^2),
        lambda~_jl^2 = c^2 lambda_jl^2 / (c^2 + tau^2 lambda_jl^2)
        lambda_jl ~ C+(0, 1),   tau ~ C+(0, tau_0),
        c^2 ~ InvGamma(nu / 2, nu s_slab^2 / 2)
        tau_0 = p_0 / (d - p_0) * sigma / sqrt(n)

    with ``sigma = sqrt(mean_j psi_j)`` the model's noise standard deviation
    (a parameter, so the prior scales with the data) and ``n`` the number of
    rows. Far below the slab (``tau lambda << c``) it is the horseshoe, whose
    spike at 0 and Cauchy tails shrink small loadings to 0 and leave large
    ones alone; far above, each loading is ``N(0, c^2)``-regularised. The
    shrinkage factor ``kappa_jl = 1 / (1 + n psi_j^{-1} tau^2 lambda~_jl^2)``
    has prior effective number of non-zeros ``sum_j (1 - kappa_jl)`` of about
    ``p_0`` per column.

    Its entries are sampled in ``W``'s own coordinates. The likelihood of
    pPCA and FA does not change under ``W -> W R`` (``R`` orthogonal), so
    with ``W`` free (identification ``"none"``) the rotation is set by the
    prior alone, and its posterior has a narrow peak (about ``tau / |W|``
    radians wide) at each rotation that sends one loading to 0: a
    multimodal, funnelled density that NUTS crosses with divergent
    transitions (raw iris, k = 2: ~20 in 4 x 500 draws at target 0.99)
    and without reaching every peak. The default identification is
    therefore ``"lower_triangular"``, the (generalised) positive
    lower-triangular structure of sparse Bayesian factor analysis: for
    anchor features ``p_1, ..., p_k``, ``W_{p_i l} = 0`` for ``l > i``
    fixes the rotation, and the horseshoe acts on the other entries. That
    is a different model from ``"none"`` (anchor ``p_i`` loads on the first
    ``i`` factors only); at ``k = 1`` the two coincide. The estimators take
    as anchors the rows that pin the rotation best,
    :func:`bayespca.models.pivot_anchors` of the maximum-likelihood
    loadings (with the first ``k`` features as anchors, breast cancer
    standardised, k = 3, gave 3-23 divergent transitions, the third
    anchor barely loading on its factor; pivoted, none). Columns are signed
    to agree with the start (the maximum-likelihood ``W`` made triangular,
    ``W_{p_l l} > 0``); under ``"none"``, draws are aligned by signed
    permutations (:meth:`align`).

    Sites: ``"W_z"`` and ``"W_lambda"`` ((d, k), or (m,) for the ``m``
    free entries of the triangular structure, row by row), ``"W_tau"``,
    ``"W_c2"``, with ``"W"`` and ``"kappa"`` deterministic (``kappa = 1`` at
    the structural zeros).

    Attributes
    ----------
    p0 : float or None
        Prior guess of the number of non-zero loadings per column,
        ``0 < p0 < d``. None: ``max(1, d / 4)``.
    slab_scale : float or None
        ``s_slab`` in data units. None: ``s``, the root mean column
        standard deviation, which bounds a loading (``W_jl^2 <= var_j``).
    slab_df : float, default=4
        ``nu > 0``: the slab is Student-t with ``nu`` degrees of freedom.

    References
    ----------
    J. Piironen and A. Vehtari (2017). Sparsity information and
    regularization in the horseshoe and other shrinkage priors. Electronic
    Journal of Statistics 11(2), 5018-5051.

    Examples
    --------
    >>> Priors(loadings=Horseshoe(p0=3)).loadings.slab_df
    4.0
    """

    p0: Any = None
    slab_scale: Any = None
    slab_df: Any = 4.0

    rotation_invariant = False
    identifications = ("lower_triangular", "none")
    samples_entries = True

    def resolve(self, scales, noise_kind):
        d = jnp.shape(scales.mean)[-1]
        p0 = max(1.0, d / 4.0) if self.p0 is None else self.p0
        slab_scale = scales.overall if self.slab_scale is None else self.slab_scale
        return Horseshoe(p0, slab_scale, self.slab_df)

    def to_units(self, scale):
        return self if self.slab_scale is None else replace(self, slab_scale=self.slab_scale / scale)

    def check(self, d: int) -> Horseshoe:
        """Named ValueErrors for values outside their range (before any tracing)."""
        checks = (
            (self.p0, "p0", f"a number in (0, n_features) = (0, {d}) or None", lambda v: 0 < v < d),
            (self.slab_scale, "slab_scale", "a finite number > 0 or None", lambda v: 0 < v < np.inf),
            (self.slab_df, "slab_df", "a finite number > 0", lambda v: 0 < v < np.inf),
        )
        for value, name, accepted, ok in checks:
            if value is None and name != "slab_df":
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = None
            if isinstance(value, bool) or np.ndim(value) != 0 or number is None or not ok(number):
                raise ValueError(f"Horseshoe {name} must be {accepted}; got {value!r}.")
        return self

    def _scales(self, shape):
        local = numpyro.sample("W_lambda", dist.HalfCauchy(1.0).expand(shape).to_event(len(shape)))
        global_ = numpyro.sample("W_tau", dist.HalfCauchy(1.0))
        half = 0.5 * self.slab_df
        slab = numpyro.sample("W_c2", dist.InverseGamma(half, half))
        return local, global_, slab

    def sample(self, d, k, noise, n, reparam=None, free=None):
        """``W`` non-centred (``W = tau lambda~ z``), or partly centred with a :class:`HorseshoeReparam`.

        Non-centred suits the loadings the data barely inform (the zeros: no
        funnel); for loadings the data pin down, ``z`` would be tied to the
        scales along a narrow curved ridge, so a reparameterisation may
        sample those centred, in units of their standard error, with density
        ``N(W; 0, tau^2 lambda~^2)``. Either way the posterior of ``W`` is the
        same; ``"W_z"`` then holds ``z`` or ``W / standard_error`` entry by entry.
        ``free`` (bool (d, k), NumPy) keeps the other entries at 0, with sites
        for the free ones only (None: every entry).
        """
        where = None if free is None else np.nonzero(free)
        shape = (d, k) if free is None else (where[0].size,)

        def pick(a):  # the entries of a (d, k) array that have sites, in the sites' shape
            return a if where is None else a[where]

        local, global_, slab = self._scales(shape)
        full_local = local if where is None else jnp.ones((d, k)).at[where].set(local)
        unit, kappa = horseshoe_loadings(jnp.ones((d, k)), full_local, global_, slab, noise, self, n)
        unit = pick(unit)
        if reparam is None:
            w = unit * numpyro.sample("W_z", dist.Normal(0.0, 1.0).expand(shape).to_event(len(shape)))
        else:
            raw = numpyro.sample("W_z", dist.ImproperUniform(constraints.real, (), shape))
            centred = pick(jnp.asarray(reparam.centred))
            w = jnp.where(centred, pick(jnp.broadcast_to(reparam.standard_error, (d, k))) * raw, unit * raw)
            # N(0, 1) for non-centred entries; N(W; 0, unit^2) for centred ones (the constant
            # Jacobian standard_error left out).
            ratio = jnp.where(centred, w / unit, raw)
            numpyro.factor("W_z_density", jnp.sum(-0.5 * ratio**2 - jnp.where(centred, jnp.log(unit), 0.0)))
        if free is not None:
            w, kappa = jnp.zeros((d, k)).at[where].set(w), jnp.where(free, kappa, 1.0)
        numpyro.deterministic("kappa", kappa)
        return numpyro.deterministic("W", w)

    def log_density(self, w, noise, n):
        raise ValueError(
            "The horseshoe samples W's entries itself: use identification='lower_triangular' or 'none'."
        )

    def site_units(self, d, k):
        return 0  # its sampled variables are unit-free; W is a function of them and the noise

    def start(self, w, noise, n, reparam=None, free=None):
        """Unit-free variables that give loadings ``w`` (NumPy).

        ``tau`` and ``c`` at their prior scales, ``lambda`` such that
        ``tau lambda~ = max(|w|, tau)`` (clipped to ``0.9 c``) and
        ``z = w / (tau lambda~)``, or ``w / standard_error`` where ``reparam``
        samples the entry centred; ``free`` as in :meth:`sample`.
        """
        d = w.shape[0]
        tau = float(self.p0) / (d - float(self.p0)) * np.sqrt(np.mean(noise)) / np.sqrt(n)
        c = float(self.slab_scale)
        size = np.clip(np.abs(w), tau, 0.9 * c)
        local = size / tau * c / np.sqrt(c**2 - size**2)
        z = w / size
        if reparam is not None:
            z = np.where(reparam.centred, w / reparam.standard_error, z)
        if free is not None:
            z, local = z[free], local[free]
        return {"W_z": z, "W_lambda": local, "W_tau": np.ones(()), "W_c2": np.ones(())}

    @staticmethod
    def align(w: np.ndarray, kappa: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Signed-permutation alignment of draws ``w`` (m, d, k), in a canonical order and sign.

        Each draw's columns go to the reference columns they have the largest
        absolute inner products with (an assignment problem, solved exactly),
        with that product's sign; the reference is ``start``, then twice the
        mean of the aligned draws. Columns are then ordered by decreasing
        norm of their mean, each with its largest-magnitude entry positive.
        ``kappa`` follows the permutation.
        """
        from scipy.optimize import linear_sum_assignment

        reference = start
        for _ in range(3):
            cross = np.einsum("mdk,dl->mkl", w, reference)
            out_w, out_kappa = np.empty_like(w), np.empty_like(kappa)
            for i in range(w.shape[0]):
                rows, cols = linear_sum_assignment(-np.abs(cross[i]))
                signs = np.where(cross[i, rows, cols] < 0, -1.0, 1.0)
                out_w[i][:, cols] = w[i][:, rows] * signs
                out_kappa[i][:, cols] = kappa[i][:, rows]
            w, kappa = out_w, out_kappa
            reference = w.mean(axis=0)
        return canonical_columns(w, kappa)

    def summaries(self, loadings, extra, noise, n):
        """``inclusion_`` (posterior mean of ``1 - kappa``), ``loadings_interval_`` (90% equal-tailed)
        and ``support_`` (loadings whose interval excludes 0)."""
        d, k = loadings.shape[-2:]
        w = loadings.reshape(-1, d, k)
        kappa = np.asarray(extra["kappa"]).reshape(-1, d, k)
        tail = (1.0 - _SUPPORT_PROB) / 2.0
        interval = np.quantile(w, [tail, 1.0 - tail], axis=0)
        return {
            "inclusion_": 1.0 - kappa.mean(axis=0),
            "loadings_interval_": np.moveaxis(interval, 0, -1),
            "support_": (interval[0] > 0) | (interval[1] < 0),
        }


def canonical_columns(w: np.ndarray, kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order the columns of draws ``w`` (m, d, k) by decreasing norm of their mean, signed so that
    the largest-magnitude entry of each mean column is positive; ``kappa`` follows.

    Under a sparsity prior the columns are identified up to these signed
    permutations only; this picks one, as :func:`bayespca.linalg.flip_signs`
    does for PCA.
    """
    mean = w.mean(axis=0)
    order = np.argsort(-np.linalg.norm(mean, axis=0), kind="stable")
    mean, w, kappa = mean[:, order], w[..., order], kappa[..., order]
    top = mean[np.argmax(np.abs(mean), axis=0), np.arange(mean.shape[1])]
    return w * np.where(top < 0, -1.0, 1.0), kappa


class Priors(NamedTuple):
    """The three priors of a model; None fields take the scale-aware defaults.

    Attributes
    ----------
    loadings : LoadingsPrior, numpyro Distribution or None
        Prior of ``W`` (d, k): a :class:`LoadingsPrior` (:class:`Normal`,
        :class:`Flat`, :class:`ARD`, :class:`Horseshoe`) or any distribution
        broadcasting to (d, k) (wrapped as :class:`Custom`).
    noise : numpyro Distribution or None
        Prior of ``sigma`` (pPCA: the noise *standard deviation*, scalar) or
        of ``psi`` (FA: the noise *variances*, (d,)); positive support.
    mean : numpyro Distribution or None
        Prior of ``mu``, (d,).

    Examples
    --------
    >>> Priors(noise=dist.HalfCauchy(1.0)).loadings is None
    True
    """

    loadings: Any = None
    noise: Any = None
    mean: Any = None


@jax.tree_util.register_pytree_node_class
class _Stable:
    """A NumPyro distribution whose parameters flatten in the order of their names.

    NumPyro flattens a distribution's parameters in the iteration order of a
    ``set`` of their names, which follows Python's per-process string hash
    seed. Compiled programs take the leaves as arguments in that order, so
    the same program got a different persistent-cache key in half of all
    processes and was compiled again (found by ``tests/test_cache.py``).
    """

    def __init__(self, value):
        self.value = value

    def tree_flatten(self):
        kind = type(self.value)
        children, aux = self.value.tree_flatten()
        names = kind.gather_pytree_data_fields()
        order = sorted(range(len(names)), key=names.__getitem__)
        return tuple(_stable(children[i]) for i in order), (kind, aux, tuple(names[i] for i in order))

    @classmethod
    def tree_unflatten(cls, static, children):
        kind, aux, names = static
        by_name = dict(zip(names, children, strict=True))
        params = tuple(_plain(by_name[name]) for name in kind.gather_pytree_data_fields())
        return cls(kind.tree_unflatten(aux, params))


def _is_distribution(value) -> bool:
    return isinstance(value, dist.Distribution)


def _stable(tree):
    return jax.tree.map(lambda v: _Stable(v) if _is_distribution(v) else v, tree, is_leaf=_is_distribution)


def _plain(tree):
    return jax.tree.map(lambda v: v.value if isinstance(v, _Stable) else v, tree,
                        is_leaf=lambda v: isinstance(v, _Stable))


# Priors cross every jit boundary of the samplers and optimisers (as model arguments): their leaves
# must come in the same order in every process for the compiled programs to be found in the cache.
jax.tree_util.register_pytree_node(
    Priors,
    lambda p: (tuple(_stable(field) for field in p), None),
    lambda _, fields: Priors(*map(_plain, fields)),
)


_ACCEPTED = (
    "None, 'flat', 'ard', 'horseshoe', a bayespca.priors prior (Normal, Flat, ARD, Horseshoe), a "
    "numpyro Distribution of W, a bayespca.priors.Priors or a dict with keys loadings, noise, mean"
)


def as_priors(prior: Any) -> Priors:
    """Read a ``prior`` argument into a :class:`Priors` (named errors for anything else).

    Examples
    --------
    >>> type(as_priors("ard").loadings).__name__
    'ARD'
    >>> as_priors("ridge")
    Traceback (most recent call last):
    ...
    ValueError: prior must be None, 'flat', 'ard', 'horseshoe', ... got 'ridge'.
    """
    if prior is None:
        return Priors()
    if isinstance(prior, str):
        if prior not in PRIOR_NAMES:
            raise ValueError(f"prior must be {_ACCEPTED}; got {prior!r}.")
        if prior == "flat":
            return Priors(Flat(), dist.ImproperUniform(constraints.positive, (), ()), Flat())
        return Priors(ARD() if prior == "ard" else Horseshoe())
    if isinstance(prior, Priors):
        out = prior
    elif isinstance(prior, LoadingsPrior | dist.Distribution):
        out = Priors(loadings=prior)
    elif isinstance(prior, Mapping):
        unknown = sorted(set(prior) - set(Priors._fields))
        if unknown:
            raise ValueError(f"prior has unknown keys {unknown}; accepted keys: {list(Priors._fields)}.")
        out = Priors(**prior)
    else:
        raise TypeError(f"prior must be {_ACCEPTED}; got {type(prior).__name__}.")
    loadings = out.loadings
    if isinstance(loadings, dist.Distribution):
        loadings = Flat() if isinstance(loadings, dist.ImproperUniform) else Custom(loadings)
    if loadings is not None and not isinstance(loadings, LoadingsPrior):
        raise TypeError(f"prior.loadings must be a LoadingsPrior, a Distribution or None; got {loadings!r}.")
    for name in ("noise", "mean"):
        value = getattr(out, name)
        if value is not None and not isinstance(value, dist.Distribution | Flat):
            raise TypeError(
                f"prior.{name} must be a numpyro Distribution or None; got {type(value).__name__}."
            )
    return out._replace(loadings=loadings)


def resolve(priors: Priors, noise_kind: str, scales: DataScales) -> Priors:
    """Every field filled from the data's scales: a LoadingsPrior and two site distributions.

    Traceable (``scales`` may hold traced arrays). The noise distribution is
    shaped () for pPCA and (d,) for FA, the mean's (d,). FA's default noise
    prior needs ``scales.residual`` (not skipped by ``data_scales``).

    Examples
    --------
    >>> X = np.array([[0.0, 1.0], [2.0, 5.0], [1.0, 0.0]])
    >>> scales = data_scales(X)
    >>> p = resolve(as_priors(None), "diagonal", scales)
    >>> bool(np.allclose(p.noise.mean, scales.residual)), type(p.loadings).__name__
    (True, 'Normal')
    """
    d = jnp.shape(scales.mean)[-1]
    loadings = (priors.loadings or Normal()).resolve(scales, noise_kind)
    noise_shape = () if noise_kind == "isotropic" else (d,)
    noise = priors.noise
    if noise is None and noise_kind == "isotropic":
        noise = dist.HalfNormal(scales.overall)
    elif noise is None:
        if scales.residual is None:
            raise ValueError(
                "FA's default noise prior needs the residual variances u_j: call data_scales "
                "with residual=True; got scales.residual=None."
            )
        noise = dist.InverseGamma(_UNIQUENESS_SHAPE, (_UNIQUENESS_SHAPE - 1.0) * scales.residual)
    mean = priors.mean
    if mean is None:
        mean = dist.Normal(scales.mean, _MEAN_PRIOR_WIDTH * scales.sd)
    elif isinstance(mean, Flat):
        mean = dist.ImproperUniform(constraints.real, (), ())
    return Priors(loadings, as_site(noise, noise_shape, "noise"), as_site(mean, (d,), "mean"))


@functools.partial(jax.jit, static_argnames=("noise_kind", "n_features"))
def resolve_at_data(
    priors: Priors, noise_kind: str, *, X: Any = None, suff_stats: Any = None, n_features: int | None = None
) -> tuple[DataScales, Priors]:
    """:func:`data_scales` of the data (rows ``X`` or ``suff_stats``) and :func:`resolve` at them, compiled.

    One program per ``noise_kind`` and shapes: run operation by operation,
    the two compiled a small program for each of their operations (about
    60, over 1 s) in every new process. ``u_j`` is computed for FA
    (``noise_kind="diagonal"``) only.

    Examples
    --------
    >>> X = np.array([[0.0, 1.0], [2.0, 5.0], [1.0, 0.0]])
    >>> scales, p = resolve_at_data(as_priors(None), "isotropic", X=X)
    >>> bool(np.isclose(p.noise.scale, scales.overall)), bool(np.allclose(scales.sd, X.std(0)))
    (True, True)
    """
    scales = data_scales(X, suff_stats, n_features, residual=noise_kind == "diagonal")
    return scales, resolve(priors, noise_kind, scales)


def to_units(priors: Priors, noise_kind: str, scale: float | np.ndarray) -> Priors:
    """The priors of the parameters of ``X / scale``, from priors stated in data units.

    ``W`` and ``mu`` scale as ``x``, ``sigma`` as ``x`` and ``psi`` as ``x^2``;
    given distributions are pushed forward by the affine map (improper flat
    ones stay flat), LoadingsPriors rescale their own hyper-parameters.
    Defaults (None) are left to :func:`resolve`, which takes them from the
    data in whatever units it sees. A ``scale`` per feature (d,) rescales
    row ``j`` of ``W`` by ``scale[j]``: for FA with a :class:`Normal` or
    :class:`Flat` loadings prior (others are not stated per feature).
    """
    if np.all(np.asarray(scale) == 1.0):
        return priors
    rows = scale if np.ndim(scale) == 0 else np.asarray(scale)[:, None]

    def push(prior, power):
        if prior is None or isinstance(prior, Flat):
            return prior
        return pushforward(prior, scale ** (-power))

    loadings = None if priors.loadings is None else priors.loadings.to_units(rows)
    noise_power = 1 if noise_kind == "isotropic" else 2
    return Priors(loadings, push(priors.noise, noise_power), push(priors.mean, 1))


def is_named(prior: Any, name: str) -> bool:
    """Whether a ``prior`` argument asks for the named loadings prior (before resolution).

    Examples
    --------
    >>> is_named("horseshoe", "horseshoe"), is_named(Priors(loadings=ARD()), "ard")
    (True, True)
    """
    kinds = {"horseshoe": Horseshoe, "ard": ARD, "flat": Flat}
    try:
        loadings = as_priors(prior).loadings
    except (TypeError, ValueError):
        return False
    return isinstance(loadings, kinds[name])
