"""Pointwise log-likelihood of posterior draws, against SciPy's density of each row's observed block."""

import numpy as np
import pytest
from scipy import stats

import bayespca.posterior as posterior
from bayespca.inference.contract import Draws
from bayespca.posterior import pointwise_log_likelihood


def _draws(rng, chains=2, n_draws=7, d=6, k=2):
    w = rng.normal(size=(d, k)) + 0.1 * rng.normal(size=(chains, n_draws, d, k))
    noise = rng.uniform(0.3, 1.5, size=(chains, n_draws, d))
    mean = 5.0 + 0.1 * rng.normal(size=(chains, n_draws, d))
    return Draws(w, noise, mean, "none", "diagonal")


def _scipy(draws, X):
    out = np.zeros((*draws.loadings.shape[:2], len(X)))
    for c, s in np.ndindex(*out.shape[:2]):
        w, psi, mu = draws.loadings[c, s], draws.noise[c, s], draws.mean[c, s]
        cov = w @ w.T + np.diag(psi)
        for i, row in enumerate(X):
            o = ~np.isnan(row)
            if o.any():
                out[c, s, i] = stats.multivariate_normal(mu[o], cov[np.ix_(o, o)]).logpdf(row[o])
    return out


def _rows(rng, n, d):
    X = 5.0 + rng.normal(size=(n, d)) * 1.5
    X[:20, [1, 4]] = np.nan  # a common pattern: scored for all draws at once
    X[20:30, 0] = np.nan  # another
    X[30:34, 2] = np.nan  # a rare one: draw by draw
    X[34] = np.nan  # nothing observed: log 1
    X[35:45][rng.random((10, d)) < 0.3] = np.nan  # mostly rare patterns
    return X


@pytest.mark.parametrize("pattern_rows", [8, 1, 10**6])  # default; every pattern at once; all draw by draw
def test_pointwise_log_likelihood_with_missing_rows_equals_scipy(monkeypatch, pattern_rows):
    monkeypatch.setattr(posterior, "_PATTERN_ROWS", pattern_rows)
    rng = np.random.default_rng(0)
    draws = _draws(rng)
    X = _rows(rng, 80, 6)
    got = pointwise_log_likelihood(draws, X)
    assert got.shape == (2, 7, 80)
    np.testing.assert_allclose(got, _scipy(draws, X), rtol=1e-10, atol=1e-12)
    assert np.all(got[..., 34] == 0.0)


def test_pointwise_log_likelihood_of_complete_rows_equals_scipy():
    rng = np.random.default_rng(1)
    draws = _draws(rng)
    X = 5.0 + rng.normal(size=(30, 6))
    np.testing.assert_allclose(pointwise_log_likelihood(draws, X), _scipy(draws, X), rtol=1e-10)
