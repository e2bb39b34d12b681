"""Multiple imputation from NUTS fits: coverage of hidden truths, shrinking parameter uncertainty, moments."""

import warnings

import numpy as np
import pytest
from scipy import optimize
from scipy.stats import norm

from bayespca import PPCA
from bayespca.gaussian import LowRankGaussian
from bayespca.imputation import multiple_imputation
from bayespca.posterior import SamplingWarning


def _hidden(n, seed):
    """pPCA rows (k = 2, noise sd 0.7) with 10% of the entries hidden completely at random."""
    rng = np.random.default_rng(seed)
    w = np.array([[2.0, 1.0, -1.0, 0.5, 1.5, 0.0], [0.0, 1.0, 1.0, -2.0, 0.5, 1.0]]).T
    X = rng.normal(size=(n, 2)) @ w.T + 0.7 * rng.normal(size=(n, 6)) + 1.0
    return X, rng.random(X.shape) < 0.1


def _fit(X, hidden):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # one short chain
        return PPCA(2, method="nuts", num_warmup=300, num_samples=200, num_chains=1,
                    random_state=0).fit(np.where(hidden, np.nan, X))


@pytest.fixture(scope="module")
def fits():
    return {n: (*_hidden(n, seed=1), _fit(*_hidden(n, seed=1))) for n in (100, 800)}


def test_ninety_percent_intervals_cover_the_hidden_truths(fits):
    X, hidden, model = fits[800]
    imputations = model.impute(np.where(hidden, np.nan, X), n_imputations=20, random_state=0)
    interval = imputations.interval(0.9)[hidden]
    truth = X[hidden]
    coverage = np.mean((interval[:, 0] <= truth) & (truth <= interval[:, 1]))
    assert 0.85 <= coverage <= 0.95, (coverage, hidden.sum())
    # Observed entries are kept, missing ones drawn, in every data set.
    assert np.all(imputations.datasets[:, ~hidden] == X[~hidden])
    assert np.all(np.ptp(imputations.datasets[:, hidden], axis=0) > 0)


def test_between_imputation_variance_shrinks_as_n_grows(fits):
    between = {}
    for n, (X, hidden, model) in fits.items():
        imputations = model.impute(np.where(hidden, np.nan, X), n_imputations=20, random_state=0)
        between[n] = imputations.between_variance[hidden].mean()
        # The noise part does not shrink: within ~ sigma^2 = 0.49 plus the latent part.
        assert 0.49 < imputations.within_variance[hidden].mean() < 1.2
    # Parameter uncertainty ~ 1/n: 8 times the rows, about an eighth of the variance.
    assert between[800] < between[100] / 4


def test_moments_intervals_and_joint_draws_against_direct_conditioning():
    rng = np.random.default_rng(5)
    draws = LowRankGaussian(rng.normal(size=(3, 4, 2)), rng.uniform(0.3, 1.0, (3, 4)),
                            rng.normal(size=(3, 4)))
    X = np.array([[0.5, np.nan, np.nan, 1.0]])
    missing = np.isnan(X)
    imputations = multiple_imputation(draws, X, missing, 6000, random_state=0)
    # Gaussian conditioning on the d x d covariance, draw by draw.
    obs, mis = [0, 3], [1, 2]
    means, covs = [], []
    for w, psi, mu in zip(*draws, strict=True):
        c = w @ w.T + np.diag(psi)
        gain = c[np.ix_(mis, obs)] @ np.linalg.inv(c[np.ix_(obs, obs)])
        means.append(mu[mis] + gain @ (X[0, obs] - mu[obs]))
        covs.append(c[np.ix_(mis, mis)] - gain @ c[np.ix_(obs, mis)])
    means, covs = np.array(means), np.array(covs)
    np.testing.assert_allclose(imputations.mean[0, mis], means.mean(0), rtol=1e-10)
    variances = np.diagonal(covs, axis1=1, axis2=2)
    np.testing.assert_allclose(imputations.within_variance[0, mis], variances.mean(0), rtol=1e-10)
    np.testing.assert_allclose(imputations.between_variance[0, mis], means.var(0), rtol=1e-10)
    # Interval ends: roots of the mixture CDF by brentq.
    def mixture_cdf(x, e, q):
        return norm.cdf((x - means[:, e]) / np.sqrt(variances[:, e])).mean() - q

    for j, q in ((0, 0.05), (1, 0.95)):
        for e in range(2):
            root = optimize.brentq(mixture_cdf, -50, 50, args=(e, q), xtol=1e-14)
            assert imputations.interval(0.9)[0, mis[e], j] == pytest.approx(root, abs=1e-10)
    # 6000 draws: one posterior draw each, then the row's missing block jointly (their covariance).
    values = imputations.datasets[:, 0, mis]
    total_cov = covs.mean(0) + np.cov(means.T, bias=True)
    np.testing.assert_allclose(np.cov(values.T), total_cov, atol=5 * np.sqrt(2 / 6000) * total_cov.max())


def test_multiple_imputation_needs_a_posterior():
    X, hidden = _hidden(50, seed=2)
    X[hidden] = np.nan
    with pytest.raises(ValueError, match="needs a posterior"):
        PPCA(2).fit(X).impute(X, n_imputations=5)
    with pytest.raises(ValueError, match="n_imputations must be"):
        multiple_imputation(LowRankGaussian(np.ones((2, 6, 1)), np.ones((2, 6)), np.zeros((2, 6))), X,
                            np.isnan(X), 0)
