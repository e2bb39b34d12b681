"""PPCA and FactorAnalysis estimators against scikit-learn, R factanal and dense algebra."""

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import multivariate_normal
from sklearn.datasets import load_iris
from sklearn.decomposition import PCA as SkPCA
from sklearn.decomposition import FactorAnalysis as SkFA
from sklearn.utils.estimator_checks import parametrize_with_checks

from bayespca.probabilistic import PPCA, FactorAnalysis

DATA = Path(__file__).parent / "data"


def _data(n=300, d=8, k=2, seed=0, missing=0.0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d, k)) * np.linspace(2.0, 1.0, k)
    psi = rng.uniform(0.1, 0.5, d)
    X = rng.standard_normal((n, k)) @ W.T + rng.standard_normal((n, d)) * np.sqrt(psi) + 1.0
    if missing:
        hidden = rng.random((n, d)) < missing
        hidden[hidden.all(axis=1), 0] = False
        X = np.where(hidden, np.nan, X)
    return X


def _conditioning(model, x):
    """Dense reference: E[z|x_O], Cov[z|x_O] and log N(x_O) from the d x d covariance."""
    w, mu = model.gaussian_.loadings, model.mean_
    c = model.get_covariance()
    o = ~np.isnan(x)
    gain = np.linalg.solve(c[np.ix_(o, o)], w[o]).T
    mean = gain @ (x[o] - mu[o])
    cov = np.eye(w.shape[1]) - gain @ w[o]
    logpdf = multivariate_normal(mu[o], c[np.ix_(o, o)]).logpdf(x[o])
    return mean, cov, logpdf


# ------------------------------------------------------------ scikit-learn API
@parametrize_with_checks([PPCA(), PPCA(method="em"), FactorAnalysis()])
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Heywood/floor notes on random data
        check(estimator)


def test_tags_allow_nan():
    assert PPCA().__sklearn_tags__().input_tags.allow_nan
    assert FactorAnalysis().__sklearn_tags__().input_tags.allow_nan


# ------------------------------------------------------------------- PPCA
def test_ppca_iris_against_sklearn_pca():
    X = load_iris().data
    n = X.shape[0]
    ppca = PPCA(2).fit(X)
    sk = SkPCA(2, svd_solver="full").fit(X)
    # scikit-learn's covariance divides by n - 1; rescaled, it is the ML fit.
    c_ml = sk.get_covariance() * (n - 1) / n
    np.testing.assert_allclose(ppca.get_covariance(), c_ml, rtol=1e-10)
    assert ppca.noise_variance_ == pytest.approx(sk.noise_variance_ * (n - 1) / n, rel=1e-10)
    assert ppca.method_ == "closed_form"
    # Exact ML average log-likelihood on iris, k = 2 (see the shared notes):
    assert ppca.score(X) == pytest.approx(-2.6997518677, abs=1e-10)
    assert sk.score(X) == pytest.approx(-2.6997965107, abs=1e-10)
    lam = np.linalg.eigvalsh(np.cov(X.T, bias=True))[::-1]
    ll = -n / 2 * (4 * np.log(2 * np.pi) + np.log(lam[:2]).sum() + 2 * np.log(lam[2:].mean()) + 4)
    assert ppca.log_likelihood_ == pytest.approx(ll, rel=1e-12)
    np.testing.assert_allclose(
        np.abs(ppca.components_ / np.linalg.norm(ppca.components_, axis=1)[:, None]),
        np.abs(sk.components_),
        atol=1e-10,
    )


def test_ppca_em_equals_closed_form():
    X = _data(k=3)
    cf = PPCA(3).fit(X)
    em = PPCA(3, method="em", tol=1e-14).fit(X)
    assert em.method_ == "em" and em.n_iter_ >= 1  # EM starts at the closed-form maximum
    assert em.log_likelihood_ == pytest.approx(cf.log_likelihood_, rel=1e-10)
    atol = 1e-5 * np.abs(cf.components_).max()
    np.testing.assert_allclose(em.components_, cf.components_, atol=atol)
    assert em.noise_variance_ == pytest.approx(cf.noise_variance_, rel=1e-6)
    assert np.all(np.diff(em.loglike_trace_) >= 0)


@pytest.mark.parametrize("k", range(1, 9))
def test_ppca_every_n_components(k):
    X = _data(n=60, d=8, k=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # k = d: sigma^2 at the floor
        cf = PPCA(k).fit(X)
    np.testing.assert_allclose(cf.transform(X[:1])[0], _conditioning(cf, X[0])[0], atol=1e-8)
    lam = np.linalg.eigvalsh(np.cov(X.T, bias=True))[::-1]
    if k < 8:
        assert cf.noise_variance_ == pytest.approx(lam[k:].mean(), rel=1e-9)
    ref = multivariate_normal(cf.mean_, cf.get_covariance()).logpdf(X).sum()
    assert cf.log_likelihood_ == pytest.approx(ref, rel=1e-9)


def test_ppca_n_less_than_d():
    X = _data(n=10, d=30, k=2)
    ppca = PPCA().fit(X)
    assert ppca.n_components_ == 8  # min(n - 1, d) - 1
    # sigma^2 averages the d - k discarded eigenvalues, 21 of them zeros.
    lam = np.clip(np.linalg.eigvalsh(np.cov(X.T, bias=True))[::-1], 0, None)
    assert ppca.noise_variance_ == pytest.approx(lam[8:].sum() / 22, rel=1e-9)
    ref = multivariate_normal(ppca.mean_, ppca.get_covariance()).logpdf(X).sum()
    assert ppca.log_likelihood_ == pytest.approx(ref, rel=1e-9)


def test_n_less_than_d_by_em_never_forms_the_scatter():
    X = _data(n=12, d=40, k=2)
    cf = PPCA(3).fit(X)
    em = PPCA(3, method="em", tol=1e-14).fit(X)  # d > n: the O(n d k) form
    assert em.log_likelihood_ == pytest.approx(cf.log_likelihood_, rel=1e-9)
    c_ref = cf.get_covariance()
    np.testing.assert_allclose(em.get_covariance(), c_ref, atol=1e-5 * np.abs(c_ref).max())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fa = FactorAnalysis(3).fit(X)
    assert np.all(np.diff(fa.loglike_trace_) >= 0)
    ref = multivariate_normal(fa.mean_, fa.get_covariance()).logpdf(X).sum()
    assert fa.log_likelihood_ == pytest.approx(ref, rel=1e-9)
    assert fa.log_likelihood_ >= cf.log_likelihood_  # FA nests pPCA


# --------------------------------------------------------- Factor analysis
def test_fa_equals_sklearn_at_convergence():
    X = _data()
    n = X.shape[0]
    sk = SkFA(2, tol=1e-12, max_iter=100_000, svd_method="lapack").fit(X)
    fa = FactorAnalysis(2, tol=0).fit(X)
    assert fa.log_likelihood_ == pytest.approx(sk.score(X) * n, rel=1e-10)
    assert fa.score(X) == pytest.approx(sk.score(X), rel=1e-10)
    np.testing.assert_allclose(fa.noise_variance_, sk.noise_variance_, rtol=1e-5)
    # Both stop where the log-likelihood is flat to ~1e-10: parameters agree to ~1e-6.
    c_sk = sk.get_covariance()
    np.testing.assert_allclose(fa.get_covariance(), c_sk, atol=1e-5 * np.abs(c_sk).max())
    p_sk = sk.get_precision()
    np.testing.assert_allclose(fa.get_precision(), p_sk, atol=1e-5 * np.abs(p_sk).max())
    # Same orientation of the factors up to sign, so the same factor scores.
    signs = np.sign(np.sum(fa.components_ * sk.components_, axis=1))
    np.testing.assert_allclose(fa.components_, sk.components_ * signs[:, None], atol=1e-4)
    np.testing.assert_allclose(fa.transform(X), sk.transform(X) * signs, atol=1e-4)
    # diag(C) = diag(S) at an interior ML point.
    np.testing.assert_allclose(np.diag(fa.get_covariance()), X.var(axis=0), rtol=1e-6)


def _factanal():
    ref = json.loads((DATA / "factanal_mtcars.json").read_text())
    X = pd.read_csv(DATA / "factanal_mtcars_data.csv").to_numpy(dtype=float)
    return ref, (X - X.mean(axis=0)) / X.std(axis=0)


@pytest.mark.parametrize("k", [2, 3])
def test_fa_equals_r_factanal(k):
    ref, Z = _factanal()
    fit = ref["fits"][str(k)]
    n, d = Z.shape
    fa = FactorAnalysis(k, tol=0).fit(Z)
    # factanal minimises F = tr(C^{-1} R) - log|C^{-1} R| - d on the correlation
    # matrix R, so the ML log-likelihood of the standardised data is
    # -n/2 (d log 2pi + log|R| + F + d).
    ll_r = -n / 2 * (d * np.log(2 * np.pi) + ref["log_det_correlation"] + fit["objective"] + d)
    assert fa.log_likelihood_ == pytest.approx(ll_r, rel=1e-12)
    np.testing.assert_allclose(fa.noise_variance_, fit["uniquenesses"], atol=1e-6)
    loadings = np.array(fit["loadings"])
    signs = np.sign(np.sum(fa.loadings_ * loadings, axis=0))
    np.testing.assert_allclose(fa.loadings_, loadings * signs, atol=1e-5)


def test_fa_heywood_and_constant_columns_are_reported_not_nan():
    X = _data(seed=3)
    X = np.column_stack([X, X[:, 0], np.full(X.shape[0], 2.5)])  # duplicated and constant
    with pytest.warns(UserWarning, match="Heywood"):
        fa = FactorAnalysis(2).fit(X)
    assert {0, 8, 9} <= set(fa.heywood_features_.tolist())
    for value in (fa.loadings_, fa.noise_variance_, fa.transform(X), fa.score_samples(X)):
        assert np.all(np.isfinite(value))


@pytest.mark.parametrize("k", range(1, 8))
def test_fa_every_n_components(k):
    X = _data(n=200, d=8, k=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # large k: Heywood cases, slow convergence
        fa = FactorAnalysis(k, max_iter=3000).fit(X)
    assert np.all(np.diff(fa.loglike_trace_) >= 0)
    ref = multivariate_normal(fa.mean_, fa.get_covariance()).logpdf(X).sum()
    assert fa.log_likelihood_ == pytest.approx(ref, rel=1e-9)
    if k > 1:  # more factors never fit worse
        smaller = FactorAnalysis(k - 1, max_iter=3000)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert fa.log_likelihood_ >= smaller.fit(X).log_likelihood_ - 1e-6


# ------------------------------------- methods shared by both estimators
@pytest.fixture(params=["ppca", "fa"], scope="module")
def fitted_with_missing(request):
    X = _data(missing=0.2, seed=5)
    model = PPCA(2) if request.param == "ppca" else FactorAnalysis(2)
    return model.fit(X), X


def test_missing_values_default_to_em_and_trace_increases(fitted_with_missing):
    model, _ = fitted_with_missing
    assert model.method_ == "em"
    assert np.all(np.diff(model.loglike_trace_) >= 0)


def test_transform_and_latent_posterior_match_dense_conditioning(fitted_with_missing):
    model, X = fitted_with_missing
    rows = X[:12]
    post = model.latent_posterior(rows)
    assert post.covariance.shape == (12, 2, 2)
    np.testing.assert_allclose(model.transform(rows), post.mean)
    for i, x in enumerate(rows):
        mean, cov, _ = _conditioning(model, x)
        np.testing.assert_allclose(post.mean[i], mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(post.covariance[i], cov, rtol=1e-9, atol=1e-12)
    complete = np.nan_to_num(rows, nan=1.0)
    shared = model.latent_posterior(complete)
    assert shared.covariance.shape == (2, 2)
    np.testing.assert_allclose(shared.covariance, _conditioning(model, complete[0])[1], atol=1e-12)


def test_a_row_with_nothing_observed_gets_the_prior_at_any_scale():
    # Its latent posterior is the prior N(0, I) whatever the mean: at 1e300 the missing entries'
    # placeholders minus the mean, divided by the noise sd, used to overflow (a RuntimeWarning
    # that a property test found).
    X = np.array([[np.nan], [8.21618144e299]])  # as the property test drew it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("error", RuntimeWarning)
        model = PPCA(1, noise_floor=1e-12).fit(X)
        post = model.latent_posterior(X[:1])
    np.testing.assert_array_equal(post.mean, [[0.0]])
    np.testing.assert_allclose(post.covariance, [[[1.0]]], rtol=1e-12)

def test_score_samples_match_scipy(fitted_with_missing):
    model, X = fitted_with_missing
    rows = X[:15]
    ref = [_conditioning(model, x)[2] for x in rows]
    np.testing.assert_allclose(model.score_samples(rows), ref, rtol=1e-10)
    assert model.score(rows) == pytest.approx(np.mean(ref), rel=1e-10)
    scored = np.sum(model.score_samples(X))
    assert scored == pytest.approx(model.log_likelihood_, rel=1e-10)


def test_impute_matches_dense_conditional(fitted_with_missing):
    model, X = fitted_with_missing
    rows = X[:10]
    filled, var = model.impute(rows, return_variance=True)
    c, mu = model.get_covariance(), model.mean_
    for i, x in enumerate(rows):
        o, m = ~np.isnan(x), np.isnan(x)
        np.testing.assert_array_equal(filled[i, o], x[o])
        np.testing.assert_array_equal(var[i, o], 0.0)
        if m.any():
            gain = np.linalg.solve(c[np.ix_(o, o)], c[np.ix_(o, m)]).T
            np.testing.assert_allclose(filled[i, m], mu[m] + gain @ (x[o] - mu[o]), rtol=1e-10)
            cond = c[np.ix_(m, m)] - gain @ c[np.ix_(o, m)]
            np.testing.assert_allclose(var[i, m], np.diag(cond), rtol=1e-10)
    np.testing.assert_array_equal(model.impute(filled), filled)


def test_covariance_precision_sample_inverse_transform(fitted_with_missing):
    model, _ = fitted_with_missing
    d = model.n_features_in_
    product = model.get_precision() @ model.get_covariance()
    np.testing.assert_allclose(product, np.eye(d), atol=1e-10)
    draws = model.sample(50_000, random_state=0)
    np.testing.assert_allclose(np.cov(draws.T), model.get_covariance(), atol=0.06)
    np.testing.assert_array_equal(model.sample(5, random_state=3), model.sample(5, random_state=3))
    assert not np.allclose(model.sample(5, random_state=1), model.sample(5, random_state=2))
    # E[x | z] = W z + mu: the conditional mean of x given the factors.
    Z = np.array([[1.0, -0.5], [0.0, 0.0]])
    np.testing.assert_allclose(model.inverse_transform(Z)[1], model.mean_)
    np.testing.assert_allclose(
        model.inverse_transform(Z)[0] - model.mean_, model.loadings_ @ Z[0], rtol=1e-12
    )


def test_all_observed_rows_equal_complete_path():
    X = _data(seed=7)
    Xm = X.copy()
    Xm[0, 0] = np.nan  # forces the missing-value EM path
    em_missing = PPCA(2, method="em", tol=1e-14).fit(Xm)
    complete_rows = X[1:]
    # Rows without NaN are scored and transformed identically by both paths.
    np.testing.assert_allclose(
        em_missing.score_samples(complete_rows),
        [_conditioning(em_missing, x)[2] for x in complete_rows],
        rtol=1e-10,
    )
    # With the NaN entry dropped from the data, EM sees a slightly different
    # data set; it still matches the complete-data fit closely.
    cf = PPCA(2).fit(X)
    np.testing.assert_allclose(em_missing.get_covariance(), cf.get_covariance(), atol=0.02)


def test_dataframe_feature_names():
    X = _data()
    df = pd.DataFrame(X, columns=[f"v{i}" for i in range(8)])
    fa = FactorAnalysis(2).fit(df)
    np.testing.assert_array_equal(fa.feature_names_in_, df.columns)
    names = ["factoranalysis0", "factoranalysis1"]
    np.testing.assert_array_equal(fa.get_feature_names_out(), names)
    np.testing.assert_allclose(fa.transform(df), FactorAnalysis(2).fit(X).transform(X))


# ---------------------------------------------------- parallel modules
def test_fa_rotation_changes_loadings_not_likelihood():
    rotations = pytest.importorskip("bayespca.rotations")
    X = _data(d=9, k=2)
    plain = FactorAnalysis(2).fit(X)
    for method in ("varimax", "promax"):
        rot = FactorAnalysis(2, rotation=method).fit(X)
        ref = rotations.rotate(plain.loadings_, method)
        np.testing.assert_allclose(rot.loadings_, ref.loadings, atol=1e-8)
        np.testing.assert_allclose(rot.get_covariance(), plain.get_covariance(), atol=1e-12)
        assert rot.score(X) == pytest.approx(plain.score(X), rel=1e-12)
        # L_rot z_rot = W z: the rotated scores reproduce the same mean of x.
        np.testing.assert_allclose(
            rot.transform(X) @ rot.components_, plain.transform(X) @ plain.components_, atol=1e-8
        )
        phi = rot.factor_correlation_
        np.testing.assert_allclose(rot.loadings_ @ phi @ rot.loadings_.T,
                                   plain.loadings_ @ plain.loadings_.T, atol=1e-8)


def test_ppca_svi_map_reaches_closed_form():
    pytest.importorskip("bayespca.inference.svi")
    X = _data(k=2)
    cf = PPCA(2).fit(X)
    svi = PPCA(2, method="svi", random_state=0).fit(X)
    assert svi.log_likelihood_ == pytest.approx(cf.log_likelihood_, rel=1e-4)
    # MAP under SVI's priors, stopped by its own tolerance: close, not equal.
    gap = np.linalg.norm(svi.get_covariance() - cf.get_covariance())
    assert gap < 0.05 * np.linalg.norm(cf.get_covariance())
    # With flat priors the MAP is the maximum-likelihood point itself.
    flat = PPCA(2, method="svi", prior="flat", random_state=0).fit(X)
    assert flat.log_likelihood_ == pytest.approx(cf.log_likelihood_, rel=1e-9)
    np.testing.assert_allclose(flat.get_covariance(), cf.get_covariance(), rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("model", "match"),
    [
        (PPCA(method="mcmc"), "method must be one of \\['auto', 'closed_form', 'em', 'svi', 'nuts'\\]"),
        (FactorAnalysis(method="closed_form"), "method must be one of \\['auto', 'em', 'svi', 'nuts'\\]"),
        (PPCA(9), "n_components must be None or an int in \\[1, 8\\]"),
        (PPCA(0), "n_components must be"),
        (FactorAnalysis(8), "n_components must be None or an int in \\[1, 7\\]"),
        (FactorAnalysis(2, rotation="equamax"), "rotation must be one of"),
        (PPCA(2, tol=-1.0), "tol must be"),
        (PPCA(2, max_iter=0), "max_iter must be"),
        (FactorAnalysis(2, noise_floor=0.0), "noise_floor must be"),
        # Checked whatever the method, as scikit-learn checks every parameter at fit.
        (PPCA(2, padded_components=1), "padded_components must be an int >= 2 and <= 8 or None; got 1"),
        (FactorAnalysis(2, method="nuts", padded_components=9), "padded_components must be an int >= 2"),
        (PPCA(2, method="nuts", prior="horseshoe", anchors=(3, 3)),
         "anchors must be None or 2 distinct integer features in \\[0, 8\\); got \\(3, 3\\)"),
        (PPCA(2, anchors=(0, 1)), "anchors needs prior='horseshoe' with identification None or 'lower_tri"),
        (FactorAnalysis(2, method="svi", guide="normal", prior="horseshoe", identification="none",
                        anchors=(0, 1)), "anchors needs prior='horseshoe'.*identification='none'"),
    ],
)
def test_bad_parameters(model, match):
    with pytest.raises(ValueError, match=match):
        model.fit(_data())


def test_closed_form_rejects_nan():
    with pytest.raises(ValueError, match="method='closed_form' needs complete data"):
        PPCA(2, method="closed_form").fit(_data(missing=0.1))


def test_bad_method_arguments():
    fa = FactorAnalysis(2).fit(_data())
    with pytest.raises(ValueError, match="n_samples must be an int >= 1"):
        fa.sample(0)
    with pytest.raises(TypeError, match="random_state must be"):
        fa.sample(2, random_state="seed")
    with pytest.raises(ValueError, match="inverse_transform expects n_components_ = 2"):
        fa.inverse_transform(np.ones((3, 4)))
    with pytest.raises(ValueError, match="X has 3 features, but FactorAnalysis is expecting 8"):
        fa.transform(np.ones((2, 3)))
    with pytest.raises(ValueError, match="infinity"):
        fa.score(np.full((2, 8), np.inf))
