"""PPCA / FactorAnalysis with method="nuts": point estimates, latent draws, ArviZ output."""

import dataclasses
import functools
import itertools
import types
import warnings

import arviz as az
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, load_wine
from test_convergence import converged  # R-hat within its chance bound, defined once

from bayespca import gaussian
from bayespca.posterior import SamplingWarning, diagnose
from bayespca.probabilistic import PPCA, FactorAnalysis


def _data(n=300, d=5, k=2, noise_sd=0.5, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, k)) * np.linspace(2.5, 1.5, k)
    return rng.normal(size=(n, k)) @ w.T + noise_sd * rng.normal(size=(n, d)) + 1.0


@pytest.fixture(scope="module")
def tight():
    """A posterior so tight (n = 10000, 1% missing) that it is nearly a point mass at the ML fit."""
    X = _data(n=10_000, seed=1)
    X[np.random.default_rng(1).random(X.shape) < 0.01] = np.nan
    model = PPCA(
        2,
        method="nuts",
        num_warmup=200,
        num_samples=200,
        num_chains=1,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # one short chain
        model.fit(X)
    return X, model


def test_large_n_posterior_concentrates_on_ml(tight):
    X, model = tight
    assert np.allclose(model.components_.T, model.loadings_samples_.mean((0, 1)))
    assert model.noise_variance_ == pytest.approx(model.noise_variance_samples_.mean())
    ml = PPCA(2, method="em").fit(X)  # NaN present: EM, exact ML with missing values
    assert model.noise_variance_ == pytest.approx(ml.noise_variance_, rel=0.02)
    # Polar draws (ordered scales, signs fixed) sit around the ML loadings, not a rotation of them.
    sd = model.loadings_samples_.std((0, 1))
    assert np.all(np.abs(model.components_.T - ml.components_.T) < 4 * sd)
    assert np.allclose(model.components_, ml.components_, atol=0.03)


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


def test_sample_latent_spread_includes_parameter_uncertainty(small):
    X, model = small
    row = X.iloc[1:2]
    z = model.sample_latent(row, num_samples=3000, random_state=1)
    post = model.latent_posterior(row)
    # The latent_posterior covariance is the mixture covariance: E[C_theta] + Cov[m_theta].
    assert np.allclose(np.cov(z[:, 0].T), post.covariance[0], rtol=0.15, atol=0.01)
    plug_in = gaussian.latent_posterior(model.gaussian_, row.to_numpy())
    assert np.trace(post.covariance[0]) > np.trace(plug_in.covariance)


def _fa_truth():
    rng = np.random.default_rng(4)
    w = rng.normal(size=(6, 2)) * 1.5
    psi = rng.uniform(0.3, 1.0, 6)
    X = rng.normal(size=(400, 2)) @ w.T + rng.normal(size=(400, 6)) * np.sqrt(psi)
    return X, w, psi


def test_factor_analysis_polar_default_reports_factanal_orientation():
    """FA's default (polar) draws: W^T Psi^-1 W diagonal and decreasing, covering the truth so rotated."""
    X, w, psi = _fa_truth()
    fa = FactorAnalysis(2, method="nuts", num_warmup=300, num_samples=300, chain_method="vectorized",
                        random_state=1).fit(X)
    assert fa.identification_ == "polar"
    assert fa.sample_stats_["diverging"].sum() == 0
    draws = fa.loadings_samples_.reshape(-1, 6, 2)
    noise = fa.noise_variance_samples_.reshape(-1, 6)
    gram = np.einsum("mdk,md,mdl->mkl", draws, 1.0 / noise, draws)
    assert np.max(np.abs(gram[:, 0, 1]) / gram[:, 0, 0]) < 1e-10
    assert np.all(gram[:, 0, 0] > gram[:, 1, 1])
    # The true loadings in the same orientation (Psi^1/2 U S from the SVD Psi^-1/2 W = U S V^T,
    # true Psi) lie within the posterior. (Not the ML fit's: it sits near a Heywood case,
    # psi_6 = 0.135 against 0.95, which the posterior, 1.19 +- 0.35, does not follow.)
    sd = np.sqrt(psi)[:, None]
    u, sv, _ = np.linalg.svd(w / sd, full_matrices=False)
    truth = sd * u * sv
    truth = truth * np.sign(np.sum(truth * draws.mean(0), axis=0))
    assert np.max(np.abs(draws.mean(0) - truth) / draws.std(0)) < 4.5
    assert np.max(np.abs((noise.mean(0) - psi) / noise.std(0))) < 4.5


def test_factor_analysis_lower_triangular_converges_and_covers_truth():
    X, w, psi = _fa_truth()
    fa = FactorAnalysis(
        2,
        method="nuts",
        identification="lower_triangular",
        num_warmup=300,
        num_samples=600,  # R-hat < 1.01 needs a few hundred effective draws per chain
        num_chains=4,
        chain_method="vectorized",
        random_state=1,
    ).fit(X)
    draws = fa.loadings_samples_
    assert fa.identification_ == "lower_triangular"
    assert fa.sample_stats_["diverging"].sum() == 0
    assert np.all(draws[:, :, 0, 1] == 0) and np.all(draws[:, :, [0, 1], [0, 1]] > 0)
    noise = fa.noise_variance_samples_.reshape(-1, 6)
    assert np.max(np.abs((noise.mean(0) - psi) / noise.std(0))) < 4.5
    wwt = np.einsum("cmdk,cmek->cmde", draws, draws).reshape(-1, 6, 6)
    assert np.max(np.abs((wwt.mean(0) - w @ w.T) / wwt.std(0))) < 4.5
    for series in np.moveaxis(draws.reshape(4, 600, -1), -1, 0):
        if series.std() > 0:
            # The failure guarded against is a stuck chain (R-hat of psi 1.57, ESS 5). W[1, 1]'s bulk or
            # folded ESS is 294-1125 over seeds 0-6 (numpy 2.5.5, jax 0.12.0.1); the R-hat bound of
            # `converged` widens with a lower ESS, so a floor of 100 still fails a stuck chain.
            assert converged(series, min_ess=100.0)


def test_sample_latent_needs_nuts():
    X = _data()
    with pytest.raises(ValueError, match="method='nuts'"):
        PPCA(2).fit(X).sample_latent(X)


# ------------------------------------------------------------------ ArviZ
@pytest.fixture(scope="module")
def small():
    import pandas as pd

    X = pd.DataFrame(_data(n=60, d=4, seed=4), columns=["a", "b", "c", "d"])
    X.iloc[0, 1] = np.nan
    model = PPCA(
        2,
        method="nuts",
        num_warmup=150,
        num_samples=100,
        num_chains=2,
        chain_method="vectorized",
        random_state=2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # a deliberately short run
        model.fit(X)
    return X, model


def test_log_likelihood_group_is_marginal_density(small):
    from scipy.stats import multivariate_normal

    X, model = small
    tree = model.to_arviz()
    ll = tree["log_likelihood"]["X"]
    assert ll.dims == ("chain", "draw", "obs") and ll.shape == (2, 100, 60)
    post = tree["posterior"]
    assert list(post["W"].dims) == ["chain", "draw", "feature", "component"]
    assert list(post["feature"].values) == ["a", "b", "c", "d"]
    values = X.to_numpy()
    for c, m in [(0, 0), (1, 57)]:
        w = post["W"].values[c, m]
        cov = w @ w.T + post["sigma2"].values[c, m] * np.eye(4)
        mu = post["mu"].values[c, m]
        for i in (0, 1, 30):
            o = ~np.isnan(values[i])
            ref = multivariate_normal(mu[o], cov[np.ix_(o, o)]).logpdf(values[i, o])
            assert ll.values[c, m, i] == pytest.approx(ref, rel=1e-10)


def test_loo_invariant_to_rotating_draws(small):
    import arviz as az

    _, model = small
    tree = model.to_arviz()
    # ArviZ's default reff averages the ESS of every posterior variable, W included, which the
    # rotation changes; what must be invariant is the pointwise log-likelihood.
    elpd = az.loo(tree, reff=1.0).elpd
    rng = np.random.default_rng(0)
    fit = model.nuts_
    q = np.linalg.qr(rng.normal(size=(*fit.loadings.shape[:2], 2, 2)))[0]
    rotated = type(fit)(**{**fit.__dict__, "loadings": fit.loadings @ q})
    from bayespca.posterior import to_datatree

    rot_tree = to_datatree(rotated, tree["observed_data"]["X"].values)
    assert az.loo(rot_tree, reff=1.0).elpd == pytest.approx(elpd, rel=1e-10)
    assert not np.allclose(rot_tree["posterior"]["W"].values, tree["posterior"]["W"].values)


def test_summary(small):
    _, model = small
    table = model.summary()
    assert {"mean", "sd", "ess_bulk", "ess_tail", "r_hat"} <= set(table.columns)
    assert float(table.loc["sigma2", "mean"]) == pytest.approx(model.noise_variance_, rel=0.01)
    eig = np.linalg.svd(model.loadings_samples_, compute_uv=False) ** 2
    assert float(table.loc["eigenvalues[0]", "mean"]) == pytest.approx(eig[..., 0].mean(), rel=0.01)
    assert "W[a, 0]" in table.index


def test_netcdf_round_trip(small, tmp_path):
    pytest.importorskip("h5netcdf")
    import xarray as xr

    _, model = small
    path = tmp_path / "post.nc"
    model.posterior_.to_netcdf(path)
    back = xr.open_datatree(path)
    assert np.array_equal(back["log_likelihood"]["X"].values, model.posterior_["log_likelihood"]["X"].values)


def test_posterior_predictive_moments(small):
    _, model = small
    tree = model.to_arviz(posterior_predictive=True, random_state=0)
    reps = tree["posterior_predictive"]["X"].values
    assert reps.shape == (2, 100, 60, 4)
    # Pooled over draws, the replicated data have the posterior-averaged covariance.
    w = model.loadings_samples_
    avg = np.einsum("cmdk,cmek->de", w, w) / 200 + model.noise_variance_samples_.mean() * np.eye(4)
    emp = np.cov(reps.reshape(-1, 4).T)
    assert np.allclose(emp, avg, rtol=0.1, atol=0.1)


def test_ard_keeps_three_of_eight_components():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(10, 3)) * np.array([2.5, 2.0, 1.5])
    X = rng.normal(size=(300, 3)) @ w.T + 0.5 * rng.normal(size=(300, 10))
    model = PPCA(8, method="nuts", prior="ard", num_warmup=150, num_samples=100, num_chains=1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # one short chain
        model.fit(X)
    assert model.n_effective_components_ == 3
    # The shrunk components carry far less variance than the smallest true one.
    eig = np.sort(np.linalg.svd(model.loadings_samples_, compute_uv=False).mean((0, 1)) ** 2)[::-1]
    true = np.linalg.svd(w, compute_uv=False) ** 2
    assert eig[3] < 0.05 * true[2]
    assert model.noise_variance_ == pytest.approx(0.25, rel=0.15)


def test_a_fit_on_new_data_with_another_number_of_rows_compiles_nothing(backend_compiles):
    """Issue 18: a compiled program per data shape costs ~60 memory maps, and a long session
    (a notebook, a loop over data sets) died at the kernel's limit. The sampler, the DataTree's
    pointwise log-likelihood and LOO depend on the number of rows only through data. One component:
    from k = 2, short chains that fail the check on the smallest eigenvalue of W W^T run again in a
    second chart, a program of its own, which a fit enters or not as its draws (so the machine's
    rounding) fall; the n = 81 fit did on one machine and the warm-up fit did not."""
    from bayespca.comparison import loo

    rng = np.random.default_rng(3)
    options = {"method": "nuts", "num_warmup": 50, "num_samples": 50, "num_chains": 2, "progress_bar": False}
    make = lambda n: rng.normal(size=(n, 2)) @ rng.normal(size=(2, 5)) + rng.normal(size=(n, 5))  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo(PPCA(1, random_state=0, **options).fit(make(80)))
        with backend_compiles() as compiles:
            for n in (81, 97, 130):
                loo(PPCA(1, random_state=n, **options).fit(make(n)))
    assert compiles == []


def _invariant_series(posterior):
    """Noise variances, eigenvalues of W W^T and the log-likelihood, each as (chain, draw)."""
    for name in ("sigma2", "psi", "eigenvalues", "log_lik"):
        if name in posterior:
            values = np.asarray(posterior[name])
            yield from np.moveaxis(values.reshape(*values.shape[:2], -1), -1, 0)


def test_iris_samples_cleanly_under_the_horseshoe_at_the_defaults():
    """The README's horseshoe example, ``PPCA(2, method="nuts", prior="horseshoe")`` on raw iris, at
    the defaults: with ``W`` free (identification ``"none"``, the default before the triangle) 19-22
    divergent transitions at seeds 0-2 and 511 leapfrog steps a draw, from the rotation the
    likelihood leaves to the prior; on the triangle of pivoted anchors none and 127 steps. Its
    invariants and its now identified loadings converge, and the posterior mean of the covariance
    ``W W^T + sigma^2 I`` lies within a posterior sd of scikit-learn's maximum-likelihood one
    (0.02-0.22 sd here: 150 rows outweigh the prior)."""
    from sklearn.decomposition import PCA

    X = load_iris().data
    fit = PPCA(2, method="nuts", prior="horseshoe", random_state=0, progress_bar=False).fit(X)
    assert fit.identification_ == "lower_triangular"
    assert int(np.asarray(fit.sample_stats_["diverging"]).sum()) <= 1
    post = fit.posterior_["posterior"]
    for series in _invariant_series(post):
        assert converged(series)
    w = np.asarray(post["W"])
    free = ~np.all(w == 0.0, axis=(0, 1))
    assert free.sum() == 7  # one structural zero at k = 2
    for series in np.moveaxis(w[..., free], -1, 0):
        assert converged(series)
    draws = w.reshape(-1, 4, 2)
    cov = np.einsum("mdk,mek->mde", draws, draws) + fit.noise_variance_samples_.reshape(-1, 1, 1) * np.eye(4)
    reference = PCA(2).fit(X).get_covariance() * (len(X) - 1) / len(X)  # ML: divisor n
    assert np.all(np.abs(cov.mean(0) - reference) < cov.std(0))


@pytest.mark.parametrize(
    ("load", "model", "k"),
    [(load_iris, PPCA, 3), (load_iris, PPCA, 2), (load_diabetes, FactorAnalysis, 1),
     (load_diabetes, FactorAnalysis, 6)],
    ids=["iris-ppca-3", "iris-std-ppca-2", "diabetes-std-fa-1", "diabetes-std-fa-6"],
)
def test_real_data_sample_cleanly_with_the_defaults(load, model, k):
    """Issue 12's real-data panel, short: default settings (4 chains x 500 + 500), 0 divergences,
    bulk and folded ESS > 400 and R-hat within what converged chains reach (``converged``: 1.01,
    or its chance bound where the ESS leaves 1.01 within chance) on every invariant
    (benchmarks/bench_nuts_real.py runs the whole panel at the plain 1.01). A fixed seed's R-hat
    against 1.01 alone depends on the machine's rounding: diabetes FA k = 6 read 1.011 on one
    machine's draws, below 1.01 on others'. FA with 6 factors on 10 features (the Ledermann bound)
    has weak factors whose scales may meet: sampled in polar coordinates its chains disagreed (R-hat
    1.041, ESS 196); FA's draws are reported in factanal's orientation whatever coordinates the
    chains moved in."""
    X = load().data
    if k != 3:
        X = (X - X.mean(0)) / X.std(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SamplingWarning)
        fit = model(k, method="nuts", random_state=0, progress_bar=False).fit(X)
    assert not [w for w in caught if "divergent" in str(w.message)]
    assert int(np.asarray(fit.sample_stats_["diverging"]).sum()) == 0
    for series in _invariant_series(fit.posterior_["posterior"]):
        assert converged(series)
    if model is FactorAnalysis:  # W^T Psi^-1 W diagonal, decreasing, in every draw
        w, psi = fit.loadings_samples_, fit.noise_variance_samples_
        gram = np.einsum("cmdk,cmd,cmdl->cmkl", w, 1.0 / psi, w)
        diagonal = np.diagonal(gram, axis1=-2, axis2=-1)
        off = gram - diagonal[..., None] * np.eye(k)
        assert np.abs(off).max() < 1e-8 * diagonal.max()
        assert (np.diff(diagonal, axis=-1) <= 0).all()


def _spied_runs(monkeypatch) -> list:
    """The NUTS runs ``(draws, chains, xi)`` made from here on, recorded as they return."""
    import bayespca.inference.nuts as nuts

    runs, real_run = [], nuts._run

    def recorded_run(*args):
        runs.append(real_run(*args))
        return runs[-1]

    monkeypatch.setattr(nuts, "_run", recorded_run)
    return runs


def _recorded_runs(monkeypatch, failing_checks: float = 1, keep: bool = True) -> list:
    """The NUTS runs ``(draws, chains, xi)`` of the next fit, recorded; its users' check made to fail
    the first ``failing_checks`` times (``np.inf``: every time), so that another run follows, and
    another run kept (``keep``) or not; the chains that still fail do not run on (tested on its own:
    ``test_chains_that_still_fail_the_check_run_on_and_keep_every_t_th_draw``), nor again around a
    weightier mode (``test_chains_that_reached_a_weightier_mode_run_again_around_it``)."""
    import bayespca.inference.nuts as nuts

    runs, checks = _spied_runs(monkeypatch), []
    real_agree = nuts._chains_agree

    def failing_once(*args):
        checks.append(args)
        return len(checks) > failing_checks and real_agree(*args)

    monkeypatch.setattr(nuts, "_chains_agree", failing_once)
    monkeypatch.setattr(nuts, "_mixes_better", lambda new, old, check: keep)
    monkeypatch.setattr(nuts, "_lengthened", lambda draws, chains, *rest: (draws, chains))
    monkeypatch.setattr(nuts, "_recentred", lambda *args: None)
    return runs


def _assert_same_invariants(first, second, noise=lambda d: d.noise) -> None:
    """The means of the noise variances (``noise`` of the draws) and of W W^T's eigenvalues of two runs'
    draws agree within 4 Monte Carlo standard errors (each ``sd / sqrt(ESS)``, ArviZ's bulk ESS)."""
    from bayespca.convergence import ess_bulk

    for quantity in (noise, lambda d: np.linalg.svd(d.loadings, compute_uv=False) ** 2):
        a, b = (np.asarray(quantity(d)) for d in (first, second))
        a, b = (x.reshape(*x.shape[:2], -1) for x in (a, b))
        for j in range(a.shape[-1]):
            se = [x[..., j].std() / np.sqrt(ess_bulk(x[None, ..., j])[0]) for x in (a, b)]
            assert abs(a[..., j].mean() - b[..., j].mean()) < 4 * np.hypot(*se)


def _assert_metric_of_the_draws(first_factor: np.ndarray, new_factor: np.ndarray, z: np.ndarray,
                                shape: tuple) -> tuple[int, int]:
    """The second run's metric ``F F^T`` seen in the first run's whitened coordinates (``S^-1 F``; the
    Laplace metric is the identity there), along the eigenvectors ``u`` of the whitened draws' ``z``
    (chain * draw, p; ``shape`` their chains and draws) covariance (SciPy's ``eigh``, variances
    ``lam``): ``lam`` along those where ``lam`` and 1 differ by a factor 2 or more and by more than the
    Marchenko-Pastur edges ``(1 -+ sqrt(q / n))^2`` (``q`` directions, ``n`` the median of ArviZ's
    mean ESS of the draws' coordinates), 1 along the others, 0 across. Where the draws have no spread
    (turned back along a rotation), ``1 / m`` (``m`` draws). Returns how many were corrected and how
    many had no spread."""
    from arviz_stats.base import array_stats
    from scipy.linalg import eigh, solve

    lam, u = eigh(np.cov(z.T))
    whitened = solve(first_factor, new_factor)
    along = u.T @ whitened @ whitened.T @ u
    np.testing.assert_allclose(along - np.diag(np.diag(along)), 0.0, atol=1e-8)
    along, none = np.diag(along), lam < 1e-9
    n = np.median(array_stats.ess(z.T.reshape(-1, *shape), chain_axis=-2, draw_axis=-1, method="mean"))
    spread = np.sqrt((~none).sum() / n)
    low, high = min(0.5, max(0.0, 1 - spread) ** 2), max(2.0, (1 + spread) ** 2)
    corrected = ~none & ((lam >= high) | (lam <= low))
    np.testing.assert_allclose(along[~none], np.where(corrected, lam, 1.0)[~none], rtol=1e-8)
    np.testing.assert_allclose(along[none], 1.0 / len(z), rtol=1e-8)
    return corrected.sum(), none.sum()


@pytest.mark.parametrize("p, rho", [(277, 0.7), (300, 0.5)])
def test_the_second_runs_metric_leaves_what_chance_makes_of_laplace_shaped_draws(p, rho):
    """Draws whose covariance is the Laplace fit's (whitened: the identity), 4 chains x 500 of an AR(1)
    with lag-one autocorrelation ``rho`` in each of ``p`` coordinates: their sample covariance's
    eigenvalues spread by chance to about ``(1 -+ sqrt(p / n))^2`` (Marchenko-Pastur), ``n`` the draws'
    effective number, ``N (1 - rho) / (1 + rho)`` for a mean (``N`` = 2000). The band of variances
    left uncorrected has those edges (``n`` estimated: within 10%), at least a factor 2 from 1, and
    holds every eigenvalue, where a bare factor 2 would correct 100-odd directions of such draws; a
    planted direction of variance 6 falls outside it."""
    import bayespca.inference.nuts as nuts

    rng = np.random.default_rng(0)
    noise = rng.standard_normal((4, 500, p))
    z = np.empty_like(noise)
    z[:, 0] = noise[:, 0]
    for t in range(1, 500):
        z[:, t] = rho * z[:, t - 1] + np.sqrt(1 - rho**2) * noise[:, t]
    lam = np.linalg.eigvalsh(np.cov(z.reshape(-1, p).T))
    low, high = nuts._chance_band(z, p)
    spread = np.sqrt(p / (2000 * (1 - rho) / (1 + rho)))
    np.testing.assert_allclose([low, high], [min(0.5, (1 - spread) ** 2), max(2.0, (1 + spread) ** 2)],
                               rtol=0.1, atol=0.01)
    assert ((lam >= high) | (lam <= low)).sum() == 0 < ((lam >= 2.0) | (lam <= 0.5)).sum()
    z[..., 0] *= np.sqrt(6.0)
    lam = np.linalg.eigvalsh(np.cov(z.reshape(-1, p).T))
    low, high = nuts._chance_band(z, p)
    assert ((lam >= high) | (lam <= low)).sum() == 1 and lam.max() > high


def test_chains_that_fail_the_check_run_again_on_their_draws_metric_and_the_same_posterior(
    monkeypatch, capsys
):
    """Standardised wine, pPCA k = 3, 4 x 400 draws, the users' check made to fail once: the fit runs
    again centred at the first run's draws' mean in the sampled coordinates ``theta``, with the
    Laplace metric corrected along the directions where the draws spread differently
    (:func:`_assert_metric_of_the_draws`), and keeps that run. An affine map of the coordinates: both
    runs sample one posterior, so the means of sigma^2 and of W W^T's eigenvalues agree within 4 Monte
    Carlo standard errors (sd / sqrt(bulk ESS) of each run). Breast cancer FA k = 7, whose chains
    this is for, is in ``benchmarks/bench_nuts_real.py`` (9 of 10 fits pass with it, none without;
    one fit is too few for a test that must pass on any machine's rounding)."""

    runs = _recorded_runs(monkeypatch)
    X = load_wine().data
    X = (X - X.mean(0)) / X.std(0)
    fit = PPCA(3, method="nuts", num_samples=400, random_state=0, progress_bar=True).fit(X)
    assert len(runs) == 2
    bars = capsys.readouterr().err  # the second run's progress bar says why it runs
    assert "NUTS again, check failed: draws' metric" in bars
    (first, chains, xi), (second, other, _) = runs
    z = xi.reshape(-1, xi.shape[-1])
    theta = chains.data["centre"] + z @ chains.data["factor"].T
    np.testing.assert_allclose(other.data["centre"], theta.mean(0), rtol=1e-12, atol=1e-12)
    corrected, _ = _assert_metric_of_the_draws(chains.data["factor"], other.data["factor"], z, xi.shape[:2])
    assert corrected > 0
    np.testing.assert_array_equal(fit.sample_stats_["n_steps"], second.sample_stats["n_steps"])
    _assert_same_invariants(first, second, lambda d: d.noise[..., 0])


def test_a_second_run_in_ws_own_coordinates_takes_its_metric_across_the_rotation_not_along_it(monkeypatch):
    """Standardised wine, FA k = 2 with ``W`` sampled free (``identification="none"``), 4 x 400 draws,
    the users' check made to fail once. The posterior is constant along ``W -> W R`` and the first
    run's chains drift along that orbit: the draws' raw covariance has a large variance along its
    tangents ``W0 A`` (``A`` antisymmetric) at the centre. The second run's metric is built on the
    draws turned back to the centre, so along the tangent it keeps under a tenth of that drift,
    while both runs sample one posterior: means of the noise variances and of W W^T's eigenvalues
    agree within 4 Monte Carlo standard errors."""
    from scipy.linalg import orthogonal_procrustes

    import bayespca.inference.nuts as nuts

    runs = _recorded_runs(monkeypatch)
    X = load_wine().data
    X = (X - X.mean(0)) / X.std(0)
    FactorAnalysis(2, method="nuts", identification="none", num_samples=400, random_state=0,
                   progress_bar=False).fit(X)
    assert len(runs) == 2
    (first, chains, xi), (second, other, _) = runs
    offset = nuts._site_offset(chains.static, "W")
    d, k = dict(chains.static.layout)["W"]
    theta = chains.data["centre"] + xi.reshape(-1, xi.shape[-1]) @ chains.data["factor"].T
    tangent = np.zeros(theta.shape[1])
    tangent[offset:offset + d * k] = (other.data["centre"][offset:offset + d * k].reshape(d, k)
                                      @ np.array([[0.0, 1.0], [-1.0, 0.0]])).ravel()
    tangent /= np.linalg.norm(tangent)
    drift = tangent @ np.cov(theta.T) @ tangent
    metric = other.data["factor"] @ other.data["factor"].T
    assert tangent @ metric @ tangent < 0.1 * drift
    # The draws turned one by one by SciPy's Procrustes: their mean and covariance are the new run's.
    centre_w, turned = chains.data["centre"][offset:offset + d * k].reshape(d, k), theta.copy()
    for row in turned:
        w = row[offset:offset + d * k].reshape(d, k)
        row[offset:offset + d * k] = (w @ orthogonal_procrustes(w, centre_w)[0]).ravel()
    np.testing.assert_allclose(other.data["centre"], turned.mean(0), rtol=1e-10, atol=1e-12)
    z = np.linalg.solve(chains.data["factor"], (turned - chains.data["centre"]).T).T
    _, none = _assert_metric_of_the_draws(chains.data["factor"], other.data["factor"], z, xi.shape[:2])
    assert none == k * (k - 1) // 2  # the rotation's tangents at the centre
    _assert_same_invariants(first, second)


def test_fa_in_ws_own_coordinates_is_held_by_the_gauge_and_samples_the_same_posterior(monkeypatch):
    """Standardised wine, FA k = 2, the polar chart made to reach its singularity and its check to
    fail once: the second run samples ``W``'s own coordinates with the model's gauge about the ML
    loadings ``B``. The likelihood and the prior see only ``W W^T``, so along the orbit the posterior
    is the gauge alone: the angle ``t`` of the rotation ``Q(W^T B)`` is von Mises with concentration
    ``2 kappa``, of mean cosine ``I_1(2 kappa) / I_0(2 kappa)``, which the draws' mean cosine meets
    within 4 Monte Carlo standard errors. And the gauge leaves the invariants' posterior as it was:
    the means of the noise variances and of W W^T's eigenvalues agree with the polar run's within 4."""
    from scipy.linalg import polar
    from scipy.special import i0, i1

    import bayespca.inference.nuts as nuts
    from bayespca.convergence import ess_bulk
    from bayespca.models import GAUGE_CONCENTRATION

    monkeypatch.setattr(nuts, "_near_degenerate", lambda *args: True)
    runs = _recorded_runs(monkeypatch)
    X = load_wine().data
    X = (X - X.mean(0)) / X.std(0)
    FactorAnalysis(2, method="nuts", num_samples=400, random_state=0, progress_bar=False).fit(X)
    assert len(runs) == 2  # the polar run and the gauged one, which passed the check
    (first, _, _), (second, chains, xi) = runs
    assert dict(chains.static.options)["identification"] == "none"
    offset, (d, k) = nuts._site_offset(chains.static, "W"), dict(chains.static.layout)["W"]
    theta = chains.data["centre"] + xi.reshape(-1, xi.shape[-1]) @ chains.data["factor"].T
    b = chains.data["kwargs"]["gauge"]  # whatever B the model holds W to, the law of Q's angle is the same
    rotations = [polar(row[offset:offset + d * k].reshape(d, k).T @ b)[0] for row in theta]
    assert all(np.linalg.det(q) > 0 for q in rotations)  # no chain crossed to the reflections
    cosines = np.array([np.trace(q) / 2 for q in rotations]).reshape(xi.shape[:2])
    concentration = 2 * GAUGE_CONCENTRATION
    se = cosines.std() / np.sqrt(ess_bulk(cosines[None])[0])
    assert abs(cosines.mean() - i1(concentration) / i0(concentration)) < 4 * se
    _assert_same_invariants(first, second)


def test_fa_with_divergent_polar_chains_samples_ws_own_coordinates_ungauged_where_a_scale_reaches_0(
        monkeypatch):
    """Standardised wine, FA k = 7, seed 3: the polar chains pass R-hat and ESS (1.008, 421) but had
    one divergent transition, which fails the users' bar, so the fit samples ``W``'s own coordinates.
    There the weakest factor's scale reaches 0 (the polar draws' smallest singular value of
    ``W^T B`` at its 1% quantile 0.03 of its median), and with it the gauge's jump, which runs through
    every ``W`` with a zero column: gauged, 1023 leapfrog steps a draw in 2 chains of 4; so it runs
    ungauged (63). The
    fit keeps those draws, with no divergent transition, and they sample the polar run's posterior:
    the means of the noise variances and of W W^T's eigenvalues agree within 4 Monte Carlo standard
    errors. Whether a transition diverges depends on the machine's rounding, so the test marks one of
    the polar run's transitions divergent. Where no scale reaches 0 (wine, k = 2: 0.87) the gauge
    holds (the test before)."""
    import bayespca.inference.nuts as nuts

    monkeypatch.setattr(nuts, "_recentred", lambda *args: None)
    runs, real_run = [], nuts._run

    def diverging_first(*args):
        runs.append(real_run(*args))
        if len(runs) == 1:
            runs[0][0].sample_stats["diverging"][0, 100] = True
        return runs[-1]

    monkeypatch.setattr(nuts, "_run", diverging_first)
    X = load_wine().data
    fit = FactorAnalysis(7, method="nuts", random_state=3, progress_bar=False).fit((X - X.mean(0)) / X.std(0))
    charts = [(dict(chains.static.options)["identification"], chains.data["kwargs"]["gauge"] is not None)
              for _, chains, _ in runs]
    assert charts[:2] == [("polar", False), ("none", False)]
    assert not np.any(fit.sample_stats_["diverging"])
    np.testing.assert_array_equal(fit.sample_stats_["n_steps"], runs[1][0].sample_stats["n_steps"])
    _assert_same_invariants(runs[0][0], runs[1][0])


def test_a_run_with_divergent_transitions_loses_to_one_without_that_running_on_could_mend():
    """Of two runs, the remedies keep the one without divergent transitions whatever the ESS, where
    running on four times as long could make it pass: draws of independent noise variances (ESS about
    2000) with one divergent transition lose to AR(1) draws of coefficient 0.8 (ESS about 2000 / 9,
    shortfall about 1.8) with none; not to AR(1) draws of coefficient 0.98 (ESS about 2000 / 99,
    shortfall about 20), chains no length mends. Between runs alike in divergent transitions, the
    independent draws win."""
    from scipy.signal import lfilter

    import bayespca.inference.nuts as nuts
    from bayespca.inference.contract import Draws

    rng = np.random.default_rng(0)

    def draws(series, divergent):
        stats = {"diverging": np.zeros(series.shape, bool)}
        stats["diverging"][0, 100] = divergent
        zeros = np.zeros((*series.shape, 1))
        return Draws(zeros[..., None], np.exp(series[..., None] / 10), zeros, "none", "diagonal", stats)

    white = rng.standard_normal((4, 500))
    slow, stuck = (lfilter([1.0], [1.0, -phi], rng.standard_normal((4, 500)), axis=1) for phi in (0.8, 0.98))
    check = nuts._Check(None)
    shortfalls = [nuts._shortfall(draws(series, False), check) for series in (slow, stuck)]
    assert nuts._chains_agree(draws(white, False), check) and 1.0 < shortfalls[0] <= 4.0 < shortfalls[1]
    assert nuts._mixes_better(draws(slow, False), draws(white, True), check)
    assert not nuts._mixes_better(draws(white, True), draws(slow, False), check)
    assert nuts._mixes_better(draws(white, True), draws(stuck, False), check)
    for series, divergent in itertools.product((slow, stuck), (False, True)):
        assert nuts._mixes_better(draws(white, divergent), draws(series, divergent), check)
        assert not nuts._mixes_better(draws(series, divergent), draws(white, divergent), check)


def test_fa_keeps_the_polar_run_where_ws_own_coordinates_mix_worse(monkeypatch, capsys):
    """FA whose polar chains fail the check runs again in ``W``'s own coordinates, and keeps that run
    only where it mixes better: on standardised breast cancer, k = 18, seed 0, the polar chains
    missed by little (R-hat 1.013, bulk ESS 440) and the chains in ``W``'s coordinates stuck in two
    modes (R-hat 2.03, ESS 5), which the fit reported. Here (wine, k = 2, the chart's check and the
    comparison made to say so) the fit reports the polar run's draws. The remedies judge those draws
    as the users' diagnostics do (:func:`bayespca.posterior.worst_convergence` of the reported draws,
    in data units: raw wine's features run in units from 2^-3 to 2^9)."""
    import bayespca.inference.nuts as nuts
    from bayespca.posterior import worst_convergence

    monkeypatch.setattr(nuts, "_near_degenerate", lambda *args: True)
    runs = _recorded_runs(monkeypatch, failing_checks=np.inf, keep=False)
    monkeypatch.setattr(nuts, "_shortfall", lambda draws, check: np.inf)  # beyond running on's reach
    checks, run_again = [], nuts._run_again
    monkeypatch.setattr(nuts, "_run_again", lambda run, sampling, key, check, *rest: checks.append(check)
                        or run_again(run, sampling, key, check, *rest))
    X = load_wine().data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        fit = FactorAnalysis(2, method="nuts", num_warmup=200, num_samples=400, random_state=0,
                             progress_bar=True).fit(X)
    assert "NUTS again, check failed: W's coordinates" in capsys.readouterr().err
    charts = [(dict(chains.static.options)["identification"], chains.data["kwargs"]["gauge"] is not None)
              for _, chains, _ in runs]
    # The chart, W's own coordinates with the gauge and without it, the polar draws' metric.
    assert charts == [("polar", False), ("none", True), ("none", False), ("polar", False)]
    np.testing.assert_array_equal(fit.sample_stats_["n_steps"], runs[0][0].sample_stats["n_steps"])
    assert fit._chains.static is runs[0][1].static  # sample_more and fit_warm go on from the polar chains
    assert fit._chains.data["centre"] is runs[0][1].data["centre"]
    # The log-likelihoods differ by a constant (the units' Jacobian): R-hat and ESS, rank-based, do not.
    users = worst_convergence(fit.nuts_, np.asarray(fit.posterior_["posterior"]["log_lik"]))
    for (label, value), (users_label, users_value) in zip(checks[0].convergence(runs[0][0]), users,
                                                          strict=True):
        assert label == users_label and value == pytest.approx(users_value, rel=1e-6)


@pytest.mark.parametrize("scaling", ["standardised", "raw"])
def test_heywood_fit_does_not_trap_chains_in_a_minor_mode(scaling):
    """Breast cancer, FA k=5, whose ML fit is a Heywood case (psi_16 at its floor). Standardised,
    Newton from that point alone stopped in a minor mode of the posterior, 36 nats of log density
    below the main one, and two of four chains stayed there (R-hat 1.7 on psi_16). Raw (feature
    variances from 7e-6 to 3e5), chains run in one unit for all features stayed apart (R-hat 1.5-1.7,
    ESS 6-7). Chains sampling one mode have the same mean log density, up to Monte Carlo error (well
    under a nat here)."""
    X = load_breast_cancer().data
    if scaling == "standardised":
        X = (X - X.mean(0)) / X.std(0)
    assert FactorAnalysis(5).fit(X).noise_variance_.min() < 1e-6  # the Heywood case this is about
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        fit = FactorAnalysis(5, method="nuts", random_state=0, progress_bar=False).fit(X)
    lp = np.asarray(fit.sample_stats_["lp"]).mean(axis=1)
    assert lp.max() - lp.min() < 5, lp
    for series in _invariant_series(fit.posterior_["posterior"]):
        assert float(az.rhat(series)) < 1.05


@functools.cache
def _minor_mode_runs() -> tuple:
    """Breast cancer, standardised, FA k = 5: the first run of the default fit, and that of a fit whose
    chains start from the ML point alone (the start that raises its Heywood case switched off); their
    centre is then a minor mode (psi_16 about 0.03), some 35 nats of log density below the main one
    (psi_16 about 0.31), where the default fit's chains sit (on 2026-12-01: 37.7 nats at the peaks,
    32.6 in Laplace mass). Each is ``(draws, chains, xi)`` and what ``_run_again`` gets with it,
    ``(sampling, key, check, loadings, free)``."""
    import bayespca.inference.nuts as nuts

    X = load_breast_cancer().data
    X = (X - X.mean(0)) / X.std(0)
    runs = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nuts, "_run_again", lambda run, *rest: runs.append((run, rest)) or run[:2])
        FactorAnalysis(5, method="nuts", random_state=0, progress_bar=False).fit(X)
        patch.setattr(nuts, "_raised_noise", lambda *args: None)
        FactorAnalysis(5, method="nuts", random_state=0, progress_bar=False).fit(X)
    return tuple(runs)


def _main_mode_point(reference, chains) -> np.ndarray:
    """The centre of the ``reference`` run (the main mode) in the whitened coordinates of ``chains``."""
    return np.linalg.solve(chains.data["factor"], reference[1].data["centre"] - chains.data["centre"])


def _psi_16_as_the_default_fit_s(draws, reference) -> bool:
    """Whether the posterior mean of psi_16 of ``draws`` is the default fit's (``reference``, in the
    main mode) within 4 Monte Carlo standard errors."""
    from bayespca.convergence import ess_bulk

    psi = [d.noise[..., 16] for d in (reference, draws)]
    se = [p.std() / np.sqrt(ess_bulk(p[None])[0]) for p in psi]
    return 0.2 < psi[0].mean() and abs(psi[1].mean() - psi[0].mean()) < 4 * np.hypot(*se)


def test_chains_that_reached_a_weightier_mode_run_again_around_it(monkeypatch):
    """Given the first run of chains centred at a minor mode (``_minor_mode_runs``), made to fail the
    check, with one chain's densest draw put at the default fit's centre, the chains run again around
    the mode Newton reaches from there: they are within running on's reach of the check (they pass it
    on two cores; on one, XLA's rounding leaves them a hair short, which the fit's next step, running
    on, mends), and the posterior mean of psi_16 is the default fit's within 4 Monte Carlo standard
    errors. With every chain's densest draw at their own centre no run follows. (At seeds 3 and 4 the
    chains so started split between the two modes by themselves, and the fit runs again around the
    main one and passes.)"""
    import bayespca.inference.nuts as nuts

    (reference, _), (run, (sampling, key, check, _, free)) = _minor_mode_runs()
    draws, chains, xi = run
    # The check fails on the runs given, beyond running on's reach as chains split between modes do
    # (:func:`nuts._mixes_better`), and is real on others.
    given, real = [], nuts._shortfall
    monkeypatch.setattr(nuts, "_shortfall", lambda d, c: np.inf if any(d is g for g in given) else real(d, c))
    monkeypatch.setattr(nuts, "_with_pilot_metric", lambda d, c, *rest: (d, c))
    runs = _spied_runs(monkeypatch)

    def with_densest(point):
        """The run with each chain's densest draw at the centre (``xi = 0``), chain 1's at ``point``."""
        lp, moved = draws.sample_stats["lp"].copy(), xi.copy()
        lp[:, 7], moved[:, 7], moved[1, 7] = lp.max() + 1.0, 0.0, point
        given.append(dataclasses.replace(draws, sample_stats={**draws.sample_stats, "lp": lp}))
        return given[-1], chains, moved

    nuts._run_again(with_densest(np.zeros(xi.shape[-1])), sampling, key, check, None, free)
    assert not runs
    again, other = nuts._run_again(with_densest(_main_mode_point(reference, chains)), sampling, key, check,
                                   None, free)
    assert len(runs) == 1 and other is runs[0][1] and nuts._shortfall(again, check) <= nuts._LONGEST
    assert _psi_16_as_the_default_fit_s(again, reference[0])
    # Kept only where it passes or mixes better: a run that does not leaves the first one's draws.
    monkeypatch.setattr(nuts, "_recentred", lambda *args: (again, other, None))
    monkeypatch.setattr(nuts, "_mixes_better", lambda new, old, c: False)
    first = with_densest(_main_mode_point(reference, chains))
    kept = nuts._run_again(first, sampling, key, check, None, free)
    assert kept[0] is first[0] and kept[1] is first[1]


def test_chains_that_reached_a_weightier_mode_while_running_on_run_again_around_it(monkeypatch):
    """Chains that ran on and still fail the check run again around the weightiest mode that Newton
    reaches from where they stopped, and that run runs on in turn (a chain can cross to another mode
    while running on: breast cancer raw FA k = 18, seed 1, on one machine). Here the chains of
    ``_minor_mode_runs`` stand as if they had run on, failing the check, chain 1 stopped at the default
    fit's centre: the new run passes the check with the default fit's psi_16, and runs on by the same
    rule. No run follows where the chains stopped all at their own centre, where they had not run on,
    or where they passed after running on. The new run is judged once it has run on: its first draws
    are made to fail the check with fewer effective draws than the old ones (as draws of one run
    against draws thinned from more transitions can), and the fit keeps it."""
    import bayespca.inference.nuts as nuts

    (reference, _), (run, (sampling, key, check, _, free)) = _minor_mode_runs()
    draws, chains, xi = run
    lengthened, runs = [], _spied_runs(monkeypatch)

    def run_on(d, c, *rest):
        """Only the new run's draws change: to the same draws, marked as run on."""
        lengthened.append(c)
        return (dataclasses.replace(d, thinning=2) if runs and d is runs[-1][0] else d), c

    agree = nuts._chains_agree
    monkeypatch.setattr(nuts, "_lengthened", run_on)
    monkeypatch.setattr(nuts, "_chains_agree", lambda d, c: d.thinning > 1 and agree(d, c))
    monkeypatch.setattr(nuts, "_smallest_ess", lambda d, c: float(d.thinning))
    ran_on = dataclasses.replace(draws, thinning=2)
    failing, passing = (check, free, lambda d: 2.0), (check, free, lambda d: 0.5)

    def stopped_at(point):
        """The chains stopped at their centre (``xi = 0``), chain 1 at ``point``."""
        states = [s._replace(z=np.zeros_like(s.z)) for s in chains.states]
        states[1] = states[1]._replace(z=point)
        return dataclasses.replace(chains, states=states)

    main = _main_mode_point(reference, chains)
    at_centre, at_main = stopped_at(np.zeros_like(main)), stopped_at(main)
    for d, c, checks in ((ran_on, at_centre, failing), (draws, at_main, failing), (ran_on, at_main, passing)):
        nuts._run_on((d, c), sampling, key, checks, False)
    assert not runs and len(lengthened) == 3
    again, other = nuts._run_on((ran_on, at_main), sampling, key, failing, False)
    assert len(runs) == 1 and len(lengthened) == 5 and other is lengthened[-1]
    assert other.report is sampling[1] and agree(again, check)
    assert _psi_16_as_the_default_fit_s(again, reference[0])
    # Kept only where it passes or mixes better once it has run on: else the chains that ran on stay.
    monkeypatch.setattr(nuts, "_recentred", lambda *args: (again, other, None))
    monkeypatch.setattr(nuts, "_mixes_better", lambda new, old, c: False)
    kept = nuts._run_on((ran_on, at_main), sampling, key, failing, False)
    assert kept[0] is ran_on and kept[1] is lengthened[-2] and len(lengthened) == 7


def test_factor_analysis_posterior_follows_each_feature_s_units():
    """FA with its default priors is equivariant under rescaling each feature: the draws for
    ``X c`` (``c`` powers of two, 2^-7 .. 2^11) are those for ``X`` times ``c`` per feature. Chains
    run in units shared by all features would see another geometry for ``X c`` (and differ)."""
    X = load_iris().data
    c = 2.0 ** np.array([-7, 0, 5, 11])
    options = dict(method="nuts", random_state=0, progress_bar=False, num_warmup=100, num_samples=100,
                   num_chains=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short chains; iris's FA k=1 is a Heywood case
        a = FactorAnalysis(1, **options).fit(X).posterior_["posterior"]
        b = FactorAnalysis(1, **options).fit(X * c).posterior_["posterior"]
    for name, power in (("W", c[:, None]), ("psi", c**2), ("mu", c)):
        np.testing.assert_allclose(np.asarray(a[name]) * power, np.asarray(b[name]), rtol=1e-10)


def test_factor_analysis_takes_noise_priors_in_data_units():
    """A user's noise prior (data units, no mean in closed form once moved to the sampler's units):
    with n = 178 and k = 1 on wine (no Heywood case), the posterior mean of each psi_j lies within 3
    posterior sds of the ML value (psi_j from 0.01 to 7e4: HalfCauchy(1) pulls little against 178 rows)."""
    import numpyro.distributions as dist

    from bayespca.priors import Priors

    X = load_wine().data
    ml = FactorAnalysis(1).fit(X).noise_variance_
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        fit = FactorAnalysis(1, method="nuts", prior=Priors(noise=dist.HalfCauchy(1.0)), random_state=0,
                             progress_bar=False, num_warmup=300, num_samples=300, num_chains=2).fit(X)
    psi = np.asarray(fit.posterior_["posterior"]["psi"]).reshape(-1, X.shape[1])
    assert np.all(np.abs(psi.mean(0) - ml) < 3 * psi.std(0)), (psi.mean(0), psi.std(0), ml)


def test_posterior_tree_is_built_when_read_with_the_rows_log_likelihood_summing_to_the_statistics():
    """A fit's per-draw log-likelihood comes from the statistics (patterns with missing values);
    the draws x rows values, a DataTree of them, only when ``posterior_`` is read."""
    X = _data(n=200, d=5, k=2, seed=4)
    X[np.random.default_rng(4).random(X.shape) < 0.05] = np.nan
    options = dict(method="nuts", num_warmup=100, num_samples=100, num_chains=2, random_state=0,
                   progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # short chains
        fit = FactorAnalysis(2, **options).fit(X)
    assert "posterior_" not in vars(fit)
    tree = fit.posterior_
    rows = tree["log_likelihood"]["X"].values.sum(-1)  # each row's observed block, summed
    np.testing.assert_allclose(tree["posterior"]["log_lik"].values, rows, rtol=1e-12)
    direct = [gaussian.log_prob(gaussian.LowRankGaussian(*g), np.nan_to_num(X), ~np.isnan(X)).sum()
              for g in zip(*(a[0, :3] for a in (fit.loadings_samples_, fit.noise_variance_samples_,
                                                   fit.mean_samples_)), strict=True)]
    np.testing.assert_allclose(rows[0, :3], direct, rtol=1e-12)
    fit.set_params(method="em").fit(X)
    assert not hasattr(fit, "posterior_")


def test_posterior_tree_past_the_pointwise_limit_never_forms_the_rows_values(monkeypatch):
    """Above ``_MAX_POINTWISE`` draws x rows values ``posterior_`` leaves the log_likelihood group out;
    it formed the values anyway for NumPy rows (n = 200000: 3.2 GB and 221 s), only to drop them."""
    from scipy.stats import multivariate_normal

    import bayespca.posterior as posterior
    import bayespca.probabilistic as probabilistic

    X = _data(n=60, d=3, k=1, seed=5)
    monkeypatch.setattr(probabilistic, "_MAX_POINTWISE", 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # a deliberately short run
        fit = PPCA(1, method="nuts", num_warmup=50, num_samples=50, num_chains=1, random_state=0,
                   progress_bar=False).fit(X)

    def refuse(*args):
        raise AssertionError("the draws x rows values were formed")

    monkeypatch.setattr(posterior, "pointwise_log_likelihood", refuse)
    tree = fit.posterior_
    assert "log_likelihood" not in tree.children
    post = tree["posterior"]
    for m in (0, 17, 49):  # the per-draw total, from the statistics: SciPy's density summed over rows
        w = post["W"].values[0, m]
        cov = w @ w.T + post["sigma2"].values[0, m] * np.eye(3)
        ref = multivariate_normal(post["mu"].values[0, m], cov).logpdf(X).sum()
        assert post["log_lik"].values[0, m] == pytest.approx(ref, rel=1e-10)


# ------------------------------------------------------------- sample_more
def _posterior_arrays(model):
    return (model.loadings_samples_, model.noise_variance_samples_, model.mean_samples_,
            *(model.sample_stats_[name] for name in sorted(model.sample_stats_)))


@pytest.mark.parametrize(
    "estimator, data, options",
    [
        (PPCA, "synthetic", {"chain_method": "parallel"}),
        (PPCA, "synthetic", {"chain_method": "vectorized"}),
        (FactorAnalysis, "synthetic", {"chain_method": "sequential"}),
        (PPCA, "missing", {"prior": "ard"}),
        (PPCA, "iris", {}),
        (FactorAnalysis, "wine", {}),
    ],
)
def test_sample_more_continues_the_chains_as_one_longer_run(estimator, data, options):
    # The reference is a single fit that draws as many: continuing the chains (the same states, keys,
    # adapted step sizes and masses, in 50-transition chunks) must give its draws bit for bit.
    X = {"iris": load_iris, "wine": load_wine}[data]().data if data in ("iris", "wine") else _data(n=200, d=5)
    if data == "missing":
        X[np.random.default_rng(3).random(X.shape) < 0.02] = np.nan
    base = {"method": "nuts", "num_warmup": 100, "num_chains": 3, "random_state": 5, "progress_bar": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # short runs
        continued = estimator(2, num_samples=100, **base, **options).fit(X)
        continued.sample_more(50)
        continued.sample_more()  # the fit's num_samples again
        once = estimator(2, num_samples=250, **base, **options).fit(X)
    for a, b in zip(_posterior_arrays(continued), _posterior_arrays(once), strict=True):
        np.testing.assert_array_equal(a, b)
    assert continued.posterior_["posterior"].sizes["draw"] == 250
    np.testing.assert_array_equal(continued.loadings_, once.loadings_)
    np.testing.assert_array_equal(continued.noise_variance_, once.noise_variance_)
    assert continued.log_likelihood_ == once.log_likelihood_
    assert continued.n_iter_ == once.n_iter_ == 3 * 250
    np.testing.assert_array_equal(continued.summary().to_numpy(), once.summary().to_numpy())


def test_chains_that_still_fail_the_check_run_on_and_keep_every_t_th_draw(monkeypatch):
    """Chains that fail the check after every other remedy run on without a new warm-up and keep every
    t-th draw, t the first that passes: the draws of one run of t times as many transitions, every
    t-th (the reference: such a run, by the first run's own path, which the check lets pass), and
    ``sample_more`` keeps every t-th too; the DataTree says how many transitions a draw. The check's
    verdicts are set (twice as long needed, then again, then passing: t = 3), so that the test does not
    turn on where R-hat falls by chance on this machine."""
    from bayespca.inference import nuts

    X = load_iris().data
    base = {"method": "nuts", "num_warmup": 100, "num_chains": 2, "random_state": 5, "progress_bar": False}
    verdicts = iter([2.0, 2.0, 1.0, 1.0])
    monkeypatch.setattr(nuts, "_run_again", lambda run, *rest: run[:2])
    monkeypatch.setattr(nuts, "_shortfall", lambda draws, check: next(verdicts))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        run_on = PPCA(2, num_samples=400, **base).fit(X)
        assert next(verdicts, "used") == "used"  # asked three times, and once more after running on
        first = _posterior_arrays(run_on)
        run_on.sample_more(100)
        monkeypatch.setattr(nuts, "_shortfall", lambda draws, check: 1.0)
        once = PPCA(2, num_samples=3 * 500, **base).fit(X)
    thinned = [a[:, 2::3] for a in _posterior_arrays(once)]
    for a, b, c in zip(first, _posterior_arrays(run_on), thinned, strict=True):
        assert b.shape[1] == 500
        np.testing.assert_array_equal(a, c[:, :400])
        np.testing.assert_array_equal(b, c)
    assert run_on.posterior_["sample_stats"].attrs["thinning"] == 3
    assert once.posterior_["sample_stats"].attrs["thinning"] == 1
    # A divergence among the transitions thinned away is still reported, on the draw that ends them.
    from bayespca.inference.contract import Draws

    flags = np.zeros((2, 6), bool)
    flags[0, 1] = flags[1, 5] = True
    draws = Draws(np.zeros((2, 6, 1, 1)), np.ones((2, 6, 1)), np.zeros((2, 6, 1)), "none", "isotropic",
                  {"diverging": flags})
    np.testing.assert_array_equal(draws.thinned(3).sample_stats["diverging"], [[True, False], [False, True]])


@dataclasses.dataclass
class _StatefulChains:
    data: dict
    states: object = None


def test_chains_that_four_times_the_length_would_not_mend_do_not_run_on(monkeypatch):
    """Running on is for a shortfall in (1, 4] (:func:`bayespca.posterior.shortfall`): chains in different
    modes (R-hat far from 1, or not finite) warn at once, with no transition made; 4 runs on. After the
    t-th look the chains stop where the shortfall is above 4 / t (out of reach) or passes."""
    from bayespca.inference import nuts
    from bayespca.inference.contract import Draws

    draws = Draws(np.zeros((2, 400, 1, 1)), np.ones((2, 400, 1)), np.zeros((2, 400, 1)), "none", "isotropic",
                  {"diverging": np.zeros((2, 400), bool)})

    def no_transitions(*args):
        raise AssertionError("ran on")

    monkeypatch.setattr(nuts, "_transitions", no_transitions)
    chains = types.SimpleNamespace(data={})
    for beyond in (1.0, 4.001, 50.0, np.inf):
        kept, same = nuts._lengthened(draws, chains, lambda draws, value=beyond: value, False)
        assert kept is draws and same is chains
    with pytest.raises(AssertionError, match="ran on"):
        nuts._lengthened(draws, chains, lambda draws: 4.0, False)
    # Running on stops where the joined chains fall out of reach (a shortfall above 4 / t) or pass.
    runs = []

    def transitions(chains, data, lengths, progress_bar, label):
        runs.append(lengths)
        return draws, None

    monkeypatch.setattr(nuts, "_transitions", transitions)
    stateful = _StatefulChains({})
    cases = (([2.0, 2.01], 2), ([2.0, 2.0, 1.0], 3), ([2.0, 1.5, 1.34], 3), ([3.0, 1.5, 1.33, 1.2], 4))
    for verdicts, kept in cases:  # the check's values at t = 1, 2, ...; the t kept
        runs.clear()
        looks = iter(verdicts)
        kept_draws, _ = nuts._lengthened(draws, stateful, lambda draws, looks=looks: next(looks), False)
        assert kept_draws.thinning == kept
        assert runs == [(0, 400)] * (kept - 1) and next(looks, "all") == "all"
    # Chains apart (the second one's noise a tenth higher) after running on: the warning says so.
    apart = np.exp(np.random.default_rng(0).normal(size=(2, 400, 1)) / 100 + [[[0.0]], [[0.1]]])
    with pytest.warns(SamplingWarning, match="already ran on, 3 transitions for each draw kept"):
        diagnose(dataclasses.replace(draws, noise=apart, thinning=3))


def test_sample_more_after_pickling_and_on_a_rotated_factor_analysis():
    import pickle

    X = load_wine().data
    model = FactorAnalysis(3, method="nuts", rotation="varimax", num_warmup=150, num_samples=100,
                           num_chains=2, random_state=0, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        model.fit(X)
        copy = pickle.loads(pickle.dumps(model))
        model.sample_more(100)
        copy.sample_more(100)
    for a, b in zip(_posterior_arrays(model), _posterior_arrays(copy), strict=True):
        np.testing.assert_array_equal(a, b)
    # The rotation follows the new posterior mean: varimax of it, as the fit would give.
    from bayespca.rotations import rotate

    np.testing.assert_allclose(model.loadings_, rotate(model.gaussian_.loadings, "varimax").loadings,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model.gaussian_.loadings, model.loadings_samples_.mean((0, 1)), rtol=1e-12)


def test_sample_more_refuses_what_it_cannot_continue():
    X = _data(n=100, d=4)
    with pytest.raises(ValueError, match="method='nuts'.*got 'em'"):
        PPCA(2, method="em").fit(X).sample_more(10)
    model = PPCA(1, method="nuts", num_warmup=50, num_samples=50, num_chains=1, random_state=0,
                 progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        model.fit(X)
    for bad in (0, 2.5, True, "10"):
        with pytest.raises((ValueError, TypeError), match="num_samples"):
            model.sample_more(bad)
    model.set_params(method="closed_form").fit(X)  # a refit leaves no chains behind
    with pytest.raises(ValueError, match="got 'closed_form'"):
        model.sample_more(10)


def _invariants_mean_and_mcse(model):
    """Posterior means of the noise and the eigenvalues of ``W^T W`` (rotation-free), and their MCSE."""
    import arviz_stats

    w = model.loadings_samples_
    noise = model.noise_variance_samples_
    noise = noise[..., None] if noise.ndim == 2 else noise
    values = np.concatenate([noise, np.linalg.eigvalsh(np.swapaxes(w, -1, -2) @ w)], axis=-1)
    errors = [float(arviz_stats.mcse(values[..., j], method="mean")) for j in range(values.shape[-1])]
    return values.mean((0, 1)), np.array(errors)


@pytest.mark.parametrize(
    "estimator, k, data, rows",
    [(PPCA, 2, "iris", slice(0, 50)), (PPCA, 3, "wine", slice(0, 120)),
     (FactorAnalysis, 2, "wine", slice(0, 120))],
)
def test_fit_warm_samples_the_posterior_of_the_new_rows(estimator, k, data, rows):
    # The reference is a new fit to the new rows (mode search, warm-up, its own seed), with the default
    # priors, which read the data's scales: both target the same posterior, so the means of the
    # invariants agree within 4.5 Monte Carlo standard errors, while the first fit's lie hundreds away
    # (iris -> setosa alone, whose scales are a quarter of iris's; wine -> its first two cultivars,
    # raw, FA in per-feature units).
    X = {"iris": load_iris, "wine": load_wine}[data]().data
    options = {"method": "nuts", "progress_bar": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        model = estimator(k, random_state=0, **options).fit(X)
        before, before_error = _invariants_mean_and_mcse(model)
        assert model.fit_warm(X[rows]) is model
        new = estimator(k, random_state=1, **options).fit(X[rows])
    warm, warm_error = _invariants_mean_and_mcse(model)
    fresh, fresh_error = _invariants_mean_and_mcse(new)
    assert np.all(np.abs(warm - fresh) < 4.5 * np.hypot(warm_error, fresh_error))
    assert np.max(np.abs(before - fresh) / np.hypot(before_error, fresh_error)) > 100
    assert model.loadings_samples_.shape[:2] == (4, 500)
    assert int(model.sample_stats_["diverging"].sum()) == 0
    # The fitted attributes follow the new rows: the stored log-likelihood is theirs at the new mean.
    assert model.log_likelihood_ == pytest.approx(model.score(X[rows]) * X[rows].shape[0], rel=1e-9)


def test_fit_warm_refuses_what_it_cannot_continue_before_any_work():
    X = _data(n=100, d=4)
    short = {"method": "nuts", "num_warmup": 50, "num_samples": 50, "num_chains": 1, "random_state": 0,
             "progress_bar": False}
    with pytest.raises(ValueError, match="fit_warm needs a posterior: fit with method='nuts' .*got 'em'"):
        PPCA(1, method="em").fit(X).fit_warm(X)
    gappy = X.copy()
    gappy[3, 1] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        model = PPCA(1, **short).fit(X)
        with_gaps = PPCA(1, **short).fit(gappy)
        free = PPCA(1, prior="horseshoe", identification="none", **short).fit(X)
    for bad, message in [(gappy, "2 or more complete rows; got 1 missing entries"),
                         (X[:1], "2 or more complete rows; got 1 row"),
                         (X[:, :3], "X has 3 features, but PPCA is expecting 4"),
                         # as fit refuses them: 2 rows, which 1 component reproduces exactly (improper)
                         (X[:2], "n_components = 1 components reproduce the centred data exactly")]:
        with pytest.raises(ValueError, match=message):
            model.fit_warm(bad)
    for bad in (0, 2.5, "10"):
        with pytest.raises((ValueError, TypeError), match="num_samples"):
            model.fit_warm(X, num_samples=bad)
    with pytest.raises(ValueError, match="this fit had missing values. Fit the estimator to the new rows"):
        with_gaps.fit_warm(X)
    with pytest.raises(ValueError, match="whitens by a rotated or diagonal factor"):
        free.fit_warm(X)
    # Nothing was changed by the refusals: the chains go on as before, in the sampler the fit compiled
    # (adapted to the default target 0.9, whatever the options say now).
    assert model.loadings_samples_.shape[:2] == (1, 50) and model.n_iter_ == 50
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)
        model.set_params(target_accept_prob=0.6).fit_warm(X[10:], num_samples=60)
    assert model.loadings_samples_.shape[:2] == (1, 60) and model.target_accept_prob_ == 0.9


def test_sampling_warnings_offer_to_continue_the_chains_where_the_user_can():
    from bayespca import compare_n_components
    from bayespca.cli import format_warning
    from bayespca.messages import MORE_DRAWS

    X = _data(n=100, d=4)
    short = {"num_warmup": 100, "num_samples": 10, "num_chains": 2, "random_state": 0, "progress_bar": False}
    with pytest.warns(SamplingWarning) as caught:
        PPCA(1, method="nuts", **short).fit(X)
    messages = [str(w.message) for w in caught if w.category is SamplingWarning]
    assert any(m.startswith("Effective sample size") and m.endswith(MORE_DRAWS) for m in messages)
    # The command line and compare_n_components hand the user no estimator to continue.
    assert not any("sample_more" in format_warning(m) for m in messages)
    with pytest.warns(SamplingWarning) as caught:
        compare_n_components(X, [1, 2], cv=2, **short)
    messages = [str(w.message) for w in caught if w.category is SamplingWarning]
    assert any(m.startswith("n_components=1: Effective sample size") for m in messages)
    assert not any("sample_more" in m for m in messages)


def test_the_ml_start_s_own_warnings_stay_out_of_a_nuts_fit():
    # At k = d the ML noise variance is 0, held at its floor, and the closed form says so; the
    # posterior's sigma^2 is not 0 (iris: about 0.013), so a NUTS fit does not repeat that warning.
    X = load_iris().data
    with pytest.warns(UserWarning, match="The ML noise variance is 0"):
        PPCA(4).fit(X)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PPCA(4, method="nuts", num_warmup=150, num_samples=150, num_chains=1, random_state=0).fit(X)
    assert not [w for w in caught if "ML noise variance" in str(w.message)]
    assert 0.005 < model.noise_variance_ < 0.05
