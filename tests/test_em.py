"""EM for pPCA and FA against the closed form, scikit-learn, autodiff, L-BFGS and dense algebra."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
from scipy.stats import multivariate_normal
from sklearn.decomposition import FactorAnalysis as SkFA
from sklearn.exceptions import ConvergenceWarning

from bayespca.gaussian import LowRankGaussian, log_prob
from bayespca.inference.closed_form import ppca_closed_form
from bayespca.inference.contract import ModelSpec
from bayespca.inference.em import DEFAULT_FLOOR, fit_em, pairwise_covariance
from bayespca.statistics import Prepared, prepare


def _fa_data(n=400, d=8, k=2, seed=0, offset=3.0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d, k)) * np.linspace(2.0, 1.0, k)
    psi = rng.uniform(0.2, 1.0, d)
    Z = rng.standard_normal((n, k))
    X = Z @ W.T + rng.standard_normal((n, d)) * np.sqrt(psi) + offset
    return X, W, psi


def _random_init(d, k, seed=1):
    rng = np.random.default_rng(seed)
    return LowRankGaussian(rng.standard_normal((d, k)), np.ones(d), np.zeros(d))


def _cov(g):
    return g.loadings @ g.loadings.T + np.diag(g.noise)


@pytest.mark.parametrize("form", ["scatter", "data"])
@pytest.mark.parametrize("accelerate", [True, False])
def test_ppca_em_from_random_start_reaches_closed_form(form, accelerate):
    X, _, _ = _fa_data(d=10, k=3)  # three well-separated eigenvalues
    ref = ppca_closed_form(prepare(X), ModelSpec("isotropic", 3))
    fit = fit_em(
        prepare(X), ModelSpec("isotropic", 3), init=_random_init(10, 3), form=form,
        accelerate=accelerate, tol=1e-15,
    )
    assert fit.converged
    assert fit.log_likelihood == pytest.approx(ref.log_likelihood, rel=1e-10)
    # Same W, not only the same W W^T: EM's W is rotated to the principal axes.
    # (EM stops when the log-likelihood stops changing in floating point; along
    # the leading axis, where the likelihood is flattest, that leaves ~1e-6
    # relative error.)
    w_ref = ref.gaussian.loadings
    np.testing.assert_allclose(fit.gaussian.loadings, w_ref, atol=1e-5 * np.abs(w_ref).max())
    c_ref = _cov(ref.gaussian)
    np.testing.assert_allclose(_cov(fit.gaussian), c_ref, atol=1e-5 * np.abs(c_ref).max())
    assert np.all(np.diff(fit.trace) >= 0)
    assert fit.trace[-1] == fit.log_likelihood


def test_fa_em_equals_sklearn_at_convergence():
    X, _, _ = _fa_data()
    n = X.shape[0]
    sk = SkFA(2, tol=1e-12, max_iter=100_000, svd_method="lapack").fit(X)
    fit = fit_em(prepare(X), ModelSpec("diagonal", 2), tol=0)
    assert fit.log_likelihood == pytest.approx(sk.score(X) * n, rel=1e-10)
    assert fit.log_likelihood >= sk.score(X) * n - 1e-8
    np.testing.assert_allclose(fit.gaussian.noise, sk.noise_variance_, rtol=1e-5)
    np.testing.assert_allclose(_cov(fit.gaussian), sk.get_covariance(), atol=1e-6)
    # Unrotated loadings in the same orientation as scikit-learn's (up to sign).
    np.testing.assert_allclose(np.abs(fit.gaussian.loadings), np.abs(sk.components_.T), atol=1e-4)
    assert np.all(np.diff(fit.trace) >= 0)


@pytest.mark.parametrize("form", ["scatter", "data"])
def test_fa_stationarity_diag_c_equals_diag_s(form):
    X, _, _ = _fa_data(seed=2)
    fit = fit_em(prepare(X), ModelSpec("diagonal", 2), tol=0, form=form)
    np.testing.assert_allclose(np.diag(_cov(fit.gaussian)), X.var(axis=0), rtol=1e-10)
    # Stationary point of the likelihood: autodiff gradient of an independent
    # evaluation (per-row log-density) vanishes in W and log psi.
    w, psi, mu = (jnp.asarray(a) for a in fit.gaussian)

    def total(w, log_psi):
        return jnp.sum(log_prob(LowRankGaussian(w, jnp.exp(log_psi), mu), X))

    gw, gpsi = jax.grad(total, argnums=(0, 1))(w, jnp.log(psi))
    assert np.max(np.abs(gw)) < 1e-8
    assert np.max(np.abs(gpsi)) < 1e-8


@pytest.mark.parametrize("noise", ["isotropic", "diagonal"])
def test_missing_path_with_nothing_missing_equals_complete_fit(noise):
    # EM over missing entries with an all-False mask: the expected statistics
    # are the sample statistics and one M-step is the complete-data maximum.
    X, _, _ = _fa_data(n=200, d=6)
    complete = prepare(X)
    masked = Prepared(X, np.zeros(X.shape, dtype=bool), complete.scale)
    spec = ModelSpec(noise, 2)
    ref = ppca_closed_form(complete, spec) if noise == "isotropic" else fit_em(complete, spec)
    fit = fit_em(masked, spec)
    assert fit.converged and fit.n_iter <= 4
    assert fit.log_likelihood == pytest.approx(ref.log_likelihood, rel=1e-12)
    np.testing.assert_allclose(_cov(fit.gaussian), _cov(ref.gaussian), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fit.gaussian.mean, X.mean(axis=0), rtol=1e-12)


def _missing_data(noise, frac, seed=0, n=600, d=15, k=3, sigma=0.2):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d, k))
    psi = np.full(d, sigma**2) if noise == "isotropic" else rng.uniform(0.5, 1.5, d) * sigma**2
    X = rng.standard_normal((n, k)) @ W.T + rng.standard_normal((n, d)) * np.sqrt(psi) + 1.0
    hidden = rng.random((n, d)) < frac
    hidden[hidden.all(axis=1), 0] = False
    return X, np.where(hidden, np.nan, X), hidden, W, psi


@pytest.mark.parametrize("noise", ["isotropic", "diagonal"])
@pytest.mark.parametrize("frac", [0.1, 0.3])
def test_missing_values_recover_subspace_and_impute(noise, frac):
    X, Xm, hidden, W, psi = _missing_data(noise, frac)
    fit = fit_em(prepare(Xm), ModelSpec(noise, 3))
    assert fit.converged
    assert np.all(np.diff(fit.trace) >= 0)
    angles = scipy.linalg.subspace_angles(fit.gaussian.loadings, W)
    assert np.max(angles) < 0.05
    # Reported log-likelihood = sum over rows of the observed-block density (SciPy).
    obs = ~hidden
    c, mu = _cov(fit.gaussian), fit.gaussian.mean
    ref = sum(
        multivariate_normal(mu[o], c[np.ix_(o, o)]).logpdf(Xm[i, o])
        for i, o in enumerate(obs)
    )
    assert fit.log_likelihood == pytest.approx(ref, rel=1e-10)
    # Imputation by the conditional mean (dense Gaussian conditioning).
    imputed = X.copy()
    for i in np.flatnonzero(hidden.any(axis=1)):
        o, m = obs[i], hidden[i]
        gain = np.linalg.solve(c[np.ix_(o, o)], c[np.ix_(o, m)]).T
        imputed[i, m] = mu[m] + gain @ (Xm[i, o] - mu[o])
    rmse = np.sqrt(np.mean((imputed[hidden] - X[hidden]) ** 2))
    col_mean = np.broadcast_to(np.nanmean(Xm, axis=0), X.shape)
    rmse_mean = np.sqrt(np.mean((col_mean[hidden] - X[hidden]) ** 2))
    noise_sd = np.sqrt(np.mean(psi))
    assert rmse < 1.5 * noise_sd
    assert rmse < 0.2 * rmse_mean


def _observed_loglik_gradient(Xm, noise):
    """Value and gradient of the observed-data log-likelihood in (W, log psi, mu), by JAX autodiff."""
    x0, obs = np.nan_to_num(Xm), ~np.isnan(Xm)
    d = Xm.shape[1]

    def total(w, log_psi, mu):
        noise_vec = jnp.exp(log_psi) * jnp.ones(d)
        return jnp.sum(log_prob(LowRankGaussian(w, noise_vec, mu), x0, obs))

    return jax.jit(jax.value_and_grad(total, argnums=(0, 1, 2)))


@pytest.mark.parametrize("noise", ["isotropic", "diagonal"])
def test_missing_value_em_is_a_stationary_point(noise):
    _, Xm, _, _, _ = _missing_data(noise, 0.2, seed=4, n=300, d=8, k=2)
    fit = fit_em(prepare(Xm), ModelSpec(noise, 2), tol=0)
    w, psi, mu = (jnp.asarray(a) for a in fit.gaussian)
    log_psi = jnp.log(psi[:1]) if noise == "isotropic" else jnp.log(psi)
    _, grads = _observed_loglik_gradient(Xm, noise)(w, log_psi, mu)
    # EM stops when the log-likelihood is flat to rounding (~1e-13 relative);
    # with a curvature of ~n / sigma^2 that leaves gradients of ~1e-4 per row at most.
    for grad in grads:
        assert np.max(np.abs(grad)) / Xm.shape[0] < 1e-7
    # The mean is estimated jointly: it is not the observed column mean.
    assert not np.allclose(fit.gaussian.mean, np.nanmean(Xm, axis=0), atol=1e-6)


def _issue14_data(frac, seed=7):
    """Issue 14's reproducer: W (10 x 2, scale 2), 500 rows, noise sd 0.3, mean 5, MCAR."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((10, 2)) * 2
    X = rng.standard_normal((500, 2)) @ W.T + 0.3 * rng.standard_normal((500, 10)) + 5
    hidden = np.random.default_rng(seed).random(X.shape) < frac
    return np.where(hidden, np.nan, X)


def _best_by_lbfgs(Xm, noise, k, starts):
    """The best observed-data log-likelihood found by L-BFGS (JAX gradients) from several starts."""
    d = Xm.shape[1]
    value_and_grad = _observed_loglik_gradient(Xm, noise)
    n_psi = 1 if noise == "isotropic" else d

    def objective(theta):
        w, lp, mu = theta[: d * k].reshape(d, k), theta[d * k : d * k + n_psi], theta[d * k + n_psi :]
        value, (gw, gp, gm) = value_and_grad(jnp.asarray(w), jnp.asarray(lp), jnp.asarray(mu))
        grad = np.concatenate([np.ravel(gw), np.ravel(gp), np.ravel(gm)])
        return -float(value), -grad

    best = -np.inf
    for w, psi, mu in starts:
        theta = np.concatenate([w.ravel(), np.log(psi[:n_psi]), mu])
        res = scipy.optimize.minimize(objective, theta, jac=True, method="L-BFGS-B",
                                      options={"maxiter": 5000, "ftol": 1e-14, "gtol": 1e-9})
        best = max(best, -res.fun)
    return best


@pytest.mark.parametrize(("noise", "frac"), [("diagonal", 0.1), ("diagonal", 0.5), ("isotropic", 0.3),
                                             ("isotropic", 0.6)])
def test_missing_value_em_reaches_the_best_optimum_found_by_multistart(noise, frac):
    # Issue 14: mean imputation started EM ~1000 nats below the optimum, where it
    # stopped and reported convergence (FA 50%: -3705.5 against SVI's -2716.3).
    Xm = _issue14_data(frac)
    fit = fit_em(prepare(Xm), ModelSpec(noise, 2))
    assert fit.converged
    rng = np.random.default_rng(0)
    mu0 = np.nanmean(Xm, axis=0)
    starts = [(rng.standard_normal((10, 2)), rng.uniform(0.5, 2.0, 10), mu0) for _ in range(3)]
    starts.append(tuple(np.asarray(a) for a in fit.gaussian))
    best = _best_by_lbfgs(Xm, noise, 2, starts)
    assert fit.log_likelihood >= best - 1e-7 * abs(best)


def test_convergence_warning_when_max_iter_reached():
    X, _, _ = _fa_data()
    with pytest.warns(ConvergenceWarning, match="max_iter=2"):
        fit = fit_em(prepare(X), ModelSpec("isotropic", 2), max_iter=2, init=_random_init(8, 2))
    assert not fit.converged
    assert fit.n_iter == 2


def test_heywood_case_is_floored_and_reported():
    X, _, _ = _fa_data(seed=5)
    X = np.column_stack([X, X[:, 0]])  # a duplicated column: psi -> 0 for both copies
    with pytest.warns(UserWarning, match="Heywood"):
        fit = fit_em(prepare(X), ModelSpec("diagonal", 2))
    assert fit.at_floor[0] and fit.at_floor[-1]
    assert np.all(np.isfinite(fit.gaussian.loadings)) and np.isfinite(fit.log_likelihood)
    floored = fit.at_floor
    bound = DEFAULT_FLOOR["diagonal"] * X.var(axis=0)
    np.testing.assert_allclose(fit.gaussian.noise[floored], bound[floored])
    assert np.all(np.diff(fit.trace) >= 0)
    # The likelihood is that of the data under the fitted Gaussian. C has an
    # eigenvalue ~5e-9 here (the copies, cond(C) ~1e8), so the reference is a
    # dense Cholesky in extended precision (SciPy's float64 eigh is off by 6e-9
    # relative; float64 itself allows ~eps cond(C)).
    ref = _extended_precision_loglik(fit.gaussian, X)
    assert fit.log_likelihood == pytest.approx(ref, rel=1e-10)


def _extended_precision_loglik(g, X):
    """sum_i log N(x_i | mu, W W^T + Psi) by a dense Cholesky in np.longdouble (80-bit on x86)."""
    w, psi, mu = (np.asarray(a, dtype=np.longdouble) for a in g)
    c = w @ w.T + np.diag(psi)
    d = c.shape[0]
    chol = np.zeros_like(c)
    for j in range(d):
        chol[j, j] = np.sqrt(c[j, j] - np.sum(chol[j, :j] ** 2))
        chol[j + 1 :, j] = (c[j + 1 :, j] - chol[j + 1 :, :j] @ chol[j, :j]) / chol[j, j]
    resid = np.asarray(X, dtype=np.longdouble) - mu
    y = np.zeros_like(resid)
    for j in range(d):
        y[:, j] = (resid[:, j] - y[:, :j] @ chol[j, :j]) / chol[j, j]
    logdet = 2 * np.sum(np.log(np.diag(chol)))
    total = -0.5 * (X.shape[0] * (d * np.log(np.longdouble(2) * np.pi) + logdet) + np.sum(y**2))
    return float(total)


def test_constant_column_is_finite():
    X, _, _ = _fa_data(seed=6)
    X[:, 3] = 7.0
    with pytest.warns(UserWarning, match="lower bound"):
        fit = fit_em(prepare(X), ModelSpec("diagonal", 2))
    assert fit.at_floor[3]
    np.testing.assert_allclose(fit.gaussian.loadings[3], 0.0, atol=1e-12)
    assert np.isfinite(fit.log_likelihood)
    # The other features are fitted as if the constant one were not there.
    rest = fit_em(prepare(np.delete(X, 3, axis=1)), ModelSpec("diagonal", 2))
    np.testing.assert_allclose(np.delete(fit.gaussian.noise, 3), rest.gaussian.noise, rtol=1e-9)


@pytest.mark.parametrize("noise", ["isotropic", "diagonal"])
@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("scale", [1e-150, 1e-8, 3e8, 1e150])
def test_scale_equivariance(noise, missing, scale):
    # Issue 14: EM failed on tiny-scale data (FloatingPointError) and on huge
    # scale (a broadcast error), and FA took 1301 iterations on X but 123 on 1e150 X.
    X, _, _ = _fa_data(n=120, d=6, seed=8)
    if missing:
        X[np.random.default_rng(9).random(X.shape) < 0.15] = np.nan
    spec = ModelSpec(noise, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow, underflow or floor warnings either
        ref = fit_em(prepare(X), spec)
        fit = fit_em(prepare(scale * X), spec)
    np.testing.assert_allclose(fit.gaussian.loadings, scale * ref.gaussian.loadings, rtol=1e-8,
                               atol=1e-8 * scale * np.abs(ref.gaussian.loadings).max())
    np.testing.assert_allclose(fit.gaussian.noise, scale**2 * ref.gaussian.noise, rtol=1e-8)
    np.testing.assert_allclose(fit.gaussian.mean, scale * ref.gaussian.mean, rtol=1e-8)
    n_obs = np.sum(~np.isnan(X))
    assert fit.log_likelihood == pytest.approx(ref.log_likelihood - n_obs * np.log(scale), rel=1e-10)
    assert abs(fit.n_iter - ref.n_iter) <= 4  # the last steps are rounding noise


def test_tiny_scale_with_k_equal_d_is_finite():
    # Issue 14 reproducer: PPCA(10, method="em", max_iter=3) on a 10 x 10 matrix at 1e-150.
    X = np.random.default_rng(0).standard_normal((10, 10)) * 1e-150
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter and the floor of sigma^2 (k = d)
        fit = fit_em(prepare(X), ModelSpec("isotropic", 10), max_iter=3)
    assert np.isfinite(fit.log_likelihood)
    assert np.all(np.isfinite(fit.gaussian.loadings)) and np.all(fit.gaussian.noise > 0)


def test_pairwise_covariance_equals_available_case_estimate():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 3))
    obs = rng.random(x.shape) > 0.3
    x0 = np.where(obs, x, 0.0)
    got = pairwise_covariance(x0, obs)
    for j in range(3):
        for m in range(3):
            both = obs[:, j] & obs[:, m]
            assert got[j, m] == pytest.approx(np.mean(x[both, j] * x[both, m]), rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"spec": ModelSpec("spherical", 2)}, "noise must be one of"),
        ({"form": "dense"}, "form must be one of"),
        ({"tol": -1.0}, "tol must be"),
        ({"max_iter": 0}, "max_iter must be"),
        ({"floor": 0.0}, "floor must be"),
        ({"init": LowRankGaussian(np.ones((8, 3)), np.ones(8), np.zeros(8))}, "init must have"),
    ],
)
def test_bad_arguments(kwargs, match):
    X, _, _ = _fa_data()
    spec = kwargs.pop("spec", ModelSpec("isotropic", 2))
    with pytest.raises(ValueError, match=match):
        fit_em(prepare(X), spec, **kwargs)


def test_ml_fits_and_post_fit_calls_compile_nothing():
    # Issue 18: compiling JAX code for each new data shape exhausted memory maps
    # after ~1090 shapes. Maximum-likelihood fits and every post-fit call of a
    # fitted PPCA / FactorAnalysis now run in NumPy/SciPy: XLA compiles nothing.
    from bayespca.probabilistic import PPCA, FactorAnalysis

    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(kwargs.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        rng = np.random.default_rng(0)
        for n, d in [(30, 4), (31, 5), (47, 6), (64, 9), (80, 12), (101, 7)]:
            X = rng.standard_normal((n, 2)) @ rng.standard_normal((2, d)) + rng.standard_normal((n, d))
            Xm = np.where(rng.random(X.shape) < 0.1, np.nan, X)
            for model in (PPCA(2), PPCA(2, method="em"), FactorAnalysis(2)):
                for data in (X, Xm):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", UserWarning)
                        model.fit(data)
                    model.score(X)
                    model.score_samples(Xm)
                    model.transform(Xm)
                    model.latent_posterior(X)
                    model.impute(Xm, return_variance=True)
                    model.get_covariance()
                    model.get_precision()
                    model.sample(3, random_state=0)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
