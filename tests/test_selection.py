"""Rules for choosing the number of components, against closed forms and scikit-learn."""

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import multivariate_normal
from sklearn.datasets import load_iris
from sklearn.decomposition._pca import _assess_dimension

from bayespca import PCA, select_n_components
from bayespca.selection import (
    METHODS,
    gavish_donoho_lambda,
    gavish_donoho_omega,
    marchenko_pastur_median,
    minka_log_evidence,
    ppca_profile_log_likelihood,
    select_from_singular_values,
)


def _planted(n=400, d=30, rank=3, noise=1.0, seed=0, strength=(6.0, 5.5, 5.0)):
    """Rank-`rank` signal well above the noise bulk edge sigma (sqrt(n) + sqrt(d))."""
    rng = np.random.default_rng(seed)
    u = np.linalg.qr(rng.standard_normal((n, rank)))[0]
    v = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    edge = noise * (np.sqrt(n) + np.sqrt(d))
    signal = u @ np.diag(edge * np.array(strength)[:rank]) @ v.T
    return signal + noise * rng.standard_normal((n, d)) + 2.0


def test_gavish_donoho_constants():
    assert gavish_donoho_lambda(1.0) == pytest.approx(4 / np.sqrt(3), rel=1e-15)
    assert gavish_donoho_omega(1.0) == pytest.approx(2.858, abs=5e-4)
    # The paper's polynomial approximation of omega(beta).
    for beta in np.linspace(0.05, 1.0, 12):
        approx = 0.56 * beta**3 - 0.95 * beta**2 + 1.82 * beta + 1.43
        assert gavish_donoho_omega(beta) == pytest.approx(approx, abs=0.02)


@pytest.mark.parametrize("beta", [0.1, 0.5, 1.0])
def test_marchenko_pastur_median_halves_the_mass(beta):
    # Independent check: integrate the density with a different rule (trapezoid on a fine grid).
    lo, hi = (1 - np.sqrt(beta)) ** 2, (1 + np.sqrt(beta)) ** 2
    med = marchenko_pastur_median(beta)
    t = np.linspace(lo, med, 400001)[1:]
    f = np.sqrt(np.clip((hi - t) * (t - lo), 0, None)) / (2 * np.pi * beta * t)
    mass = integrate.trapezoid(f, t)
    assert mass == pytest.approx(0.5, abs=2e-3 if beta == 1.0 else 1e-5)


def test_minka_matches_sklearn_assess_dimension():
    for X in (load_iris().data, _planted(n=200, d=12)):
        spectrum = PCA().fit(X).explained_variance_
        n = X.shape[0]
        for k in range(1, X.shape[1]):
            ours = minka_log_evidence(spectrum, k, n)
            ref = _assess_dimension(spectrum, k, n)
            assert ours == pytest.approx(ref, rel=1e-12)
    # Published in scikit-learn's tests: iris evidence for k = 1, 2, 3.
    spectrum = PCA().fit(load_iris().data).explained_variance_
    for k, ref in zip((1, 2, 3), (364.0337315, 420.9353768, 440.4184836), strict=True):
        assert minka_log_evidence(spectrum, k, 150) == pytest.approx(ref, abs=1e-6)


def test_ppca_profile_log_likelihood_is_the_maximised_likelihood():
    X = _planted(n=150, d=8)
    n, d = X.shape
    s = PCA().fit(X).singular_values_
    prof = ppca_profile_log_likelihood(s, n, d)
    S = np.cov(X, rowvar=False, bias=True)
    evals, evecs = np.linalg.eigh(S)
    evals, evecs = evals[::-1], evecs[:, ::-1]
    for k in range(0, d):
        sigma2 = evals[k:].mean()
        W = evecs[:, :k] * np.sqrt(evals[:k] - sigma2)
        ref = multivariate_normal(X.mean(0), W @ W.T + sigma2 * np.eye(d)).logpdf(X).sum()
        assert prof[k] == pytest.approx(ref, rel=1e-12)


def test_information_criteria_formulas():
    X = _planted(n=200, d=10)
    n, d = X.shape
    s = PCA().fit(X).singular_values_
    sigma = 0.9
    Xc = X - X.mean(0)
    _, _, vt = np.linalg.svd(Xc, full_matrices=False)
    for method, c, extra in (("aic", 2.0, 0), ("bic", np.log(n), 0), ("gaic", 2.0, 1)):
        sel = select_from_singular_values(s, n, d, method, noise_std=sigma)
        for k, value in zip(sel.candidates, sel.criterion, strict=True):
            resid = Xc - Xc @ vt[:k].T @ vt[:k]
            params = d * k - k * k + extra * n * k
            ref = (resid**2).sum() / n + c * params * sigma**2 / n
            assert value == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("method", [m for m in METHODS if m != "variance"])
def test_planted_rank_is_recovered(method):
    # AIC and BIC with the Grassmann count d k - k^2 penalise one more
    # dimension by c (d - 2k) sigma^2 / n, which exceeds a noise eigenvalue
    # only when n is not much larger than d: that is where they should work.
    X = _planted(n=40, d=300) if method in ("aic", "bic") else _planted()
    sel = select_n_components(X, method)
    assert sel.n_components == 3, sel.table
    assert PCA(method).fit(X).n_components_ == 3


def test_known_noise_gavish_donoho_threshold():
    X = _planted(noise=0.5)
    n, d = X.shape
    sel = select_n_components(X, "gavish-donoho", noise_std=0.5)
    assert sel.threshold == pytest.approx(gavish_donoho_lambda(d / n) * np.sqrt(n) * 0.5)
    assert sel.n_components == 3


def test_pure_noise_selects_nothing_by_hard_thresholds():
    X = np.random.default_rng(1).standard_normal((300, 40))
    assert select_n_components(X, "gavish-donoho").n_components == 0
    assert select_n_components(X, "gavish-donoho", noise_std=1.0).n_components == 0
    assert select_n_components(X, "rank").n_components == 0
    assert PCA("gavish-donoho").fit(X).transform(X).shape == (300, 0)


def test_variance_rule_and_table():
    X = load_iris().data
    sel = select_n_components(X, "variance", threshold=0.95)
    assert sel.n_components == 2
    table = sel.table
    assert table["selected"].sum() == 1 and table.loc[2, "selected"]
    np.testing.assert_allclose(table.loc[1:, "eigenvalue"], [4.22824171, 0.24267075, 0.0782095, 0.02383509],
                               rtol=1e-6)
    np.testing.assert_allclose(table.loc[1:, "cumulative_variance_ratio"], [0.9246, 0.9777, 0.9948, 1.0],
                               atol=1e-4)


def test_selection_errors():
    s = np.array([3.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="method must be one of"):
        select_from_singular_values(s, 10, 3, "bogus")
    with pytest.raises(ValueError, match="threshold"):
        select_from_singular_values(s, 10, 3, "variance", threshold=1.5)
    with pytest.raises(ValueError, match="noise_std"):
        select_from_singular_values(s, 10, 3, "bic", noise_std=-1.0)
    with pytest.raises(ValueError, match="n_samples >= n_features"):
        select_from_singular_values(s, 3, 10, "mle")
    with pytest.raises(ValueError, match="min\\(n_samples, n_features\\)"):
        select_from_singular_values(s[:2], 10, 3, "mle")


# ------------------------------------------------------------------ extreme data
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("c", [1e-300, 1e-150, 1e150, 1e300])
def test_every_rule_is_scale_free(method, c):
    # Reference: the same rule on the unscaled singular values. The choice is the same; the
    # criterion is in the units of the data where it has units, else unchanged up to a constant.
    X = _planted(n=60, d=30) if method in ("aic", "bic") else _planted(n=100, d=12)
    n, d = X.shape
    s = np.linalg.svd(X - X.mean(0), compute_uv=False)
    ref = select_from_singular_values(s, n, d, method)
    if c == 1e300 and method in ("aic", "bic", "gaic", "rank"):  # criteria in squared units
        with pytest.raises(ValueError, match=f"The '{method}' criterion of singular values up to"):
            select_from_singular_values(s * c, n, d, method)
        return
    ours = select_from_singular_values(s * c, n, d, method)
    assert ours.n_components == ref.n_components
    if 1e-150 <= c <= 1e150:
        power = {"aic": 2, "bic": 2, "gaic": 2, "rank": 2, "gavish-donoho": 1}.get(method, 0)
        if method == "mle":  # log-evidence of data in units of 1/c: shift -n d log c
            np.testing.assert_allclose(ours.criterion + n * d * np.log(c), ref.criterion, rtol=1e-10)
        elif method == "profile-likelihood":  # Gaussian log-likelihood of c^2-scaled values
            np.testing.assert_allclose(ours.criterion + 2 * s.size * np.log(c), ref.criterion, rtol=1e-10)
        else:
            np.testing.assert_allclose(ours.criterion / c**power, ref.criterion, rtol=1e-10)


def test_selection_arguments_are_checked():
    s = np.array([3.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="finite, non-negative and descending"):
        select_from_singular_values(s[::-1], 10, 3, "variance")
    with pytest.raises(ValueError, match="finite, non-negative and descending"):
        select_from_singular_values([3.0, np.nan, 1.0], 10, 3, "variance")
    with pytest.raises(ValueError, match="n_samples must be an int >= 2; got 1"):
        select_from_singular_values([1.0], 1, 3, "variance")
    with pytest.raises(ValueError, match=r"tau is used by method in \['rank'\] only"):
        select_from_singular_values(s, 10, 3, "bic", tau=1.0)
    with pytest.raises(ValueError, match="tau must be a finite number >= 0"):
        select_from_singular_values(s, 10, 3, "rank", tau=-1.0)
    with pytest.raises(TypeError, match=r"unknown options \['noise'\]"):
        select_n_components(np.eye(4), "rank", noise=1.0)
    with pytest.raises(TypeError, match="standardize must be True or False"):
        select_n_components(np.eye(4), "rank", standardize="yes")


@pytest.mark.parametrize("offset", [1.26736591, 1e6, 1e100])
def test_select_n_components_on_constant_data(offset):
    # A centred matrix of zeros (closed form: every singular value 0), large enough for the
    # covariance solver, which cancels catastrophically here.
    X = np.full((3000, 8), offset)
    sel = select_n_components(X, "gavish-donoho")
    np.testing.assert_array_equal(sel.singular_values, 0.0)
    assert sel.n_components == 0
    assert select_n_components(X, "variance").n_components == 8  # nothing exceeds 0.9 of zero


def test_select_n_components_is_pca_of_the_same_data():
    X = load_iris().data
    for standardize in (False, True):
        sel = select_n_components(X * 1e100, "variance", standardize=standardize)
        ref = PCA(standardize=standardize).fit(X)
        np.testing.assert_allclose(sel.singular_values / (1.0 if standardize else 1e100),
                                   ref.singular_values_, rtol=1e-12)
