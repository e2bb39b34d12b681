"""Mixtures of probabilistic PCA (Tipping & Bishop 1999): clusters, each with its own subspace.

The model::

    x_i ~ sum_c pi_c N(mu_c, C_c),    C_c = W_c W_c^T + sigma_c^2 I,   c = 1..K,

a Gaussian mixture whose covariances are pPCA's (``k`` components each):
``K (d + d k - k (k - 1) / 2 + 1) + K - 1`` free parameters instead of the
``K d (d + 3) / 2 + K - 1`` of full covariances, which it equals at
``k = d - 1`` (a pPCA with ``d - 1`` components is any covariance).

EM (:func:`fit_mixture_em`). The E-step computes the responsibilities
``R_ic = pi_c N(x_i | mu_c, C_c) / sum_c' pi_c' N(x_i | mu_c', C_c')`` with
the Woodbury log-density of :mod:`bayespca.gaussian`; the M-step sets
``pi_c = sum_i R_ic / n`` and fits cluster ``c`` by pPCA of the rows
weighted by ``R_ic`` (:func:`bayespca.inference.weighted.weighted_ppca`),
exactly, so the log-likelihood never decreases. Starts: k-means++ centres
(Arthur & Vassilvitskii 2007), each row assigned to its nearest; the best of
``n_init`` restarts is kept.

NUTS (:func:`fit_mixture_nuts`) samples :func:`bayespca.models.mixture_ppca`.
What is identified and what is not: the mixture density is invariant
under the ``K!`` permutations of the clusters and the model does not break
that symmetry. Every chain starts at the EM fit, and each draw is relabelled
by the permutation that brings its cluster means closest to EM's (the
assignment problem on squared distances, solved exactly); within a cluster
``W_c`` is identified as in pPCA (polar: columns ordered by norm, signs
aligned to EM's). With well separated clusters no chain leaves its labelling
and the relabelled draws are those of one mode; with overlapping clusters
chains may switch labels and relabelling is only a heuristic, so the
quantities to trust are the label-free ones: the pointwise log-likelihood
(hence LOO), the predicted density, and the sorted weights.

Model choice over ``(K, k)``: :func:`compare_mixtures` gives BIC, ICL
(BIC plus twice the entropy of the responsibilities, Biernacki, Celeux &
Govaert 2000) and, with NUTS, PSIS-LOO.

References
----------
M. E. Tipping, C. M. Bishop (1999). Mixtures of probabilistic principal
component analyzers. Neural Computation 11(2), 443-482.
C. Biernacki, G. Celeux, G. Govaert (2000). Assessing a mixture model for
clustering with the integrated completed likelihood. IEEE TPAMI 22(7), 719-725.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, ClusterMixin, DensityMixin

from bayespca import gaussian
from bayespca.data import check_is_fitted, validate_transform
from bayespca.gaussian import LowRankGaussian
from bayespca.inference.closed_form import check_rows_leave_noise
from bayespca.inference.contract import IDENTIFICATIONS, Draws, Fit, ModelSpec
from bayespca.inference.threads import serial_blas
from bayespca.inference.weighted import weighted_ppca
from bayespca.messages import warn
from bayespca.params import (
    as_generator,
    check_bool,
    check_choice,
    check_number,
    check_sampler_options,
    check_seed,
)
from bayespca.statistics import Prepared, prepare

__all__ = ["MixturePPCA", "compare_mixtures", "fit_mixture_em", "fit_mixture_nuts", "mixture_parameters"]

_METHODS = ("em", "nuts")


def mixture_parameters(n_mixtures: int, n_components: int, n_features: int) -> int:
    """Free parameters of a mixture of pPCA: ``K (d + d k - k (k - 1) / 2 + 1) + K - 1``.

    Examples
    --------
    >>> d = 4  # at k = d - 1 it is the count of a full-covariance Gaussian mixture
    >>> mixture_parameters(3, d - 1, d) == 3 * (d + d * (d + 1) // 2) + 2
    True
    """
    K, k, d = n_mixtures, n_components, n_features
    return K * (d + d * k - k * (k - 1) // 2 + 1) + K - 1


def _stacked(gaussians: list) -> LowRankGaussian:
    return LowRankGaussian(*(np.stack([np.asarray(g[i]) for g in gaussians]) for i in range(3)))


def _cluster(g: LowRankGaussian, c: int) -> LowRankGaussian:
    return LowRankGaussian(*(np.asarray(a)[c] for a in g))


def _joint_log_density(weights: np.ndarray, g: LowRankGaussian, X: np.ndarray, observed=None) -> np.ndarray:
    """``log pi_c + log N(x_i | mu_c, C_c)``, shape (n, K) (observed blocks)."""
    columns = [np.asarray(gaussian.log_prob(_cluster(g, c), X, observed)) for c in range(len(weights))]
    with np.errstate(divide="ignore"):
        return np.stack(columns, axis=1) + np.log(weights)


def _e_step(weights, g, X, observed=None) -> tuple[float, np.ndarray]:
    """Total log-likelihood and responsibilities (n, K)."""
    joint = _joint_log_density(weights, g, X, observed)
    norm = logsumexp(joint, axis=1)
    return float(norm.sum()), np.exp(joint - norm[:, None])


def _m_step(X, resp, k, floor, previous):
    """Weights and per-cluster pPCA from responsibilities; an emptied cluster keeps its parameters."""
    n = X.shape[0]
    counts = resp.sum(axis=0) + 10 * np.finfo(float).eps  # as scikit-learn, so no cluster has weight 0
    gaussians = []
    for c in range(resp.shape[1]):
        if counts[c] < 1e-8 * n and previous is not None:
            gaussians.append(_cluster(previous, c))
        else:
            gaussians.append(weighted_ppca(X, resp[:, c], counts[c], k, floor))
    return counts / counts.sum(), _stacked(gaussians)


def _kmeans_plus_plus_responsibilities(X, K, rng) -> np.ndarray:
    """One-hot responsibilities of the nearest of ``K`` k-means++ centres."""
    from sklearn.cluster import kmeans_plusplus

    centres, _ = kmeans_plusplus(X, K, random_state=int(rng.integers(2**31)))
    nearest = np.argmin(((X[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    return np.eye(K)[nearest]


def _run_em(X, weights, g, k, floor, tol, max_iter):
    trace = []
    converged = False
    for _ in range(max_iter):
        ll, resp = _e_step(weights, g, X)
        if trace and ll - trace[-1] <= tol * abs(ll):
            trace.append(max(ll, trace[-1]))
            converged = True
            break
        trace.append(ll)
        weights, g = _m_step(X, resp, k, floor, g)
    return weights, g, np.array(trace), converged


def fit_mixture_em(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    n_mixtures: int,
    n_init: int = 5,
    tol: float = 1e-10,
    max_iter: int = 1000,
    floor: float = 1e-6,
    random_state: Any = None,
    init: tuple | None = None,
) -> Fit:
    """Maximum likelihood of a mixture of pPCA by EM, the best of ``n_init`` k-means++ starts.

    Parameters
    ----------
    prepared : Prepared
        Complete data.
    spec : ModelSpec
        ``noise="isotropic"``; ``n_components`` ``k`` per cluster, in ``[1, d - 1]``.
    n_mixtures : int
        ``K``.
    n_init : int, default=5
        Restarts from k-means++ centres.
    tol : float, default=1e-10
        Stop when a cycle raises the log-likelihood by at most ``tol * |ll|``.
    max_iter : int, default=1000
        Cycles per start.
    floor : float, default=1e-6
        Lower bound on each ``sigma_c^2`` relative to the mean feature
        variance: a cluster collapsing on ``k + 1`` rows would otherwise make
        the likelihood infinite.
    random_state : None, int, Generator or RandomState
    init : tuple (weights, LowRankGaussian), optional
        Start from these parameters (data units, cluster axis first) instead
        of k-means++; ``n_init`` is then ignored.

    Returns
    -------
    Fit
        In data units: ``gaussian`` with a leading cluster axis (loadings
        (K, d, k), noise (K, d), mean (K, d)), ``details`` with ``weights``
        (K,) and ``responsibilities`` (n, K); ``trace`` the log-likelihood per
        cycle of the best start.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(size=(100, 3)), rng.normal(size=(100, 3)) + 8])
    >>> fit = fit_mixture_em(prepare(X), ModelSpec("isotropic", 1), n_mixtures=2, random_state=0)
    >>> sorted(np.round(fit.details["weights"], 2).tolist())
    [0.5, 0.5]
    """
    if prepared.missing is not None:
        raise ValueError(
            f"method='em' needs complete data, but X has {int(prepared.missing.sum())} missing (NaN) "
            "entries; use method='nuts', whose likelihood is the mixture density of each row's observed "
            "block."
        )
    X = prepared.X
    k = spec.n_components
    bound = floor * max(float(np.mean(prepared.variances)), np.finfo(float).tiny)
    rng = as_generator(random_state)
    if init is not None:
        w0, g0 = init
        s = prepared.scale
        g0 = LowRankGaussian(*(np.asarray(a) / f for a, f in zip(g0, (s, s**2, s), strict=True)))
        starts = [(np.asarray(w0, float), g0)]
    else:
        starts = [_m_step(X, _kmeans_plus_plus_responsibilities(X, n_mixtures, rng), k, bound, None)
                  for _ in range(n_init)]
    best = None
    # Small d x d products and eigenproblems: see fit_robust_em on threads.
    with serial_blas(0):
        for weights, g in starts:
            run = _run_em(X, weights, g, k, bound, tol, max_iter)
            if best is None or run[2][-1] > best[2][-1]:
                best = run
    weights, g, trace, converged = best
    if not converged:
        warn(f"Mixture EM did not converge in {max_iter} cycles (tol={tol:g}).", UserWarning)
    ll, resp = _e_step(weights, g, X)
    fit = Fit(g, ll, "em", trace.size, converged, trace, np.zeros(prepared.d, bool),
              details={"weights": weights, "responsibilities": resp})
    return fit.to_data_units(prepared.scale, prepared.total_observed)


def _relabel(means: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per draw, the permutation of clusters bringing ``means`` (m, K, d) closest to ``reference`` (K, d).

    Returns indices (m, K): draw ``s``'s cluster ``perm[s, c]`` takes label ``c``.
    """
    from scipy.optimize import linear_sum_assignment

    cost = ((means[:, None, :, :] - reference[None, :, None, :]) ** 2).sum(-1)  # (m, label, cluster)
    return np.stack([linear_sum_assignment(c)[1] for c in cost])


def fit_mixture_nuts(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    n_mixtures: int,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    chain_method: str = "parallel",
    target_accept_prob: float = 0.9,
    random_state: Any = None,
    progress_bar: bool | None = None,
    em_options: dict | None = None,
) -> Fit:
    """Posterior of a mixture of pPCA by NUTS, started at EM, draws relabelled to EM's clusters.

    See the module docstring for what is and is not identified. Rows with
    missing entries (NaN) enter by the mixture density of their observed
    block (EM, for the start, runs on the column-mean filled data). One
    gradient costs O(K (n d k + d k^2)).

    Returns
    -------
    Fit
        In data units: ``draws`` with a cluster axis after (chain, draw)
        (loadings (chain, draw, K, d, k), ...) and ``extra["weights"]``
        (chain, draw, K); ``gaussian`` and ``details["weights"]`` their
        posterior means; ``details["responsibilities"]`` averaged over draws.
    """
    from bayespca import priors as prior_classes
    from bayespca.inference.nuts import sample_model
    from bayespca.models import identification_for, initial_values, mixture_ppca

    X = prepared.X
    n, k, K = prepared.n, spec.n_components, n_mixtures
    # Each cluster lies in the data's span: k at or above its rank leaves every cluster no noise.
    check_rows_leave_noise(prepared, k)
    filled = X if prepared.missing is None else np.where(prepared.missing, prepared.mean, X)
    em = fit_mixture_em(Prepared(filled, None), ModelSpec("isotropic", k), n_mixtures=K,
                        random_state=random_state, **(em_options or {}))
    priors = prior_classes.to_units(prior_classes.as_priors(spec.prior), "isotropic", prepared.scale)
    resolved = prior_classes.resolve_at_data(priors, "isotropic", X=X)[1]
    identification = identification_for(spec.identification, "isotropic", resolved.loadings)
    values = {"weights": np.asarray(em.details["weights"])}
    for c in range(K):
        start = _cluster(em.gaussian, c)
        for name, value in initial_values(identification, resolved.loadings, start, "isotropic", n).items():
            values[f"c{c}/{name}"] = value
    options = {"n_mixtures": K, "n_components": k, "identification": identification,
               "has_missing": prepared.missing is not None}
    draws = sample_model(
        mixture_ppca, options, {"X": X, "prior": priors}, values,
        functools.partial(_relabelled_draws, em=em.gaussian, identification=identification),
        log_lik=lambda draws: pointwise_log_likelihood(draws, X).sum(-1),
        num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains, chain_method=chain_method,
        target_accept_prob=target_accept_prob, random_state=random_state, progress_bar=progress_bar,
    )
    return _posterior_fit(draws, prepared)


def _relabelled_draws(sites: dict, stats: dict, *, em: LowRankGaussian, identification: str) -> Draws:
    """The mixture's draws (chain, draw, cluster, ...) from its sites, each draw's clusters relabelled to
    EM's (``em``, stacked) by their means, and polar columns' signs aligned to EM's loadings."""
    from bayespca.inference.nuts import align_signs

    K, d = np.shape(em.mean)
    shape = stats["diverging"].shape
    loadings = np.stack([sites[f"c{c}/W"] for c in range(K)], axis=2)
    noise = np.stack([np.broadcast_to(sites[f"c{c}/sigma"][..., None] ** 2, (*shape, d))
                      for c in range(K)], axis=2)
    means = np.stack([sites[f"c{c}/mu"] for c in range(K)], axis=2)
    perm = _relabel(means.reshape(-1, K, d), np.asarray(em.mean)).reshape(*shape, K)

    def take(a):
        return np.take_along_axis(a, perm.reshape(*shape, K, *([1] * (a.ndim - 3))), axis=2)

    loadings, noise, means, weights = take(loadings), take(noise), take(means), take(sites["weights"])
    if identification == "polar":
        loadings = np.stack([align_signs(loadings[:, :, c], np.asarray(em.loadings[c]))
                             for c in range(K)], axis=2)
    return Draws(loadings, noise, means, identification, "isotropic", stats, em, {"weights": weights})


def _draw_gaussians(draws: Draws):
    """Per draw (flattened): weights (m, K) and the stacked LowRankGaussian (m, K, ...)."""
    K, d, k = draws.loadings.shape[-3:]
    g = LowRankGaussian(draws.loadings.reshape(-1, K, d, k), draws.noise.reshape(-1, K, d),
                        draws.mean.reshape(-1, K, d))
    return np.asarray(draws.extra["weights"]).reshape(-1, K), g


def pointwise_log_likelihood(draws: Draws, X: np.ndarray) -> np.ndarray:
    """``log sum_c pi_c N(x_i | mu_c, C_c)`` per draw and row, shape (chain, draw, n) (observed blocks)."""
    arr = np.asarray(X, dtype=float)
    observed = ~np.isnan(arr)
    values, mask = np.where(observed, arr, 0.0), (observed if (~observed).any() else None)
    weights, g = _draw_gaussians(draws)
    out = _draws_mixture_log_prob(jnp.asarray(weights), tuple(jnp.asarray(a) for a in g), values, mask)
    return np.asarray(out).reshape(*draws.loadings.shape[:2], arr.shape[0])


@jax.jit  # module-level, the data as arguments: compiled once per shape, not at every call
def _draws_mixture_log_prob(weights, gs, values, mask):
    def one(args):
        w, g = args
        terms = jax.vmap(lambda c: gaussian.log_prob(LowRankGaussian(*c), values, mask))(g)
        return jax.scipy.special.logsumexp(terms + jnp.log(w)[:, None], axis=0)

    return jax.lax.map(one, (weights, gs))


def _posterior_fit(draws: Draws, prepared: Prepared) -> Fit:
    """Posterior means as the point estimate; responsibilities averaged over the draws (working units in)."""
    weights, g = _draw_gaussians(draws)
    values, observed = np.nan_to_num(prepared.X), prepared.observed
    resp = np.zeros((prepared.n, weights.shape[1]))
    for w, *parts in zip(weights, *g, strict=True):
        resp += _e_step(w, LowRankGaussian(*parts), values, observed)[1]
    resp /= weights.shape[0]
    mean_w = weights.mean(axis=0)
    point = LowRankGaussian(*(a.mean(axis=0) for a in g))
    ll = _e_step(mean_w, point, values, observed)[0]
    converged = not draws.sample_stats["diverging"].any()
    fit = Fit(point, ll, "nuts", weights.shape[0], converged, np.array([ll]), np.zeros(prepared.d, bool),
              draws, details={"weights": mean_w, "responsibilities": resp})
    return fit.to_data_units(prepared.scale, prepared.total_observed)


class MixturePPCA(ClusterMixin, DensityMixin, BaseEstimator):
    """Mixture of probabilistic PCA: ``K`` clusters, each a pPCA with ``k`` components.

    ``x ~ sum_c pi_c N(mu_c, W_c W_c^T + sigma_c^2 I)`` (module docstring).

    Parameters
    ----------
    n_mixtures : int, default=2
        Number of clusters ``K``.
    n_components : int, default=1
        Latent dimensions per cluster, in ``[1, n_features - 1]``
        (``n_features - 1``: a full-covariance Gaussian mixture).
    method : {"em", "nuts"}, default="em"
        EM (:func:`fit_mixture_em`) or the posterior by NUTS
        (:func:`fit_mixture_nuts`).
    n_init : int, default=5
        EM restarts from k-means++ centres.
    tol : float, default=1e-10
        EM's relative log-likelihood gain at which to stop.
    max_iter : int, default=1000
        EM cycles per start.
    noise_floor : float, default=1e-6
        Lower bound on each ``sigma_c^2`` relative to the mean feature variance.
    prior : None, "flat" or a bayespca.priors prior, default=None
        NUTS: the priors of every cluster's pPCA (as :class:`bayespca.PPCA`);
        the weights are ``Dirichlet(1, ..., 1)``.
    identification : {None, "polar", "lower_triangular", "procrustes", "none"}, default=None
        NUTS: how each cluster's ``W_c`` is sampled (None: ``"polar"``).
    num_warmup, num_samples, num_chains : int, default=500, 500, 4
        NUTS warm-up and kept draws per chain, and number of chains. Chains
        that fail the convergence check run on as :class:`bayespca.PPCA`'s do
        (``posterior_["sample_stats"].attrs["thinning"]``: every 2nd, 3rd or
        4th transition kept).
    chain_method : {"parallel", "sequential", "vectorized"}, default="parallel"
        NUTS chains on threads, one after the other (the same draws) or as one
        vectorized program (the choice on a GPU), as in :class:`bayespca.PPCA`.
    target_accept_prob : float, default=0.9
    random_state : None, int, Generator or RandomState
        Seeds the k-means++ starts and NUTS.
    progress_bar : bool or None, default=None
        NUTS: a progress bar over the transitions; None shows it in a terminal
        or a notebook only.

    Attributes
    ----------
    weights_ : ndarray of shape (n_mixtures,)
    means_ : ndarray of shape (n_mixtures, n_features)
    loadings_ : ndarray of shape (n_mixtures, n_features, n_components)
        Each cluster's ``W_c``: orthogonal columns of decreasing norm.
    noise_variance_ : ndarray of shape (n_mixtures,)
        ``sigma_c^2``.
    covariances_ : ndarray of shape (n_mixtures, n_features, n_features)
        ``W_c W_c^T + sigma_c^2 I``.
    gaussian_ : LowRankGaussian
        The clusters stacked on a leading axis.
    log_likelihood_ : float
        Total log-likelihood of the training rows.
    responsibilities_ : ndarray of shape (n_samples, n_mixtures)
        Of the training rows (NUTS: averaged over the posterior).
    labels_ : ndarray of shape (n_samples,)
        ``argmax`` of ``responsibilities_``.
    n_parameters_ : int
        :func:`mixture_parameters`.
    bic_, icl_ : float
        BIC ``-2 L + P log n`` and ICL = BIC ``- 2 sum_ic R_ic log R_ic``
        of the training data (smaller is better).
    loglike_trace_, n_iter_, converged_, method_, n_features_in_
    nuts_ : Draws or None
        NUTS draws with a cluster axis after (chain, draw) and
        ``extra["weights"]``.
    posterior_ : xarray.DataTree
        NUTS: posterior (``weights``, ``mu``, ``sigma2``, ``W``,
        ``eigenvalues``, ``log_lik``), ``sample_stats``, ``log_likelihood``
        (mixture density of each row, for :func:`bayespca.compare`) and
        ``observed_data``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> line = rng.normal(size=(150, 1)) @ [[1.0, 1.0, 0.0]]
    >>> X = np.vstack([line, line[:, ::-1] + [6.0, 0.0, 0.0]]) + 0.1 * rng.normal(size=(300, 3))
    >>> model = MixturePPCA(2, 1, random_state=0).fit(X)
    >>> np.bincount(model.predict(X)).tolist(), np.round(np.sort(model.noise_variance_), 2).tolist()
    ([150, 150], [0.01, 0.01])
    """

    def __init__(
        self,
        n_mixtures=2,
        n_components=1,
        *,
        method="em",
        n_init=5,
        tol=1e-10,
        max_iter=1000,
        noise_floor=1e-6,
        prior=None,
        identification=None,
        num_warmup=500,
        num_samples=500,
        num_chains=4,
        chain_method="parallel",
        target_accept_prob=0.9,
        random_state=None,
        progress_bar=None,
    ):
        self.n_mixtures = n_mixtures
        self.n_components = n_components
        self.method = method
        self.n_init = n_init
        self.tol = tol
        self.max_iter = max_iter
        self.noise_floor = noise_floor
        self.prior = prior
        self.identification = identification
        self.num_warmup = num_warmup
        self.num_samples = num_samples
        self.num_chains = num_chains
        self.chain_method = chain_method
        self.target_accept_prob = target_accept_prob
        self.random_state = random_state
        self.progress_bar = progress_bar

    def _plan(self, prepared: Prepared) -> tuple[str, ModelSpec, dict]:
        """Every parameter checked against the data (named errors before any work)."""
        method = check_choice(self.method, "method", _METHODS)
        n, d = prepared.n, prepared.d
        if d < 2:
            raise ValueError(f"MixturePPCA needs at least 2 features; got n_features={d}.")
        K = check_number(self.n_mixtures, "MixturePPCA: n_mixtures", integer=True, low=1, high=n)
        k = check_number(self.n_components, "MixturePPCA: n_components", integer=True, low=1, high=d - 1)
        em = {
            "n_init": check_number(self.n_init, "n_init", integer=True, low=1),
            "tol": check_number(self.tol, "tol", low=0),
            "max_iter": check_number(self.max_iter, "max_iter", integer=True, low=1),
            "floor": check_number(self.noise_floor, "noise_floor", low=0, low_open=True),
        }
        check_choice(self.identification, "identification", IDENTIFICATIONS, allow_none=True)
        check_seed(self.random_state)
        progress = None if self.progress_bar is None else check_bool(self.progress_bar, "progress_bar")
        check_sampler_options(  # with method='em' too, as scikit-learn checks every parameter at fit
            self.num_warmup, self.num_samples, self.num_chains, self.chain_method, self.target_accept_prob
        )
        from bayespca.inference.model_nuts import check_prior

        check_prior(self.prior, method, "MixturePPCA", "'nuts'")
        options = {"n_mixtures": K, "random_state": self.random_state}
        if method == "em":
            options.update(em)
        else:
            options.update(num_warmup=self.num_warmup, num_samples=self.num_samples,
                           num_chains=self.num_chains, chain_method=self.chain_method,
                           target_accept_prob=self.target_accept_prob, progress_bar=progress,
                           em_options=em)
        return method, ModelSpec("isotropic", int(k), self.prior, self.identification), options

    def fit(self, X, y=None):
        """Fit the mixture.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            NaN marks a missing entry (``method="nuts"`` only).
        y : ignored

        Returns
        -------
        self
        """
        for name in [a for a in vars(self) if a.endswith("_") and not a.startswith("_")]:
            delattr(self, name)
        prepared = prepare(X, estimator=self)
        method, spec, options = self._plan(prepared)
        fit = (fit_mixture_em if method == "em" else fit_mixture_nuts)(prepared, spec, **options)
        g = LowRankGaussian(*(np.asarray(a, dtype=float) for a in fit.gaussian))
        self.gaussian_ = g
        self.weights_ = np.asarray(fit.details["weights"])
        self.means_ = g.mean
        self.loadings_ = g.loadings
        self.noise_variance_ = g.noise[:, 0]
        self.covariances_ = np.einsum("cdk,cek->cde", g.loadings, g.loadings) + np.einsum(
            "cd,de->cde", g.noise, np.eye(prepared.d))
        self.responsibilities_ = np.asarray(fit.details["responsibilities"])
        self.labels_ = self.responsibilities_.argmax(axis=1)
        self.log_likelihood_ = float(fit.log_likelihood)
        self.loglike_trace_ = np.asarray(fit.trace)
        self.n_iter_ = int(fit.n_iter)
        self.converged_ = bool(fit.converged)
        self.method_ = method
        self.n_parameters_ = mixture_parameters(len(self.weights_), spec.n_components, prepared.d)
        self.bic_ = _bic(self.log_likelihood_, self.n_parameters_, prepared.n)
        self.icl_ = _icl(self.bic_, self.responsibilities_)
        self.nuts_ = fit.draws
        if fit.draws is not None:
            self._store_posterior(fit.draws, prepared)
        return self

    def _store_posterior(self, draws: Draws, prepared: Prepared) -> None:
        from bayespca.inference.model_nuts import posterior_tree

        X = prepared.data
        self.posterior_ = posterior_tree(
            draws, X, pointwise_log_likelihood(draws, X), feature_names=prepared.feature_names,
            extra={"weights": np.asarray(draws.extra["weights"])}, clusters=len(self.weights_),
        )

    # -------------------------------------------------------------- inference
    def _joint(self, X) -> np.ndarray:
        check_is_fitted(self, "gaussian_")
        X, missing = validate_transform(self, X, allow_nan=True)
        observed = None if missing is None else ~missing
        return _joint_log_density(self.weights_, self.gaussian_, np.nan_to_num(X), observed)

    def score_samples(self, X):
        """``log sum_c pi_c N(x_i | mu_c, C_c)`` per row (observed blocks), shape (n_samples,)."""
        return logsumexp(self._joint(X), axis=1)

    def score(self, X, y=None):
        """Mean log-density of the rows of ``X``."""
        return float(np.mean(self.score_samples(X)))

    def predict_proba(self, X):
        """Responsibilities ``p(c | x_i)``, shape (n_samples, n_mixtures)."""
        joint = self._joint(X)
        return np.exp(joint - logsumexp(joint, axis=1, keepdims=True))

    def predict(self, X):
        """The most probable cluster of each row, shape (n_samples,)."""
        return self._joint(X).argmax(axis=1)

    def bic(self, X):
        """``-2 sum_i log p(x_i) + P log n`` on ``X`` (smaller is better)."""
        log_density = self.score_samples(X)
        return _bic(float(np.sum(log_density)), self.n_parameters_, log_density.size)

    def icl(self, X):
        """BIC plus twice the entropy of the responsibilities on ``X`` (Biernacki et al. 2000)."""
        joint = self._joint(X)
        log_density = logsumexp(joint, axis=1)
        resp = np.exp(joint - log_density[:, None])
        return _icl(_bic(float(np.sum(log_density)), self.n_parameters_, log_density.size), resp)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags


def _bic(log_likelihood: float, n_parameters: int, n: int) -> float:
    return -2.0 * log_likelihood + n_parameters * math.log(n)


def _icl(bic: float, responsibilities: np.ndarray) -> float:
    """``bic`` plus twice the entropy of the ``responsibilities`` (n, K)."""
    resp = responsibilities
    return bic - 2.0 * float(np.sum(resp * np.log(np.where(resp > 0, resp, 1.0))))


def compare_mixtures(
    X: Any,
    n_mixtures=(1, 2, 3),
    n_components=(1, 2),
    *,
    method: str = "em",
    random_state: Any = None,
    **fit_kwargs,
) -> pd.DataFrame:
    """Fit every ``(K, k)`` and tabulate BIC, ICL and, with ``method="nuts"``, PSIS-LOO.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    n_mixtures, n_components : iterables of int
        The grid of ``K`` and ``k``.
    method : {"em", "nuts"}, default="em"
    random_state : None, int or Generator
        One derived seed per fit.
    **fit_kwargs
        Further :class:`MixturePPCA` options, shared by every fit.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``(n_mixtures, n_components)``: ``log_likelihood``,
        ``n_parameters``, ``bic``, ``icl`` (smaller is better) and, for NUTS,
        the columns of :func:`bayespca.compare` (``elpd``, ``se``,
        ``elpd_diff``, ``dse``, ``weight``, ``pareto_k_max``, ...). The
        attribute ``models`` (``table.attrs["models"]``) holds the fits.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(size=(100, 3)), rng.normal(size=(100, 3)) + 6])
    >>> table = compare_mixtures(X, [1, 2], [1], random_state=0)
    >>> table["bic"].idxmin() == (2, 1)
    True
    """
    check_choice(method, "method", _METHODS)
    rng = as_generator(random_state)
    grid = list(itertools.product(n_mixtures, n_components))
    models = {}
    for K, k in grid:
        models[K, k] = MixturePPCA(K, k, method=method, random_state=int(rng.integers(2**31)),
                                   **fit_kwargs).fit(X)
    table = pd.DataFrame(
        {"log_likelihood": [m.log_likelihood_ for m in models.values()],
         "n_parameters": [m.n_parameters_ for m in models.values()],
         "bic": [m.bic_ for m in models.values()],
         "icl": [m.icl_ for m in models.values()]},
        index=pd.MultiIndex.from_tuples(grid, names=["n_mixtures", "n_components"]),
    )
    if method == "nuts" and len(grid) > 1:
        from bayespca.comparison import compare

        loo = compare({f"{K},{k}": m.posterior_ for (K, k), m in models.items()})
        loo.index = pd.MultiIndex.from_tuples([tuple(int(v) for v in s.split(",")) for s in loo.index],
                                              names=table.index.names)
        table = table.join(loo[["elpd", "se", "elpd_diff", "dse", "p", "weight", "warning", "pareto_k_max"]])
    table.attrs["models"] = models
    return table
