"""Closed-form ML pPCA against Tipping & Bishop's formula, SciPy and scikit-learn."""

import numpy as np
import pytest
from scipy.stats import multivariate_normal
from sklearn.decomposition import PCA as SkPCA

from bayespca.gaussian import LowRankGaussian, log_prob
from bayespca.inference.closed_form import noise_floor, ppca_closed_form
from bayespca.inference.contract import ModelSpec
from bayespca.statistics import prepare


def _low_rank(n, d, k, noise=0.5, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d, k)) * np.linspace(3.0, 1.0, k)
    return rng.standard_normal((n, k)) @ W.T + noise * rng.standard_normal((n, d)) + 2.0


def _tipping_bishop(X, k):
    """L* = -n/2 (d log 2pi + sum_{j<=k} log lambda_j + (d-k) log sigma^2 + d), 1/n covariance."""
    n, d = X.shape
    lam = np.sort(np.linalg.eigvalsh(np.cov(X.T, bias=True)))[::-1]
    lam = np.clip(lam, 0.0, None)
    sigma2 = lam[k:].mean()
    ll = -0.5 * n * (d * np.log(2 * np.pi) + np.log(lam[:k]).sum() + (d - k) * np.log(sigma2) + d)
    return ll, sigma2, lam


# (200, 12): covariance solver; (15, 40): n < d, Gram solver; (30, 6): tiny, full SVD.
@pytest.mark.parametrize("shape", [(200, 12), (15, 40), (30, 6)])
@pytest.mark.parametrize("k", [1, 3])
def test_log_likelihood_equals_tipping_bishop_formula_and_scipy(shape, k):
    n, d = shape
    X = _low_rank(n, d, 3)
    fit = ppca_closed_form(prepare(X), ModelSpec("isotropic", k))
    ll_ref, sigma2_ref, lam = _tipping_bishop(X, k)
    # With n < d, sigma^2 averages all d - k discarded eigenvalues, zeros included.
    assert fit.gaussian.noise[0] == pytest.approx(sigma2_ref, rel=1e-9)
    assert fit.log_likelihood == pytest.approx(ll_ref, rel=1e-10)
    cov = fit.gaussian.loadings @ fit.gaussian.loadings.T + np.diag(fit.gaussian.noise)
    scipy_ll = multivariate_normal(X.mean(axis=0), cov).logpdf(X).sum()
    assert fit.log_likelihood == pytest.approx(scipy_ll, rel=1e-10)
    # W = U_k (Lambda_k - sigma^2 I)^{1/2}: W^T W is diag(lambda_j - sigma^2).
    np.testing.assert_allclose(
        fit.gaussian.loadings.T @ fit.gaussian.loadings,
        np.diag(lam[:k] - sigma2_ref),
        rtol=1e-8,
        atol=1e-10 * lam[0],
    )


def test_equals_sklearn_pca_score_after_n_minus_1_correction():
    X = _low_rank(300, 10, 3)
    n = X.shape[0]
    sk = SkPCA(3, svd_solver="full").fit(X)
    # scikit-learn's parameters: its covariance estimate divides by n - 1.
    w_sk = sk.components_.T * np.sqrt(sk.explained_variance_ - sk.noise_variance_)
    g_sk = LowRankGaussian(w_sk, np.full(10, sk.noise_variance_), sk.mean_)
    assert float(np.sum(log_prob(g_sk, X))) == pytest.approx(sk.score(X) * n, rel=1e-12)
    fit = ppca_closed_form(prepare(X), ModelSpec("isotropic", 3))
    # Rescaling scikit-learn's eigenvalues by (n - 1) / n gives the ML fit exactly.
    assert fit.gaussian.noise[0] == pytest.approx(sk.noise_variance_ * (n - 1) / n, rel=1e-10)
    np.testing.assert_allclose(
        fit.gaussian.loadings @ fit.gaussian.loadings.T + np.diag(fit.gaussian.noise),
        sk.get_covariance() * (n - 1) / n,
        rtol=1e-9,
        atol=1e-12,
    )
    # The ML fit beats scikit-learn's n - 1 fit, by a hair.
    assert fit.log_likelihood > sk.score(X) * n
    assert fit.log_likelihood - sk.score(X) * n < 1e-3 * abs(fit.log_likelihood)


def test_loadings_orientation_matches_pca_axes():
    X = _low_rank(300, 10, 3)
    fit = ppca_closed_form(prepare(X), ModelSpec("isotropic", 3))
    sk = SkPCA(3, svd_solver="full").fit(X)
    axes = fit.gaussian.loadings / np.linalg.norm(fit.gaussian.loadings, axis=0)
    # Same axes up to sign, and each column's largest-magnitude entry positive.
    np.testing.assert_allclose(np.abs(axes.T), np.abs(sk.components_), atol=1e-8)
    idx = np.argmax(np.abs(axes), axis=0)
    assert np.all(axes[idx, np.arange(3)] > 0)


def test_k_equal_d_holds_sigma2_at_floor_and_stays_finite():
    X = _low_rank(50, 4, 2)
    with pytest.warns(UserWarning, match="lower bound"):
        fit = ppca_closed_form(prepare(X), ModelSpec("isotropic", 4))
    bound = noise_floor(np.array([X.var(axis=0).mean()]), 1e-10)[0]
    assert fit.gaussian.noise[0] == pytest.approx(bound)
    assert fit.at_floor.all()
    # The covariance is then the sample covariance (all directions kept).
    cov = fit.gaussian.loadings @ fit.gaussian.loadings.T + np.diag(fit.gaussian.noise)
    np.testing.assert_allclose(cov, np.cov(X.T, bias=True), atol=1e-8)
    assert np.isfinite(fit.log_likelihood)


def test_k_above_rank_pads_zero_loadings():
    X = _low_rank(5, 12, 2)  # rank of the centred data is 4
    with pytest.warns(UserWarning, match="lower bound"):
        fit = ppca_closed_form(prepare(X), ModelSpec("isotropic", 6))
    norms = np.linalg.norm(fit.gaussian.loadings, axis=0)
    assert np.all(norms[:4] > 0)
    np.testing.assert_array_equal(norms[4:], 0.0)


@pytest.mark.parametrize("k", [0, 13, 2.5, True])
def test_bad_n_components(k):
    accepted = "n_components must be an int in \\[1, 12\\]"
    with pytest.raises((ValueError, TypeError), match=accepted):
        ppca_closed_form(prepare(_low_rank(20, 12, 2)), ModelSpec("isotropic", k))
