"""PPCA / FactorAnalysis with method="nuts": point estimates, latent draws, ArviZ output."""

import numpy as np
import pytest

from bayespca import gaussian
from bayespca.probabilistic import PPCA, FactorAnalysis


def _data(n=300, d=5, k=2, noise_sd=0.5, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, k)) * np.linspace(2.5, 1.5, k)
    return rng.normal(size=(n, k)) @ w.T + noise_sd * rng.normal(size=(n, d)) + 1.0


@pytest.fixture(scope="module")
def tight():
    """A posterior so tight (n = 20000) that it is close to a point mass at the ML fit."""
    X = _data(n=20_000, seed=1)
    model = PPCA(
        2,
        method="nuts",
        num_warmup=200,
        num_samples=200,
        num_chains=2,
        chain_method="vectorized",
        random_state=0,
    ).fit(X)
    return X, model


def test_point_estimate_is_posterior_mean(tight):
    _, model = tight
    assert np.allclose(model.components_.T, model.loadings_samples_.mean((0, 1)))
    assert model.noise_variance_ == pytest.approx(model.noise_variance_samples_.mean())
    ml = PPCA(2).fit(tight[0])
    assert model.noise_variance_ == pytest.approx(ml.noise_variance_, rel=0.02)


def test_sample_latent_matches_analytic_posterior(tight):
    X, model = tight
    new = X[:3] + 0.1
    new[1, 2] = np.nan
    z = model.sample_latent(new, num_samples=4000, random_state=0)
    assert z.shape == (4000, 3, 2)
    observed = ~np.isnan(new)
    post = gaussian.latent_posterior(model.gaussian_, np.nan_to_num(new), observed)
    sd = np.sqrt(np.diagonal(post.covariance, axis1=1, axis2=2))
    assert np.all(np.abs(z.mean(0) - post.mean) < 5 * sd / np.sqrt(4000) + 0.01 * sd)
    for i in range(3):
        assert np.allclose(np.cov(z[:, i].T), post.covariance[i], rtol=0.1, atol=0.02)
    # transform is the posterior mean of z, averaged over the parameter draws.
    assert np.allclose(model.transform(new), post.mean, atol=0.01 * sd.max() + 1e-3)


def test_sample_latent_spread_includes_parameter_uncertainty():
    X = _data(n=40, seed=2)
    model = PPCA(2, method="nuts", num_warmup=200, num_samples=200, num_chains=1, random_state=1).fit(X)
    z = model.sample_latent(X[:1], num_samples=3000, random_state=1)
    post = model.latent_posterior(X[:1])
    # The latent_posterior covariance is the mixture covariance: E[C_theta] + Cov[m_theta].
    assert np.allclose(np.cov(z[:, 0].T), post.covariance[0], rtol=0.15, atol=0.01)
    plug_in = gaussian.latent_posterior(model.gaussian_, X[:1])
    assert np.trace(post.covariance[0]) > np.trace(plug_in.covariance)


def test_factor_analysis_nuts_near_em():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(6, 2))
    X = rng.normal(size=(2000, 2)) @ w.T + rng.normal(size=(2000, 6)) * np.sqrt(rng.uniform(0.3, 1.0, 6))
    fa = FactorAnalysis(2, method="nuts", num_warmup=200, num_samples=200, num_chains=1, random_state=0).fit(
        X
    )
    em = FactorAnalysis(2).fit(X)
    assert np.allclose(fa.noise_variance_, em.noise_variance_, rtol=0.15, atol=0.02)
    assert np.allclose(fa.get_covariance(), em.get_covariance(), atol=0.1)


def test_sample_latent_needs_nuts():
    X = _data()
    with pytest.raises(ValueError, match="method='nuts'"):
        PPCA(2).fit(X).sample_latent(X)
