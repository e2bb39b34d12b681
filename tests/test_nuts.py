"""NUTS posteriors: the sufficient-statistic likelihood, calibration against the truth and ML."""

import warnings

import arviz as az
import numpy as np
import numpyro.distributions as dist
import pytest

from bayespca.gaussian import LowRankGaussian
from bayespca.inference.contract import ModelSpec
from bayespca.inference.nuts import (
    NUTSFit,
    SamplingWarning,
    diagnose,
    fit_nuts,
    marginal_log_likelihood,
    missing_patterns,
)
from bayespca.statistics import prepare


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


@pytest.mark.parametrize("identification", ["polar", "lower_triangular", "none"])
def test_start_maps_back_to_the_ml_loadings(identification):
    """The unconstrained start of the chains reproduces ``W W^T`` of the ML fit it came from."""
    from bayespca.inference.closed_form import ppca_closed_form
    from bayespca.inference.nuts import _Parameterisation

    X, _ = _data(300, 6, 3, 0.5, seed=2)
    ml = ppca_closed_form(prepare(X), ModelSpec("isotropic", 3)).gaussian
    w = np.asarray(ml.loadings)
    par = _Parameterisation(6, 3, "isotropic", identification, X.mean(0), np.eye(6))
    back = par.constrain(par.unconstrain(w, np.asarray(ml.noise), np.asarray(ml.mean)))
    assert np.allclose(back[0] @ back[0].T, w @ w.T, rtol=1e-10, atol=1e-10)
    assert np.allclose(back[1], np.asarray(ml.noise)) and np.allclose(back[2], np.asarray(ml.mean))


@pytest.fixture(scope="module")
def ppca_fit():
    X, w = _data(400, 6, 2, 0.6, seed=3)
    fit = fit_nuts(
        X, 2, num_warmup=300, num_samples=400, num_chains=4, chain_method="vectorized", random_state=0
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
        *np.moveaxis(fit.loadings.reshape(4, 400, -1), -1, 0),
    ]:
        assert az.rhat(series) < 1.01


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"identification": "qr"}, "identification"),
        ({"num_chains": 0}, "num_chains"),
        ({"chain_method": "threads"}, "chain_method"),
        ({"target_accept_prob": 1.5}, "target_accept"),
        ({"dense_mass": "auto"}, "dense_mass"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_nuts(np.ones((5, 3)), 1, **kwargs)


def test_new_data_of_the_same_shapes_reuse_the_compiled_sampler():
    """The data are arguments of the compiled sampler, not constants baked into it.

    ``3 X + 5`` has noise variances 9 times those of ``X``; the scale-aware
    default priors keep the posterior equivariant, so the posterior mean of
    ``sigma^2`` scales by 9, while nothing is compiled again.
    """
    from bayespca.inference import nuts

    X, _ = _data(150, 4, 1, 0.5, seed=10)
    options = {"num_warmup": 150, "num_samples": 150, "num_chains": 1, "random_state": 0}
    first = fit_nuts(X, 1, **options)
    compiled = [f._cache_size() for f in (nuts._chain_jit, nuts._hessian, nuts._constrained_draws)]
    second = fit_nuts(3 * X + 5, 1, **options)
    assert [f._cache_size() for f in (nuts._chain_jit, nuts._hessian, nuts._constrained_draws)] == compiled
    assert second.noise.mean() / first.noise.mean() == pytest.approx(9.0, rel=0.05)


def test_diagnostics_silent_on_converged_chains(ppca_fit):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplingWarning)
        assert diagnose(ppca_fit[2], min_ess_per_chain=50) == []


def test_diagnostics_warn_and_name_the_fix():
    """Synthetic draws: chains stuck at different values, a divergence, an AR(1) series."""
    rng = np.random.default_rng(0)
    chains, draws, d = 2, 200, 4
    ar = np.zeros((chains, draws))
    for t in range(1, draws):
        ar[:, t] = 0.995 * ar[:, t - 1] + 0.1 * rng.normal(size=chains)
    noise = np.broadcast_to(1.0 + 0.01 * ar[..., None], (chains, draws, d)).copy()
    w = rng.normal(size=(chains, draws, d, 1)) * 0.01 + np.array([1.0, 3.0])[:, None, None, None]
    stats = {"diverging": np.zeros((chains, draws), bool)}
    stats["diverging"][1, 5] = True
    ref = LowRankGaussian(np.ones((d, 1)), np.ones(d), np.zeros(d))
    fit = NUTSFit(w, noise, np.zeros((chains, draws, d)), stats, ref, "none", "isotropic")
    with pytest.warns(SamplingWarning) as record:
        messages = diagnose(fit)
    assert len([r for r in record if r.category is SamplingWarning]) == len(messages) == 3
    assert "1 divergent" in messages[0] and "target_accept_prob" in messages[0]
    assert "R-hat of " in messages[1] and "num_warmup" in messages[1]
    assert "increase num_samples" in messages[2]


def test_procrustes_aligned_loadings_converge_to_the_ml_solution(ppca_fit):
    """Unconstrained W (the rotation ridge left in), rotated onto the ML loadings after sampling."""
    from bayespca.inference.closed_form import ppca_closed_form

    X, _, polar = ppca_fit
    fit = fit_nuts(
        X,
        2,
        identification="procrustes",
        num_warmup=300,
        num_samples=300,
        num_chains=4,
        chain_method="vectorized",
        random_state=1,
    )
    draws = fit.loadings
    for series in np.moveaxis(draws.reshape(4, 300, -1), -1, 0):
        assert az.rhat(series) < 1.01
    # n = 400: the posterior mean sits within a fraction of a posterior sd of the ML fit.
    ml = np.asarray(ppca_closed_form(prepare(X), ModelSpec("isotropic", 2)).gaussian.loadings)
    sd = draws.std((0, 1))
    assert np.max(np.abs(draws.mean((0, 1)) - ml) / sd) < 1.0
    # Same likelihood, a different parameterisation: the rotation-invariant posterior agrees with polar's.
    for ours, theirs in [
        (fit.noise[..., 0], polar.noise[..., 0]),
        *zip(
            np.moveaxis(np.linalg.svd(draws, compute_uv=False) ** 2, -1, 0),
            np.moveaxis(np.linalg.svd(polar.loadings, compute_uv=False) ** 2, -1, 0),
            strict=True,
        ),
    ]:
        assert abs(ours.mean() - theirs.mean()) < 0.3 * theirs.std()
