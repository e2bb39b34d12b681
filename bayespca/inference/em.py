"""EM for probabilistic PCA and factor analysis, with complete or missing data (NumPy/SciPy).

Both models are ``x = W z + mu + eps``, ``z ~ N(0, I_k)``, ``eps ~ N(0, Psi)``
with ``Psi = sigma^2 I`` (pPCA, ``noise="isotropic"``) or diagonal (FA,
``noise="diagonal"``). With ``A = Psi^{-1} W`` and ``M = I + W^T A``:

Complete data (Rubin & Thayer 1982; Tipping & Bishop 1999). The data enter
only through ``S = Xc^T Xc / n``, and only as the product ``S A``::

    B     = S A M^{-1}                      (= sum_i (x_i - mu) E[z_i]^T / n)
    C_zz  = M^{-1} + M^{-1} A^T B           (= sum_i E[z_i z_i^T] / n)
    W'    = B C_zz^{-1}
    psi'  = diag(S) - rowsum(W' * B)        (pPCA: sigma'^2 = mean of psi')

at O(d^2 k) per iteration with ``S`` formed once (``form="scatter"``) or
O(n d k) as ``Xc^T (Xc A) / n`` without ever forming ``S`` (``form="data"``,
for ``d > n``). Factor analysis of complete data does not iterate EM: its
likelihood is maximised over ``psi`` alone by Newton's method
(:mod:`bayespca.inference.factor_ml`), which converges where EM crawls.

Missing data (exact EM for data missing at random; Dempster, Laird &
Rubin 1977, section 4.1.3). The missing entries, not ``z``, are the missing
data: the E-step is the expected complete-data statistics given the
observed entries (:func:`bayespca.gaussian.expected_statistics`: imputed
rows ``E[x_i | x_{i,O}]`` and the conditional covariance of each row's
missing block), and the M-step the complete-data maximum at them: the pPCA
closed form, or the factor-analysis Newton fit. The usual EM over ``z``
(Tipping & Bishop 1999, appendix) converges at a rate set by the
information in ``z``, close to 1 when the noise is small against the
signal (measured: 0.92 per iteration on 20000 x 100, k = 10, 20% missing;
8285 updates for the FA example of issue 14); over the missing entries the
rate is the fraction of information missing (0.07 and 33 updates there).
Cost per iteration: O(n d k^2) for the latent posteriors plus one
O(n d^2 k) matrix product for the missing-block covariances.

The start is the complete-data maximum at the *pairwise* covariance, each
entry averaged over the rows where both features are observed: unlike mean
imputation, which shrinks every covariance by the fraction observed, it is
unbiased, and EM starts near the optimum (mean imputation started the
issue-14 example 1000 nats below it, where EM stopped).

Acceleration. EM converges linearly, slowly when the noise is small against
the signal or a ``psi_j`` approaches 0. Each cycle therefore tries a SQUAREM
extrapolation (Varadhan & Roland 2008) ``x - 2 a r + a^2 v`` from two EM
steps and keeps it only if its log-likelihood beats the plain EM step; so
the recorded log-likelihood trace never decreases.

Convergence. EM's steps shrink geometrically, so a small step or gain says
little about the distance to the optimum when the rate is close to 1, and
the log-likelihood, quadratic in that distance, stops changing in floating
point long before the parameters settle. EM stops when the distance of the
parameters to the fixed point, bounded by ``|F(x) - x| / (1 - r)`` with
``r`` the contraction rate measured from two consecutive EM steps, is below
``tol``: in the working units of the fit (power-of-two scaled data) for
``W`` and ``mu``, relatively for ``psi``. It means the same at any ``n``,
``d`` and scale of the data.

Heywood cases. ``psi_j`` is bounded below by ``floor * var_j``
(:func:`bayespca.inference.closed_form.noise_floor`); the constrained M-step
is still an exact M-step (the expected complete log-likelihood is unimodal
in each ``psi_j``), so monotonicity is kept. Features at the bound are
reported.

References
----------
A. P. Dempster, N. M. Laird, D. B. Rubin (1977). Maximum likelihood from
incomplete data via the EM algorithm. J. R. Stat. Soc. B 39(1), 1-38.
D. B. Rubin, D. T. Thayer (1982). EM algorithms for ML factor analysis.
Psychometrika 47(1), 69-76.
M. E. Tipping, C. M. Bishop (1999). Probabilistic principal component
analysis. J. R. Stat. Soc. B 61(3), 611-622.
R. Varadhan, C. Roland (2008). Simple and globally convergent methods for
accelerating the convergence of any EM algorithm. Scand. J. Stat. 35(2),
335-353.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning

from bayespca.chunked import in_memory, is_chunked, reduce_row_blocks
from bayespca.gaussian import (
    LowRankGaussian,
    canonical_loadings,
    expected_statistics,
    log_likelihood_from_stats,
    log_prob,
    whiten,
)
from bayespca.inference.closed_form import check_n_components, noise_floor, ppca_from_spectrum
from bayespca.inference.contract import NOISE_KINDS, Fit, ModelSpec
from bayespca.inference.factor_ml import fit_covariance, fit_factor_analysis
from bayespca.inference.threads import serial_blas
from bayespca.linalg import eigh_top
from bayespca.messages import warn
from bayespca.params import check_choice, check_number
from bayespca.statistics import Prepared, pooled_statistics

__all__ = ["DEFAULT_FLOOR", "DEFAULT_TOL", "fit_em", "pairwise_covariance"]

FORMS = ("auto", "scatter", "data")
DEFAULT_FLOOR = {"isotropic": 1e-10, "diagonal": 1e-9}
DEFAULT_TOL = 1e-9  # estimated distance of the parameters to the EM fixed point
_NOISY_STEP = 1e-11  # steps this small are too noisy to measure the rate from
_STALLED = 1e-6  # step size below which a stop forced by rounding still counts as converged
_M_STEP_TOL = 1e-12  # Newton tolerance of the factor-analysis M-step
_START_FLOOR = 5e-3  # uniquenesses of the start, relative to each variance, at least this


class _Problem(NamedTuple):
    """Centred working-unit data and what each EM map needs."""

    x0: np.ndarray | None  # (n, d) centred on the observed means, 0 at missing entries (None: scatter form)
    observed: np.ndarray | None  # (n, d) bool, None for complete data
    source: np.ndarray  # complete data: S (d, d) or x0 (data form)
    var: np.ndarray  # (d,) observed-entry variances
    sum_sq: np.ndarray  # (d,) sums of squares of the observed entries
    n_obs: np.ndarray  # (d,) observed entries per feature
    floor: np.ndarray  # (d,) lower bounds of psi
    isotropic: bool
    data_form: bool


# --------------------------------------------------------------- EM maps
def _noise_update(psi_new, prob: _Problem):
    if prob.isotropic:
        psi_new = np.full_like(psi_new, np.sum(prob.n_obs * psi_new) / np.sum(prob.n_obs))
    return np.maximum(psi_new, prob.floor)


def _complete_map(params, prob: _Problem):
    """One EM update from complete data; returns (new params, log-likelihood at params)."""
    w, psi, mu = params
    g = LowRankGaussian(w, psi, mu)
    n = prob.n_obs[0]  # complete data: every feature observed in every row
    if prob.data_form:
        ll = float(np.sum(log_prob(g, prob.x0)))
    else:
        ll = float(log_likelihood_from_stats(g, n, mu, n * prob.source))
    # The update in the whitened frame of bayespca.gaussian.whiten, where M is
    # diagonal and well factorised; W' is rotated back at the end (EM is
    # equivariant, and SQUAREM needs consecutive iterates in one orientation).
    wh = whiten(g)
    scaled = wh.loadings / wh.sd[:, None]  # Psi^{-1} W R
    if prob.data_form:
        sa = prob.source.T @ (prob.source @ scaled) / n
    else:
        sa = prob.source @ scaled
    b = _chol_solve(wh.chol, sa.T).T
    k = w.shape[1]
    czz = _chol_solve(wh.chol, np.eye(k) + scaled.T @ b)
    czz = 0.5 * (czz + czz.T)
    w_rot = np.linalg.solve(czz, b.T).T
    psi_new = _noise_update(prob.var - np.sum(w_rot * b, axis=1), prob)
    return (w_rot @ wh.rotation.T, psi_new, mu), ll


def _chol_solve(chol, b):
    return scipy.linalg.cho_solve((chol, True), b, check_finite=False)


def _missing_map(params, prob: _Problem):
    """One EM update over the missing entries: expected statistics, then the complete-data maximum."""
    w, psi, mu = params
    g = LowRankGaussian(w, psi, mu)
    if is_chunked(prob.x0):  # by blocks of rows on the workers, pooled there
        block_fn = functools.partial(expected_statistics, g)
        stats, ll = reduce_row_blocks(block_fn, _pool, prob.x0, prob.observed)
    else:
        stats, ll = expected_statistics(g, prob.x0, prob.observed)
    w_new, psi_new = _maximise(stats.scatter / stats.n, w.shape[1], prob, start=psi)
    return (_align(w_new, w), psi_new, stats.mean), float(ll)


def _pool(a, b):
    """Expected statistics and log-likelihoods of two blocks of rows together."""
    return pooled_statistics(a[0], b[0]), a[1] + b[1]


def _maximise(cov, k, prob: _Problem, start=None):
    """Complete-data maximum likelihood at covariance ``cov``: pPCA closed form or FA by Newton."""
    if prob.isotropic:
        lam, axes = eigh_top(cov, k)
        sol = ppca_from_spectrum(lam[:k], axes[:, :k], float(np.trace(cov)), float(prob.floor[0]))
        return sol.loadings, np.full(cov.shape[0], sol.sigma2)
    starts = None if start is None else [start]
    fit = fit_covariance(cov, k, prob.floor, starts=starts, tol=_M_STEP_TOL)
    return fit.loadings, fit.noise


def _align(w_new, w_old):
    """``w_new`` rotated to the orientation closest to ``w_old`` (orthogonal Procrustes).

    The EM map is then continuous in its argument, as extrapolation needs;
    the Gaussian does not depend on the rotation.
    """
    u, _, vt = np.linalg.svd(w_new.T @ w_old)
    return w_new @ (u @ vt)


def _extrapolate(x, fx, fy, step_max, floor):
    """SQUAREM point ``x - 2 a r + a^2 v`` from ``x``, ``F(x)``, ``F(F(x))``.

    ``r = F(x) - x``, ``v = F(F(x)) - 2 F(x) + x`` and ``a = -|r| / |v|``
    clipped to ``[-step_max, -1]``; ``a = -1`` gives ``F(F(x))`` itself.
    """
    r = [b - a for a, b in zip(x, fx, strict=True)]
    v = [c - 2.0 * b + a for a, b, c in zip(x, fx, fy, strict=True)]
    sr = sum(float(np.sum(t**2)) for t in r)
    sv = sum(float(np.sum(t**2)) for t in v)
    alpha = -np.sqrt(sr / sv) if sv > 0 else -1.0
    alpha = float(np.clip(alpha, -step_max, -1.0))
    w, psi, mu = (a - 2.0 * alpha * b + alpha**2 * c for a, b, c in zip(x, r, v, strict=True))
    return (w, np.maximum(psi, floor), mu), alpha


def _step_size(x, fx) -> float:
    """Size of the EM step ``F(x) - x``: largest change of W or mu (working units) or of log psi."""
    (w, psi, mu), (fw, fpsi, fmu) = x, fx
    return float(max(np.max(np.abs(fw - w), initial=0.0), np.max(np.abs(fmu - mu), initial=0.0),
                     np.max(np.abs(fpsi - psi) / psi)))


def _rate(previous, size, next_size):
    """EM's contraction rate from two consecutive step sizes (kept while the steps are rounding noise)."""
    if size <= _NOISY_STEP:
        return previous
    return min(next_size / size, 1.0)


def _iterate(params, prob: _Problem, step, *, tol, max_iter, accelerate):
    """Run EM (optionally SQUAREM-accelerated) until the estimated distance to the fixed point is <= tol.

    Near the fixed point ``x*`` of the EM map ``F``, which contracts at a rate
    ``r`` (estimated from two consecutive EM steps, ``|F(F(x)) - F(x)| /
    |F(x) - x|``), ``|x - x*| <= |F(x) - x| / (1 - r)``. Stopping on that
    bound, and not on the change of the log-likelihood, which is quadratic
    in the distance and drowns in rounding long before the parameters
    settle, gives parameters accurate to ``tol`` whatever the rate.
    """
    x = params
    fx, ll = step(x, prob)
    if not np.isfinite(ll):
        raise FloatingPointError(
            "The log-likelihood of the initial parameters is not finite; give a finite `init` "
            "with positive noise."
        )
    trace = [ll]
    n_maps, step_max, rate = 1, 1.0, 1.0
    rounding = 64 * np.finfo(float).eps
    while n_maps < max_iter:
        size = _step_size(x, fx)
        if size <= rounding or size <= tol * (1.0 - rate):
            return x, ll, np.array(trace), n_maps, True
        if accelerate and n_maps + 2 <= max_iter:
            # One EM step y = F(x), then the SQUAREM point; keep the better.
            fy, ll_y = step(fx, prob)
            rate = _rate(rate, size, _step_size(fx, fy))
            xp, alpha = _extrapolate(x, fx, fy, step_max, prob.floor)
            fxp, ll_p = step(xp, prob)
            n_maps += 2
            # (Within rounding of each other the two are equally good, and the
            # extrapolation is the one that converges.)
            keep = np.isfinite(ll_p) and ll_p >= ll_y - rounding * abs(ll_y)
            new, fnew, ll_new = (xp, fxp, ll_p) if keep else (fx, fy, ll_y)
            # Varadhan & Roland's step-length control: allow longer
            # extrapolations while they succeed at the limit, shrink on failure.
            if keep:
                if alpha <= -step_max:
                    step_max *= 4.0
            else:
                step_max = max(1.0, step_max / 4.0)
        else:
            new = fx
            fnew, ll_new = step(new, prob)
            rate = _rate(rate, size, _step_size(new, fnew))
            n_maps += 1
        if ll_new < ll - rounding * abs(ll):  # EM never decreases the likelihood beyond rounding
            return x, ll, np.array(trace), n_maps, size <= _STALLED
        x, fx, ll = new, fnew, max(ll_new, ll)
        trace.append(ll)
    return x, ll, np.array(trace), n_maps, False


# --------------------------------------------------------------- start
def pairwise_covariance(x0: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """Covariance of centred data with missing entries, each entry over the rows observing both.

    ``S_jl = sum_i o_ij o_il x_ij x_il / sum_i o_ij o_il`` (available-case
    estimate; 0 where no row observes both). Unbiased under missingness at
    random, unlike the covariance of mean-imputed data, but not always
    positive semi-definite.

    Parameters
    ----------
    x0 : ndarray of shape (n, d)
        Centred data with 0 at missing entries.
    observed : ndarray of bool, shape (n, d)

    Examples
    --------
    >>> x0 = np.array([[1.0, 2.0], [-1.0, 0.0], [0.0, -2.0]])
    >>> pairwise_covariance(x0, np.array([[True, True], [True, False], [True, True]]))
    array([[0.66666667, 1.        ],
           [1.        , 4.        ]])
    """
    o = observed.astype(float)
    counts = o.T @ o
    return (x0.T @ x0) / np.maximum(counts, 1.0)


def _initial(cov, k, prob: _Problem):
    """Deterministic start: the complete-data maximum at ``cov``.

    For factor analysis with uniquenesses held above ``_START_FLOOR`` of each
    variance (R's ``factanal`` bound): a start with a Heywood case traps EM
    over missing entries (the missing values of a feature explained exactly
    are imputed exactly, which keeps it explained exactly; measured: 870
    nats below the optimum), while EM moves a ``psi_j`` to its floor from
    above when the data want it.
    """
    if prob.isotropic:
        return _maximise(cov, k, prob)
    fit = fit_covariance(cov, k, np.maximum(prob.floor, _START_FLOOR * np.diag(cov)))
    return fit.loadings, fit.noise


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
def _problem(prepared: Prepared, isotropic: bool, rel_floor: float, form: str) -> tuple[_Problem, np.ndarray]:
    """Centre the working-unit data on the observed means; returns the problem and the centre."""
    X = prepared.X
    n, d = X.shape
    observed = prepared.observed
    n_obs = prepared.n_observed.astype(float)
    if np.any(n_obs == 0):
        raise ValueError(
            "X has features with no observed value (columns "
            f"{np.flatnonzero(n_obs == 0)[:10].tolist()})."
        )
    # Centre on the observed means: the fit is translation-equivariant, and
    # centred numbers keep psi_j = (sum x^2 - w~^T b) / n_j accurate.
    centre = prepared.mean
    data_form = observed is None and (form == "data" or (form == "auto" and d > n))
    if observed is None and not data_form:  # the reduced statistics suffice (and stay on a backend's side)
        x0, var = None, prepared.variances
        sum_sq = var * n_obs
        source = prepared.stats.scatter / n
    elif is_chunked(X) and observed is not None:
        import dask.array as da

        # Dask rows with missing values stay on the workers: every E-step is a tree reduction.
        x0 = da.where(observed, X - centre, 0.0)
        sum_sq = np.asarray((x0**2).sum(axis=0).compute())
        var = sum_sq / n_obs
        source = x0
    else:  # the rows themselves (a backend's rows are brought here: bayespca.chunked.in_memory)
        X = in_memory(X, "EM with more features than rows")
        x0 = X - centre if observed is None else np.where(observed, X - centre, 0.0)
        sum_sq = np.einsum("ij,ij->j", x0, x0)
        var = sum_sq / n_obs
        source = x0
    floor = noise_floor(var, rel_floor)
    if isotropic:
        floor = np.full(d, float(noise_floor(np.array([var.mean()]), rel_floor)[0]))
    prob = _Problem(x0, observed, source, var, sum_sq, n_obs, floor, isotropic, data_form)
    return prob, centre


def _start(prob: _Problem, k: int):
    if prob.observed is not None:
        # Two n x d x d products, on one BLAS thread as the E-steps that follow: on a loaded 2-core
        # machine two threads took 0.1-0.9 s at 20000 x 100 against 0.02-0.04 s (quiet: the same).
        with serial_blas(0):
            cov = pairwise_covariance(prob.x0, prob.observed)
            return _initial(np.asarray(cov.compute()) if is_chunked(cov) else cov, k, prob)
    if not prob.data_form:
        return _initial(prob.source, k, prob)
    # d > n (pPCA): the top eigenpairs of S from the thin SVD of x0
    n, d = prob.x0.shape
    _, s, vt = np.linalg.svd(prob.x0, full_matrices=False)
    lam = np.zeros(k)
    axes = np.zeros((d, k))
    r = min(k, s.size)
    lam[:r], axes[:, :r] = s[:r] ** 2 / n, vt[:r].T
    sol = ppca_from_spectrum(lam, axes, float(np.sum(prob.var)), float(prob.floor[0]))
    return sol.loadings, np.full(d, sol.sigma2)


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
        EM stops when the estimated distance of the parameters to the EM
        fixed point (module notes; ``W`` and ``mu`` in working units, ``psi``
        relative) is at most ``tol``, or when a step changes nothing beyond
        rounding. None: 1e-9. Factor analysis of complete data uses Newton's
        method instead (:func:`bayespca.inference.factor_ml.fit_factor_analysis`,
        where ``tol`` bounds the scaled gradient, default 1e-11).
    max_iter : int, default=10000
        Maximum number of EM updates (an accelerated cycle counts 2).
    floor : float or None, default=None
        Lower bound on ``psi_j`` relative to the variance of feature ``j``, in
        ``(0, 1)`` (:func:`~bayespca.inference.closed_form.noise_floor`); None gives
        1e-10 for pPCA and 1e-6 for FA.
    form : {"auto", "scatter", "data"}, default="auto"
        Complete data only. ``"scatter"`` forms ``S`` once, then O(d^2 k) per
        iteration; ``"data"`` never forms ``S``, O(n d k) per iteration;
        ``"auto"`` takes ``"scatter"`` when ``d <= n``.
    accelerate : bool, default=True
        SQUAREM extrapolation (monotone; see the module notes).
    init : LowRankGaussian or None
        Starting parameters in data units; by default the closed-form pPCA
        solution of the (pairwise, for missing values) sample covariance, for
        FA on the correlation scale.

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
    >>> X[rng.random(X.shape) < 0.1] = np.nan
    >>> from bayespca.statistics import prepare
    >>> fit = fit_em(prepare(X), ModelSpec("diagonal", 2))
    >>> bool(fit.converged), bool(np.all(np.diff(fit.trace) >= 0))
    (True, True)
    """
    noise = check_choice(spec.noise, "noise", NOISE_KINDS)
    check_choice(form, "form", FORMS)
    tol = check_number(tol, "tol", low=0.0, allow_none=True)
    max_iter = check_number(max_iter, "max_iter", integer=True, low=1)
    rel_floor = check_number(
        DEFAULT_FLOOR[noise] if floor is None else floor, "floor", low=0.0, high=1.0, low_open=True,
        high_open=True,
    )
    accelerate = bool(accelerate)
    n, d = prepared.n, prepared.d
    k = check_n_components(spec.n_components, d, "n_features")
    isotropic = noise == "isotropic"
    has_missing = prepared.missing is not None
    if init is not None:
        init = _check_init(init, d, k)
    if not (isotropic or has_missing):
        start = None if init is None else LowRankGaussian(*init)
        return fit_factor_analysis(prepared, spec, tol=tol, max_iter=max_iter, floor=rel_floor, init=start)
    prob, centre = _problem(prepared, isotropic, rel_floor, form)
    if tol is None:
        tol = DEFAULT_TOL
    if init is None:
        w0, psi0 = _start(prob, k)
        mu0 = np.zeros(d)
    else:
        units = (prepared.scale, prepared.scale**2, prepared.scale)
        w0, psi0, mu0 = (a / s for a, s in zip(init, units, strict=True))
        mu0 = mu0 - centre if has_missing else np.zeros(d)  # complete data: the ML mean is xbar
        psi0 = np.full(d, psi0.mean()) if isotropic else psi0
        psi0 = np.maximum(psi0, prob.floor)
    step = _missing_map if has_missing else _complete_map
    # Largest call of one map: S A or Xc^T (Xc A). With missing values the E-step is many calls on
    # blocks of rows, much of it elementwise; a second BLAS thread made it slower, not faster
    # (20000 x 100, 20% missing, k = 10, 2 cores: PPCA 3.2-4.3 s against 2.1 s on one thread).
    flops = 0 if has_missing else (n * d * k if prob.data_form else d * d * k)
    with serial_blas(flops):
        x, ll, trace, n_maps, converged = _iterate(
            (w0, psi0, mu0), prob, step, tol=tol, max_iter=max_iter, accelerate=accelerate
        )
    w, psi, mu = x
    at_floor = psi <= prob.floor * (1.0 + 1e-9)
    _warn(converged, max_iter, tol, at_floor, isotropic, rel_floor)
    g = canonical_loadings(LowRankGaussian(w, psi, mu + centre))
    fit = Fit(g, ll, "em", n_maps, converged, trace, at_floor)
    return fit.to_data_units(prepared.scale, prepared.total_observed)


def _warn(converged, max_iter, tol, at_floor, isotropic, rel_floor):
    if not converged:
        warn(
            f"EM did not converge in max_iter={max_iter} iterations (estimated distance to the "
            f"optimum above tol={tol:g}); increase max_iter or tol.",
            ConvergenceWarning,
        )
    if at_floor.any():
        what = (
            "the noise variance sigma^2 reached its lower bound "
            "(the data have rank <= n_components)"
            if isotropic
            else f"features {np.flatnonzero(at_floor)[:10].tolist()} have noise variance at the "
            "lower bound (Heywood case: they are explained almost exactly by the factors)"
        )
        warn(f"{what}; floor = {rel_floor:g} x feature variance.", UserWarning)
