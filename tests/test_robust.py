"""Robust (Student-t) pPCA: density, EM, SVI and NUTS against independent references."""

import functools
import math
import warnings

import numpy as np
import pytest
from numpyro.infer import log_likelihood
from scipy.linalg import subspace_angles
from scipy.stats import chi2, multivariate_normal, multivariate_t

from bayespca import PCA, PPCA, compare
from bayespca.comparison import ParetoKWarning
from bayespca.gaussian import LowRankGaussian
from bayespca.models import robust_ppca
from bayespca.posterior import SamplingWarning
from bayespca.robust import NU_BOUNDS, RobustPPCA, expected_scale, student_t_log_prob


def _t_data(n=300, d=5, nu=4.0, seed=1):
    """Rows t_nu(1, W W^T + 0.25 I) with one latent dimension: the model itself."""
    rng = np.random.default_rng(seed)
    w = 2.0 * rng.normal(size=(d, 1))
    u = rng.gamma(nu / 2, 2 / nu, n)
    return (rng.normal(size=(n, 1)) @ w.T + 0.5 * rng.normal(size=(n, d))) / np.sqrt(u)[:, None] + 1.0


def _contaminated(seed=0, n=500, d=10, share=0.1):
    """A 2-plane with noise 0.5, and a share of rows replaced by gross outliers (sd 20)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, 2)) * [3.0, 2.0]
    X = rng.normal(size=(n, 2)) @ w.T + 0.5 * rng.normal(size=(n, d))
    outlier = rng.random(n) < share
    X[outlier] = 20.0 * rng.standard_normal((outlier.sum(), d))
    return X, w, outlier


def test_density_is_scipys_multivariate_t_and_its_observed_block():
    rng = np.random.default_rng(0)
    w, psi, mu = rng.normal(size=(4, 2)), rng.uniform(0.2, 1.0, 4), rng.normal(size=4)
    g = LowRankGaussian(w, psi, mu)
    cov = w @ w.T + np.diag(psi)
    X = 3.0 * rng.normal(size=(6, 4))
    for df in (0.7, 3.0, 40.0):
        np.testing.assert_allclose(student_t_log_prob(g, df, X), multivariate_t(mu, cov, df=df).logpdf(X),
                                   rtol=1e-12)
    observed = np.ones(X.shape, bool)
    observed[0, [1, 3]] = False
    block = [0, 2]
    ref = multivariate_t(mu[block], cov[np.ix_(block, block)], df=3.0).logpdf(X[0, block])
    value = student_t_log_prob(g, 3.0, np.where(observed, X, np.nan), observed)[0]
    assert value == pytest.approx(ref, rel=1e-12)
    # nu -> inf: the Gaussian, with the ratio of gamma functions exact at nu = 1e12.
    np.testing.assert_allclose(student_t_log_prob(g, 1e12, X), multivariate_normal(mu, cov).logpdf(X),
                               rtol=1e-10)


def test_weights_are_the_posterior_mean_of_the_row_scales():
    rng = np.random.default_rng(2)
    w, mu = rng.normal(size=(3, 1)), rng.normal(size=3)
    g = LowRankGaussian(w, np.full(3, 0.5), mu)
    X = rng.normal(size=(5, 3)) * 4
    cov = w @ w.T + 0.5 * np.eye(3)
    delta = np.einsum("ij,ij->i", X - mu, np.linalg.solve(cov, (X - mu).T).T)
    # u | x ~ Gamma((nu + d) / 2, (nu + delta) / 2): its mean.
    np.testing.assert_allclose(expected_scale(g, 2.5, X), (2.5 + 3) / (2.5 + delta), rtol=1e-12)


def test_model_log_likelihood_is_the_t_density():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(7, 3))
    X[2, 0] = np.nan
    w, mu = rng.normal(size=(3, 1)), rng.normal(size=3)
    cov = w @ w.T + 0.3 * np.eye(3)
    model = functools.partial(robust_ppca, n_components=1, identification="none")
    params = {"W": w[None], "sigma": np.sqrt([0.3]), "mu": mu[None], "nu": np.array([2.5])}
    ll = np.asarray(log_likelihood(model, params, X)["X"])[0]
    ref = multivariate_t(mu, cov, df=2.5).logpdf(np.nan_to_num(X))
    ref[2] = multivariate_t(mu[1:], cov[1:, 1:], df=2.5).logpdf(X[2, 1:])
    np.testing.assert_allclose(ll, ref, rtol=1e-12)


@pytest.mark.parametrize("nu", [np.inf, 1e12])
def test_infinite_nu_is_the_ppca_closed_form(nu):
    X, _, _ = _contaminated(share=0.0)
    robust = RobustPPCA(2, nu=nu).fit(X)
    ppca = PPCA(2, method="closed_form").fit(X)
    assert robust.log_likelihood_ == pytest.approx(ppca.log_likelihood_, rel=1e-8)
    np.testing.assert_allclose(robust.loadings_ @ robust.loadings_.T, ppca.loadings_ @ ppca.loadings_.T,
                               rtol=1e-8, atol=1e-8 * np.abs(ppca.loadings_).max() ** 2)
    assert robust.noise_variance_ == pytest.approx(ppca.noise_variance_, rel=1e-8)
    np.testing.assert_allclose(robust.mean_, ppca.mean_, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(robust.score_samples(X), ppca.score_samples(X), rtol=1e-8)


def test_gross_outliers_do_not_rotate_the_subspace():
    X, w, outlier = _contaminated(share=0.1)
    robust = RobustPPCA(2).fit(X)
    pca = PCA(2).fit(X)
    assert np.degrees(subspace_angles(robust.loadings_, w)).max() < 5.0
    assert np.degrees(subspace_angles(pca.components_.T, w)).max() > 30.0
    # The outliers are the rows the fit down-weights.
    assert robust.row_weights_[outlier].max() < 0.05 < robust.row_weights_[~outlier].min()
    # ECME never lowers the log-likelihood.
    assert np.all(np.diff(robust.loglike_trace_) >= -1e-9 * abs(robust.log_likelihood_))


@pytest.fixture(scope="module")
def t_fits():
    """EM, SVI (delta guide, flat priors) and NUTS (flat priors) of t data, and NUTS of pPCA."""
    X = _t_data()
    em = RobustPPCA(1).fit(X)
    svi = RobustPPCA(1, method="svi", prior="flat", random_state=0).fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # short chains
        nuts = RobustPPCA(1, method="nuts", prior="flat", num_warmup=300, num_samples=400, num_chains=2,
                          random_state=0).fit(X)
        gauss = PPCA(1, method="nuts", num_warmup=300, num_samples=400, num_chains=2, random_state=0).fit(X)
    return X, em, svi, nuts, gauss


def test_em_and_svi_find_the_same_maximum(t_fits):
    _, em, svi, _, _ = t_fits
    # EM stops at a relative gain of 1e-10; Adam's decayed steps end within ~1e-9 of the optimum.
    assert svi.log_likelihood_ == pytest.approx(em.log_likelihood_, rel=1e-9)
    assert svi.nu_ == pytest.approx(em.nu_, rel=1e-4)
    assert svi.noise_variance_ == pytest.approx(em.noise_variance_, rel=1e-4)
    assert np.degrees(subspace_angles(svi.loadings_, em.loadings_)).max() < 1e-3
    np.testing.assert_allclose(svi.mean_, em.mean_, atol=1e-4 * np.abs(em.mean_).max())


def test_nuts_posterior_mode_is_the_em_fit(t_fits):
    X, em, _, nuts, _ = t_fits
    draws = nuts.nuts_
    nu, sigma2 = draws.extra["nu"].ravel(), draws.noise[..., 0].ravel()
    # Bernstein-von Mises: mean and mode differ by O(1/n), far less than the posterior sd.
    assert abs(nu.mean() - em.nu_) < 2 * nu.std()
    assert abs(sigma2.mean() - em.noise_variance_) < 2 * sigma2.std()
    # The likelihood of every draw is at most EM's maximum, and the best of 800 draws is within the
    # 0.1% quantile of chi^2_p / 2 (p = 12 parameters) of it: the draws surround the EM mode.
    ll = nuts.posterior_["posterior"]["log_lik"].values.ravel()
    assert ll.max() <= em.log_likelihood_ + 1e-6
    assert em.log_likelihood_ - ll.max() < chi2(12).ppf(1e-3) / 2 + 1.0


def test_nuts_on_new_rows_of_the_same_shape_compiles_nothing(t_fits, backend_compiles):
    # The rows, priors and start reach the compiled sampler as arguments (the runner of PPCA's NUTS);
    # before, NumPyro's MCMC closed over the rows and compiled every program again at each fit.
    X = _t_data(seed=7)
    with warnings.catch_warnings(), backend_compiles() as compiles:
        warnings.simplefilter("ignore", SamplingWarning)  # short chains
        fit = RobustPPCA(1, method="nuts", prior="flat", num_warmup=300, num_samples=400, num_chains=2,
                         random_state=1).fit(X)
    assert compiles == []
    em = RobustPPCA(1).fit(X)
    nu = fit.nuts_.extra["nu"].ravel()
    assert abs(nu.mean() - em.nu_) < 2 * nu.std()


def test_em_runs_on_numpy_and_compiles_nothing(backend_compiles):
    # A shape no other test uses: any JAX operation run eagerly by EM would compile a program here.
    X = _t_data(n=41, d=7, seed=3)
    with backend_compiles() as compiles:
        fit = RobustPPCA(2).fit(X)
    assert compiles == []
    cov = fit.loadings_ @ fit.loadings_.T + fit.noise_variance_ * np.eye(7)
    assert fit.log_likelihood_ == pytest.approx(multivariate_t(fit.mean_, cov, df=fit.nu_).logpdf(X).sum(),
                                                rel=1e-10)


def test_nuts_compiles_each_program_once_and_takes_the_runners_options(backend_compiles, capsys):
    # A shape no other test uses. Run operation by operation (the priors' resolution, EM's and the
    # summaries' t densities in JAX), the set-up compiled over 100 programs; the runner's are about 10.
    X = _t_data(n=43, d=4, seed=5)
    options = dict(method="nuts", prior="flat", num_warmup=100, num_samples=100, num_chains=2, random_state=2)
    with warnings.catch_warnings(), backend_compiles() as compiles:
        warnings.simplefilter("ignore", SamplingWarning)  # short chains
        threads = RobustPPCA(1, progress_bar=False, **options).fit(X)
        assert len(compiles) < 20, len(compiles)
        assert capsys.readouterr().err == ""
        sequential = RobustPPCA(1, chain_method="sequential", progress_bar=True, **options).fit(X)
    np.testing.assert_array_equal(threads.nuts_.loadings, sequential.nuts_.loadings)
    np.testing.assert_array_equal(threads.nu_samples_, sequential.nu_samples_)
    # 2 chains x (100 + 100) transitions
    assert "400/400" in capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    with pytest.raises(ValueError, match="chain_method must be one of"):
        RobustPPCA(1, chain_method="threads", **options).fit(X)


def test_svi_on_new_rows_of_the_same_shape_compiles_nothing(backend_compiles, capsys):
    # The data and prior numbers are arguments of the kept program of 100 steps; before, NumPyro's
    # SVI.run compiled its loop again at each fit (1.4 s a fit at 500 x 10, against 0.1 s).
    options = dict(method="svi", random_state=0, progress_bar=False)
    RobustPPCA(1, **options).fit(_t_data(seed=11))
    X = _t_data(seed=12)
    with backend_compiles() as compiles:
        fit = RobustPPCA(1, **options).fit(X)
    assert compiles == []
    assert capsys.readouterr().err == ""
    em = RobustPPCA(1).fit(X)
    # Flat priors: the MAP is the maximum likelihood that EM finds (as test_em_and_svi_find_the_same_maximum).
    flat = RobustPPCA(1, method="svi", prior="flat", random_state=0, progress_bar=True).fit(X)
    assert flat.log_likelihood_ == pytest.approx(em.log_likelihood_, rel=1e-9)
    assert "SVI" in capsys.readouterr().err
    assert fit.converged_ and fit.n_iter_ < 3000


def test_flat_prior_keeps_the_posterior_of_nu_proper():
    # On Gaussian rows the t likelihood keeps growing towards its Gaussian limit as nu -> inf, so a flat
    # prior on all of nu > 0 has no posterior: chains drifted to nu ~ 1e76, every transition divergent.
    # prior="flat" is uniform on the range EM searches, NU_BOUNDS.
    rng = np.random.default_rng(0)
    X = 2.0 * rng.normal(size=(300, 1)) @ rng.normal(size=(1, 5)) + 0.5 * rng.normal(size=(300, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # short chains
        fit = RobustPPCA(1, method="nuts", prior="flat", num_warmup=300, num_samples=400, num_chains=2,
                         random_state=0).fit(X)
    nu = fit.nuts_.extra["nu"]
    assert not fit.nuts_.sample_stats["diverging"].any()
    assert np.all((NU_BOUNDS[0] <= nu) & (nu <= NU_BOUNDS[1]))
    # EM's maximum sits at the upper bound here; the posterior leans the same way.
    assert RobustPPCA(1).fit(X).nu_ == pytest.approx(NU_BOUNDS[1], rel=1e-3)
    assert np.median(nu) > 100


def test_loo_prefers_the_t_model_on_heavy_tailed_rows(t_fits):
    X, _, _, nuts, gauss = t_fits
    # The pointwise log-likelihood of one draw is scipy's multivariate t density of the rows.
    g = nuts.nuts_
    w, s2, mu, nu = g.loadings[0, 0], g.noise[0, 0, 0], g.mean[0, 0], g.extra["nu"][0, 0]
    ref = multivariate_t(mu, w @ w.T + s2 * np.eye(X.shape[1]), df=nu).logpdf(X)
    np.testing.assert_allclose(nuts.posterior_["log_likelihood"]["X"].values[0, 0], ref, rtol=1e-10)
    with warnings.catch_warnings():
        # pPCA meets the heaviest rows with k-hat > 0.7; PSIS then overestimates its elpd, so the
        # difference below is if anything understated.
        warnings.simplefilter("ignore", ParetoKWarning)
        table = compare({"robust": nuts, "ppca": gauss})
    assert table.index[0] == "robust"
    assert -table.loc["ppca", "elpd_diff"] > 2 * table.loc["ppca", "dse"]


def test_named_errors_before_any_work():
    X = _t_data(n=50)
    with pytest.raises(ValueError, match="nu must be"):
        RobustPPCA(1, nu=-1.0).fit(X)
    with pytest.raises(ValueError, match="n_components must be"):
        RobustPPCA(5).fit(X)
    X[0, 0] = np.nan
    with pytest.raises(ValueError, match="method='em' needs complete data"):
        RobustPPCA(1).fit(X)
    with pytest.raises(ValueError, match="prior='flat' needs method='svi' or 'nuts'"):
        RobustPPCA(1, prior="flat").fit(np.nan_to_num(X))
    with pytest.raises(ValueError, match="prior='horseshoe' is not available for RobustPPCA"):
        RobustPPCA(1, method="nuts", prior="horseshoe").fit(X)
    assert math.isinf(RobustPPCA(1, nu=np.inf).fit(np.nan_to_num(X)).nu_)
