"""EM for pPCA and FA against the closed form, scikit-learn, autodiff and dense algebra."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from scipy.stats import multivariate_normal
from sklearn.decomposition import FactorAnalysis as SkFA
from sklearn.exceptions import ConvergenceWarning

from bayespca.gaussian import LowRankGaussian, log_prob
from bayespca.inference.closed_form import ppca_closed_form
from bayespca.inference.contract import ModelSpec
from bayespca.inference.em import _complete_step, _missing_step, fit_em
from bayespca.statistics import prepare


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
        accelerate=accelerate, tol=1e-13,
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
    np.testing.assert_allclose(np.diag(_cov(fit.gaussian)), X.var(axis=0), rtol=1e-6)
    # Stationary point of the likelihood: autodiff gradient of an independent
    # evaluation (per-row log-density) vanishes in W and log psi.
    w, psi, mu = (jnp.asarray(a) for a in fit.gaussian)

    def total(w, log_psi):
        return jnp.sum(log_prob(LowRankGaussian(w, jnp.exp(log_psi), mu), X))

    gw, gpsi = jax.grad(total, argnums=(0, 1))(w, jnp.log(psi))
    scale = X.shape[0]
    assert np.max(np.abs(gw)) / scale < 1e-5
    assert np.max(np.abs(gpsi)) / scale < 1e-5


def test_missing_step_with_nothing_missing_equals_complete_step():
    X, _, _ = _fa_data(n=50, d=6)
    n, d = X.shape
    xc = X - X.mean(axis=0)
    rng = np.random.default_rng(3)
    params = (jnp.asarray(rng.standard_normal((d, 2))), jnp.asarray(rng.uniform(0.5, 1, d)),
              jnp.zeros(d))
    floor = jnp.full(d, 1e-12)
    obs = np.ones((n, d), dtype=bool)
    for isotropic in (True, False):
        complete = _complete_step(
            params, (jnp.asarray(xc.T @ xc / n), jnp.asarray(xc.var(axis=0)), float(n), floor),
            isotropic, False,
        )
        missing = _missing_step(
            params, (jnp.asarray(xc), jnp.asarray(obs), jnp.asarray(obs, dtype=float),
                     jnp.full(d, float(n)), jnp.asarray(np.sum(xc**2, axis=0)), floor),
            isotropic, False,
        )
        assert float(missing[1]) == pytest.approx(float(complete[1]), rel=1e-12)
        for a, b in zip(missing[0], complete[0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


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


@pytest.mark.parametrize("noise", ["isotropic", "diagonal"])
def test_missing_value_em_is_a_stationary_point(noise):
    _, Xm, hidden, _, _ = _missing_data(noise, 0.2, seed=4, n=300, d=8, k=2)
    fit = fit_em(prepare(Xm), ModelSpec(noise, 2), tol=0)
    obs = ~hidden
    x0 = np.nan_to_num(Xm)
    w, psi, mu = (jnp.asarray(a) for a in fit.gaussian)

    def total(w, log_psi, mu):
        noise_vec = jnp.exp(log_psi) * jnp.ones_like(mu)
        return jnp.sum(log_prob(LowRankGaussian(w, noise_vec, mu), x0, obs))

    log_psi = jnp.log(psi[:1]) if noise == "isotropic" else jnp.log(psi)
    grads = jax.grad(total, argnums=(0, 1, 2))(w, log_psi, mu)
    for grad in grads:
        assert np.max(np.abs(grad)) / Xm.shape[0] < 1e-5
    # The mean is estimated jointly: it is not the observed column mean.
    assert not np.allclose(fit.gaussian.mean, np.nanmean(Xm, axis=0), atol=1e-6)


def test_convergence_warning_when_max_iter_reached():
    X, _, _ = _fa_data()
    with pytest.warns(ConvergenceWarning, match="max_iter=2"):
        fit = fit_em(prepare(X), ModelSpec("diagonal", 2), max_iter=2, init=_random_init(8, 2))
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
    np.testing.assert_allclose(fit.gaussian.noise[floored], 1e-6 * X.var(axis=0)[floored])
    assert np.all(np.diff(fit.trace) >= 0)


def test_constant_column_is_finite():
    X, _, _ = _fa_data(seed=6)
    X[:, 3] = 7.0
    with pytest.warns(UserWarning, match="lower bound"):
        fit = fit_em(prepare(X), ModelSpec("diagonal", 2))
    assert fit.at_floor[3]
    np.testing.assert_allclose(fit.gaussian.loadings[3], 0.0, atol=1e-12)
    assert np.isfinite(fit.log_likelihood)


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
