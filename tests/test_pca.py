"""bayespca.PCA against scikit-learn, numpy's SVD and closed forms."""

import numpy as np
import pytest
from scipy.stats import multivariate_normal
from sklearn.base import clone
from sklearn.datasets import load_iris
from sklearn.decomposition import PCA as SkPCA
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from bayespca import PCA
from bayespca.linalg import choose_solver

EXACT_SOLVERS = ["full", "covariance", "gram"]


def _data(kind, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "tall":
        X = rng.standard_normal((120, 8)) @ np.diag(np.linspace(4, 0.5, 8)) + 3.0
    elif kind == "wide":
        X = rng.standard_normal((15, 40)) * np.linspace(3, 1, 40) - 2.0
    elif kind == "square":
        X = rng.standard_normal((25, 25)) * np.linspace(5, 1, 25)
    elif kind == "rank_deficient":  # rank 3 plus a large offset
        X = rng.standard_normal((60, 3)) @ rng.standard_normal((3, 10)) * 2 + 100.0
    return X


def _sklearn_reference(X, k, solver="full"):
    return SkPCA(k, svd_solver=solver, random_state=0).fit(X)


def _stable(explained_variance, rtol=1e-6):
    """Components whose eigenvalue is simple and non-zero (only those are unique up to sign)."""
    ev = np.asarray(explained_variance)
    keep = ev > rtol * ev[0]
    gaps = np.abs(np.diff(ev)) > rtol * ev[0]
    keep[:-1] &= gaps
    keep[1:] &= gaps
    return keep


def _close(a, b, rtol=1e-10, scale=None):
    a, b = np.asarray(a), np.asarray(b)
    atol = rtol * (np.max(np.abs(b)) if scale is None else scale)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "kind, sk_solver",
    # scikit-learn's covariance_eigh forms X^T X - n mean mean^T, which cancels
    # catastrophically with the rank-deficient data's large mean: not a reference there.
    [(kind, "full") for kind in ("tall", "wide", "square", "rank_deficient")]
    + [(kind, "covariance_eigh") for kind in ("tall", "wide", "square")],
)
@pytest.mark.parametrize("solver", EXACT_SOLVERS)
def test_exact_solvers_match_sklearn(kind, solver, sk_solver):
    X = _data(kind)
    n, d = X.shape
    k = min(n, d) - 1 if kind != "rank_deficient" else 3
    ours = PCA(k, solver=solver).fit(X)
    ref = _sklearn_reference(X, k, sk_solver)
    stable = _stable(ref.explained_variance_)
    _close(ours.explained_variance_, ref.explained_variance_)
    _close(ours.singular_values_, ref.singular_values_)
    _close(ours.explained_variance_ratio_, ref.explained_variance_ratio_)
    _close(ours.components_[stable], ref.components_[stable], rtol=1e-9, scale=1.0)
    Xnew = X[::3] + 0.1
    Z, Zref = ours.transform(Xnew)[:, stable], ref.transform(Xnew)[:, stable]
    _close(Z, Zref, rtol=1e-9)
    _close(ours.fit_transform(X)[:, stable], ref.transform(X)[:, stable], rtol=1e-9)
    Zall = ours.transform(Xnew)
    _close(ours.inverse_transform(Zall), ref.inverse_transform(ref.transform(Xnew)), rtol=1e-9)
    _close(ours.noise_variance_, ref.noise_variance_, rtol=1e-9, scale=ref.explained_variance_[0])
    if ref.noise_variance_ > 1e-8 * ref.explained_variance_[0]:
        _close(ours.score(Xnew), ref.score(Xnew), rtol=1e-9)
        _close(ours.get_covariance(), ref.get_covariance(), rtol=1e-9)
        _close(ours.get_precision(), ref.get_precision(), rtol=1e-7)


@pytest.mark.parametrize(
    "kind, solver",
    [(kind, solver) for kind in ("tall", "wide", "square") for solver in EXACT_SOLVERS]
    + [("decaying", "randomized"), ("decaying_wide", "randomized")],
)
def test_against_numpy_svd(kind, solver):
    # The randomized solver is exact to rounding only when the spectrum decays
    # past k + n_oversamples, so it is checked on such data.
    if kind.startswith("decaying"):
        rng = np.random.default_rng(3)
        X = rng.standard_normal((90, 60)) * 0.7 ** np.arange(60)
        X = X.T if kind == "decaying_wide" else X
    else:
        X = _data(kind)
    k = 3
    _, s, vt = np.linalg.svd(X - X.mean(0), full_matrices=False)
    ours = PCA(k, solver=solver, random_state=0).fit(X)
    # Sign rule: largest-|entry| of each axis positive.
    idx = np.argmax(np.abs(vt[:k]), axis=1)
    vt = vt[:k] * np.sign(vt[np.arange(k), idx])[:, None]
    rtol = 1e-10 if solver != "randomized" else 1e-8
    _close(ours.singular_values_, s[:k], rtol=rtol)
    _close(ours.components_, vt, rtol=rtol * 10, scale=1.0)


@pytest.mark.parametrize("sk_solver", ["arpack", "randomized"])
def test_truncated_sklearn_solvers_agree(sk_solver):
    X = _data("tall")
    ours = PCA(3, solver="full").fit(X)
    ref = SkPCA(3, svd_solver=sk_solver, random_state=0).fit(X)
    _close(ours.explained_variance_, ref.explained_variance_, rtol=1e-9)
    _close(ours.components_, ref.components_, rtol=1e-7, scale=1.0)
    _close(ours.noise_variance_, ref.noise_variance_, rtol=1e-9)


def test_randomized_solver_matches_full_on_large_matrix():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((700, 10)) @ rng.standard_normal((10, 600)) * np.linspace(4, 1, 600)
    X += 0.01 * rng.standard_normal(X.shape)
    full = PCA(5, solver="full").fit(X)
    rand = PCA(5, solver="randomized", random_state=0).fit(X)
    _close(rand.singular_values_, full.singular_values_, rtol=1e-10)
    _close(rand.components_, full.components_, rtol=1e-8, scale=1.0)
    _close(rand.noise_variance_, full.noise_variance_, rtol=1e-10)


def test_signs_identical_across_solvers_and_refits():
    X = _data("tall")
    comps = [PCA(4, solver=s, random_state=0).fit(X).components_ for s in EXACT_SOLVERS + ["randomized"]]
    for c in comps[1:]:
        assert np.all(np.sign(c) == np.sign(comps[0]))
    np.testing.assert_array_equal(PCA(4).fit(X).components_, PCA(4).fit(X).components_)
    big = np.abs(comps[0]).argmax(axis=1)
    assert np.all(comps[0][np.arange(4), big] > 0)


@pytest.mark.parametrize("solver", EXACT_SOLVERS)
def test_covariance_times_precision_is_identity(solver):
    X = _data("tall")
    for k in range(0, X.shape[1] + 1):
        pca = PCA(k, solver=solver).fit(X)
        np.testing.assert_allclose(pca.get_covariance() @ pca.get_precision(), np.eye(X.shape[1]),
                                   atol=1e-10)


def test_explained_variance_is_variance_of_scores():
    X = _data("square")
    pca = PCA(6).fit(X)
    Z = pca.transform(X)
    np.testing.assert_allclose(Z.var(axis=0, ddof=1), pca.explained_variance_, rtol=1e-10)
    total = X.var(axis=0, ddof=1).sum()
    np.testing.assert_allclose(pca.explained_variance_ / pca.explained_variance_ratio_, total, rtol=1e-10)


def test_score_is_the_ppca_gaussian_and_whitening_does_not_change_it():
    X = _data("tall")
    pca = PCA(3).fit(X)
    lam, sigma2, V = pca.explained_variance_, pca.noise_variance_, pca.components_
    cov = V.T @ np.diag(lam - sigma2) @ V + sigma2 * np.eye(X.shape[1])
    ref = multivariate_normal(pca.mean_, cov).logpdf(X)
    np.testing.assert_allclose(pca.score_samples(X), ref, rtol=1e-11)
    white = PCA(3, whiten=True).fit(X)
    np.testing.assert_allclose(white.score_samples(X), ref, rtol=1e-11)
    np.testing.assert_allclose(white.get_covariance(), cov, rtol=1e-11, atol=1e-12)


def test_whitening_gives_unit_variance_and_exact_inverse():
    X = _data("tall")
    pca = PCA(4, whiten=True).fit(X)
    Z = pca.transform(X)
    np.testing.assert_allclose(Z.std(axis=0, ddof=1), 1.0, rtol=1e-10)
    np.testing.assert_allclose(pca.fit_transform(X), Z, rtol=1e-9, atol=1e-12)
    full = PCA(None, whiten=True).fit(X)
    # Round-off is relative to the data's scale, not to each (possibly tiny) entry.
    np.testing.assert_allclose(full.inverse_transform(full.transform(X)), X, rtol=1e-11,
                               atol=1e-13 * np.abs(X).max())


def test_standardize_matches_r_prcomp_on_iris():
    # R: prcomp(iris[, 1:4], scale. = TRUE)$sdev (published in R's documentation examples
    # and countless tutorials).
    sdev = np.array([1.7083611, 0.9560494, 0.3830886, 0.1439265])
    X = load_iris().data
    pca = PCA(standardize=True).fit(X)
    np.testing.assert_allclose(np.sqrt(pca.explained_variance_), sdev, atol=5e-8)
    np.testing.assert_allclose(pca.scale_, X.std(axis=0, ddof=1), rtol=1e-12)
    # Same axes as a pipeline of scikit-learn's scaler (ddof=0) and PCA.
    pipe = make_pipeline(StandardScaler(), SkPCA(4)).fit(X)
    _close(pca.components_, pipe[-1].components_, rtol=1e-10, scale=1.0)
    np.testing.assert_allclose(pca.inverse_transform(pca.transform(X)), X, rtol=1e-11)
    # The likelihood is given in the original units: the Jacobian of the scaling enters.
    model = PCA(2).fit((X - X.mean(0)) / pca.scale_)
    expected = model.score_samples((X - X.mean(0)) / pca.scale_) - np.log(pca.scale_).sum()
    np.testing.assert_allclose(PCA(2, standardize=True).fit(X).score_samples(X), expected, rtol=1e-11)


def test_fraction_of_variance_uses_a_strict_cut():
    X = load_iris().data
    assert PCA(0.95).fit(X).n_components_ == 2
    assert PCA(0.01).fit(X).n_components_ == 1
    cum = np.cumsum(SkPCA().fit(X).explained_variance_ratio_)
    assert PCA(float(cum[1])).fit(X).n_components_ == 3  # equal is not enough
    for f in (0.5, 0.9, 0.99):
        assert PCA(f).fit(X).n_components_ == SkPCA(f).fit(X).n_components_


def test_mle_matches_sklearn():
    rng = np.random.default_rng(0)
    datasets = [load_iris().data, rng.standard_normal((600, 10))]
    redundant = rng.standard_normal((1000, 10))
    redundant[:, -1] = redundant[:, :-1].mean(axis=1)
    datasets.append(redundant)
    low = rng.standard_normal((500, 3)) @ rng.standard_normal((3, 12)) + 0.3 * rng.standard_normal((500, 12))
    datasets.append(low)
    for X in datasets:
        assert PCA("mle").fit(X).n_components_ == SkPCA("mle").fit(X).n_components_
    assert PCA("mle").fit(low).n_components_ == 3


def test_singular_model_refuses_density_and_precision():
    X = _data("wide")  # n = 15 < d: at most 14 non-zero variances
    pca = PCA(None).fit(X)
    assert pca.noise_variance_ == 0
    with pytest.raises(ValueError, match="singular"):
        pca.score(X)
    with pytest.raises(ValueError, match="singular"):
        pca.get_precision()
    cov = pca.get_covariance()
    np.testing.assert_allclose(cov, np.cov(X, rowvar=False), rtol=1e-9, atol=1e-12)


def test_zero_components():
    X = _data("tall")
    pca = PCA(0).fit(X)
    assert pca.transform(X).shape == (X.shape[0], 0)
    sigma2 = X.var(axis=0, ddof=1).sum() / X.shape[1]
    np.testing.assert_allclose(pca.noise_variance_, sigma2, rtol=1e-12)
    ref = multivariate_normal(X.mean(0), sigma2 * np.eye(X.shape[1])).logpdf(X)
    np.testing.assert_allclose(pca.score_samples(X), ref, rtol=1e-12)


def test_auto_solver_rule():
    assert choose_solver(20000, 100, 10) == "covariance"
    assert choose_solver(100000, 50, 5) == "covariance"
    assert choose_solver(2000, 2000, 10) == "randomized"
    assert choose_solver(500, 20000, 10) == "gram"
    assert choose_solver(2000, 2000, None) == "covariance"
    assert choose_solver(30, 20, 2) == "full"
    X = np.random.default_rng(0).standard_normal((3000, 8))
    assert PCA(2).fit(X).solver_ == "covariance"
    assert PCA(2).fit(X[:50]).solver_ == "full"


@pytest.mark.parametrize(
    "params, match",
    [
        ({"n_components": -1}, "n_components"),
        ({"n_components": 9}, "n_components"),
        ({"n_components": 1.5}, "n_components"),
        ({"n_components": "nope"}, "n_components"),
        ({"n_components": [2]}, "n_components"),
        ({"solver": "arpack"}, "solver"),
        ({"solver": "randomized", "n_components": None}, "randomized"),
        ({"n_oversamples": -1}, "n_oversamples"),
        ({"n_power_iter": 1.5}, "n_power_iter"),
    ],
)
def test_bad_parameters_are_named(params, match):
    with pytest.raises((ValueError, TypeError), match=match):
        PCA(**params).fit(_data("tall"))


def test_inverse_transform_checks_width():
    pca = PCA(2).fit(_data("tall"))
    with pytest.raises(ValueError, match="n_components_ = 2"):
        pca.inverse_transform(np.zeros((3, 3)))


def test_clone_pipeline_and_grid_search():
    X = _data("tall")
    pca = PCA(2, standardize=True)
    assert clone(pca).get_params() == pca.get_params()
    pipe = make_pipeline(PCA(2), StandardScaler()).fit(X)
    np.testing.assert_allclose(pipe.transform(X).std(axis=0), 1.0, rtol=1e-10)
    search = GridSearchCV(PCA(), {"n_components": [1, 3, 5]}, cv=3).fit(X)
    # Held-out pPCA log-likelihood increases with k on this full-rank data.
    assert search.best_params_["n_components"] == 5
    assert list(PCA(2).fit(X).get_feature_names_out()) == ["pca0", "pca1"]


@parametrize_with_checks([PCA(), PCA(2, solver="full"), PCA(1, whiten=True, standardize=True)])
def test_sklearn_compatible(estimator, check):
    check(estimator)


# ------------------------------------------------------------ extreme and degenerate data
ALL_SOLVERS = EXACT_SOLVERS + ["randomized"]


@pytest.mark.parametrize("solver", ALL_SOLVERS)
@pytest.mark.parametrize("c", [1e-150, 1e-8, 1e8, 1e150])
def test_fit_of_scaled_data_is_the_scaled_fit(solver, c):
    # Reference: the fit of the unscaled data (itself checked against scikit-learn above).
    X = _data("tall")
    ref = PCA(3, solver=solver, random_state=0).fit(X)
    ours = PCA(3, solver=solver, random_state=0).fit(c * X)
    _close(ours.components_, ref.components_, rtol=1e-10, scale=1.0)
    _close(ours.explained_variance_ / c**2, ref.explained_variance_, rtol=1e-10)
    _close(ours.singular_values_ / c, ref.singular_values_, rtol=1e-10)
    _close(ours.noise_variance_ / c**2, ref.noise_variance_, rtol=1e-10)
    _close(ours.transform(c * X) / c, ref.transform(X), rtol=1e-10)
    _close(ours.inverse_transform(ours.transform(c * X)) / c, ref.inverse_transform(ref.transform(X)))
    _close(ours.get_covariance() / c**2, ref.get_covariance(), rtol=1e-10)
    _close(ours.get_precision() * c**2, ref.get_precision(), rtol=1e-8)
    # p(c x) = p(x) / c^d
    _close(ours.score_samples(c * X) + X.shape[1] * np.log(c), ref.score_samples(X), rtol=1e-10)


@pytest.mark.parametrize("c", [1e-160, 1e154, 1e300])
@pytest.mark.parametrize("solver", ALL_SOLVERS)
def test_spread_outside_float64_variances_is_refused(c, solver):
    X = _data("tall")
    with pytest.raises(ValueError, match=r"X has a spread of about .* \(e.g. column \d\); variances"):
        PCA(2, solver=solver, random_state=0).fit(X * c)


def test_huge_offset_constant_data_is_exactly_zero_variance():
    # A centred matrix of zeros: every variance is 0, on every solver (closed form). n d > 10^4,
    # so "auto" would take the covariance solver, whose X^T X overflows here.
    X = np.full((600, 20), 3e300)
    for solver in ALL_SOLVERS:
        with pytest.warns(UserWarning, match="rank 0 < n_components = 2"):
            pca = PCA(2, solver=solver, random_state=0).fit(X)
        np.testing.assert_array_equal(pca.explained_variance_, 0.0)
        np.testing.assert_allclose(pca.transform(X), 0.0, atol=8 * np.finfo(float).eps * 3e300)
        np.testing.assert_allclose(pca.components_ @ pca.components_.T, np.eye(2), atol=1e-15)


@pytest.mark.parametrize(
    "X", [np.ones((30, 4)), np.full((30, 4), 1.26736591), np.repeat([[0.3, -2.0, 7.0]], 40, 0)]
)
def test_constant_data_gives_zero_variances_and_one_basis_on_every_solver(X):
    fits = []
    for solver in ALL_SOLVERS:
        with pytest.warns(UserWarning, match="rank 0 < n_components"):
            fits.append(PCA(2, solver=solver, random_state=0).fit(X))
    for pca in fits:
        np.testing.assert_array_equal(pca.explained_variance_, 0.0)
        np.testing.assert_array_equal(pca.explained_variance_ratio_, 0.0)
        assert pca.noise_variance_ == 0.0
        # X - mean is 0: its projections are rounding of the two products in transform.
        np.testing.assert_allclose(pca.transform(X), 0.0, atol=8 * np.finfo(float).eps * np.abs(X).max())
        np.testing.assert_allclose(pca.components_ @ pca.components_.T, np.eye(2), atol=1e-15)
        np.testing.assert_allclose(pca.components_, fits[0].components_, atol=1e-15)


@pytest.mark.parametrize("solver", ALL_SOLVERS)
def test_rank_below_k_warns_and_matches_sklearn_on_the_rank(solver):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((50, 2)) @ rng.standard_normal((2, 6)) + 4.0  # rank 2
    X = np.vstack([X, X[:10]])  # duplicate rows too
    with pytest.warns(UserWarning, match="rank 2 < n_components = 4"):
        ours = PCA(4, solver=solver, random_state=0).fit(X)
    ref = SkPCA(2).fit(X)
    _close(ours.explained_variance_[:2], ref.explained_variance_)
    np.testing.assert_array_equal(ours.explained_variance_[2:], 0.0)
    _close(ours.components_[:2], ref.components_, rtol=1e-9, scale=1.0)
    np.testing.assert_allclose(ours.components_ @ ours.components_.T, np.eye(4), atol=1e-14)
    full = PCA(4, solver="full").fit(X) if solver != "full" else ours
    np.testing.assert_allclose(ours.components_[2:], full.components_[2:], atol=1e-12)


def test_one_feature_and_two_samples():
    X = np.array([[1.0], [4.0], [2.0]])
    pca = PCA().fit(X)
    np.testing.assert_allclose(pca.explained_variance_, [np.var(X, ddof=1)], rtol=1e-14)
    np.testing.assert_allclose(pca.components_, [[1.0]])
    two = PCA().fit([[0.0, 1.0], [2.0, 5.0]])  # one non-zero direction, (2, 4) / sqrt(20)
    np.testing.assert_allclose(two.components_[0], [2.0, 4.0] / np.sqrt(20.0), rtol=1e-14)
    np.testing.assert_allclose(two.explained_variance_, [10.0, 0.0], rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError, match="X has 1 sample"):
        PCA().fit([[1.0, 2.0]])


def test_standardize_with_a_constant_column_is_the_pca_of_the_others():
    rng = np.random.default_rng(2)
    X = np.c_[rng.standard_normal((40, 3)) * [1.0, 5.0, 0.1], np.full(40, 1.26736591)]
    ours = PCA(standardize=True).fit(X)
    ref = SkPCA().fit(StandardScaler().fit_transform(X[:, :3]) * np.sqrt(39 / 40))  # ddof = 1
    _close(ours.explained_variance_[:3], ref.explained_variance_)
    assert ours.explained_variance_[3] == 0.0
    assert ours.scale_[3] == 1.0
    _close(ours.components_[:3, :3], ref.components_, rtol=1e-9, scale=1.0)
    np.testing.assert_array_equal(ours.components_[:3, 3], 0.0)


def test_random_state_follows_the_params_rule():
    X = _data("square")
    for seed in ("seed", 1.5, [1]):
        with pytest.raises(TypeError, match="random_state must be None, an int >= 0"):
            PCA(2, solver="randomized", random_state=seed).fit(X)
        with pytest.raises(TypeError, match="random_state must be None, an int >= 0"):
            PCA(2, solver="full", random_state=seed).fit(X)
    with pytest.raises(ValueError, match="random_state"):
        PCA(2, solver="randomized", random_state=-1).fit(X)
    full = PCA(3, solver="full").fit(X)
    for seed in (2**70, np.random.RandomState(0), np.random.default_rng(0)):
        rand = PCA(3, solver="randomized", random_state=seed, n_power_iter=8).fit(X)
        _close(rand.explained_variance_, full.explained_variance_, rtol=1e-8)


def test_selection_options_are_checked():
    X = _data("tall")
    with pytest.raises(ValueError, match=r"selection_options has unknown keys \['thresh'\]"):
        PCA("variance", selection_options={"thresh": 0.5}).fit(X)
    with pytest.raises(ValueError, match="only used when n_components is a rule name"):
        PCA(0.9, selection_options={"threshold": 0.5}).fit(X)
    with pytest.raises(ValueError, match=r"threshold is used by method in \['variance', 'parallel'\] only"):
        PCA("mle", selection_options={"threshold": 0.5}).fit(X)
    sel = PCA("variance", selection_options={"threshold": 0.5}).fit(X).selection_
    assert sel.threshold == 0.5


def test_new_data_that_overflow_are_a_named_error():
    rng = np.random.default_rng(0)
    X = 10 * rng.standard_normal((50, 1)) + 0.1 * rng.standard_normal((50, 8))  # first axis ~ 1 / sqrt(8)
    pca = PCA(2, whiten=True).fit(X)
    big = np.finfo(float).max / 2
    # sum_j |v_1j| ~ sqrt(8) > 2, and whitening multiplies scores by sqrt(lambda_1) ~ 10 > 2.
    assert np.abs(pca.components_[0]).sum() > 2 and pca.explained_variance_[0] > 4
    with pytest.raises(ValueError, match="PCA.transform overflowed float64"):
        PCA(2).fit(X).transform(big * np.sign(pca.components_[:1]))
    with pytest.raises(ValueError, match="PCA.inverse_transform overflowed float64"):
        pca.inverse_transform([[big, 0.0]])


def test_eigh_top_falls_back_when_lapack_returns_fewer_pairs():
    # The centred identity H = I - 11^T/n has eigenvalue 1 (n - 1 times) and 0 (closed form).
    from bayespca.linalg import eigh_top

    for n in (20, 57, 200):
        H = np.eye(n) - 1.0 / n
        evals, evecs = eigh_top(H.copy(), 2)
        np.testing.assert_allclose(evals, [1.0, 1.0], rtol=1e-12)
        np.testing.assert_allclose(H @ evecs, evecs, atol=1e-12)
