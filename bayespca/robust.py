"""Robust probabilistic PCA: pPCA with multivariate Student-t rows.

The model (Archambeau, Delannay & Verleysen 2006) gives each row its own
precision scale ``u_i``::

    u_i ~ Gamma(nu / 2, nu / 2),   z_i | u_i ~ N(0, I_k / u_i),
    x_i | z_i, u_i ~ N(W z_i + mu, sigma^2 I / u_i)
    =>  x_i ~ t_nu(mu, C),   C = W W^T + sigma^2 I,

a multivariate t with ``nu`` degrees of freedom and scale matrix ``C``. A
row far from the subspace (large Mahalanobis distance
``delta_i = (x_i - mu)^T C^{-1} (x_i - mu)``) is explained by a small
``u_i`` instead of by rotating ``W`` towards it: its expected scale

    E[u_i | x_i] = (nu + p_i) / (nu + delta_i)         (p_i observed entries)

is the weight it gets in the fit (``row_weights_``), near 0 for gross
outliers and near 1 for typical rows. As ``nu -> inf`` the model is pPCA.

The density (:func:`student_t_log_prob`) is computed from the Gaussian of
:mod:`bayespca.gaussian` (Woodbury identity and determinant lemma):
``log N(x | mu, C)`` at ``x`` and at ``mu`` give ``delta`` and ``log|C|``, so
one row costs O(d k) after an O(d k^2) set-up, and a row with missing
entries (NaN) is the t of its observed block.

Methods (:class:`RobustPPCA`):

* ``"em"``: ECME (Liu & Rubin 1995). Given the weights ``E[u_i | x_i]``,
  the M-step for ``(W, sigma^2, mu)`` is exact pPCA of the weighted rows
  (:func:`bayespca.inference.weighted.weighted_ppca`); ``nu`` (unless fixed)
  then maximises the observed log-likelihood itself, a 1-D search. Each
  cycle costs O(n d^2 + d^3) and never lowers the log-likelihood.
* ``"svi"`` and ``"nuts"``: the NumPyro model
  :func:`bayespca.models.robust_ppca` (pPCA's model with its likelihood
  replaced by the marginal multivariate t). The t does not reduce to
  sufficient statistics (each row has its own weight), so one gradient of
  the log joint costs O(n d k + d k^2): linear in ``n``, unlike the Gaussian
  models' O(d^2 k).

References
----------
C. Archambeau, N. Delannay, M. Verleysen (2006). Robust probabilistic
projections. ICML, 33-40.
C. Liu, D. B. Rubin (1995). ML estimation of the t distribution using EM and
its extensions, ECM and ECME. Statistica Sinica 5, 19-39.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
import scipy.special
from scipy import optimize
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin

from bayespca import gaussian
from bayespca.data import as_float_matrix, check_is_fitted, validate_transform
from bayespca.gaussian import LowRankGaussian
from bayespca.inference.closed_form import check_rows_leave_noise
from bayespca.inference.contract import IDENTIFICATIONS, Draws, Fit, ModelSpec
from bayespca.inference.threads import serial_blas
from bayespca.inference.weighted import weighted_ppca
from bayespca.messages import warn
from bayespca.params import check_bool, check_choice, check_number, check_sampler_options, check_seed
from bayespca.statistics import Prepared, prepare

__all__ = [
    "NU_BOUNDS",
    "RobustPPCA",
    "expected_scale",
    "fit_robust_em",
    "fit_robust_nuts",
    "fit_robust_svi",
    "student_t_from_gaussian",
    "student_t_log_prob",
]

#: Range of ``nu`` searched by EM: below 0.05 the tails are heavier than any
#: data need; above 1e6 the t is Gaussian to within rounding for moderate n.
NU_BOUNDS = (0.05, 1e6)
_METHODS = ("em", "svi", "nuts")
_LOG_2 = math.log(2.0)


def _distance_and_base(g: LowRankGaussian, X, observed):
    """``delta_i``, ``log N(mu_O | mu_O, C_OO)`` and ``p_i`` for each row (observed block)."""
    xp = gaussian.array_namespace(g, X, observed)[0]
    X = xp.asarray(X)
    at_mean = xp.broadcast_to(xp.asarray(g.mean), X.shape)
    if observed is None:
        base = gaussian.log_prob(g, at_mean[:1])[0]  # no quadratic term: -(p log 2 pi + log|C|) / 2
        p = xp.full(X.shape[0], X.shape[1], dtype=X.dtype)
        return -2.0 * (gaussian.log_prob(g, X) - base), base, p
    base = gaussian.log_prob(g, at_mean, observed)
    p = xp.sum(xp.asarray(observed), axis=1).astype(X.dtype)
    return -2.0 * (gaussian.log_prob(g, X, observed) - base), base, p


def _log_gamma_ratio(x, a, xp, special):
    """``lgamma(x + a) - lgamma(x)`` for ``x > 0``, to ~1e-13 from tiny ``x`` to ``x = 1e300``.

    Directly below ``x = 100``; above, the difference of Stirling's series
    ``(x - 1/2) log1p(a / x) + a log(x + a) - a + s(x + a) - s(x)`` with
    ``s(z) = 1/(12 z) - 1/(360 z^3) + 1/(1260 z^5)`` (truncation error below
    1e-17), which the difference of two huge ``lgamma`` cannot give.
    (``jax.scipy.special.betaln`` is off by up to 6e-7.)
    """
    small = x < 100.0
    xs, xl = xp.where(small, x, 100.0), xp.where(small, 100.0, x)  # both branches finite

    def series(z):
        return 1.0 / (12.0 * z) - 1.0 / (360.0 * z**3) + 1.0 / (1260.0 * z**5)

    stirling = (xl - 0.5) * xp.log1p(a / xl) + a * xp.log(xl + a) - a + series(xl + a) - series(xl)
    return xp.where(small, special.gammaln(xs + a) - special.gammaln(xs), stirling)


def _t_from_distance(delta, base, p, df, xp, special):
    """``log t_nu`` of rows from their distances ``delta``, Gaussian base terms and sizes ``p``.

    ``log t = lgamma((nu + p) / 2) - lgamma(nu / 2) + (p / 2) log(2 / nu)
    + log N(mu | mu, C) - ((nu + p) / 2) log(1 + delta / nu)``, the ratio of
    gamma functions by :func:`_log_gamma_ratio`. ``xp, special`` are JAX's
    (traceable) or NumPy's and SciPy's (EM's 1-D search over ``nu``, which
    then needs no compilation).
    """
    half_p = p / 2.0
    ratio = _log_gamma_ratio(df / 2.0, half_p, xp, special)
    value = ratio + half_p * (_LOG_2 - xp.log(df)) + base - (df / 2.0 + half_p) * xp.log1p(delta / df)
    return xp.where(p > 0, value, 0.0)


def student_t_from_gaussian(log_density: Any, log_density_at_mean: Any, n_observed: Any,
                            df: Any) -> jax.Array:
    """``log t_nu(x | mu, C)`` from the Gaussian ``log N(x | mu, C)`` and ``log N(mu | mu, C)``.

    The two Gaussian values give the Mahalanobis distance
    ``delta = -2 (log N(x) - log N(mu))`` and ``log|C|``, all the t needs
    besides ``nu`` and the number ``p`` of (observed) entries. Traceable:
    the NumPyro models take the t of any Gaussian likelihood this way.

    Examples
    --------
    >>> from scipy.stats import multivariate_normal, multivariate_t
    >>> gauss = multivariate_normal(np.zeros(2), np.eye(2))
    >>> x = np.array([1.0, 3.0])
    >>> value = student_t_from_gaussian(gauss.logpdf(x), gauss.logpdf(np.zeros(2)), 2, 5.0)
    >>> bool(np.isclose(value, multivariate_t(np.zeros(2), np.eye(2), df=5.0).logpdf(x)))
    True
    """
    delta = -2.0 * (log_density - log_density_at_mean)
    namespace = gaussian.array_namespace(log_density, log_density_at_mean, n_observed, df)
    return _t_from_distance(delta, log_density_at_mean, n_observed, df, *namespace)


def _is_infinite(df) -> bool:
    return isinstance(df, numbers.Real) and math.isinf(df)


def student_t_log_prob(g: LowRankGaussian, df: Any, X: Any, observed: Any = None) -> jax.Array:
    """Log-density of each row under the multivariate t ``t_nu(mu, W W^T + Psi)``.

    ``log t = lgamma((nu + p) / 2) - lgamma(nu / 2) - (p / 2) log(nu pi)
    - log|C| / 2 - ((nu + p) / 2) log(1 + delta / nu)`` with ``p`` the number
    of (observed) entries of the row and ``delta`` its Mahalanobis distance;
    ``nu = inf`` gives the Gaussian. Traceable and differentiable in
    ``(g, df)``.

    Parameters
    ----------
    g : LowRankGaussian
        ``(W, Psi, mu)``: the scale matrix is ``W W^T + diag(Psi)``.
    df : float or Array
        Degrees of freedom ``nu > 0``; a Python ``inf`` gives
        :func:`bayespca.gaussian.log_prob`.
    X : Array of shape (n, d)
    observed : Array of bool, shape (n, d), optional
        True where observed: a row's density is that of its observed block
        (a row with nothing observed has density 1).

    Returns
    -------
    Array of shape (n,)

    Examples
    --------
    >>> from scipy.stats import multivariate_t
    >>> g = LowRankGaussian(np.array([[1.0], [2.0]]), np.array([0.5, 0.3]), np.array([0.1, -0.2]))
    >>> x = np.array([[0.3, 4.0]])
    >>> ref = multivariate_t(g.mean, np.asarray(gaussian.covariance(g)), df=3.0).logpdf(x)
    >>> bool(np.isclose(student_t_log_prob(g, 3.0, x)[0], ref))
    True
    """
    if _is_infinite(df):
        return gaussian.log_prob(g, X, observed)
    delta, base, p = _distance_and_base(g, X, observed)
    return _t_from_distance(delta, base, p, df, *gaussian.array_namespace(g, X, observed, df))


def expected_scale(g: LowRankGaussian, df: Any, X: Any, observed: Any = None) -> jax.Array:
    """``E[u_i | x_i] = (nu + p_i) / (nu + delta_i)``: the weight of each row in the fit, shape (n,).

    Near 1 for a row as close to the subspace as the model expects, near 0
    for a gross outlier; exactly 1 for ``nu = inf``.

    Examples
    --------
    >>> g = LowRankGaussian(np.zeros((2, 1)), np.ones(2), np.zeros(2))
    >>> np.asarray(expected_scale(g, 4.0, np.array([[0.0, 0.0], [10.0, 0.0]]))).round(3).tolist()
    [1.5, 0.058]
    """
    if _is_infinite(df):
        return gaussian.array_namespace(g, X, observed)[0].ones(np.shape(X)[0])
    delta, _, p = _distance_and_base(g, X, observed)
    return (df + p) / (df + delta)


# ------------------------------------------------------------------ EM
def _best_nu(delta: np.ndarray, base: float, d: int) -> tuple[float, float]:
    """``nu`` maximising the t log-likelihood of rows with distances ``delta``, and that maximum.

    A bounded Brent search over ``log nu`` in :data:`NU_BOUNDS`.
    """
    delta = np.asarray(delta, dtype=float)
    p = float(d)  # every row complete: the gamma-function terms are one scalar

    def negative(log_nu):
        return -float(np.sum(_t_from_distance(delta, base, p, math.exp(log_nu), np, scipy.special)))

    lo, hi = (math.log(b) for b in NU_BOUNDS)
    res = optimize.minimize_scalar(negative, bounds=(lo, hi), method="bounded", options={"xatol": 1e-9})
    return math.exp(res.x), -float(res.fun)


def fit_robust_em(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    nu: float | None = None,
    tol: float = 1e-10,
    max_iter: int = 2000,
    floor: float = 1e-10,
) -> Fit:
    """Maximum likelihood of the Student-t pPCA by ECME (module docstring).

    Parameters
    ----------
    prepared : Prepared
        Complete data (no NaN).
    spec : ModelSpec
        ``noise="isotropic"``, ``n_components`` ``k`` in ``[1, d - 1]``.
    nu : float or None, default=None
        Fixed degrees of freedom (``inf`` for pPCA), or None to estimate
        ``nu`` within :data:`NU_BOUNDS`.
    tol : float, default=1e-10
        Stop when a cycle raises the log-likelihood by at most
        ``tol * |log-likelihood|``.
    max_iter : int, default=2000
    floor : float, default=1e-10
        Lower bound on ``sigma^2`` relative to the mean feature variance.

    Returns
    -------
    Fit
        In data units; ``details`` holds ``{"nu": nu, "row_weights": E[u_i | x_i]}``
        at the fitted point; ``trace`` the log-likelihood per cycle (non-decreasing).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((300, 1)) @ [[3.0, 1.0, 0.0]] + 0.3 * rng.standard_normal((300, 3))
    >>> X[:15] += 50 * rng.standard_normal((15, 3))  # 5% gross outliers
    >>> fit = fit_robust_em(prepare(X), ModelSpec("isotropic", 1))
    >>> w = fit.gaussian.loadings[:, 0]
    >>> round(float(abs(w @ [3.0, 1.0, 0.0]) / np.linalg.norm(w) / np.sqrt(10)), 4)  # cos to the truth
    1.0
    """
    if prepared.missing is not None:
        raise ValueError(
            f"method='em' needs complete data, but X has {int(prepared.missing.sum())} missing (NaN) "
            "entries; use method='svi' or 'nuts', whose likelihood is the t of each row's observed block."
        )
    X = prepared.X
    n, d = X.shape
    k = spec.n_components
    tol = check_number(tol, "tol", low=0)
    max_iter = check_number(max_iter, "max_iter", integer=True, low=1)
    bound = floor * max(float(np.mean(prepared.variances)), np.finfo(float).tiny)
    g = weighted_ppca(X, np.ones(n), float(n), k, bound)
    df = math.inf if nu is None else float(nu)
    trace: list[float] = []
    converged = False
    # Small d x d products and eigenproblems: threading them only adds synchronisation, and on a
    # machine with more busy threads than cores it made each cycle ~30x slower (measured).
    with serial_blas(0):
        for _ in range(max_iter):
            delta, base, _ = (np.asarray(a) for a in _distance_and_base(g, X, None))
            if nu is None:
                df, ll = _best_nu(delta, float(base), d)
            else:
                ll = float(np.sum(student_t_log_prob(g, df, X)))
            if trace and ll - trace[-1] <= tol * abs(ll):
                trace.append(max(ll, trace[-1]))
                converged = True
                break
            trace.append(ll)
            weights = np.ones(n) if math.isinf(df) else (df + d) / (df + delta)
            g = weighted_ppca(X, weights, float(n), k, bound)
    if not converged:
        warn(f"Robust pPCA EM did not converge in {max_iter} cycles (tol={tol:g}).", UserWarning)
    weights = np.asarray(expected_scale(g, df, X))
    fit = Fit(g, trace[-1], "em", len(trace), converged, np.array(trace),
              np.zeros(d, bool), details={"nu": df, "row_weights": weights})
    return fit.to_data_units(prepared.scale, prepared.total_observed)


# ----------------------------------------------------------- SVI and NUTS
def _model_arguments(spec: ModelSpec, nu: float | None, prepared: Prepared) -> tuple[dict, dict]:
    """The keyword arguments of :func:`bayespca.models.robust_ppca` for the fit, priors in working units.

    Those that fix the model's code (``n_components``, ``nu``) and its
    numbers (``prior``, ``nu_prior``), apart: the NUTS runner compiles the
    first in.
    """
    from bayespca import priors as prior_classes

    priors = prior_classes.to_units(prior_classes.as_priors(spec.prior), "isotropic", prepared.scale)
    return {"n_components": spec.n_components, "nu": nu}, {"prior": priors, "nu_prior": _nu_prior(spec.prior)}


def _nu_prior(prior: Any):
    """Uniform on :data:`NU_BOUNDS` with ``prior="flat"``; else None (the model's default).

    The MAP is then the maximum likelihood over the range EM searches. A
    flat prior on all of ``nu > 0`` leaves the posterior improper: the t
    likelihood tends to the Gaussian one as ``nu`` grows, so its integral
    diverges, and on near-Gaussian rows NUTS chains drifted to ``nu ~ 1e76``.
    """
    from bayespca.priors import is_named

    if is_named(prior, "flat"):
        import numpyro.distributions as dist

        return dist.Uniform(*NU_BOUNDS)
    return None


def _gaussian_start(prepared: Prepared, k: int) -> LowRankGaussian:
    """Closed-form pPCA of the (column-mean filled) working-unit data: where SVI starts."""
    X = prepared.X if prepared.missing is None else np.where(prepared.missing, prepared.mean, prepared.X)
    floor = 1e-6 * float(np.mean(prepared.variances))
    return weighted_ppca(X, np.ones(prepared.n), float(prepared.n), k, floor)


def fit_robust_svi(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    nu: float | None = None,
    num_steps: int = 3000,
    learning_rate: float = 0.02,
    tol: float = 1e-7,
    random_state: Any = None,
    progress_bar: bool | None = None,
) -> Fit:
    """MAP (maximum likelihood with ``prior="flat"``) of the Student-t pPCA by SVI with a delta guide.

    Adam on the unconstrained sites of :func:`bayespca.models.robust_ppca`
    (identification ``"none"``), its step decaying exponentially from
    ``learning_rate`` to ``1e-3 * learning_rate``, started from the Gaussian
    closed form with ``nu = 10``, until the loss settles (``tol``, as in
    :func:`bayespca.inference.svi.fit_svi`) or ``num_steps``
    (:func:`bayespca.inference.svi.map_by_svi`: compiled once per
    configuration, a progress bar). Each step costs O(n d k + d k^2) (the t
    has no sufficient statistics). Rows with missing entries (NaN) enter by
    the t of their observed block.

    Returns
    -------
    Fit
        In data units; ``trace`` the loss per step; ``details`` holds
        ``nu`` and ``row_weights``.
    """
    from bayespca.inference.svi import map_by_svi
    from bayespca.models import robust_ppca

    num_steps = check_number(num_steps, "num_steps", integer=True, low=1)
    learning_rate = check_number(learning_rate, "learning_rate", low=0, low_open=True)
    tol = check_number(tol, "tol", low=0, low_open=True)
    check_rows_leave_noise(prepared, spec.n_components)
    options, numbers = _model_arguments(spec, nu, prepared)
    has_missing = prepared.missing is not None
    model = functools.partial(robust_ppca, **options, identification="none", has_missing=has_missing)
    start = _gaussian_start(prepared, spec.n_components)
    values = {"W": np.asarray(start.loadings), "sigma": math.sqrt(start.noise[0]),
              "mu": np.asarray(start.mean)}
    if nu is None:
        values["nu"] = 10.0
    X = jnp.asarray(prepared.X)
    # The prior numbers are arguments: the program serves every fit of this configuration.
    config = ("robust_ppca", X.shape, tuple(sorted(options.items())), has_missing, num_steps, learning_rate,
              jax.tree_util.tree_structure(numbers))
    point, losses, converged = map_by_svi(model, values, ((X,), numbers), config, num_steps=num_steps,
                                          learning_rate=learning_rate, tol=tol, random_state=random_state,
                                          progress_bar=progress_bar)
    if not np.all(np.isfinite(losses)):
        raise ValueError("SVI loss became non-finite; lower learning_rate.")
    df = float(point["nu"]) if nu is None else float(nu)
    g = LowRankGaussian(np.asarray(point["W"]), np.full(prepared.d, float(point["sigma"]) ** 2),
                        np.asarray(point["mu"]))
    g = gaussian.canonical_loadings(g)
    observed = prepared.observed
    data = np.nan_to_num(prepared.X)
    ll = float(np.sum(student_t_log_prob(g, df, data, observed)))
    weights = np.asarray(expected_scale(g, df, data, observed))
    fit = Fit(g, ll, "svi", losses.size, converged, losses, np.zeros(prepared.d, bool),
              details={"nu": df, "row_weights": weights})
    return fit.to_data_units(prepared.scale, prepared.total_observed)


def fit_robust_nuts(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    nu: float | None = None,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    chain_method: str = "parallel",
    target_accept_prob: float = 0.9,
    random_state: Any = None,
    progress_bar: bool | None = None,
) -> Fit:
    """Posterior of the Student-t pPCA by NUTS on the marginal multivariate t.

    The chains start at the EM fit (mean-filled data when some entries are
    missing) and are preconditioned by the Laplace approximation there
    (:func:`bayespca.inference.nuts.sample_model`); ``W`` is sampled
    in the coordinates of ``spec.identification`` (default ``"polar"``),
    its columns' signs aligned to the EM loadings afterwards. Each gradient
    costs O(n d k + d k^2): the t has no sufficient statistics.

    Returns
    -------
    Fit
        In data units: ``draws`` (chain, draw, ...) with ``extra["nu"]``
        when ``nu`` is estimated; ``gaussian`` the posterior mean of
        ``(W, sigma^2, mu)``; ``details`` holds ``nu`` (posterior mean) and
        ``row_weights`` (posterior mean of ``E[u_i | x_i, theta]``).
    """
    from bayespca import priors as prior_classes
    from bayespca.inference.nuts import sample_model
    from bayespca.models import identification_for, initial_values, robust_ppca

    check_rows_leave_noise(prepared, spec.n_components)
    options, numbers = _model_arguments(spec, nu, prepared)
    X = prepared.X
    resolved = prior_classes.resolve_at_data(numbers["prior"], "isotropic", X=X)[1]
    identification = identification_for(spec.identification, "isotropic", resolved.loadings)
    # EM in working units (scale 1), on the column-mean filled rows when some are missing.
    filled = X if prepared.missing is None else np.where(prepared.missing, prepared.mean, X)
    em = fit_robust_em(Prepared(filled, None), ModelSpec("isotropic", spec.n_components), nu=nu)
    start = LowRankGaussian(*(np.asarray(a) for a in em.gaussian))
    values = initial_values(identification, resolved.loadings, start, "isotropic", prepared.n)
    if nu is None:
        values["nu"] = min(max(em.details["nu"], 0.5), 1e3)
    options.update(identification=identification, has_missing=prepared.missing is not None)
    draws = sample_model(
        robust_ppca, options, {"X": X, **numbers}, values,
        functools.partial(_t_draws, start=start, identification=identification, sampled_nu=nu is None),
        log_lik=lambda draws: pointwise_log_likelihood(draws, nu, X).sum(-1),
        num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains, chain_method=chain_method,
        target_accept_prob=target_accept_prob, random_state=random_state, progress_bar=progress_bar,
    )
    return _posterior_fit(draws, prepared, nu).to_data_units(prepared.scale, prepared.total_observed)


def _t_draws(sites: dict, stats: dict, *, start: LowRankGaussian, identification: str,
             sampled_nu: bool) -> Draws:
    """The Student-t pPCA's draws from its sites: polar columns' signs aligned to the EM loadings
    ``start``, ``nu`` among the extra draws where it is sampled."""
    from bayespca.inference.nuts import align_signs

    w = sites["W"]
    if identification == "polar":
        w = align_signs(w, start.loadings)
    noise = np.broadcast_to(sites["sigma"][..., None] ** 2, (*w.shape[:2], w.shape[2])).copy()
    extra = {"nu": sites["nu"]} if sampled_nu else {}
    return Draws(w, noise, sites["mu"], identification, "isotropic", stats, start, extra)


def _draws_nu(draws: Draws, nu: float | None) -> np.ndarray:
    """``nu`` per draw, flattened (the fixed value repeated when not sampled)."""
    if "nu" in draws.extra:
        return np.asarray(draws.extra["nu"], dtype=float).reshape(-1)
    return np.full(draws.loadings.shape[0] * draws.loadings.shape[1], float(nu))


def pointwise_log_likelihood(draws: Draws, nu: float | None, X: np.ndarray) -> np.ndarray:
    """``log t_nu(x_i | mu, C)`` per draw and row, shape (chain, draw, n) (observed blocks)."""
    arr = np.asarray(X, dtype=float)
    observed = ~np.isnan(arr)
    values, mask = np.where(observed, arr, 0.0), (observed if (~observed).any() else None)

    out = _draws_t_log_prob(tuple(draws.gaussians()), jnp.asarray(_draws_nu(draws, nu)), values, mask)
    return np.asarray(out).reshape(*draws.loadings.shape[:2], arr.shape[0])


# Module-level and jitted with the data as arguments: compiled once per shape, not at every call.
@jax.jit
def _draws_t_log_prob(gs, nus, values, mask):
    return jax.lax.map(lambda a: student_t_log_prob(LowRankGaussian(*a[0]), a[1], values, mask), (gs, nus))


@jax.jit
def _draws_expected_scale(gs, nus, values, observed):
    return jax.lax.map(lambda a: expected_scale(LowRankGaussian(*a[0]), a[1], values, observed), (gs, nus))


def _posterior_fit(draws: Draws, prepared: Prepared, nu: float | None) -> Fit:
    """Posterior means as the point estimate; mean row weights over the draws."""
    g = LowRankGaussian(draws.loadings.mean((0, 1)), draws.noise.mean((0, 1)), draws.mean.mean((0, 1)))
    nus = _draws_nu(draws, nu)
    data, observed = np.nan_to_num(prepared.X), prepared.observed
    weights = np.mean(np.asarray(_draws_expected_scale(tuple(draws.gaussians()), jnp.asarray(nus), data,
                                                       observed)), axis=0)
    df = float(np.mean(nus))
    ll = float(np.sum(student_t_log_prob(g, df, data, observed)))
    n_draws = nus.size
    converged = not draws.sample_stats["diverging"].any()
    return Fit(g, ll, "nuts", n_draws, converged, np.array([ll]), np.zeros(prepared.d, bool), draws,
               details={"nu": df, "row_weights": weights})


# -------------------------------------------------------------- estimator
class RobustPPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Probabilistic PCA with multivariate Student-t rows: outlying rows do not rotate the subspace.

    ``x_i ~ t_nu(mu, W W^T + sigma^2 I)`` (module docstring): a row's weight
    in the fit is ``E[u_i | x_i] = (nu + d) / (nu + delta_i)``, small for rows
    far from the fitted subspace. ``nu = inf`` is :class:`bayespca.PPCA`.

    Parameters
    ----------
    n_components : int or None, default=None
        ``k`` in ``[1, n_features - 1]``; None: ``min(n_samples - 1, n_features) - 1``.
    nu : float or None, default=None
        Degrees of freedom: None estimates them (EM: maximum likelihood within
        :data:`NU_BOUNDS`; SVI and NUTS: ``nu ~ Gamma(2, 0.1)`` as in Juarez &
        Steel 2010, uniform on :data:`NU_BOUNDS` with ``prior="flat"``); a positive float (``inf``
        included) fixes them.
    method : {"em", "svi", "nuts"}, default="em"
        ECME (complete data), SVI with a delta guide (MAP) or NUTS on the
        marginal multivariate t (:func:`fit_robust_em`,
        :func:`fit_robust_svi`, :func:`fit_robust_nuts`).
    tol, max_iter : float, int or None
        EM's tolerance (default 1e-10) and cycles (default 2000); for SVI
        the relative change of the loss at which to stop (default 1e-7, as
        :class:`bayespca.PPCA`'s) and the most steps (default 3000).
    noise_floor : float, default=1e-10
        EM's lower bound on ``sigma^2`` relative to the mean feature variance.
    learning_rate : float or None, default=None
        SVI's first Adam step (default 0.02, in working units).
    prior : None, "flat" or a bayespca.priors prior, default=None
        Priors of ``W``, ``sigma`` and ``mu`` for SVI and NUTS (as in
        :class:`bayespca.PPCA`).
    identification : {None, "polar", "lower_triangular", "procrustes", "none"}, default=None
        How NUTS samples ``W`` (None: ``"polar"``).
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
        Seeds SVI and NUTS.
    progress_bar : bool or None, default=None
        SVI and NUTS: a progress bar over the steps or transitions; None shows
        it in a terminal or a notebook only.

    Attributes
    ----------
    components_ : ndarray of shape (n_components_, n_features)
        ``W^T``: orthogonal rows of decreasing norm, largest entry positive.
    loadings_ : ndarray of shape (n_features, n_components_)
    noise_variance_ : float
        ``sigma^2`` (a scale: the noise variance of a row is
        ``sigma^2 nu / (nu - 2)`` for ``nu > 2``).
    mean_ : ndarray of shape (n_features,)
        ``mu``, the location.
    nu_ : float
        Degrees of freedom (fixed, ML, MAP or posterior mean).
    row_weights_ : ndarray of shape (n_samples,)
        ``E[u_i | x_i]`` of the training rows (NUTS: averaged over the
        posterior): near 0 flags an outlier.
    gaussian_ : LowRankGaussian
        ``(W, sigma^2 1, mu)``, location and scale matrix of the t.
    log_likelihood_ : float
        Total t log-likelihood of the training rows.
    loglike_trace_ : ndarray
        EM: log-likelihood per cycle; SVI: loss per step.
    n_iter_, converged_, method_, n_components_, n_features_in_
    nuts_ : Draws or None
        NUTS draws (``extra["nu"]`` when ``nu`` is estimated).
    nu_samples_ : ndarray (chain, draw)
        NUTS draws of ``nu`` (when estimated).
    posterior_ : xarray.DataTree
        NUTS: posterior (``W``, ``sigma2``, ``mu``, ``eigenvalues``, ``nu``,
        ``log_lik``), ``sample_stats``, ``log_likelihood`` (the marginal t
        of each row, for :func:`bayespca.compare`) and ``observed_data``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((200, 2)) @ rng.standard_normal((2, 5)) + 0.2 * rng.standard_normal((200, 5))
    >>> X[:10] = 30 * rng.standard_normal((10, 5))  # 5% gross outliers
    >>> model = RobustPPCA(2).fit(X)
    >>> bool(model.row_weights_[:10].max() < 0.1 < model.row_weights_[10:].min())
    True
    """

    def __init__(
        self,
        n_components=None,
        *,
        nu=None,
        method="em",
        tol=None,
        max_iter=None,
        noise_floor=1e-10,
        learning_rate=None,
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
        self.n_components = n_components
        self.nu = nu
        self.method = method
        self.tol = tol
        self.max_iter = max_iter
        self.noise_floor = noise_floor
        self.learning_rate = learning_rate
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
            raise ValueError(f"RobustPPCA needs at least 2 features; got n_features={d}.")
        k = check_number(self.n_components, "RobustPPCA: n_components", integer=True, low=1, high=d - 1,
                         allow_none=True)
        if k is None:
            k = max(1, min(n - 1, d) - 1)
        nu = check_number(self.nu, "nu", low=0, low_open=True, allow_none=True) if not _is_infinite(
            self.nu) else math.inf
        check_choice(self.identification, "identification", IDENTIFICATIONS, allow_none=True)
        check_seed(self.random_state)
        progress = None if self.progress_bar is None else check_bool(self.progress_bar, "progress_bar")
        from bayespca.inference.model_nuts import check_prior

        check_prior(self.prior, method, "RobustPPCA", "'svi' or 'nuts'")
        tol = check_number(self.tol, "tol", low=0, allow_none=True)
        max_iter = check_number(self.max_iter, "max_iter", integer=True, low=1, allow_none=True)
        # The other methods' options too, as scikit-learn checks every parameter at fit.
        lr = check_number(self.learning_rate, "learning_rate", low=0, low_open=True, allow_none=True)
        check_sampler_options(
            self.num_warmup, self.num_samples, self.num_chains, self.chain_method, self.target_accept_prob
        )
        options: dict = {"nu": nu}
        if method == "em":
            options["floor"] = check_number(self.noise_floor, "noise_floor", low=0, low_open=True)
            if tol is not None:
                options["tol"] = tol
            if max_iter is not None:
                options["max_iter"] = max_iter
        elif method == "svi":
            if lr is not None:
                options["learning_rate"] = lr
            if max_iter is not None:
                options["num_steps"] = max_iter
            if tol is not None:
                options["tol"] = tol
            options.update(random_state=self.random_state, progress_bar=progress)
        else:
            options.update(num_warmup=self.num_warmup, num_samples=self.num_samples,
                           num_chains=self.num_chains, chain_method=self.chain_method,
                           target_accept_prob=self.target_accept_prob, progress_bar=progress,
                           random_state=self.random_state)
        return method, ModelSpec("isotropic", int(k), self.prior, self.identification), options

    def fit(self, X, y=None):
        """Fit the Student-t pPCA.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            NaN marks a missing entry (``method="svi"`` or ``"nuts"`` only).
        y : ignored

        Returns
        -------
        self
        """
        for name in [a for a in vars(self) if a.endswith("_") and not a.startswith("_")]:
            delattr(self, name)  # a refit leaves nothing of the previous method behind
        prepared = prepare(X, estimator=self)
        method, spec, options = self._plan(prepared)
        fitter = {"em": fit_robust_em, "svi": fit_robust_svi, "nuts": fit_robust_nuts}[method]
        fit = fitter(prepared, spec, **options)
        self.gaussian_ = LowRankGaussian(*(np.asarray(a, dtype=float) for a in fit.gaussian))
        self.loadings_ = self.gaussian_.loadings
        self.components_ = self.loadings_.T
        self.noise_variance_ = float(self.gaussian_.noise[0])
        self.mean_ = self.gaussian_.mean
        self.nu_ = float(fit.details["nu"])
        self.row_weights_ = np.asarray(fit.details["row_weights"])
        self.log_likelihood_ = float(fit.log_likelihood)
        self.loglike_trace_ = np.asarray(fit.trace)
        self.n_iter_ = int(fit.n_iter)
        self.converged_ = bool(fit.converged)
        self.method_ = method
        self.n_components_ = spec.n_components
        self.nuts_ = fit.draws
        if fit.draws is not None:
            self._store_posterior(fit.draws, prepared, options["nu"])
        return self

    def _store_posterior(self, draws: Draws, prepared: Prepared, nu: float | None) -> None:
        from bayespca.inference.model_nuts import posterior_tree

        X = prepared.data
        extra = {}
        if "nu" in draws.extra:
            self.nu_samples_ = extra["nu"] = np.asarray(draws.extra["nu"])
        self.posterior_ = posterior_tree(draws, X, pointwise_log_likelihood(draws, nu, X),
                                         feature_names=prepared.feature_names, extra=extra)

    # ------------------------------------------------------------- inference
    def _rows(self, X):
        check_is_fitted(self, "gaussian_")
        X, missing = validate_transform(self, X, allow_nan=True)
        return np.nan_to_num(X), (None if missing is None else ~missing)

    def score_samples(self, X):
        """Log-density ``log t_nu(x_i | mu, C)`` of each row (its observed block), shape (n_samples,)."""
        values, observed = self._rows(X)
        return np.asarray(student_t_log_prob(self.gaussian_, self.nu_, values, observed))

    def score(self, X, y=None):
        """Mean log-density of the rows of ``X``."""
        return float(np.mean(self.score_samples(X)))

    def row_weights(self, X):
        """``E[u_i | x_i]`` of new rows at the fitted point, shape (n_samples,): near 0 for an outlier."""
        values, observed = self._rows(X)
        return np.asarray(expected_scale(self.gaussian_, self.nu_, values, observed))

    def transform(self, X):
        """``E[z_i | x_i] = M^{-1} W^T (x_i - mu) / sigma^2``, shape (n_samples, n_components).

        The same as pPCA's: given ``u_i`` the posterior mean of ``z_i`` does
        not depend on ``u_i``, only its covariance (``M^{-1} / u_i``) does.
        Rows with missing entries use their observed entries.
        """
        values, observed = self._rows(X)
        return np.asarray(gaussian.latent_posterior(self.gaussian_, values, observed).mean)

    def inverse_transform(self, X):
        """``W z + mu`` for latent values ``z``, shape (n_samples, n_features)."""
        check_is_fitted(self, "gaussian_")
        Z = as_float_matrix(X, name="X")
        if Z.shape[1] != self.n_components_:
            raise ValueError(f"X has {Z.shape[1]} columns, but inverse_transform expects "
                             f"n_components_ = {self.n_components_}.")
        return Z @ self.components_ + self.mean_

    @property
    def _n_features_out(self):
        return self.n_components_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags
