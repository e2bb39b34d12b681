"""Tests of fit_svi against closed-form pPCA, scikit-learn FA and direct optimisation."""

import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import log_density
from scipy import optimize, stats
from scipy.linalg import solve_triangular
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.decomposition import FactorAnalysis
from threadpoolctl import threadpool_limits

import bayespca  # noqa: F401  (sets float64)
from bayespca import PPCA, models
from bayespca.inference.contract import Fit, ModelSpec
from bayespca.inference.em import fit_em
from bayespca.inference.svi import fit_svi
from bayespca.statistics import prepare

N, D, K = 1000, 20, 3


@pytest.fixture(autouse=True)
def _one_blas_thread():
    # Every LAPACK call here is small; on a machine with more busy threads
    # than cores, threaded OpenBLAS waits for scheduling on each call (up to
    # 100x slower, measured). Results do not depend on the thread count.
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _svi(X, k, noise="isotropic", priors=None, **options) -> Fit:
    return fit_svi(prepare(X), ModelSpec(noise, k, prior=priors), **options)


def _loglik(g, X):
    """Observed-data log-likelihood with scipy (independent of bayespca.gaussian)."""
    cov = g.loadings @ g.loadings.T + np.diag(g.noise)
    if not np.isnan(X).any():
        return stats.multivariate_normal(g.mean, cov).logpdf(X).sum()
    total = 0.0
    for pattern in np.unique(~np.isnan(X), axis=0):
        rows = X[(~np.isnan(X) == pattern).all(axis=1)][:, pattern]
        total += (
            stats.multivariate_normal(g.mean[pattern], cov[np.ix_(pattern, pattern)])
            .logpdf(rows)
            .sum()
        )
    return total


def _loglik_cholesky(g, X):
    """The same by Cholesky factors: scipy's density calls a covariance singular below 2e-10 of its top
    eigenvalue, which raw data with feature variances far apart (breast cancer) pass."""
    cov = g.loadings @ g.loadings.T + np.diag(g.noise)
    total = 0.0
    for pattern in np.unique(~np.isnan(X), axis=0):
        rows = X[(~np.isnan(X) == pattern).all(axis=1)][:, pattern] - g.mean[pattern]
        chol = np.linalg.cholesky(cov[np.ix_(pattern, pattern)])
        z = solve_triangular(chol, rows.T, lower=True)
        log_det = 2 * np.log(np.diag(chol)).sum()
        total -= 0.5 * (np.sum(z**2) + rows.shape[0] * (log_det + pattern.sum() * np.log(2 * np.pi)))
    return total


def _closed_form(X, k):
    """Tipping & Bishop ML: eigendecomposition of the 1/n covariance."""
    n, d = X.shape
    evals, evecs = np.linalg.eigh(np.cov(X.T, bias=True))
    evals, evecs = evals[::-1], evecs[:, ::-1]
    sigma2 = evals[k:].mean()
    W = evecs[:, :k] * np.sqrt(evals[:k] - sigma2)
    loglik = (
        -n / 2 * (d * np.log(2 * np.pi) + np.log(evals[:k]).sum() + (d - k) * np.log(sigma2) + d)
    )
    return W @ W.T, sigma2, loglik


@pytest.fixture(scope="module")
def ppca_data():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(D, K)) * 2.0
    X = rng.normal(size=(N, K)) @ W.T + rng.normal(size=D) * 5 + 0.5 * rng.normal(size=(N, D))
    return X * 30.0  # units far from 1: the standardisation must make this irrelevant


@pytest.mark.parametrize("init", ["svd", "random"])
def test_delta_flat_priors_reach_closed_form_ml(ppca_data, init):
    fit = _svi(ppca_data, K, priors="flat", init=init, random_state=0)
    WWt, sigma2, loglik = _closed_form(ppca_data, K)
    ours = _loglik(fit.gaussian, ppca_data)
    assert fit.converged and fit.n_iter == fit.trace.size < 5000
    assert abs(ours - loglik) / abs(loglik) < 1e-10
    g = fit.gaussian
    np.testing.assert_allclose(
        g.loadings @ g.loadings.T, WWt, rtol=0, atol=1e-7 * np.abs(WWt).max()
    )
    np.testing.assert_allclose(g.noise, sigma2, rtol=1e-8)
    np.testing.assert_allclose(g.mean, ppca_data.mean(axis=0), atol=1e-9 * ppca_data.std())
    # Flat priors: the loss is -log p(X | theta), in data units.
    np.testing.assert_allclose(fit.trace[-1], -ours, rtol=1e-10)


def test_delta_default_priors_is_map_near_ml(ppca_data):
    fit = _svi(ppca_data, K, random_state=0)
    _, _, loglik = _closed_form(ppca_data, K)
    ours = _loglik(fit.gaussian, ppca_data)
    assert fit.converged
    assert ours < loglik and (loglik - ours) / abs(loglik) < 1e-4
    # The loss is -log p(X, theta) under the documented default priors.
    g = fit.gaussian
    m, s = ppca_data.mean(axis=0), ppca_data.std(axis=0)
    overall = np.sqrt(np.mean(s**2))
    log_prior = (
        stats.norm(0, overall).logpdf(g.loadings).sum()
        + stats.halfnorm(scale=overall).logpdf(np.sqrt(g.noise[0]))
        + stats.norm(m, 10 * s).logpdf(g.mean).sum()
    )
    np.testing.assert_allclose(fit.trace[-1], -(ours + log_prior), rtol=1e-10)
    draws = fit.details.sample_posterior(3, random_state=0)
    # Every draw of a delta guide is its point (Fit.gaussian is its canonical rotation).
    wwt = np.einsum("sdk,sek->sde", draws.loadings, draws.loadings)
    # Rotated W's products round to ~k eps |w_i| |w_j|, which is far above eps |(W W^T)_ij| where
    # the sum cancels (an entry of -7.15 among rows of norm ~40 differed by 7.5e-12)
    norms = np.linalg.norm(g.loadings, axis=1)
    assert np.all(np.abs(wwt - g.loadings @ g.loadings.T) <= 1e-12 * np.outer(norms, norms))


def test_factor_analysis_matches_sklearn():
    rng = np.random.default_rng(1)
    W = rng.normal(size=(D, K))
    psi = rng.uniform(0.1, 1.0, size=D)
    X = rng.normal(size=(N, K)) @ W.T + rng.normal(size=(N, D)) * np.sqrt(psi)
    sk = FactorAnalysis(K, tol=1e-10, max_iter=20000, svd_method="lapack").fit(X)
    reference = sk.score(X) * N
    fit = _svi(X, K, noise="diagonal", priors="flat", random_state=0)
    ours = _loglik(fit.gaussian, X)
    assert fit.converged
    assert abs(ours - reference) / abs(reference) < 1e-7
    np.testing.assert_allclose(fit.gaussian.noise, sk.noise_variance_, rtol=1e-3)
    C = sk.components_.T @ sk.components_
    np.testing.assert_allclose(fit.gaussian.loadings @ fit.gaussian.loadings.T, C, atol=1e-3)


@pytest.mark.parametrize(("load", "share_missing"), [
    (load_breast_cancer, 0.0), (load_breast_cancer, 0.05), (load_wine, 0.05),
])
def test_factor_analysis_of_features_on_very_different_scales(load, share_missing):
    # Raw breast cancer: feature variances from 7e-6 to 1.2e5 (wine: 0.015 to 1e5). FA is equivariant
    # under rescaling each feature, Adam is not: standardised by one scale, breast cancer stopped after
    # 5000 steps 54% below the ML, and wine with 5% missing (40 patterns, fitted from their statistics)
    # 11% below.
    X = load().data
    X = np.where(np.random.default_rng(0).random(X.shape) < share_missing, np.nan, X)
    em = fit_em(prepare(X), ModelSpec("diagonal", 2))
    reference = _loglik_cholesky(em.gaussian, X)
    fit = _svi(X, 2, noise="diagonal", priors="flat", random_state=0)
    ours = _loglik_cholesky(fit.gaussian, X)
    assert fit.converged
    # EM stops at a relative gain of 1e-9 a step; Adam's decayed steps end closer still (they are above it).
    assert ours >= reference - 1e-8 * abs(reference)
    assert abs(ours - reference) / abs(reference) < 1e-7
    np.testing.assert_allclose(fit.trace[-1], -ours, rtol=1e-9)  # the loss in data units


def test_factor_analysis_loss_is_the_log_joint_in_data_units():
    # Default priors, each feature standardised by its own sd: the loss carries the Jacobian of that
    # change of variables, feature by feature. Reference: the model's log joint density at the fit,
    # evaluated on the raw data (wine: feature variances from 0.015 to 1e5).
    X = load_wine().data
    fit = _svi(X, 2, noise="diagonal", random_state=0)
    g = fit.gaussian
    params = {"W": jnp.asarray(g.loadings), "psi": jnp.asarray(g.noise), "mu": jnp.asarray(g.mean)}
    kwargs = {"n_components": 2, "identification": "none"}
    log_joint, _ = log_density(models.factor_analysis, (jnp.asarray(X),), kwargs, params)
    np.testing.assert_allclose(fit.trace[-1], -float(log_joint), rtol=1e-9)


def test_missing_values_reach_the_observed_data_ml():
    # Reference: scipy's L-BFGS on the observed-data likelihood written with
    # scipy densities, one block per missingness pattern.
    rng = np.random.default_rng(2)
    n, d, k = 300, 6, 2
    X = rng.normal(size=(n, k)) @ rng.normal(size=(d, k)).T + 1.0 + 0.4 * rng.normal(size=(n, d))
    patterns = np.array([[1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 1]], bool)
    X[~patterns[rng.integers(0, 3, size=n)]] = np.nan

    def unpack(theta):
        W = theta[: d * k].reshape(d, k)
        return W, np.exp(2 * theta[d * k]), theta[d * k + 1 :]

    def negloglik(theta):
        W, s2, mu = unpack(theta)
        cov = W @ W.T + s2 * np.eye(d)
        total = 0.0
        for p in patterns:
            rows = X[(~np.isnan(X) == p).all(axis=1)][:, p]
            total += stats.multivariate_normal(mu[p], cov[np.ix_(p, p)]).logpdf(rows).sum()
        return -total

    start = np.concatenate([0.5 * np.ones(d * k), [0.0], np.nanmean(X, axis=0)])
    ref = optimize.minimize(negloglik, start, method="BFGS", options={"gtol": 1e-8})
    W_ref, _, _ = unpack(ref.x)

    fit = _svi(X, k, priors="flat", random_state=0)
    ours = _loglik(fit.gaussian, X)
    assert fit.converged
    assert ours >= -ref.fun - 1e-7 * abs(ref.fun)
    assert abs(ours + ref.fun) / abs(ref.fun) < 1e-8
    np.testing.assert_allclose(
        fit.gaussian.loadings @ fit.gaussian.loadings.T, W_ref @ W_ref.T, atol=1e-4
    )


def test_minibatch_gets_close(ppca_data):
    fit = _svi(ppca_data, K, priors="flat", batch_size=100, init="random", random_state=3)
    _, _, loglik = _closed_form(ppca_data, K)
    assert abs(_loglik(fit.gaussian, ppca_data) - loglik) / abs(loglik) < 1e-3


def _laplace_log_sigma_precision(X, g):
    """-d^2/du^2 of the log-likelihood in u = log sigma, by central differences."""
    W, mu = g.loadings, g.mean
    u0, h = 0.5 * np.log(g.noise[0]), 1e-4

    def ll(u):
        cov = W @ W.T + np.exp(2 * u) * np.eye(X.shape[1])
        return stats.multivariate_normal(mu, cov).logpdf(X).sum()

    return -(ll(u0 + h) - 2 * ll(u0) + ll(u0 - h)) / h**2


@pytest.mark.parametrize("guide", ["normal", "lowrank"])
def test_gaussian_guides_locate_and_spread_like_the_posterior(guide):
    # With flat priors and n large, the posterior is close to Gaussian around
    # the ML point; a mean-field Gaussian fit to a Gaussian has marginal
    # precision equal to the diagonal of the Hessian, and sigma is nearly
    # orthogonal to the other parameters at the optimum.
    rng = np.random.default_rng(4)
    n, d, k = 400, 6, 1
    X = rng.normal(size=(n, k)) @ rng.normal(size=(d, k)).T + 0.5 * rng.normal(size=(n, d))
    fit = _svi(X, k, guide=guide, priors="flat", num_steps=2000, random_state=0)
    _, sigma2, loglik = _closed_form(X, k)
    assert abs(_loglik(fit.gaussian, X) - loglik) / abs(loglik) < 1e-4
    draws = fit.details.sample_posterior(4000, random_state=1)
    log_sigma = 0.5 * np.log(draws.noise[:, 0])
    expected_sd = 1 / np.sqrt(_laplace_log_sigma_precision(X, fit.gaussian))
    np.testing.assert_allclose(log_sigma.std(), expected_sd, rtol=0.1)
    np.testing.assert_allclose(np.median(log_sigma), 0.5 * np.log(sigma2), atol=expected_sd)
    assert draws.loadings.shape == (4000, d, k)


def test_dask_minibatches_drawn_chunk_by_chunk_stand_for_all_rows():
    da = pytest.importorskip("dask.array")
    # n is five times the rows of each sample the minibatches come from (20,000): were the
    # likelihood scaled to the sample's rows instead of n, the guide's sd of log sigma would be
    # sqrt(5) times the posterior's.
    rng = np.random.default_rng(6)
    n, d, k = 100_000, 6, 1
    X = rng.normal(size=(n, k)) @ rng.normal(size=(d, k)).T + 0.5 * rng.normal(size=(n, d)) + 3
    chunks = (15_000, d)  # uneven last chunk
    fit = _svi(da.from_array(X, chunks=chunks), k, guide="normal", priors="flat", batch_size=200,
               num_steps=3000, random_state=0)
    _, sigma2, loglik = _closed_form(X, k)
    assert abs(_loglik(fit.gaussian, X) - loglik) / abs(loglik) < 1e-3  # as the in-memory minibatches
    log_sigma = 0.5 * np.log(fit.details.sample_posterior(4000, random_state=1).noise[:, 0])
    expected_sd = 1 / np.sqrt(_laplace_log_sigma_precision(X, fit.gaussian))
    np.testing.assert_allclose(log_sigma.std(), expected_sd, rtol=0.3)


def test_out_of_steps_is_reported_and_runs_are_reproducible(capsys):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(50, 1)) @ rng.normal(size=(1, 4)) * 3 + rng.normal(size=(50, 4))
    kwargs = {"init": "random", "num_steps": 200, "batch_size": 20, "random_state": 0}
    fit = _svi(X, 1, progress_bar=True, **kwargs)
    assert isinstance(fit, Fit)
    assert not fit.converged and fit.n_iter == 200 and fit.trace.shape == (200,)
    assert fit.trace[-10:].mean() < fit.trace[:10].mean()
    assert "SVI" in capsys.readouterr().err
    again = _svi(X, 1, **kwargs)
    np.testing.assert_array_equal(fit.trace, again.trace)
    np.testing.assert_array_equal(fit.gaussian.loadings, again.gaussian.loadings)
    other = _svi(X, 1, **{**kwargs, "random_state": 1})
    assert not np.array_equal(fit.trace, other.trace)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"guide": "laplace"}, ValueError, "guide must be one of"),
        ({"init": "pca"}, ValueError, "init must be one of"),
        ({"num_steps": 0}, ValueError, "num_steps must be an int >= 1; got 0"),
        ({"learning_rate": -0.1}, ValueError, "learning_rate must be a finite number > 0"),
        ({"tol": float("nan")}, ValueError, "tol must be a finite number > 0; got nan"),
        ({"batch_size": 11}, ValueError, "batch_size must be an int >= 1 and <= 10 or None; got 11"),
        ({"priors": "weak"}, ValueError, "prior must be None, 'flat', 'ard', 'horseshoe'"),
        ({"random_state": "seed"}, TypeError, "random_state must be None, an int"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    X = np.random.default_rng(6).normal(size=(10, 4))
    with pytest.raises(error, match=match):
        _svi(X, 1, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_components": 5}, ValueError, r"n_components must be None or an int in \[1, 4\]"),
        ({"n_components": 0}, ValueError, "n_components must be None or an int in"),
        ({"prior": "weak"}, ValueError, "prior must be None, 'flat', 'ard', 'horseshoe'"),
    ],
)
def test_bad_model_arguments_are_named_before_fitting(kwargs, error, match):
    X = np.random.default_rng(6).normal(size=(10, 4))
    with pytest.raises(error, match=match):
        PPCA(method="svi", **{"n_components": 1, **kwargs}).fit(X)


def test_bad_data_is_named():
    X = np.random.default_rng(7).normal(size=(10, 4))
    X[:, 2] = np.nan
    with pytest.raises(ValueError, match=r"no observed value \(column indices \[2\]\)"):
        PPCA(1, method="svi").fit(X)
    with pytest.raises(ValueError, match="infinity"):
        PPCA(1, method="svi").fit(np.full((10, 4), np.inf))
    with pytest.raises(ValueError, match="must be 2-D"):
        PPCA(1, method="svi").fit(np.ones(10))
