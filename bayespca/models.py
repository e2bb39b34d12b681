"""Probabilistic PCA and factor analysis as NumPyro model functions.

Both models share one generative story (see :mod:`bayespca.gaussian`)::

    W ~ p(W),  noise ~ p(noise),  mu ~ p(mu)
    z_i ~ N(0, I_k),   x_i | z_i ~ N(W z_i + mu, Psi),   i = 1..n

with ``Psi = sigma^2 I`` for :func:`ppca` and ``Psi = diag(psi)`` for
:func:`factor_analysis`. Integrating ``z_i`` out gives the *marginal* model
``x_i ~ N(mu, W W^T + Psi)``, which is what NUTS and SVI should sample or
optimise: it has no per-row latent variables, no funnel, and its per-row
log-density is the pointwise log-likelihood that LOO needs.

The models are plain functions of the data, so they go straight into NumPyro
inference. Shape-defining integers (``n_components``, ``n_samples``,
``n_features``) are keyword-only Python ints; with ``jit_model_args=True``
every call argument is traced, so bind them first with
:func:`functools.partial`::

    model = functools.partial(ppca, n_components=3, has_missing=False)
    MCMC(NUTS(model), num_warmup=500, num_samples=500, jit_model_args=True).run(key, X)

(a traced ``X`` cannot be inspected for NaN, hence ``has_missing``; without
it the missing-value density is used, which is correct but slower). For
complete data, ``suff_stats=sufficient_statistics(X)`` makes one log-density
evaluation cost O(d^2 k) whatever n.

Sample sites: ``"W"`` (d, k), ``"sigma"`` (pPCA noise standard deviation,
scalar) or ``"psi"`` (FA noise variances, (d,)), ``"mu"`` (d,), ``"z"``
(n, k; explicit model only) and the observed ``"X"`` inside the plate
``"obs"`` (one log-likelihood value per row). Under the regularised
horseshoe (:class:`Horseshoe`), ``"W"`` is a deterministic function of
the unit-free sites ``"W_z"``, ``"W_lambda"``, ``"W_tau"``, ``"W_c2"``, and
the shrinkage factors ``"kappa"`` (d, k) are recorded too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from bayespca.data import as_float_matrix
from bayespca.gaussian import LowRankGaussian, log_likelihood_from_stats, log_prob
from bayespca.linalg import centred_scatter

__all__ = [
    "Horseshoe",
    "Priors",
    "SufficientStatistics",
    "default_priors",
    "factor_analysis",
    "horseshoe_loadings",
    "ppca",
    "resolve_priors",
    "suff_stats_log_likelihood",
    "sufficient_statistics",
]

_NOISE_KINDS = ("isotropic", "diagonal")
_LATENTS = ("marginal", "explicit")
# Prior sd of mu in units of the column sd: wide enough that the data, not the
# prior, locate the mean, yet proper so that the prior predictive exists.
_MEAN_PRIOR_WIDTH = 10.0


class Priors(NamedTuple):
    """Prior distributions of the parameters of :func:`ppca` / :func:`factor_analysis`.

    Each field is a NumPyro distribution whose ``batch_shape + event_shape``
    broadcasts to the parameter's shape (its event shape must be a suffix
    of it), or None for the default of :func:`default_priors`.

    Attributes
    ----------
    loadings : Distribution, Horseshoe or None
        Prior of ``W``, shape (d, k); e.g. ``dist.Normal(0.0, 1.0)`` for iid
        entries, ``dist.Normal(0.0, scale[:, None])`` per feature, or a
        :class:`Horseshoe` for sparse loadings.
    noise : Distribution or None
        Prior of ``sigma`` (pPCA: the noise *standard deviation*, scalar) or
        of ``psi`` (FA: the noise *variances*, shape (d,)); positive support.
    mean : Distribution or None
        Prior of ``mu``, shape (d,).

    Examples
    --------
    >>> import numpyro.distributions as dist
    >>> Priors(noise=dist.HalfCauchy(1.0)).loadings is None
    True
    """

    loadings: dist.Distribution | None = None
    noise: dist.Distribution | None = None
    mean: dist.Distribution | None = None


class Horseshoe(NamedTuple):
    """Regularised horseshoe prior on the entries of ``W`` (Piironen & Vehtari, 2017).

    Pass it as ``priors=Horseshoe(...)`` (short for
    ``Priors(loadings=Horseshoe(...))``), or ``priors="horseshoe"`` for the
    defaults. Each loading is a scale mixture of normals with a
    global scale ``tau``, a local scale ``lambda_jl`` per entry and a slab
    width ``c``::

        W_jl = tau * lambda~_jl * z_jl,   z_jl ~ N(0, 1)   (non-centred)
        lambda~_jl^2 = c^2 lambda_jl^2 / (c^2 + tau^2 lambda_jl^2)
        lambda_jl ~ C+(0, 1),   tau ~ C+(0, tau_0),
        c^2 ~ InvGamma(nu / 2, nu s_slab^2 / 2)
        tau_0 = p_0 / (d - p_0) * sigma / sqrt(n)

    with ``sigma = sqrt(mean_j psi_j)`` the model's own noise standard
    deviation (a parameter, so the prior scales with the data) and ``n`` the
    number of rows. Far below the slab (``tau lambda << c``) it is the
    horseshoe, whose spike at 0 and Cauchy tails shrink small loadings to 0
    and leave large ones alone; far above it each loading is
    ``N(0, c^2)``-regularised, so weakly identified large loadings stay
    finite. ``tau_0`` is the scale at which ``p_0`` of the ``d`` loadings of
    a column are expected to escape the shrinkage: the shrinkage factor of
    an entry, ``kappa_jl = 1 / (1 + n psi_j^{-1} tau^2 lambda~_jl^2)``
    (the weight of 0 in the posterior mean of ``W_jl`` given ``z``, as in a
    regression on ``n`` unit-variance inputs), has prior effective number of
    non-zeros ``sum_j (1 - kappa_jl)`` of about ``p_0``.

    Attributes
    ----------
    p0 : float or None
        Prior guess of the number of non-zero loadings per column,
        ``0 < p0 < d``. None: ``max(1, d / 4)``.
    slab_scale : float or None
        ``s_slab`` in data units. None: the root mean column standard
        deviation of the data, which bounds a loading (``W_jl^2 <= var_j``).
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


def horseshoe_loadings(
    z, local, global_, slab, noise, prior: Horseshoe, n_samples
) -> tuple[jax.Array, jax.Array]:
    """Loadings and shrinkage factors of the regularised horseshoe, from unit-free variables.

    The non-centred form of :class:`Horseshoe`: every argument is free of
    the data's units, so the sampler sees the same geometry whatever the
    scale, and the units enter only through ``noise`` and ``slab_scale``.

    Parameters
    ----------
    z : array (..., d, k)
        ``N(0, 1)`` draws.
    local : array (..., d, k)
        ``lambda_jl ~ C+(0, 1)``.
    global_ : array (...)
        ``tau / tau_0 ~ C+(0, 1)``.
    slab : array (...)
        ``c^2 / s_slab^2 ~ InvGamma(nu / 2, nu / 2)``.
    noise : array (..., d)
        Noise variances ``psi`` (pPCA: ``sigma^2`` repeated).
    prior : Horseshoe
        With ``p0`` and ``slab_scale`` set.
    n_samples : int or array
        ``n``.

    Returns
    -------
    W : array (..., d, k)
        ``tau lambda~ z``.
    kappa : array (..., d, k)
        ``1 / (1 + n psi_j^{-1} tau^2 lambda~_jl^2)``: near 1 for a loading
        shrunk to 0, near 0 for one left alone.

    Examples
    --------
    >>> import numpy as np
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


def _horseshoe_start(w: np.ndarray, noise: np.ndarray, prior: Horseshoe, n: int) -> dict:
    """Unit-free horseshoe variables (see :func:`horseshoe_loadings`) that give loadings ``w``.

    ``tau`` and ``c`` at their prior scales (``global_ = slab = 1``),
    ``lambda`` such that ``tau lambda~ = max(|w|, tau)``, clipped to
    ``0.9 c``, and ``z = w / (tau lambda~)``, so ``|z| <= 1`` unless
    ``|w| > 0.9 c``. A starting point for NUTS and SVI (NumPy).
    """
    d = w.shape[0]
    tau = prior.p0 / (d - prior.p0) * np.sqrt(np.mean(noise)) / np.sqrt(n)
    c = float(prior.slab_scale)
    size = np.clip(np.abs(w), tau, 0.9 * c)
    local = size / tau * c / np.sqrt(c**2 - size**2)
    return {"z": w / size, "local": local, "global_": np.ones(()), "slab": np.ones(())}


def _canonical_columns(w: np.ndarray, kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order the columns of draws ``w`` (m, d, k) by decreasing norm of their mean, signed
    so that the largest-magnitude entry of each mean column is positive; ``kappa`` follows.

    Under a sparsity prior the columns are identified up to these signed
    permutations only; this picks one, as :func:`bayespca.linalg.flip_signs`
    does for PCA.
    """
    mean = w.mean(axis=0)
    order = np.argsort(-np.linalg.norm(mean, axis=0), kind="stable")
    mean, w, kappa = mean[:, order], w[..., order], kappa[..., order]
    top = mean[np.argmax(np.abs(mean), axis=0), np.arange(mean.shape[1])]
    return w * np.where(top < 0, -1.0, 1.0), kappa


def _horseshoe_sites(prior: Horseshoe, noise: jax.Array, n: Any, d: int, k: int) -> jax.Array:
    """Sample the non-centred horseshoe sites; record ``W`` and ``kappa`` as deterministic."""
    half = 0.5 * prior.slab_df
    z = numpyro.sample("W_z", dist.Normal(0.0, 1.0).expand((d, k)).to_event(2))
    local = numpyro.sample("W_lambda", dist.HalfCauchy(1.0).expand((d, k)).to_event(2))
    global_ = numpyro.sample("W_tau", dist.HalfCauchy(1.0))
    slab = numpyro.sample("W_c2", dist.InverseGamma(half, half))
    w, kappa = horseshoe_loadings(z, local, global_, slab, noise, prior, n)
    numpyro.deterministic("kappa", kappa)
    return numpyro.deterministic("W", w)


class SufficientStatistics(NamedTuple):
    """What complete Gaussian data tell about ``(W, Psi, mu)``.

    Attributes
    ----------
    n : int
        Number of rows.
    mean : Array of shape (d,)
        Column means ``xbar``.
    scatter : Array of shape (d, d)
        Centred scatter ``sum_i (x_i - xbar)(x_i - xbar)^T``.
    """

    n: Any
    mean: jax.Array
    scatter: jax.Array


def sufficient_statistics(X: Any) -> SufficientStatistics:
    """Row count, column means and centred scatter matrix of complete data.

    Parameters
    ----------
    X : array-like of shape (n, d)
        No missing values (the Gaussian likelihood of data with missing
        entries does not reduce to one scatter matrix).

    Returns
    -------
    SufficientStatistics

    Examples
    --------
    >>> stats = sufficient_statistics([[1.0, 2.0], [3.0, 6.0]])
    >>> int(stats.n), stats.mean.tolist(), stats.scatter.tolist()
    (2, [2.0, 4.0], [[2.0, 4.0], [4.0, 8.0]])
    """
    arr = as_float_matrix(X, name="X")
    mean = arr.mean(axis=0)
    return SufficientStatistics(arr.shape[0], mean, centred_scatter(arr, mean))


def _check_noise(noise: Any) -> str:
    if noise not in _NOISE_KINDS:
        raise ValueError(f"noise must be one of {_NOISE_KINDS}; got {noise!r}.")
    return noise


def _column_moments(
    X: Any, suff_stats: SufficientStatistics | None, d: int
) -> tuple[jax.Array, jax.Array]:
    """Column means and standard deviations of the data (0 and 1 without data).

    Works on traced arrays (NaN-aware), so a jitted model can call it.
    """
    if suff_stats is not None:
        return jnp.asarray(suff_stats.mean), jnp.sqrt(jnp.diag(suff_stats.scatter) / suff_stats.n)
    if X is None:
        return jnp.zeros(d), jnp.ones(d)
    X = jnp.asarray(X)
    return jnp.nanmean(X, axis=0), jnp.nanstd(X, axis=0)


def _data_scales(
    X: Any, suff_stats: SufficientStatistics | None, d: int | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Column means ``m_j``, sds ``s_j`` and root mean column variance ``s`` (see default_priors)."""
    mean, sd = _column_moments(X, suff_stats, d)
    overall = jnp.sqrt(jnp.nanmean(sd**2))
    overall = jnp.where(overall > 0, overall, 1.0)
    sd = jnp.where(sd > 0, sd, overall)  # also replaces the NaN of an unobserved column
    mean = jnp.where(jnp.isnan(mean), 0.0, mean)
    return mean, sd, overall


def default_priors(
    X: Any = None,
    *,
    noise: str = "isotropic",
    n_features: int | None = None,
    suff_stats: SufficientStatistics | None = None,
) -> Priors:
    """Scale-aware default priors, in the units of the data.

    With ``m_j`` and ``s_j`` the mean and standard deviation (denominator n,
    NaN ignored) of column ``j`` and ``s = sqrt(mean_j s_j^2)`` the root mean
    column variance, the defaults are

    ==========  ===================================  ================================
    parameter   pPCA (``noise="isotropic"``)         FA (``noise="diagonal"``)
    ==========  ===================================  ================================
    ``W_jl``    ``Normal(0, s)``                     ``Normal(0, s_j)``
    noise       ``sigma ~ HalfNormal(s)``            ``psi_j ~ HalfNormal(s_j^2)``
    ``mu_j``    ``Normal(m_j, 10 s_j)``              ``Normal(m_j, 10 s_j)``
    ==========  ===================================  ================================

    These are the only data-dependent quantities: ``m_j``, ``s_j`` and
    ``s``. They make the prior weakly informative *whatever the units* (the
    prior is equivariant: rescaling the data rescales the prior, so the
    posterior of rescaled data is the rescaled posterior), and make
    ``W W^T + Psi`` a priori of order ``(k + 1) s^2`` per feature. A zero ``s_j``
    (constant column) is replaced by ``s``, and a zero ``s`` by 1. Without
    data, ``m_j = 0`` and ``s_j = s = 1`` (standardised units); a column with
    no observed value gets ``m_j = 0`` and ``s_j = s``.

    Parameters
    ----------
    X : array-like of shape (n, d), optional
        Data; NaN entries are ignored.
    noise : {"isotropic", "diagonal"}, default="isotropic"
        pPCA or FA.
    n_features : int, optional
        Needed when neither ``X`` nor ``suff_stats`` is given.
    suff_stats : SufficientStatistics, optional
        Data summarised by :func:`sufficient_statistics` (instead of ``X``).

    Returns
    -------
    Priors
        All three fields set.

    Examples
    --------
    >>> import numpy as np
    >>> p = default_priors(np.array([[0.0, 1.0], [2.0, 5.0]]), noise="diagonal")
    >>> np.asarray(p.noise.scale).tolist()
    [1.0, 4.0]
    """
    _check_noise(noise)
    if X is None and suff_stats is None:
        if n_features is None:
            raise ValueError("default_priors needs X, suff_stats or n_features; got none of them.")
        d = _check_positive_int(n_features, "n_features")
    else:
        d = None
    mean, sd, overall = _data_scales(X, suff_stats, d)
    if noise == "isotropic":
        loadings = dist.Normal(0.0, overall)
        noise_prior = dist.HalfNormal(overall)
    else:
        loadings = dist.Normal(0.0, sd[:, None])
        noise_prior = dist.HalfNormal(sd**2)
    return Priors(loadings, noise_prior, dist.Normal(mean, _MEAN_PRIOR_WIDTH * sd))


def _flat_priors(noise: str, n_features: int) -> Priors:
    """Improper flat priors: with them the MAP is the maximum-likelihood estimate."""
    positive = dist.ImproperUniform(constraints.positive, (), ())
    return Priors(
        dist.ImproperUniform(constraints.real, (), ()),
        positive if noise == "isotropic" else positive.expand((n_features,)),
        dist.ImproperUniform(constraints.real, (), ()),
    )


def resolve_priors(
    priors: Any, *, noise: str, X: Any, suff_stats: SufficientStatistics | None, d: int
) -> Priors:
    """Turn the ``priors`` argument of a model into a :class:`Priors` with no None field.

    Parameters
    ----------
    priors : None, "flat", Priors or dict
        None: :func:`default_priors`; ``"flat"``: improper flat priors (the
        MAP is then the ML estimate); a :class:`Priors` or a dict with its
        field names, whose None fields take the defaults.
    noise : {"isotropic", "diagonal"}
    X : array-like of shape (n, d) or None
        Data for the scale-aware defaults (or ``suff_stats``).
    suff_stats : SufficientStatistics or None
    d : int
        Number of features.

    Returns
    -------
    Priors

    Examples
    --------
    >>> import numpy as np
    >>> p = resolve_priors(
    ...     {"noise": dist.HalfNormal(2.0)}, noise="isotropic", X=np.eye(3), suff_stats=None, d=3
    ... )
    >>> float(p.noise.scale), type(p.loadings).__name__
    (2.0, 'Normal')
    """
    if isinstance(priors, str):
        if priors not in ("flat", "horseshoe"):
            raise ValueError(
                f"priors must be None, 'flat', 'horseshoe', a bayespca.models.Priors or a dict "
                f"with keys {Priors._fields}; got the string {priors!r}."
            )
        if priors == "flat":
            return _flat_priors(noise, d)
        priors = Priors(loadings=Horseshoe())
    if priors is None:
        priors = Priors()
    elif isinstance(priors, Horseshoe):
        priors = Priors(loadings=priors)
    elif isinstance(priors, Mapping) and not isinstance(priors, Priors):
        unknown = sorted(set(priors) - set(Priors._fields))
        if unknown:
            raise ValueError(
                f"priors has unknown keys {unknown}; accepted keys: {list(Priors._fields)}."
            )
        priors = Priors(**priors)
    elif not isinstance(priors, Priors):
        raise TypeError(
            f"priors must be None, 'flat', 'horseshoe', a Horseshoe, a bayespca.models.Priors or a dict; got "
            f"{type(priors).__name__}."
        )
    for field, value in zip(Priors._fields, priors, strict=True):
        if field == "loadings" and isinstance(value, Horseshoe):
            continue
        if value is not None and not isinstance(value, dist.Distribution):
            extra = " or a bayespca.models.Horseshoe" if field == "loadings" else ""
            raise TypeError(
                f"priors.{field} must be a numpyro Distribution{extra} or None; got "
                f"{type(value).__name__}."
            )
    if None in priors:
        defaults = default_priors(X, noise=noise, n_features=d, suff_stats=suff_stats)
        priors = Priors(
            *(p if p is not None else q for p, q in zip(priors, defaults, strict=True))
        )
    if isinstance(priors.loadings, Horseshoe):
        priors = priors._replace(
            loadings=_resolve_horseshoe(priors.loadings, X=X, suff_stats=suff_stats, d=d)
        )
    return priors


def _is_horseshoe(priors: Any) -> bool:
    """Whether a ``priors`` argument asks for the horseshoe on ``W`` (before resolution)."""
    if isinstance(priors, str):
        return priors == "horseshoe"
    if isinstance(priors, Horseshoe):
        return True
    if isinstance(priors, Priors):
        return isinstance(priors.loadings, Horseshoe)
    return isinstance(priors, Mapping) and isinstance(priors.get("loadings"), Horseshoe)


def _resolve_horseshoe(
    prior: Horseshoe, *, X: Any, suff_stats: SufficientStatistics | None, d: int
) -> Horseshoe:
    """Fill the defaults of a :class:`Horseshoe` and check its values (named ValueErrors)."""
    if any(isinstance(v, jax.core.Tracer) for v in prior):
        return prior  # already resolved and checked before tracing
    p0, slab_scale, slab_df = prior
    if p0 is None:
        p0 = max(1.0, d / 4.0)
    if slab_scale is None:
        slab_scale = _data_scales(X, suff_stats, d)[2]
    if not isinstance(slab_scale, jax.core.Tracer):
        slab_scale = float(slab_scale) if np.ndim(slab_scale) == 0 else slab_scale
    checks = (
        (p0, "p0", f"a number in (0, n_features) = (0, {d})", lambda v: 0 < v < d),
        (slab_scale, "slab_scale", "a finite number > 0 (or None)", lambda v: 0 < v < np.inf),
        (slab_df, "slab_df", "a finite number > 0", lambda v: 0 < v < np.inf),
    )
    for value, name, accepted, ok in checks:
        if isinstance(value, jax.core.Tracer):
            continue  # the data scale of a traced X (jit_model_args=True)
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
        if isinstance(value, bool) or np.ndim(value) != 0 or number is None or not ok(number):
            raise ValueError(f"Horseshoe {name} must be {accepted}; got {value!r}.")
    return Horseshoe(float(p0), slab_scale, float(slab_df))


def _as_site_distribution(prior: dist.Distribution, shape: tuple, field: str) -> dist.Distribution:
    """Broadcast a prior to a parameter of the given shape, as one event."""
    event = tuple(prior.event_shape)
    if event and tuple(shape[len(shape) - len(event) :]) != event:
        raise ValueError(
            f"priors.{field} has event shape {event}, which is not a suffix of the parameter "
            f"shape {shape}."
        )
    batch = tuple(shape[: len(shape) - len(event)])
    try:
        np.broadcast_shapes(tuple(prior.batch_shape), batch)
    except ValueError:
        raise ValueError(
            f"priors.{field} has batch shape {tuple(prior.batch_shape)}, which does not broadcast "
            f"to the parameter shape {shape}."
        ) from None
    if np.broadcast_shapes(tuple(prior.batch_shape), batch) != batch:
        raise ValueError(
            f"priors.{field} has batch shape {tuple(prior.batch_shape)}, larger than the "
            f"parameter shape {shape}."
        )
    if tuple(prior.batch_shape) != batch:
        prior = prior.expand(batch)
    return prior.to_event(len(batch)) if batch else prior


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

    Without a mask it is NumPyro's ``LowRankMultivariateNormal``; it routes
    the log-density through :func:`bayespca.gaussian.log_prob` so that every
    model, fit and score in the package shares one implementation. With a
    mask ``observed`` (batch shape + (d,)), the density of row ``i`` is that
    of its observed block, ``N(x_{i,O} | mu_O, W_O W_O^T + Psi_O)`` (the
    likelihood of data missing at random), so the observed site keeps one
    log-likelihood value per row. Draws are complete rows.
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
        if self.observed is None:
            flat = log_prob(g, rows)
        else:
            observed = jnp.reshape(jnp.broadcast_to(self.observed, shape), (-1, shape[-1]))
            flat = log_prob(g, rows, observed)
        return jnp.reshape(flat, shape[:-1])


def suff_stats_log_likelihood(g: LowRankGaussian, stats: SufficientStatistics) -> jax.Array:
    """Total log-likelihood ``sum_i log N(x_i | mu, C)`` from sufficient statistics.

    :func:`bayespca.gaussian.log_likelihood_from_stats` applied to ``stats``:
    O(d^2 k) per evaluation, whatever ``n``.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.stats import multivariate_normal
    >>> X = np.random.default_rng(0).normal(size=(30, 3))
    >>> g = LowRankGaussian(np.ones((3, 1)), np.full(3, 0.5), np.zeros(3))
    >>> ref = multivariate_normal(np.zeros(3), np.ones((3, 3)) + 0.5 * np.eye(3)).logpdf(X).sum()
    >>> bool(np.isclose(suff_stats_log_likelihood(g, sufficient_statistics(X)), ref))
    True
    """
    return log_likelihood_from_stats(g, stats.n, stats.mean, stats.scatter)


def _observed_mask(X: jax.Array, has_missing: bool | None) -> jax.Array | None:
    """Mask of observed entries, or None to use the complete-data density.

    A concrete X is inspected once; a traced X (``jit_model_args=True``)
    cannot be, so unless told ``has_missing=False`` the masked density, which
    equals the complete one when nothing is missing, is used.
    """
    if has_missing is None:
        if isinstance(X, jax.core.Tracer):
            has_missing = True
        else:
            has_missing = bool(np.isnan(np.asarray(X)).any())
    return ~jnp.isnan(X) if has_missing else None


def _low_rank_model(
    X,
    *,
    noise,
    n_components,
    n_samples,
    n_features,
    latent,
    priors,
    subsample_size,
    suff_stats,
    has_missing,
):
    """The model behind :func:`ppca` (isotropic noise) and :func:`factor_analysis`."""
    if latent not in _LATENTS:
        raise ValueError(f"latent must be one of {_LATENTS}; got {latent!r}.")
    k = _check_positive_int(n_components, "n_components")
    if suff_stats is not None:
        if X is not None:
            raise ValueError("Pass either X or suff_stats, not both.")
        if latent != "marginal" or subsample_size is not None:
            raise ValueError(
                "suff_stats needs latent='marginal' and subsample_size=None; got "
                f"latent={latent!r}, subsample_size={subsample_size!r}."
            )
        n, d = None, jnp.shape(suff_stats.mean)[-1]
    elif X is not None:
        if jnp.ndim(X) != 2:
            raise ValueError(f"X must be 2-D (n_samples, n_features); got shape {jnp.shape(X)}.")
        n, d = jnp.shape(X)
        for value, name, size in ((n_samples, "n_samples", n), (n_features, "n_features", d)):
            if value is not None and value != size:
                raise ValueError(f"{name}={value!r} does not match X of shape {jnp.shape(X)}.")
    else:
        if n_samples is None or n_features is None:
            raise ValueError(
                "Without X (prior predictive), both n_samples and n_features are needed; got "
                f"n_samples={n_samples!r}, n_features={n_features!r}."
            )
        n = _check_positive_int(n_samples, "n_samples")
        d = _check_positive_int(n_features, "n_features")
    if k > d:
        raise ValueError(f"n_components must be at most n_features={d}; got {k}.")

    p = resolve_priors(priors, noise=noise, X=X, suff_stats=suff_stats, d=d)
    horseshoe = isinstance(p.loadings, Horseshoe)
    if not horseshoe:
        W = numpyro.sample("W", _as_site_distribution(p.loadings, (d, k), "loadings"))
    if noise == "isotropic":
        sigma = numpyro.sample("sigma", _as_site_distribution(p.noise, (), "noise"))
        psi = jnp.full(d, sigma**2)
    else:
        psi = numpyro.sample("psi", _as_site_distribution(p.noise, (d,), "noise"))
    if horseshoe:
        # The horseshoe's global scale is in units of the noise sd, hence after it.
        W = _horseshoe_sites(p.loadings, psi, suff_stats.n if n is None else n, d, k)
    mu = numpyro.sample("mu", _as_site_distribution(p.mean, (d,), "mean"))

    if suff_stats is not None:
        # One factor for the whole data set: NUTS cost independent of n, but
        # only the total (not per-row) log-likelihood is recorded.
        numpyro.factor("X", suff_stats_log_likelihood(LowRankGaussian(W, psi, mu), suff_stats))
        return

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
        required).
    n_components : int, keyword-only
        Number of latent dimensions k, ``1 <= k <= d``.
    n_samples, n_features : int, optional
        Shape of the data; required without ``X``, checked against it otherwise.
    latent : {"marginal", "explicit"}, default="marginal"
        ``"marginal"`` integrates z out: each row of the observed site ``"X"``
        has density ``N(x_i | mu, W W^T + Psi)`` (that of a
        ``LowRankMultivariateNormal``, O(d k) per row), or that of its
        observed block when entries are missing, so
        ``numpyro.infer.log_likelihood`` gives one value per row.
        ``"explicit"`` samples ``z_i`` (site ``"z"``, (n, k)) and observes
        ``x_i | z_i ~ N(W z_i + mu, Psi)``, missing entries masked out; its
        per-row log-likelihood is conditional on ``z_i`` (not the marginal).
    priors : None, "flat", "horseshoe", Priors or dict, optional
        None: :func:`default_priors` (scale-aware, computed from the data).
        ``"flat"``: improper uniform priors (the MAP is then the maximum
        likelihood; no prior predictive). ``"horseshoe"``: the regularised
        horseshoe of :class:`Horseshoe` on the entries of ``W`` (sites
        ``"W_z"``, ``"W_lambda"``, ``"W_tau"``, ``"W_c2"``, with ``"W"`` and
        the shrinkage factors ``"kappa"`` deterministic), defaults
        elsewhere; a :class:`Horseshoe` sets its options. A :class:`Priors`
        or a dict with some of the keys
        ``loadings`` (a Distribution or a :class:`Horseshoe`), ``noise``,
        ``mean``: those replace the defaults.
    subsample_size : int, optional
        Minibatch size for SVI: the plate ``"obs"`` subsamples rows and
        scales their log-likelihood by ``n / subsample_size``.
    suff_stats : SufficientStatistics, optional
        Instead of ``X`` (complete data, marginal model only): the
        log-likelihood is computed from ``(n, xbar, S)`` at O(d^2 k) per
        evaluation, whatever n, as one factor site ``"X"`` holding the total
        (not per-row) log-likelihood.
    has_missing : bool, optional
        Whether ``X`` has NaN entries. None inspects a concrete ``X``; a
        traced ``X`` (``jit_model_args=True``) cannot be inspected, so the
        masked density is then used unless ``has_missing=False`` is bound
        (the complete-data density is about k times cheaper per row, but
        gives NaN on NaN entries).
"""


def ppca(
    X=None,
    *,
    n_components,
    n_samples=None,
    n_features=None,
    latent="marginal",
    priors=None,
    subsample_size=None,
    suff_stats=None,
    has_missing=None,
):
    """Probabilistic PCA (Tipping & Bishop, 1999) as a NumPyro model.

    ``z_i ~ N(0, I_k)``, ``x_i | z_i ~ N(W z_i + mu, sigma^2 I_d)``, hence
    ``x_i ~ N(mu, W W^T + sigma^2 I_d)``. Sites: ``"W"`` (d, k), ``"sigma"``
    (noise standard deviation), ``"mu"`` (d,), ``"z"`` (explicit only), and
    the observed ``"X"`` in the plate ``"obs"``.
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
        X,
        noise="isotropic",
        n_components=n_components,
        n_samples=n_samples,
        n_features=n_features,
        latent=latent,
        priors=priors,
        subsample_size=subsample_size,
        suff_stats=suff_stats,
        has_missing=has_missing,
    )


def factor_analysis(
    X=None,
    *,
    n_components,
    n_samples=None,
    n_features=None,
    latent="marginal",
    priors=None,
    subsample_size=None,
    suff_stats=None,
    has_missing=None,
):
    """Factor analysis as a NumPyro model.

    ``z_i ~ N(0, I_k)``, ``x_i | z_i ~ N(W z_i + mu, diag(psi))``, hence
    ``x_i ~ N(mu, W W^T + diag(psi))``. Sites: ``"W"`` (d, k), ``"psi"``
    (noise variances, (d,)), ``"mu"`` (d,), ``"z"`` (explicit only), and
    the observed ``"X"`` in the plate ``"obs"``.
    {parameters}
    Examples
    --------
    >>> import functools, jax, numpy as np
    >>> from numpyro.infer import log_likelihood
    >>> X = np.random.default_rng(0).normal(size=(6, 3))
    >>> X[0, 1] = np.nan
    >>> model = functools.partial(factor_analysis, n_components=1)
    >>> params = {{"W": np.ones((1, 3, 1)), "psi": np.ones((1, 3)), "mu": np.zeros((1, 3))}}
    >>> log_likelihood(model, params, X)["X"].shape
    (1, 6)
    """
    _low_rank_model(
        X,
        noise="diagonal",
        n_components=n_components,
        n_samples=n_samples,
        n_features=n_features,
        latent=latent,
        priors=priors,
        subsample_size=subsample_size,
        suff_stats=suff_stats,
        has_missing=has_missing,
    )


ppca.__doc__ = ppca.__doc__.format(parameters=_MODEL_PARAMETERS)
factor_analysis.__doc__ = factor_analysis.__doc__.format(parameters=_MODEL_PARAMETERS)
