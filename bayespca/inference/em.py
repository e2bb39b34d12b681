"""EM for probabilistic PCA and factor analysis, with complete or missing data.

Both models are ``x = W z + mu + eps``, ``z ~ N(0, I_k)``, ``eps ~ N(0, Psi)``
with ``Psi = sigma^2 I`` (pPCA, ``noise="isotropic"``) or diagonal (FA,
``noise="diagonal"``). With ``A = Psi^{-1} W`` and ``M = I + W^T A``:

Complete data (Rubin & Thayer 1982; Tipping & Bishop 1999). The data enter
only through ``S = Xc^T Xc / n``, and only as the product ``S A``::

    B     = S A M^{-1}                      (= sum_i (x_i - mu) E[z_i]^T / n)
    C_zz  = M^{-1} + M^{-1} A^T B           (= sum_i E[z_i z_i^T] / n)
    W'    = B C_zz^{-1}
    psi'  = diag(S) - rowsum(W' * B)        (pPCA: sigma'^2 = mean of psi')

The same ``S A`` gives the log-likelihood of the current parameters
(:func:`bayespca.gaussian.log_likelihood_from_stats`), so each iteration
costs one product ``S A``: O(d^2 k) with ``S`` formed once (``form="scatter"``)
or O(n d k) as ``Xc^T (Xc A) / n`` without ever forming ``S``
(``form="data"``, for ``d > n``).

Missing data (exact EM for data missing at random; Tipping & Bishop 1999,
appendix; Ilin & Raiko 2010). Row ``i`` conditions on its observed entries
``O_i``: ``z_i | x_{i,O} ~ N(m_i, Sigma_i)`` with
``Sigma_i = (I + W_O^T Psi_O^{-1} W_O)^{-1}``. With ``z~ = (z, 1)`` and
``w~_j = (w_j, mu_j)`` the mean is estimated jointly with ``W``, feature by
feature over the rows where it is observed::

    G_j = sum_{i: j in O_i} E[z~_i z~_i^T],   b_j = sum_{i: j in O_i} x_ij E[z~_i]
    w~_j' = G_j^{-1} b_j,   psi_j' = (sum_{i: j in O_i} x_ij^2 - w~_j'^T b_j) / n_j

at O(n d k^2) per iteration (pPCA pools ``psi'`` over all observed entries).

Acceleration. EM converges linearly, slowly when the noise is small against
the signal or a ``psi_j`` approaches 0. Each cycle therefore tries a SQUAREM
extrapolation (Varadhan & Roland 2008) ``x - 2 a r + a^2 v`` from two EM
steps and keeps it only if its log-likelihood beats the plain EM step; so
the recorded log-likelihood trace never decreases.

Heywood cases. ``psi_j`` is bounded below by ``floor * var_j``
(:func:`bayespca.inference.closed_form.noise_floor`); the constrained M-step
is still an exact M-step (the expected complete log-likelihood is unimodal
in each ``psi_j``), so monotonicity is kept. Features at the bound are
reported.

References
----------
D. B. Rubin, D. T. Thayer (1982). EM algorithms for ML factor analysis.
Psychometrika 47(1), 69-76.
M. E. Tipping, C. M. Bishop (1999). Probabilistic principal component
analysis. J. R. Stat. Soc. B 61(3), 611-622.
A. Ilin, T. Raiko (2010). Practical approaches to principal component
analysis in the presence of missing values. JMLR 11, 1957-2000.
R. Varadhan, C. Roland (2008). Simple and globally convergent methods for
accelerating the convergence of any EM algorithm. Scand. J. Stat. 35(2),
335-353.
"""

from __future__ import annotations

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve
from sklearn.exceptions import ConvergenceWarning

from bayespca.chunked import in_memory
from bayespca.gaussian import (
    LowRankGaussian,
    _masked_factors,
    _masked_log_prob,
    _masked_posterior,
    _stats_log_likelihood,
    _symmetric_packing,
    canonical_loadings,
    capacitance_cholesky,
)
from bayespca.inference.closed_form import check_n_components, noise_floor
from bayespca.inference.contract import NOISE_KINDS, Fit, ModelSpec
from bayespca.linalg import eigh_top, svd_full, svd_randomized
from bayespca.statistics import Prepared

__all__ = ["fit_em"]

FORMS = ("auto", "scatter", "data")
DEFAULT_FLOOR = {"isotropic": 1e-10, "diagonal": 1e-6}
DEFAULT_TOL = {False: 1e-10, True: 1e-8}  # keyed by "has missing values"
_WINDOW = 5  # iterations per block in the convergence test


# --------------------------------------------------------------- EM maps
def _m_step_noise(psi_new, floor, isotropic, weights=None):
    if isotropic:
        if weights is None:
            pooled = jnp.mean(psi_new)
        else:
            pooled = jnp.sum(weights * psi_new) / jnp.sum(weights)
        psi_new = jnp.full_like(psi_new, pooled)
    return jnp.maximum(psi_new, floor)


def _complete_step(params, data, isotropic, data_form):
    """One EM update from complete data; returns (new params, log-lik at params)."""
    w, psi, mu = params
    source, diag_s, n, floor = data
    g = LowRankGaussian(w, psi, mu)
    chol, scaled = capacitance_cholesky(g)
    sa = source.T @ (source @ scaled) / n if data_form else source @ scaled
    ll = _stats_log_likelihood(g, chol, scaled, n, mu, n * diag_s, n * sa)
    b = cho_solve((chol, True), sa.T).T
    czz = cho_solve((chol, True), jnp.eye(w.shape[1], dtype=w.dtype) + scaled.T @ b)
    czz = 0.5 * (czz + czz.T)
    w_new = cho_solve((jnp.linalg.cholesky(czz), True), b.T).T
    psi_new = _m_step_noise(diag_s - jnp.sum(w_new * b, axis=1), floor, isotropic)
    return (w_new, psi_new, mu), ll


def _missing_step(params, data, isotropic, data_form):
    """One exact EM update from data with missing entries (zeros there, ``obs`` mask)."""
    w, psi, mu = params
    x0, obs, obs_float, n_obs, sum_sq, floor = data
    g = LowRankGaussian(w, psi, mu)
    chol, proj, chol_inv, resid, inv_noise = _masked_factors(g, x0, obs, inverse=True)
    ll = jnp.sum(_masked_log_prob(g, obs, chol, proj, resid, inv_noise))
    m, cov = _masked_posterior(proj, chol_inv)
    n, k = m.shape
    # E[z~ z~^T] for z~ = (z, 1); its distinct entries, summed over the rows
    # where each feature is observed, are one matrix product.
    m_aug = jnp.concatenate([m, jnp.ones((n, 1), dtype=w.dtype)], axis=1)
    (row, col), unpack = _symmetric_packing(k + 1)
    inner = np.flatnonzero((row < k) & (col < k))
    second = (m_aug[:, row] * m_aug[:, col]).at[:, inner].add(cov[:, row[inner], col[inner]])
    gram = (obs_float.T @ second)[:, unpack]
    b = x0.T @ m_aug  # x0 is zero at missing entries
    coef = cho_solve((jnp.linalg.cholesky(gram), True), b[..., None])[..., 0]
    psi_new = (sum_sq - jnp.sum(coef * b, axis=1)) / n_obs
    psi_new = _m_step_noise(psi_new, floor, isotropic, weights=n_obs)
    return (coef[:, :k], psi_new, coef[:, k]), ll


@partial(jax.jit, static_argnames=("step", "isotropic", "data_form"))
def _em_map(params, data, *, step, isotropic, data_form):
    return step(params, data, isotropic, data_form)


@jax.jit
def _extrapolate(x, fx, fy, step_max, floor):
    """SQUAREM point ``x - 2 a r + a^2 v`` from ``x``, ``F(x)``, ``F(F(x))``.

    ``r = F(x) - x``, ``v = F(F(x)) - 2 F(x) + x`` and ``a = -|r| / |v|``
    clipped to ``[-step_max, -1]``; ``a = -1`` gives ``F(F(x))`` itself.
    """
    r = jax.tree.map(lambda a, b: a - b, fx, x)
    v = jax.tree.map(lambda a, b, c: a - 2.0 * b + c, fy, fx, x)
    sr = sum(jnp.sum(t**2) for t in jax.tree.leaves(r))
    sv = sum(jnp.sum(t**2) for t in jax.tree.leaves(v))
    alpha = jnp.where(sv > 0, -jnp.sqrt(sr / jnp.where(sv > 0, sv, 1.0)), -1.0)
    alpha = jnp.clip(alpha, -step_max, -1.0)
    w, psi, mu = jax.tree.map(lambda a, b, c: a - 2.0 * alpha * b + alpha**2 * c, x, r, v)
    return (w, jnp.maximum(psi, floor), mu), alpha


def _gain_to_come(trace, window=_WINDOW):
    """Estimated log-likelihood gain still to come (Aitken, over blocks of iterations).

    With linear convergence at rate ``a`` per block, the gain still to come
    after a block that gained ``G`` is ``G a / (1 - a)``. Stopping on the
    last gain alone stops far from the optimum when EM is slow (``a`` close
    to 1), and single SQUAREM cycles gain erratically, hence blocks of
    ``window`` iterations: ``a`` is the ratio of the last two blocks' gains.
    The returned value includes the last block's gain.
    """
    if len(trace) < 2 * window + 1:
        return np.inf
    last = trace[-1] - trace[-1 - window]
    before = trace[-1 - window] - trace[-1 - 2 * window]
    if before <= 0:
        return last if last <= 0 else np.inf
    rate = last / before
    return last / (1.0 - rate) if rate < 1.0 else np.inf


def _iterate(params, data, step, *, isotropic, data_form, tol, max_iter, accelerate):
    """Run EM (optionally SQUAREM-accelerated) until the gain still to come is <= tol |ll|."""
    statics = {"step": step, "isotropic": isotropic, "data_form": data_form}
    x = params
    fx, ll = _em_map(x, data, **statics)
    ll = float(ll)
    if not np.isfinite(ll):
        raise FloatingPointError("The log-likelihood of the initial parameters is not finite.")
    trace = [ll]
    n_maps, step_max, converged = 1, 1.0, False
    while n_maps < max_iter:
        if accelerate and n_maps + 2 <= max_iter:
            # One EM step y = F(x), then the SQUAREM point; keep the better.
            fy, ll_y = _em_map(fx, data, **statics)
            xp, alpha = _extrapolate(x, fx, fy, step_max, data[-1])
            fxp, ll_p = _em_map(xp, data, **statics)
            n_maps += 2
            ll_y, ll_p = float(ll_y), float(ll_p)
            keep = np.isfinite(ll_p) and ll_p >= ll_y
            new, fnew, ll_new = (xp, fxp, ll_p) if keep else (fx, fy, ll_y)
            # Varadhan & Roland's step-length control: allow longer
            # extrapolations while they succeed at the limit, shrink on failure.
            if keep:
                if float(alpha) <= -step_max:
                    step_max *= 4.0
            else:
                step_max = max(1.0, step_max / 4.0)
        else:
            new = fx
            fnew, ll_new = _em_map(new, data, **statics)
            n_maps += 1
        ll_new = float(ll_new)
        if not ll_new >= ll:  # rounding at convergence, never a real EM decrease
            converged = True
            break
        gain = ll_new - ll
        x, fx, ll = new, fnew, ll_new
        trace.append(ll)
        if gain <= 4 * np.finfo(float).eps * abs(ll) or _gain_to_come(trace) <= tol * abs(ll):
            converged = True
            break
    return x, ll, np.array(trace), n_maps, converged


# --------------------------------------------------------------- start
def _initial(source, is_scatter, n, diag_s, k, isotropic, floor):
    """Deterministic start: the pPCA closed form (FA: on the correlation scale).

    Factor analysis is scale-equivariant, so its start is the pPCA solution
    of the standardised data, mapped back, with ``psi = diag(S) - rowsum(W^2)``
    (the FA stationarity identity ``diag(C) = diag(S)``).
    """
    d = diag_s.shape[0]
    scale = np.ones(d) if isotropic else np.sqrt(np.where(diag_s > 0, diag_s, 1.0))
    r = min(k, d) if is_scatter else min(k, n, d)
    if is_scatter:
        evals, evecs = eigh_top(source / np.outer(scale, scale), r)
        evals, evecs = evals[:r], evecs[:, :r]
    else:
        xs = source / scale
        if r + 10 <= min(n, d):
            svd = svd_randomized(xs, np.zeros(d), r, random_state=0)
        else:
            svd = svd_full(xs, np.zeros(d))
        evals, evecs = svd.singular_values[:r] ** 2 / n, svd.components[:r].T
    total = float(np.sum(diag_s / scale**2))
    sigma2 = (total - evals.sum()) / (d - k) if k < d else 0.0
    sigma2 = max(sigma2, float(np.max(floor / scale**2)))
    w = np.zeros((d, k))
    w[:, :r] = scale[:, None] * evecs * np.sqrt(np.maximum(evals - sigma2, 0.0))
    if isotropic:
        psi = np.full(d, sigma2)
    else:
        psi = np.maximum(diag_s - np.sum(w**2, axis=1), floor)
    return w, psi


def _check_init(init, d, k):
    if not isinstance(init, LowRankGaussian):
        raise TypeError(f"init must be None or a LowRankGaussian; got {type(init).__name__}.")
    w, psi, mu = (np.asarray(a, dtype=float) for a in init)
    if w.shape != (d, k) or psi.shape != (d,) or mu.shape != (d,):
        raise ValueError(
            f"init must have loadings of shape ({d}, {k}), noise and mean of shape ({d},); got "
            f"{w.shape}, {psi.shape}, {mu.shape}."
        )
    if not (np.all(np.isfinite(w)) and np.all(psi > 0) and np.all(np.isfinite(mu))):
        raise ValueError("init must have finite loadings and mean and positive noise.")
    return w, psi, mu


# --------------------------------------------------------------- driver
def fit_em(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    tol: float | None = None,
    max_iter: int = 10_000,
    floor: float | None = None,
    form: str = "auto",
    accelerate: bool = True,
    init: LowRankGaussian | None = None,
) -> Fit:
    """Maximum likelihood for pPCA or factor analysis by EM, with NaN as missing values.

    Parameters
    ----------
    prepared : Prepared
        Data (:func:`bayespca.statistics.prepare`); NaN marks a missing entry
        (missing at random). A feature must have at least one observed value.
    spec : ModelSpec
        ``noise``: ``"isotropic"`` for pPCA (``Psi = sigma^2 I``),
        ``"diagonal"`` for factor analysis; ``n_components`` ``k`` in ``[1, d]``.
    tol : float or None, default=None
        Stop when the estimated log-likelihood gain still to come is at most
        ``tol * |log-likelihood|``: the gain ``G`` of the last 5 iterations
        plus Aitken's extrapolation ``G a / (1 - a)``, with ``a`` the ratio
        of the gains of the last two blocks of 5 iterations (or when a step
        gains nothing beyond rounding). None: 1e-10 for complete data, where
        an iteration costs O(d^2 k), and 1e-8 with missing values, where it
        costs O(n d k^2).
    max_iter : int, default=10000
        Maximum number of EM updates (an accelerated cycle counts 2).
    floor : float or None, default=None
        Lower bound on ``psi_j`` relative to the variance of feature ``j``
        (:func:`~bayespca.inference.closed_form.noise_floor`); None gives
        1e-10 for pPCA and 1e-6 for FA.
    form : {"auto", "scatter", "data"}, default="auto"
        Complete data only. ``"scatter"`` forms ``S`` once, then O(d^2 k) per
        iteration; ``"data"`` never forms ``S``, O(n d k) per iteration;
        ``"auto"`` takes ``"scatter"`` when ``d <= n``.
    accelerate : bool, default=True
        SQUAREM extrapolation (monotone; see the module notes).
    init : LowRankGaussian or None
        Starting parameters in data units; by default the closed-form pPCA
        solution of the (mean-imputed; for FA standardised) data.

    Returns
    -------
    Fit
        In data units; ``W`` in canonical orientation
        (:func:`bayespca.gaussian.canonical_loadings`).

    Warns
    -----
    ConvergenceWarning
        When ``max_iter`` is reached first.
    UserWarning
        When a noise variance ends at the floor (Heywood case for FA).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((300, 2)) @ rng.standard_normal((2, 5))
    >>> X = X + rng.standard_normal((300, 5)) * [0.3, 0.5, 0.4, 0.6, 0.2]
    >>> from bayespca.statistics import prepare
    >>> fit = fit_em(prepare(X), ModelSpec("diagonal", 2))
    >>> w, psi = fit.gaussian.loadings, fit.gaussian.noise
    >>> diag_c = np.sum(w**2, axis=1) + psi
    >>> bool(fit.converged), bool(np.allclose(diag_c, X.var(axis=0), rtol=1e-2))
    (True, True)
    """
    noise = spec.noise
    if noise not in NOISE_KINDS:
        raise ValueError(f"noise must be one of {list(NOISE_KINDS)}; got {noise!r}.")
    if form not in FORMS:
        raise ValueError(f"form must be one of {list(FORMS)}; got {form!r}.")
    if tol is not None and not (np.isscalar(tol) and tol >= 0):
        raise ValueError(f"tol must be None or a float >= 0; got {tol!r}.")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int | np.integer) or max_iter < 1:
        raise ValueError(f"max_iter must be an int >= 1; got {max_iter!r}.")
    X = prepared.X
    n, d = X.shape
    k = check_n_components(spec.n_components, d, "n_features")
    isotropic = noise == "isotropic"
    rel_floor = DEFAULT_FLOOR[noise] if floor is None else float(floor)
    if not rel_floor > 0:
        raise ValueError(f"floor must be a float > 0; got {floor!r}.")
    has_missing = prepared.missing is not None
    n_obs = prepared.n_observed
    if np.any(n_obs == 0):
        raise ValueError(
            "X has features with no observed value (columns "
            f"{np.flatnonzero(n_obs == 0)[:10].tolist()})."
        )
    # Centre on the observed means: the fit is translation-equivariant, and
    # centred numbers keep psi_j = (sum x^2 - w~^T b) / n_j accurate.
    centre = prepared.mean
    var = prepared.variances
    data_form = (form == "data") or (form == "auto" and d > n)
    if has_missing or data_form:  # the rows themselves (a backend's rows: bayespca.chunked.in_memory)
        X = in_memory(X, "EM with missing values or with more features than rows")
        obs = ~np.isnan(X)
        x0 = np.where(obs, X - centre, 0.0) if has_missing else X - centre
    floor_vec = noise_floor(var, rel_floor)
    if isotropic:
        floor_vec = np.full(d, float(noise_floor(np.array([var.mean()]), rel_floor)[0]))
    if tol is None:
        tol = DEFAULT_TOL[has_missing]

    if has_missing:
        step = _missing_step
        data = (
            jnp.asarray(x0), jnp.asarray(obs), jnp.asarray(obs, dtype=float),
            jnp.asarray(n_obs, dtype=float), jnp.asarray(np.sum(x0**2, axis=0)),
            jnp.asarray(floor_vec),
        )
        data_form = False
    else:
        step = _complete_step
        source = x0 if data_form else prepared.stats.scatter / n
        data = (jnp.asarray(source), jnp.asarray(var), float(n), jnp.asarray(floor_vec))

    if init is None:
        if not (has_missing or data_form):
            src, is_scatter = source, True
        elif d > n or data_form:
            src, is_scatter = x0, False
        else:
            src, is_scatter = (x0.T @ x0) / n, True
        w0, psi0 = _initial(src, is_scatter, n, var, k, isotropic, floor_vec)
        mu0 = np.zeros(d)
    else:
        w0, psi0, mu0 = _check_init(init, d, k)
        w0, psi0, mu0 = w0 / prepared.scale, psi0 / prepared.scale**2, mu0 / prepared.scale
        mu0 = mu0 - centre
        psi0 = np.full(d, psi0.mean()) if isotropic else psi0
        psi0 = np.maximum(psi0, floor_vec)
        if not has_missing:
            mu0 = np.zeros(d)  # the ML mean of complete data is the sample mean
    params = (jnp.asarray(w0), jnp.asarray(psi0), jnp.asarray(mu0))
    x, ll, trace, n_maps, converged = _iterate(
        params, data, step, isotropic=isotropic, data_form=data_form, tol=tol,
        max_iter=max_iter, accelerate=accelerate,
    )
    w, psi, mu = (np.asarray(a) for a in x)
    g = canonical_loadings(LowRankGaussian(w, psi, mu + centre))
    at_floor = psi <= floor_vec * (1.0 + 1e-9)
    if not converged:
        warnings.warn(
            f"EM did not converge in max_iter={max_iter} iterations (last relative log-likelihood "
            f"gain above tol={tol}); increase max_iter or tol.",
            ConvergenceWarning,
            stacklevel=2,
        )
    if at_floor.any():
        what = (
            "the noise variance sigma^2 reached its lower bound "
            "(the data have rank <= n_components)"
            if isotropic
            else f"features {np.flatnonzero(at_floor)[:10].tolist()} have noise variance at the "
            "lower bound (Heywood case: they are explained almost exactly by the factors)"
        )
        warnings.warn(
            f"{what}; floor = {rel_floor:g} x feature variance.", UserWarning, stacklevel=2
        )
    fit = Fit(g, ll, "em", n_maps, converged, trace, at_floor)
    return fit.to_data_units(prepared.scale, prepared.total_observed)
