"""NUTS posteriors: the sufficient-statistic likelihood, calibration against the truth and ML."""

import warnings

import arviz as az
import numpy as np
import numpyro.distributions as dist
import pytest

from bayespca.gaussian import LowRankGaussian
from bayespca.inference.em import fit_em
from bayespca.inference.nuts import (
    SamplingWarning,
    diagnose,
    fit_nuts,
    marginal_log_likelihood,
    missing_patterns,
)


def _data(n, d, k, noise_sd, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, k)) * np.linspace(2.5, 1.5, k)
    X = rng.normal(size=(n, k)) @ w.T + noise_sd * rng.normal(size=(n, d)) + rng.normal(size=d)
    return X, w


def _per_row_numpyro(g, X):
    """Sum of per-row LowRankMultivariateNormal log-probs on each row's observed block."""
    total = 0.0
    for row in X:
        o = ~np.isnan(row)
        total += float(dist.LowRankMultivariateNormal(g.mean[o], g.loadings[o], g.noise[o]).log_prob(row[o]))
    return total


@pytest.mark.parametrize("max_patterns", [64, 1])
@pytest.mark.parametrize("frac_missing", [0.0, 0.15])
def test_log_likelihood_equals_per_row_numpyro(frac_missing, max_patterns):
    rng = np.random.default_rng(1)
    X, _ = _data(60, 5, 2, 0.5)
    X[rng.random(X.shape) < frac_missing] = np.nan
    g = LowRankGaussian(rng.normal(size=(5, 2)), rng.uniform(0.3, 1.0, 5), rng.normal(size=5))
    ours = float(marginal_log_likelihood(g, missing_patterns(X, max_patterns)))
    assert ours == pytest.approx(_per_row_numpyro(g, X), rel=1e-10)


@pytest.fixture(scope="module")
def ppca_fit():
    X, w = _data(400, 6, 2, 0.6, seed=3)
    fit = fit_nuts(
        X, 2, num_warmup=300, num_samples=300, num_chains=4, chain_method="vectorized", random_state=0
    )
    return X, w, fit


def test_ppca_posterior_covers_truth(ppca_fit):
    _, w, fit = ppca_fit
    sigma2 = fit.noise[..., 0].ravel()
    assert abs(sigma2.mean() - 0.36) < 4 * sigma2.std()
    wwt = np.einsum("cmdk,cmek->cmde", fit.loadings, fit.loadings).reshape(-1, 6, 6)
    z = (wwt.mean(0) - w @ w.T) / wwt.std(0)
    assert np.max(np.abs(z)) < 4.5


def test_ppca_chains_converge(ppca_fit):
    _, _, fit = ppca_fit
    assert fit.sample_stats["diverging"].sum() == 0
    eig = np.linalg.svd(fit.loadings, compute_uv=False) ** 2
    for series in [
        fit.noise[..., 0],
        *np.moveaxis(eig, -1, 0),
        *np.moveaxis(fit.loadings.reshape(4, 300, -1), -1, 0),
    ]:
        assert az.rhat(series) < 1.01


def test_fa_lower_triangular_converges_and_covers_truth():
    rng = np.random.default_rng(4)
    X, w = _data(400, 6, 2, 1.0, seed=4)
    psi = rng.uniform(0.3, 1.0, 6)
    X = X - X.mean(0)
    X = rng.normal(size=(400, 2)) @ w.T + rng.normal(size=(400, 6)) * np.sqrt(psi)
    fit = fit_nuts(
        X,
        2,
        noise="diagonal",
        num_warmup=300,
        num_samples=300,
        num_chains=4,
        chain_method="vectorized",
        random_state=1,
    )
    assert fit.sample_stats["diverging"].sum() == 0
    upper = np.triu_indices(6, 1, 2)
    assert np.all(fit.loadings[:, :, upper[0], upper[1]] == 0)
    assert np.all(fit.loadings[:, :, [0, 1], [0, 1]] > 0)
    z = (fit.noise.reshape(-1, 6).mean(0) - psi) / fit.noise.reshape(-1, 6).std(0)
    assert np.max(np.abs(z)) < 4.5
    for series in np.moveaxis(fit.loadings.reshape(4, 300, -1), -1, 0):
        if series.std() > 0:
            assert az.rhat(series) < 1.01


def test_large_n_concentrates_on_ml():
    X, _ = _data(100_000, 5, 2, 0.5, seed=5)
    fit = fit_nuts(
        X, 2, num_warmup=200, num_samples=200, num_chains=1, random_state=2, identification="procrustes"
    )
    ml = fit_em(X, 2).gaussian
    wwt = np.einsum("cmdk,cmek->de", fit.loadings, fit.loadings) / 200
    ml_wwt = ml.loadings @ ml.loadings.T
    assert np.linalg.norm(wwt - ml_wwt) / np.linalg.norm(ml_wwt) < 0.01
    assert fit.noise.mean() == pytest.approx(ml.noise[0], rel=0.01)
    # Procrustes-aligned draws sit around the reference loadings themselves.
    assert np.allclose(fit.loadings.mean((0, 1)), ml.loadings, atol=0.03)


def test_missing_values_posterior_near_em():
    X, _ = _data(300, 5, 1, 0.5, seed=6)
    X[np.random.default_rng(6).random(X.shape) < 0.1] = np.nan
    fit = fit_nuts(X, 1, num_warmup=200, num_samples=200, num_chains=1, random_state=3)
    ml = fit_em(X, 1).gaussian
    assert fit.noise.mean() == pytest.approx(ml.noise[0], rel=0.1)
    assert np.allclose(fit.loadings.mean((0, 1)), ml.loadings, atol=0.1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"identification": "qr"}, "identification"),
        ({"num_chains": 0}, "num_chains"),
        ({"chain_method": "threads"}, "chain_method"),
        ({"target_accept_prob": 1.5}, "target_accept"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_nuts(np.ones((5, 3)), 1, **kwargs)


def test_diagnostics_silent_on_converged_chains(ppca_fit):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplingWarning)
        assert diagnose(ppca_fit[2], min_ess_per_chain=50) == []


def test_diagnostics_warn_and_name_the_fix():
    X, _ = _data(200, 5, 2, 0.5, seed=7)
    fit = fit_nuts(
        X,
        2,
        num_warmup=3,
        num_samples=30,
        num_chains=2,
        chain_method="vectorized",
        random_state=0,
        target_accept_prob=0.5,
    )
    fit.sample_stats["diverging"][0, 0] = True  # as if the sampler had diverged once
    with pytest.warns(SamplingWarning) as record:
        messages = diagnose(fit)
    ours = [r for r in record if r.category is SamplingWarning]
    assert len(ours) == len(messages) == 3
    text = " ".join(messages)
    assert "target_accept_prob" in text and "R-hat" in text and "increase num_samples" in text
