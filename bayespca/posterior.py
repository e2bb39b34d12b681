"""Posterior draws of ``(W, Psi, mu)`` as ArviZ data, and the sampler diagnostics users see.

:func:`to_datatree` turns :class:`bayespca.inference.contract.Draws` into an
ArviZ DataTree with labelled dims (``chain``, ``draw``, ``feature``,
``component``, ``obs``); :func:`diagnose` warns when the draws cannot be
trusted. Both look at the rotation-invariant quantities first (noise
variances, eigenvalues of ``W W^T``, log-likelihood), which mean the same
under any identification of ``W``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bayespca.convergence import ess_bulk, ess_tail, rank_rhat
from bayespca.gaussian import (
    LatentPosterior,
    LowRankGaussian,
    draws_log_prob,
    latent_posterior,
    log_prob,
    sample,
)
from bayespca.inference.contract import Draws
from bayespca.messages import MORE_DRAWS, warn
from bayespca.params import as_generator

__all__ = [
    "SamplingWarning",
    "converged",
    "diagnose",
    "latent_moments",
    "pointwise_log_likelihood",
    "posterior_variables",
    "sample_latent",
    "shortfall",
    "to_datatree",
    "worst_convergence",
    "worst_of",
]


# What diagnose warns about on any invariant: an R-hat above RHAT_LIMIT, or a bulk or tail ESS below
# MIN_ESS_PER_CHAIN a chain.
RHAT_LIMIT, MIN_ESS_PER_CHAIN = 1.01, 100
# diagnose's warnings offer more draws up to _LONGEST_OFFERED times the chains' length, and beyond it
# for chains shorter than _JUDGED_FROM draws. Beyond, R-hat is above about 1.1 (the older limit, at
# which chains are taken not to mix) or ESS below 10 a chain: chains held in separate modes, whose
# R-hat does not shrink with length. Short chains cannot tell that from slow mixing. The draws offered
# are at least _FEWEST_OFFERED (the sampler's chunk of transitions) or the chains' length.
_LONGEST_OFFERED, _JUDGED_FROM, _FEWEST_OFFERED = 10.0, 400, 50

# Rows sharing a pattern of observed entries, at least this many of them, are scored for all draws
# at once; the others draw by draw. A pattern costs about what 8 rows cost draw by draw (2000 draws,
# d = 20, k = 3: 10-14 ms a pattern, 0.7 us a row and draw, 0.3 ms a draw).
_PATTERN_ROWS = 8


def pointwise_log_likelihood(draws: Draws, X: np.ndarray) -> np.ndarray:
    """Marginal ``log p(x_i | W, Psi, mu)`` per draw and row, shape (chain, draw, n).

    Rows with missing entries (NaN) get the density of their observed block,
    ``N(x_o | mu_o, W_o W_o^T + Psi_o)`` (the same low-rank form on the
    observed coordinates ``o``): rows with a common pattern, at least
    ``_PATTERN_ROWS`` of them, for blocks of draws at once
    (:func:`bayespca.gaussian.draws_log_prob`, as complete rows), the others
    draw by draw (:func:`bayespca.gaussian.log_prob`).
    """
    arr = np.asarray(X, dtype=float)
    observed = ~np.isnan(arr)
    g = draws.gaussians()
    # NumPy: nothing is compiled for a new number of rows (a compiled program per shape costs
    # memory maps that a long session runs out of).
    keys, inverse = np.unique(observed, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    counts = np.bincount(inverse, minlength=len(keys))
    out = np.zeros((g.mean.shape[0], arr.shape[0]))  # a row with nothing observed: log 1
    for p in np.flatnonzero((counts >= _PATTERN_ROWS) & keys.any(axis=1)):
        rows, cols = np.flatnonzero(inverse == p), keys[p]
        block = LowRankGaussian(g.loadings[:, cols], g.noise[:, cols], g.mean[:, cols])
        out[:, rows] = draws_log_prob(block, arr[np.ix_(rows, cols)])
    rare = np.flatnonzero(counts[inverse] < _PATTERN_ROWS)
    if rare.size:
        values, seen = np.where(observed[rare], arr[rare], 0.0), observed[rare]
        each = zip(*g, strict=True)
        out[:, rare] = np.stack([log_prob(LowRankGaussian(*one), values, seen) for one in each])
    return out.reshape(*draws.loadings.shape[:2], arr.shape[0])


def _one_posterior(g, X, observed):
    post = latent_posterior(g, X, observed)
    cov = (
        post.covariance
        if observed is not None
        else jnp.broadcast_to(post.covariance, (X.shape[0], *post.covariance.shape))
    )
    return post.mean, cov


@jax.jit
def _mixture_moments(draws, X, observed):
    def add(carry, g):
        mean, cov = _one_posterior(LowRankGaussian(*g), X, observed)
        return (carry[0] + mean, carry[1] + cov + mean[:, :, None] * mean[:, None, :]), None

    n, k = X.shape[0], draws.loadings.shape[-1]
    zero = (jnp.zeros((n, k)), jnp.zeros((n, k, k)))
    (first, second), _ = jax.lax.scan(add, zero, tuple(draws))
    m = draws.loadings.shape[0]
    mean = first / m
    return mean, second / m - mean[:, :, None] * mean[:, None, :]


def latent_moments(draws: LowRankGaussian, X: np.ndarray, observed: np.ndarray | None) -> LatentPosterior:
    """Mean and covariance of each ``z_i`` under the posterior: ``E_theta`` of the per-draw moments.

    ``E[z] = E_theta[m_theta]``, ``Cov[z] = E_theta[C_theta + m m^T] - E[z] E[z]^T``,
    with ``m_theta``, ``C_theta`` the latent posterior of row ``i`` given the
    draw ``theta`` (:func:`bayespca.gaussian.latent_posterior`).

    Parameters
    ----------
    draws : LowRankGaussian
        ``m`` draws of ``(W, Psi, mu)`` stacked: shapes (m, d, k), (m, d), (m, d).
    X : ndarray of shape (n, d)
        Rows, with zeros (not NaN) where ``observed`` is False.
    observed : ndarray of bool, shape (n, d), or None

    Returns
    -------
    LatentPosterior
        ``mean`` (n, k) and ``covariance`` (n, k, k).

    Examples
    --------
    One draw: the moments are that draw's latent posterior.

    >>> g = LowRankGaussian(np.array([[[1.0], [2.0]]]), np.array([[0.5, 0.5]]), np.zeros((1, 2)))
    >>> post = latent_moments(g, np.array([[1.0, 2.0]]), None)
    >>> bool(np.allclose(post.covariance[0], 1 / (1 + 5 / 0.5)))
    True
    """
    mean, cov = _mixture_moments(draws, jnp.asarray(X), observed)
    return LatentPosterior(np.asarray(mean), np.asarray(cov))


@jax.jit
def _sample_latent(draws, X, observed, key):
    keys = jax.random.split(key, draws.loadings.shape[0])

    def one(g, key):
        mean, cov = _one_posterior(LowRankGaussian(*g), X, observed)
        eps = jax.random.normal(key, mean.shape)
        return mean + jnp.einsum("nij,nj->ni", jnp.linalg.cholesky(cov), eps)

    return jax.lax.map(lambda a: one(a[0], a[1]), (tuple(draws), keys))


def sample_latent(
    draws: LowRankGaussian, X: np.ndarray, observed: np.ndarray | None, key: jax.Array
) -> np.ndarray:
    """One draw of each ``z_i`` per posterior draw: ``z ~ N(m_theta, C_theta)``, shape (m, n, k).

    Parameters
    ----------
    draws : LowRankGaussian
        ``m`` draws of ``(W, Psi, mu)`` stacked, as for :func:`latent_moments`.
    X : ndarray of shape (n, d)
        Rows, zeros where ``observed`` is False.
    observed : ndarray of bool, shape (n, d), or None
    key : jax.Array
        A JAX random key.

    Returns
    -------
    ndarray of shape (m, n, k)

    Examples
    --------
    >>> g = LowRankGaussian(np.ones((3, 2, 1)), np.full((3, 2), 0.5), np.zeros((3, 2)))
    >>> sample_latent(g, np.array([[1.0, 1.0]]), None, jax.random.key(0)).shape
    (3, 1, 1)
    """
    return np.asarray(_sample_latent(draws, X, observed, key))


def posterior_variables(draws: Draws) -> dict:
    """Named posterior variables: ``W``, the noise, ``mu`` and the rotation-invariant ones.

    ``eigenvalues`` are those of ``W W^T`` (decreasing, the variance each
    component adds); ``sigma2`` (pPCA) or ``psi`` (FA) the noise variances;
    ``alpha`` the ARD precisions when present; ``inclusion`` (``1 - kappa``,
    the horseshoe's inclusion-like weight of each loading) when present.
    """
    out = {"W": draws.loadings, "mu": draws.mean}
    if draws.noise_kind == "isotropic":
        out["sigma2"] = draws.noise[..., 0]
    else:
        out["psi"] = draws.noise
    out["eigenvalues"] = np.linalg.svd(draws.loadings, compute_uv=False) ** 2
    if "alpha" in draws.extra:
        out["alpha"] = draws.extra["alpha"]
    if "kappa" in draws.extra:
        out["inclusion"] = 1.0 - draws.extra["kappa"]
    return out


def to_datatree(
    draws: Draws,
    X: np.ndarray,
    *,
    feature_names: Any = None,
    log_likelihood: bool = True,
    posterior_predictive: bool = False,
    random_state: Any = None,
    log_lik: Any = None,
):
    """The posterior as an ArviZ DataTree.

    Groups: ``posterior`` (variables of :func:`posterior_variables` plus
    ``log_lik``, the total log-likelihood of the data per draw),
    ``sample_stats`` (``diverging``, ``n_steps``, ``tree_depth``, ``lp``,
    ``acceptance_rate``, ``energy``, ``step_size``: what ArviZ's BFMI and
    energy plots need), ``log_likelihood`` (``X``: the marginal
    ``log p(x_i | W, Psi, mu)``, dims (chain, draw, obs)), ``observed_data``
    (``X``, NaN kept) and, on request, ``posterior_predictive`` (``X``: one
    replicated data set per draw). ``sample_stats.attrs["thinning"]``: each draw is
    the last of that many transitions of its chain (``Draws.thinning``); above 1,
    ``energy`` changes over that many transitions from draw to draw, and BFMI
    computed from it reads higher than the transition-to-transition one.

    Parameters
    ----------
    draws : Draws
    X : ndarray or dask.array.Array of shape (n, d)
        The data the draws were fitted to (data units). A Dask array keeps
        ``log_likelihood`` and ``observed_data`` lazy, chunked like ``X``.
    feature_names : sequence of str, optional
        Coordinates of the ``feature`` dim.
    log_likelihood : bool, default=True
        Include the pointwise group (draws x rows values).
    posterior_predictive : bool, default=False
    random_state : None, int, Generator or RandomState
        Seeds the posterior predictive draws.
    log_lik : ndarray of shape (chain, draw), optional
        The total log-likelihood per draw when known already (from the
        sufficient statistics); by default the sum of the pointwise values.

    Returns
    -------
    xarray.DataTree

    Examples
    --------
    >>> from bayespca import PPCA
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((50, 1)) @ [[2.0, 1.0, -1.0]] + rng.standard_normal((50, 3))
    >>> fit = PPCA(1, method="nuts", num_warmup=200, num_samples=200, num_chains=1, random_state=0).fit(X)
    >>> dict(to_datatree(fit.nuts_, X)["log_likelihood"]["X"].sizes)
    {'chain': 1, 'draw': 200, 'obs': 50}
    """
    from arviz_base import from_dict

    from bayespca.chunked import is_chunked

    if is_chunked(X):  # rows held by Dask: pointwise values stay lazy (bayespca.chunked)
        from bayespca.chunked import lazy_pointwise

        arr, pointwise = X, lazy_pointwise(draws, X)
    else:
        arr = np.asarray(X, dtype=float)
        # draws x rows values, formed only where asked for or needed for log_lik (n = 200000, 2000 draws:
        # 3.2 GB and 221 s, where a fit's posterior_ leaves the group out).
        needed = log_likelihood or log_lik is None
        pointwise = pointwise_log_likelihood(draws, arr) if needed else None
    n, d = arr.shape
    k = draws.loadings.shape[-1]
    # No coordinates for "obs": ArviZ gives it 0 .. n-1 itself, once per variable that has it; a list
    # here would be deep-copied for every variable (minutes and gigabytes at 10^8 rows).
    coords = {
        "feature": list(feature_names) if feature_names is not None else list(range(d)),
        "component": list(range(k)),
    }
    dims = {
        "W": ["feature", "component"],
        "mu": ["feature"],
        "psi": ["feature"],
        "eigenvalues": ["component"],
        "alpha": ["component"],
        "inclusion": ["feature", "component"],
    }
    groups = {"posterior": posterior_variables(draws), "sample_stats": dict(draws.sample_stats)}
    groups["posterior"]["log_lik"] = pointwise.sum(-1) if log_lik is None else log_lik
    if log_likelihood:
        groups["log_likelihood"] = {"X": pointwise}
    groups["observed_data"] = {"X": arr}
    if posterior_predictive:
        rng = as_generator(random_state)
        reps = np.stack([sample(LowRankGaussian(*g), rng, n) for g in zip(*draws.gaussians(), strict=True)])
        groups["posterior_predictive"] = {"X": reps.reshape(*draws.loadings.shape[:2], n, d)}
    # "X" is (obs, feature) in observed_data and posterior_predictive; from_dict
    # drops the trailing "feature" for the log_likelihood group (one value per row).
    dims["X"] = ["obs", "feature"]
    attrs = {"sample_stats": {"thinning": draws.thinning}} if draws.sample_stats else None
    return from_dict(groups, coords=coords, dims=dims, attrs=attrs)


class SamplingWarning(UserWarning):
    """NUTS diagnostics flag a problem (divergences, R-hat, effective sample size)."""


def worst_of(quantities: dict, chains: int, labels: dict | None = None) -> tuple[tuple, tuple]:
    """``(label, R-hat)`` of the largest R-hat and ``(label, ESS)`` of the smallest ESS (bulk or tail).

    ``quantities`` maps names to draws (chain, draw, ...); each scalar series that varies counts,
    labelled ``name[j]`` by its flat index ``j`` or by ``labels[name][j]`` where given.
    R-hat is the rank-normalised split R-hat (one chain: its two halves); the ESS the smaller of
    the bulk and the 90% tail ESS.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> stuck = np.concatenate([rng.normal(size=(3, 400)), 5.0 + rng.normal(size=(1, 400))])
    >>> (name, rhat), _ = worst_of({"a": rng.normal(size=(4, 400)), "b": stuck}, 4)
    >>> name, bool(rhat > 1.5)
    ('b', True)
    """
    names, series = [], []
    for name, value in quantities.items():
        flat = value.reshape(*value.shape[:2], -1)
        entries = (labels or {}).get(name, range(flat.shape[-1]))
        for j, entry in zip(range(flat.shape[-1]), entries, strict=True):
            if np.ptp(flat[..., j]) > 0:
                names.append(name if flat.shape[-1] == 1 else f"{name}[{entry}]")
                series.append(flat[..., j])
    if not series:
        return (None, 1.0), (None, np.inf)
    series = np.stack(series)
    if chains == 1:  # one chain: compare its two halves (split R-hat), where ArviZ gives NaN
        half = series.shape[2] // 2
        rhat = rank_rhat(series[:, 0, : 2 * half].reshape(-1, 2, half)) if half >= 2 else np.ones(len(names))
    else:
        rhat = rank_rhat(series)
    rhat = np.where(np.isfinite(rhat), rhat, np.inf)  # a stuck chain
    ess = np.fmin(ess_bulk(series), ess_tail(series, prob=0.9))  # NaN (too few draws) ignored
    worst_rhat = (names[int(np.argmax(rhat))], float(np.max(rhat))) if np.max(rhat) > 1.0 else (None, 1.0)
    if np.isnan(ess).all():
        return worst_rhat, (None, np.inf)
    return worst_rhat, (names[int(np.nanargmin(ess))], float(np.nanmin(ess)))


def worst_convergence(draws: Draws, log_lik: np.ndarray | None = None,
                      feature_names: Any = None) -> tuple[tuple, tuple]:
    """``(label, R-hat)`` of the largest R-hat and ``(label, ESS)`` of the smallest ESS (bulk or tail).

    Over the rotation-invariant quantities (see :func:`diagnose`) and the
    per-draw total log-likelihood ``log_lik`` (chain, draw) when given; ``psi``
    labelled by ``feature_names`` where given, as :func:`to_datatree` labels it.
    """
    # The horseshoe's inclusion weights follow W's labelling: not invariant either.
    quantities = {k: v for k, v in posterior_variables(draws).items() if k not in ("W", "mu", "inclusion")}
    if log_lik is not None:
        quantities["log_lik"] = log_lik
    labels = None if feature_names is None else {"psi": list(feature_names)}
    return worst_of(quantities, draws.loadings.shape[0], labels)


def shortfall(worst: tuple, chains: int, min_ess_per_chain: int = MIN_ESS_PER_CHAIN) -> float:
    """How many times as long the chains would have to be to pass the check; 1 or less: they pass.

    ``worst`` is ``((label, R-hat), (label, ESS))`` as :func:`worst_convergence`
    gives it for ``chains`` chains. For chains that sample one stationary
    distribution, ``R-hat^2 - 1`` (the chain means' variance over the
    draws', BDA3 11.4) and ``1 / ESS`` shrink about in proportion to the
    chains' length, so the figure is
    ``max((R-hat^2 - 1) / (RHAT_LIMIT^2 - 1), min_ess_per_chain * chains / ESS)``:
    an estimate only, infinite where a chain did not move (R-hat not finite).

    Examples
    --------
    >>> round(shortfall((("psi[0]", 1.015), ("sigma2", 200.0)), chains=4), 3)  # ESS: 400 / 200
    2.0
    >>> round(shortfall((("psi[0]", 1.03), ("sigma2", 600.0)), chains=4), 3)  # R-hat: 0.0609 / 0.0201
    3.03
    """
    (_, rhat), (_, ess) = worst
    return max(_rhat_shortfall(rhat), _ess_shortfall(ess, min_ess_per_chain * chains))


def _rhat_shortfall(rhat: float) -> float:
    """The length, in times the chains', at which R-hat would fall to ``RHAT_LIMIT`` (:func:`shortfall`)."""
    return float((rhat * rhat - 1.0) / (RHAT_LIMIT * RHAT_LIMIT - 1.0)) if np.isfinite(rhat) else np.inf


def _ess_shortfall(ess: float, needed: float) -> float:
    """The length, in times the chains', at which ESS would reach ``needed`` (:func:`shortfall`)."""
    return float(needed / ess) if ess > 0 else np.inf


def converged(draws: Draws, log_lik: np.ndarray | None = None, *,
              min_ess_per_chain: int = MIN_ESS_PER_CHAIN) -> bool:
    """Whether :func:`diagnose` would stay silent on R-hat and ESS: every R-hat <= 1.01, ESS large enough."""
    return shortfall(worst_convergence(draws, log_lik), draws.loadings.shape[0], min_ess_per_chain) <= 1.0


def _higher_targets(target: float | None) -> str:
    """Examples of a higher ``target_accept_prob`` than ``target`` (None: the usual ones)."""
    if target is None or target < 0.95:
        return "e.g. 0.95 or 0.99" + ("" if target is None else f"; it is {target:g}")
    return f"it is {target:g}; e.g. {'0.99' if target < 0.99 else '0.995 or 0.999'}"


def _within_reach(times: float, draws: Draws) -> bool:
    """Whether more draws, ``times`` the chains' length (:func:`shortfall`), are worth offering."""
    return bool(np.isfinite(times)) and (times <= _LONGEST_OFFERED or draws.loadings.shape[1] < _JUDGED_FROM)


def _more_draws(times: float, draws: Draws, reach: bool, continuable: bool) -> str:
    """The end of a warning on R-hat or ESS: the draws that would pass, from ``times`` (:func:`shortfall`).

    It names the draws to add to each chain, rounded up to two significant digits and at
    least ``_FEWEST_OFFERED`` or the chains' length (an estimate: R-hat and ESS of the
    longer chains vary about it), and where more draws are worth offering (``reach``, the
    same for both checks: :func:`_within_reach` of the overall shortfall) ``sample_more()``
    where the estimator can run on (``continuable``); else that length seldom mends it.
    """
    count = draws.loadings.shape[1]
    extra = (times - 1.0) * count
    if not extra <= 1e3 * count:  # also not finite: ESS 0
        estimate = "over 1,000 times as many draws"
    else:
        step = 10 ** max(0, math.floor(math.log10(max(extra, 1.0))) - 1)  # two significant digits, up
        extra = max(min(_FEWEST_OFFERED, count), step * math.ceil(extra / step))
        shown = 1.0 + extra / count  # the draws offered, as a multiple of the chains' length
        estimate = f"about {shown:.{1 if shown >= 1.1 else 2}f} times as many draws ({extra:,} more a chain)"
    if not reach:
        return (f" Passing would take {estimate} at this pace; chains of {_JUDGED_FROM} draws or more "
                "that far from it are mostly held in separate modes, which more draws seldom mend.")
    return f" {estimate[0].upper()}{estimate[1:]} would pass.{MORE_DRAWS if continuable else ''}"


def _rhat_message(label: str, rhat: float, reach: bool, fewer: str, ending: str) -> str:
    """The warning on R-hat above ``RHAT_LIMIT``: the remedies, then ``ending`` (:func:`_more_draws`)."""
    modes = f"several modes (e.g. too many components: {fewer})"
    if reach:
        remedy = f"Increase num_warmup and num_samples, run more chains, or check for {modes}"
    else:
        remedy = f"Check for {modes}, or increase num_warmup"
    return (f"R-hat of {label} is {rhat:.3f} > {RHAT_LIMIT}: draws from different chains (or halves of one "
            f"chain) disagree. {remedy}.{ending}")


def _ess_message(label: str, ess: float, needed: float, chains: int, reach: bool, fewer: str,
                 ending: str) -> str:
    """The warning on an ESS below ``needed``: the remedy, then ``ending`` (:func:`_more_draws`)."""
    remedy = "increase num_samples" if reach else f"check for several modes or too many components ({fewer})"
    return (f"Effective sample size of {label} is {ess:.0f} < {needed:.0f} ({needed / chains:.0f} per chain "
            f"x {chains} chains): {remedy}.{ending}")


def diagnose(draws: Draws, log_lik: np.ndarray | None = None, *,
             min_ess_per_chain: int = MIN_ESS_PER_CHAIN,
             continuable: bool = False, target_accept_prob: float | None = None,
             feature_names: Any = None) -> list:
    """Warn (:class:`SamplingWarning`) about divergences, R-hat > 1.01 or low ESS; return the messages.

    R-hat and bulk/tail ESS are checked on the rotation-invariant quantities
    only (noise variances, eigenvalues of ``W W^T``, total log-likelihood
    when given), which are meaningful whatever the identification. R-hat
    is ArviZ's rank-normalised split R-hat; a single chain is compared with
    itself by its two halves. The messages about R-hat and ESS say how many
    more draws would pass that check (:func:`shortfall`'s estimate; beyond
    ten times the chains' length, for chains of 400 draws or more, that
    length seldom mends it), and that the chains ran on already where
    ``draws.thinning`` is above 1.
    ``continuable``: the estimator's chains can run on
    (``sample_more``), which those messages then offer
    (``bayespca.messages.MORE_DRAWS``). ``target_accept_prob``: the
    sampler's, from which the advice on divergences goes up (None: not known). ``feature_names``:
    the names that label ``psi`` in the messages, as in :func:`to_datatree` (None: indices).
    """
    ran_on = ""
    if draws.thinning > 1:  # the sampler ran the chains on already (bayespca.inference.nuts)
        ran_on = f" The chains already ran on, {draws.thinning} transitions for each draw kept."
    messages = []
    n_div = int(draws.sample_stats["diverging"].sum())
    if n_div:
        messages.append(
            f"{n_div} divergent transitions after warm-up: the posterior has regions the step "
            f"size cannot resolve. Increase target_accept_prob ({_higher_targets(target_accept_prob)}), "
            "or use stronger priors (prior=...)."
        )
    chains = draws.loadings.shape[0]
    (rhat_label, rhat), (ess_label, ess) = worst_convergence(draws, log_lik, feature_names)
    # ARD (its precisions "alpha" among the draws) already prunes superfluous components.
    fewer = "try fewer" if "alpha" in draws.extra else "try fewer or prior='ard'"
    if not np.isfinite(rhat):
        messages.append(
            f"R-hat of {rhat_label} is not finite: a chain did not move. Increase num_warmup, or "
            f"check for too many components ({fewer})."
        )
    needed = min_ess_per_chain * chains
    # One verdict for both messages: chains that more draws would not mend are beyond them in either check.
    reach = _within_reach(shortfall(((rhat_label, rhat), (ess_label, ess)), chains, min_ess_per_chain), draws)
    if np.isfinite(rhat) and rhat > RHAT_LIMIT:
        ending = ran_on + _more_draws(_rhat_shortfall(rhat), draws, reach, continuable)
        messages.append(_rhat_message(rhat_label, rhat, reach, fewer, ending))
    if ess < needed:
        ending = ran_on + _more_draws(_ess_shortfall(ess, needed), draws, reach, continuable)
        messages.append(_ess_message(ess_label, ess, needed, chains, reach, fewer, ending))
    for message in messages:
        warn(message, SamplingWarning)
    return messages
