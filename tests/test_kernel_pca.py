"""KernelPCA against scikit-learn, numpy SVD, R kernlab and closed forms."""

import json
import pathlib
import warnings

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import scipy.linalg
from sklearn.datasets import load_iris
from sklearn.decomposition import PCA as SklearnPCA
from sklearn.decomposition import KernelPCA as SklearnKernelPCA
from sklearn.exceptions import NotFittedError
from sklearn.metrics.pairwise import laplacian_kernel, rbf_kernel
from sklearn.utils.estimator_checks import parametrize_with_checks

import bayespca  # noqa: F401  (float64 JAX)
from bayespca.kernel_pca import KernelPCA

DATA = pathlib.Path(__file__).parent / "data"
RNG = np.random.default_rng(0)
X = RNG.standard_normal((120, 4)) * [1.0, 2.0, 0.5, 1.5]
X_NEW = RNG.standard_normal((15, 4))


def _sign_align(a, b):
    """Flip the columns of a to match b (for references with another sign rule)."""
    return a * np.where(np.sum(a * b, axis=0) < 0, -1.0, 1.0)


def _scale(a):
    return np.abs(a).max()


# ---------------------------------------------------------------- linear = PCA


def test_linear_kernel_equals_pca_by_svd():
    kpca = KernelPCA(3, kernel="linear")
    Z = kpca.fit_transform(X)
    Xc = X - X.mean(axis=0)
    u, s, vt = np.linalg.svd(Xc, full_matrices=False)
    np.testing.assert_allclose(kpca.eigenvalues_, s[:3] ** 2, rtol=1e-12)
    np.testing.assert_allclose(_sign_align(Z, u[:, :3] * s[:3]), u[:, :3] * s[:3], atol=1e-12)
    pca_new = (X_NEW - X.mean(axis=0)) @ vt[:3].T
    np.testing.assert_allclose(_sign_align(kpca.transform(X_NEW), pca_new), pca_new, atol=1e-12)


def test_linear_kernel_eigenvalues_are_n_minus_1_times_explained_variance():
    pca = SklearnPCA(3, svd_solver="full").fit(X)
    kpca = KernelPCA(3, kernel="linear").fit(X)
    np.testing.assert_allclose(kpca.eigenvalues_, (X.shape[0] - 1) * pca.explained_variance_,
                               rtol=1e-12)
    ref = pca.transform(X)
    np.testing.assert_allclose(_sign_align(kpca.transform(X), ref), ref, atol=1e-12)


# --------------------------------------------------------- every kernel vs sklearn

KERNEL_CASES = {
    "rbf": dict(kernel="rbf", gamma=0.3),
    "rbf_default_gamma": dict(kernel="rbf"),
    "linear": dict(kernel="linear"),
    "poly": dict(kernel="poly", degree=2, gamma=0.2, coef0=1.0),
    "sigmoid": dict(kernel="sigmoid", gamma=0.02, coef0=0.5),
    "cosine": dict(kernel="cosine"),
}


@pytest.mark.parametrize("solver", ["dense", "arpack"])
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_kernels_match_sklearn(case, solver):
    params = KERNEL_CASES[case]
    ours = KernelPCA(4, solver=solver, fit_inverse_transform=True, alpha=0.1, **params)
    ref = SklearnKernelPCA(4, eigen_solver=solver, fit_inverse_transform=True, alpha=0.1,
                           random_state=0, **params)
    Z, Z_ref = ours.fit_transform(X), ref.fit_transform(X)
    np.testing.assert_allclose(ours.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    # Same sign rule as scikit-learn: no alignment needed.
    np.testing.assert_allclose(Z, Z_ref, atol=1e-9 * _scale(Z_ref))
    T_ref = ref.transform(X_NEW)
    np.testing.assert_allclose(ours.transform(X_NEW), T_ref, atol=1e-9 * _scale(T_ref))
    P_ref = ref.inverse_transform(T_ref)
    np.testing.assert_allclose(ours.inverse_transform(T_ref), P_ref, atol=1e-8 * _scale(P_ref))
    assert ours.gamma_ == pytest.approx(ref.gamma_)


def test_laplacian_matches_sklearn_with_its_laplacian_kernel():
    # scikit-learn's KernelPCA has no "laplacian" name; feed it the same Gram matrices.
    ours = KernelPCA(4, kernel="laplacian", gamma=0.5).fit(X)
    ref = SklearnKernelPCA(4, kernel="precomputed").fit(laplacian_kernel(X, gamma=0.5))
    np.testing.assert_allclose(ours.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    T_ref = ref.transform(laplacian_kernel(X_NEW, X, gamma=0.5))
    np.testing.assert_allclose(ours.transform(X_NEW), T_ref, atol=1e-10 * _scale(T_ref))


def test_precomputed_matches_sklearn():
    K, K_new = rbf_kernel(X, gamma=0.3), rbf_kernel(X_NEW, X, gamma=0.3)
    ours = KernelPCA(5, kernel="precomputed").fit(K)
    ref = SklearnKernelPCA(5, kernel="precomputed").fit(K)
    np.testing.assert_allclose(ours.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    T_ref = ref.transform(K_new)
    np.testing.assert_allclose(ours.transform(K_new), T_ref, atol=1e-10 * _scale(T_ref))
    # and equals the rbf kernel computed inside
    np.testing.assert_allclose(ours.transform(K_new),
                               KernelPCA(5, gamma=0.3).fit(X).transform(X_NEW), atol=1e-10)


def test_jax_callable_kernel_matches_sklearn_numpy_callable():
    def jax_laplace(x, y, scale):
        return jnp.exp(-scale * jnp.sum(jnp.abs(x - y)))

    def np_laplace(x, y, scale):
        return np.exp(-scale * np.sum(np.abs(x - y)))

    small, new = X[:40], X_NEW[:5]
    ours = KernelPCA(3, kernel=jax_laplace, kernel_params={"scale": 0.4},
                     fit_inverse_transform=True).fit(small)
    ref = SklearnKernelPCA(3, kernel=np_laplace, kernel_params={"scale": 0.4},
                           fit_inverse_transform=True).fit(small)
    np.testing.assert_allclose(ours.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    T_ref = ref.transform(new)
    np.testing.assert_allclose(ours.transform(new), T_ref, atol=1e-10 * _scale(T_ref))
    np.testing.assert_allclose(ours.inverse_transform(T_ref), ref.inverse_transform(T_ref),
                               atol=1e-9)


def test_randomized_solver_matches_dense_on_decaying_spectrum():
    # rbf on 2-D data: fast spectral decay, where the randomized sketch is accurate.
    Z2 = RNG.standard_normal((300, 2))
    dense = KernelPCA(5, gamma=0.5, solver="dense").fit(Z2)
    rand = KernelPCA(5, gamma=0.5, solver="randomized", random_state=0).fit(Z2)
    np.testing.assert_allclose(rand.eigenvalues_, dense.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(rand.fit_transform(Z2), dense.fit_transform(Z2), atol=1e-7)
    ref = SklearnKernelPCA(5, kernel="rbf", gamma=0.5, eigen_solver="randomized",
                           random_state=0).fit(Z2)
    np.testing.assert_allclose(rand.eigenvalues_, ref.eigenvalues_, rtol=1e-8)


def test_randomized_solver_refuses_indefinite_kernel():
    with pytest.raises(ValueError, match="solver='randomized' found a negative eigenvalue"):
        KernelPCA(3, kernel="sigmoid", gamma=0.5, coef0=-1.0, solver="randomized",
                  random_state=0).fit(X)
    # arpack selects by algebraic value and gets the largest (positive) ones right
    ours = KernelPCA(3, kernel="sigmoid", gamma=0.5, coef0=-1.0, solver="arpack").fit(X)
    full = KernelPCA(3, kernel="sigmoid", gamma=0.5, coef0=-1.0, solver="dense").fit(X)
    np.testing.assert_allclose(ours.eigenvalues_, full.eigenvalues_, rtol=1e-10)


@pytest.mark.parametrize("solver", ["dense", "arpack", "randomized"])
def test_solvers_agree_on_signs_and_values(solver):
    Z2 = RNG.standard_normal((250, 2))
    ref = KernelPCA(4, gamma=0.5, solver="dense").fit(Z2)
    ours = KernelPCA(4, gamma=0.5, solver=solver, random_state=1).fit(Z2)
    np.testing.assert_allclose(ours.eigenvectors_, ref.eigenvectors_, atol=1e-7)
    # sign rule: each eigenvector's largest-|entry| is positive
    idx = np.argmax(np.abs(ours.eigenvectors_), axis=0)
    assert np.all(ours.eigenvectors_[idx, np.arange(4)] > 0)


# ------------------------------------------------------ projections and attributes


@pytest.mark.parametrize(
    "params",
    [
        dict(kernel="rbf"),
        dict(kernel="poly", degree=3),
        dict(approximation="nystroem", n_approx=50, random_state=0),
        dict(approximation="rff", n_approx=200, random_state=0),
    ],
    ids=["rbf", "poly", "nystroem", "rff"],
)
def test_transform_of_training_points_equals_fit_transform(params):
    kpca = KernelPCA(4, **params)
    Z = kpca.fit_transform(X)
    np.testing.assert_allclose(kpca.transform(X), Z, atol=1e-10 * _scale(Z))
    # and the projections are alpha_j * sqrt(lambda_j) with unit alpha_j
    np.testing.assert_allclose(np.linalg.norm(Z, axis=0) ** 2, kpca.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(kpca.eigenvectors_.T @ kpca.eigenvectors_, np.eye(4), atol=1e-10)


def test_eigenvalues_are_those_of_the_centred_gram_matrix():
    K = rbf_kernel(X, gamma=0.3)
    H = np.eye(len(X)) - 1.0 / len(X)
    expected = scipy.linalg.eigvalsh(H @ K @ H)[::-1][:6]
    np.testing.assert_allclose(KernelPCA(6, gamma=0.3).fit(X).eigenvalues_, expected, rtol=1e-10)


def test_remove_zero_eig_and_default_n_components_match_sklearn():
    # linear kernel on 3-D data: rank 3
    Z3 = RNG.standard_normal((20, 3))
    for params in (dict(n_components=None), dict(n_components=6, remove_zero_eig=True)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the zero-eigenvalue components are dropped: nothing to warn of
            ours = KernelPCA(kernel="linear", **params).fit(Z3)
        ref = SklearnKernelPCA(kernel="linear", **params).fit(Z3)
        assert ours.n_components_ == ref.eigenvalues_.shape[0] == 3
        np.testing.assert_allclose(ours.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    with pytest.warns(UserWarning, match="3 non-zero eigenvalues, fewer than n_components = 6"):
        kept = KernelPCA(6, kernel="linear").fit(Z3)
    np.testing.assert_array_equal(kept.eigenvalues_[3:], 0.0)
    np.testing.assert_array_equal(kept.transform(Z3)[:, 3:], 0.0)


def test_tiny_negative_eigenvalues_are_clipped_and_large_ones_are_an_error():
    n = 30
    H = np.eye(n) - 1.0 / n
    q, _ = np.linalg.qr(H @ RNG.standard_normal((n, 4)))  # orthonormal, orthogonal to 1
    K = q @ np.diag([5.0, 2.0, 1.0, -1e-11]) @ q.T
    with pytest.warns(UserWarning, match="the last 1 components have eigenvalue 0"):
        kpca = KernelPCA(4, kernel="precomputed").fit(K)
    np.testing.assert_allclose(kpca.eigenvalues_, [5.0, 2.0, 1.0, 0.0], atol=1e-12)
    K_bad = q @ np.diag([5.0, 2.0, 1.0, -0.5]) @ q.T
    with pytest.raises(ValueError, match=r"precomputed kernel matrix has eigenvalue -0\.5") as e:
        KernelPCA(kernel="precomputed").fit(K_bad)
    assert "n_components <= 3" in str(e.value)
    # the three positive components remain available
    np.testing.assert_allclose(
        KernelPCA(3, kernel="precomputed").fit(K_bad).eigenvalues_, [5.0, 2.0, 1.0], rtol=1e-12
    )


def test_significant_negative_eigenvalue_names_the_kernel():
    with pytest.raises(ValueError, match="centred sigmoid kernel matrix has eigenvalue"):
        KernelPCA(kernel="sigmoid", gamma=0.5, coef0=-1.0).fit(X)


def test_feature_names_out_and_dataframe():
    df = pd.DataFrame(X, columns=list("abcd"))
    kpca = KernelPCA(3).fit(df)
    np.testing.assert_array_equal(kpca.feature_names_in_, list("abcd"))
    np.testing.assert_array_equal(kpca.get_feature_names_out(),
                                  ["kernelpca0", "kernelpca1", "kernelpca2"])
    np.testing.assert_allclose(kpca.transform(df), KernelPCA(3).fit(X).transform(X), atol=1e-12)


def test_auto_solver_rule():
    assert KernelPCA(5).fit(X).solver_ == "dense"  # n <= 300
    big = RNG.standard_normal((400, 3))
    assert KernelPCA(5).fit(big).solver_ == "arpack"
    assert KernelPCA(40).fit(big).solver_ == "dense"  # k >= 0.1 n


def test_arpack_is_reproducible_without_random_state():
    big = RNG.standard_normal((600, 3))
    a = KernelPCA(5, solver="arpack").fit(big)
    b = KernelPCA(5, solver="arpack").fit(big)
    np.testing.assert_array_equal(a.eigenvectors_, b.eigenvectors_)


# -------------------------------------------------------------------- pre-image


def test_pre_image_is_kernel_ridge_regression():
    kpca = KernelPCA(3, gamma=0.3, alpha=0.5, fit_inverse_transform=True).fit(X)
    Z = kpca.transform(X)
    # independent closed form: X_hat = k(Z, Z) (k(Z, Z) + alpha I)^{-1} X, same gamma
    Kz = rbf_kernel(Z, gamma=0.3)
    expected = Kz @ np.linalg.solve(Kz + 0.5 * np.eye(len(X)), X)
    np.testing.assert_allclose(kpca.inverse_transform(Z), expected, atol=1e-10)


@pytest.mark.parametrize("method", ["transform", "get_feature_names_out"])
def test_calls_before_fit_are_not_fitted_errors(method):
    # As scikit-learn's estimators: NotFittedError, not an AttributeError on a fitted attribute.
    args = () if method == "get_feature_names_out" else (np.zeros((1, 2)),)
    with pytest.raises(NotFittedError):
        getattr(KernelPCA(2), method)(*args)


def test_inverse_transform_errors():
    with pytest.raises(NotFittedError, match="fit_inverse_transform=False"):
        KernelPCA(2).fit(X).inverse_transform(np.zeros((1, 2)))
    with pytest.raises(NotFittedError):
        KernelPCA(2, fit_inverse_transform=True).inverse_transform(np.zeros((1, 2)))
    kpca = KernelPCA(2, fit_inverse_transform=True).fit(X)
    with pytest.raises(ValueError, match="X has 3 columns, but KernelPCA.inverse_transform expects"):
        kpca.inverse_transform(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="fit_inverse_transform with kernel='precomputed'"):
        KernelPCA(kernel="precomputed", fit_inverse_transform=True).fit(X @ X.T)


# ------------------------------------------------------------------ R kernlab


def _kernlab():
    with open(DATA / "kernlab_kpca_iris.json") as fh:
        return json.load(fh)


def test_kernlab_fixture_uses_sklearn_iris():
    np.testing.assert_array_equal(np.array(_kernlab()["data"]), load_iris().data)


def _kernlab_estimator(name, kpar):
    if name == "rbf":
        return KernelPCA(4, kernel="rbf", gamma=kpar["sigma"])
    if name == "poly":
        return KernelPCA(4, kernel="poly", degree=kpar["degree"], gamma=kpar["scale"],
                         coef0=kpar["offset"])
    if name == "linear":
        return KernelPCA(4, kernel="linear")
    sigma = kpar["sigma"]  # laplacedot uses the Euclidean norm: a JAX callable

    def laplace_l2(x, y):
        return jnp.exp(-sigma * jnp.sqrt(jnp.sum((x - y) ** 2)))

    return KernelPCA(4, kernel=laplace_l2)


@pytest.mark.parametrize("name", ["rbf", "laplace_l2", "poly", "linear"])
def test_matches_kernlab_kpca(name):
    fixture = _kernlab()
    res = fixture["results"][name]
    X_iris, new = np.array(fixture["data"]), np.array(fixture["new"])
    m = X_iris.shape[0]
    kpca = _kernlab_estimator(name, res["kpar"])
    Z = kpca.fit_transform(X_iris)
    # kernlab: eig = lambda / m, rotated = sqrt(m) * projections
    np.testing.assert_allclose(kpca.eigenvalues_ / m, res["eig"], rtol=1e-10)
    rotated = np.array(res["rotated"])
    np.testing.assert_allclose(_sign_align(np.sqrt(m) * Z, rotated), rotated,
                               atol=1e-10 * _scale(rotated))
    predicted = np.array(res["predict"])
    np.testing.assert_allclose(_sign_align(np.sqrt(m) * kpca.transform(new), predicted),
                               predicted, atol=1e-10 * _scale(predicted))


# --------------------------------------------------------------- approximations


def _max_angle(a, b):
    return scipy.linalg.subspace_angles(a, b).max()


def test_nystroem_with_all_points_equals_exact():
    exact = KernelPCA(5, gamma=0.3, fit_inverse_transform=True).fit(X)
    nys = KernelPCA(5, gamma=0.3, approximation="nystroem", n_approx=len(X),
                    fit_inverse_transform=True, random_state=0).fit(X)
    np.testing.assert_allclose(nys.eigenvalues_, exact.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(nys.eigenvectors_, exact.eigenvectors_, atol=1e-9)
    np.testing.assert_allclose(nys.fit_transform(X), exact.fit_transform(X), atol=1e-9)
    np.testing.assert_allclose(nys.transform(X_NEW), exact.transform(X_NEW), atol=1e-6)
    Z = exact.transform(X)
    np.testing.assert_allclose(nys.inverse_transform(Z), exact.inverse_transform(Z), atol=1e-6)


def test_nystroem_error_decreases_with_landmarks():
    exact = KernelPCA(4, gamma=0.3).fit(X)
    eig_err, angles = [], []
    for m in (15, 30, 60, 120):
        nys = KernelPCA(4, gamma=0.3, approximation="nystroem", n_approx=m,
                        random_state=3).fit(X)
        eig_err.append(np.max(np.abs(nys.eigenvalues_ - exact.eigenvalues_)
                              / exact.eigenvalues_))
        angles.append(_max_angle(nys.eigenvectors_, exact.eigenvectors_))
    # nested landmarks: the approximate centred Gram matrix grows in the PSD
    # order towards the exact one, so the eigenvalue error decreases monotonically
    assert all(a > b for a, b in zip(eig_err, eig_err[1:], strict=False))
    assert angles[0] > angles[1] > angles[-1]
    assert eig_err[-1] < 1e-10 and angles[-1] < 1e-6


def test_rff_error_decreases_with_features():
    exact = KernelPCA(3, gamma=0.3).fit(X)
    eig_err, angles = [], []
    for D in (50, 500, 5000):
        errs, angs = [], []
        for seed in range(3):
            rff = KernelPCA(3, gamma=0.3, approximation="rff", n_approx=D,
                            random_state=seed).fit(X)
            errs.append(np.max(np.abs(rff.eigenvalues_ - exact.eigenvalues_)
                               / exact.eigenvalues_))
            angs.append(_max_angle(rff.eigenvectors_, exact.eigenvectors_))
        eig_err.append(np.mean(errs))
        angles.append(np.mean(angs))
    assert eig_err[0] > eig_err[1] > eig_err[2]
    assert angles[0] > angles[1] > angles[2]
    assert eig_err[2] < 0.05


def test_rff_out_of_sample_matches_exact_when_features_are_many():
    exact = KernelPCA(2, gamma=0.1).fit(X)
    rff = KernelPCA(2, gamma=0.1, approximation="rff", n_approx=20000, random_state=0).fit(X)
    ref = exact.transform(X_NEW)
    np.testing.assert_allclose(_sign_align(rff.transform(X_NEW), ref), ref,
                               atol=0.05 * _scale(ref))


def test_approximate_pre_image_approaches_exact():
    exact = KernelPCA(3, gamma=0.3, fit_inverse_transform=True).fit(X)
    Z = exact.transform(X)
    rff = KernelPCA(3, gamma=0.3, approximation="rff", n_approx=4000, random_state=0,
                    fit_inverse_transform=True).fit(X)
    # express the exact projections in the rff components' signs
    signs = np.sign(np.sum(rff.transform(X) * Z, axis=0))
    approx = rff.inverse_transform(Z * signs)
    reference = exact.inverse_transform(Z)
    assert np.mean((approx - reference) ** 2) < 0.05 * np.mean((reference - X.mean(0)) ** 2)


def test_rff_all_components_are_those_of_the_feature_gram_matrix():
    # n_approx > n: the PCA runs on the n x n Gram matrix of the features
    rff = KernelPCA(approximation="rff", n_approx=300, random_state=0).fit(X)
    phi = rff.feature_map_(X)
    phi_c = phi - phi.mean(axis=0)
    expected = scipy.linalg.eigvalsh(phi_c @ phi_c.T)[::-1]
    assert rff.n_components_ == len(X) - 1  # centring removes one dimension
    np.testing.assert_allclose(rff.eigenvalues_, expected[: len(X) - 1], rtol=1e-9)
    np.testing.assert_allclose(rff.transform(X), rff.fit_transform(X), atol=1e-9)


def test_nystroem_more_landmarks_than_points_warns_and_is_exact():
    exact = KernelPCA(3).fit(X)
    with pytest.warns(UserWarning, match="n_approx=500 exceeds n_samples=120"):
        nys = KernelPCA(3, approximation="nystroem", n_approx=500, random_state=0).fit(X)
    np.testing.assert_allclose(nys.eigenvalues_, exact.eigenvalues_, rtol=1e-10)


# ------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("params", "error", "match"),
    [
        (dict(n_components=0), ValueError, "n_components must be an int >= 1 or None; got 0"),
        (dict(n_components=2.5), TypeError, "n_components must be an int >= 1 or None; got 2.5"),
        (dict(solver="lobpcg"), ValueError, "solver must be one of .*; got 'lobpcg'"),
        (dict(approximation="svd"), ValueError, "approximation must be one of .*; got 'svd'"),
        (dict(n_approx=0, approximation="nystroem"), ValueError, "n_approx must be an int >= 1 or None"),
        (dict(alpha=-1.0), ValueError, "alpha must be a finite number >= 0; got -1.0"),
        (dict(kernel="gauss"), ValueError, "kernel='gauss' is not a known kernel"),
        (dict(gamma=-0.1), ValueError, "gamma must be .*; got -0.1"),
        (dict(degree=-1), ValueError, "degree must be .*; got -1"),
        (dict(random_state="seed"), TypeError, "random_state must be None, an int >= 0"),
        (dict(remove_zero_eig=1), TypeError, "remove_zero_eig must be True or False"),
        (dict(kernel="rbf", kernel_params={"a": 1}), ValueError, "kernel_params"),
        (dict(approximation="rff", kernel="poly"), ValueError, "rbf kernel only"),
    ],
)
def test_bad_parameters_are_named(params, error, match):
    with pytest.raises(error, match=match):
        KernelPCA(**params).fit(X)


def test_bad_data_is_named():
    with pytest.raises(ValueError, match="X contains NaN"):
        KernelPCA().fit(np.array([[1.0, np.nan], [2.0, 3.0]]))
    with pytest.raises(ValueError, match="X has 1 sample"):
        KernelPCA().fit(np.array([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="X has 3 features, but KernelPCA is expecting 4"):
        KernelPCA(2).fit(X).transform(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="square Gram matrix"):
        KernelPCA(kernel="precomputed").fit(np.ones((3, 4)))
    with pytest.raises(ValueError, match="symmetric Gram matrix"):
        KernelPCA(kernel="precomputed").fit(np.triu(np.ones((4, 4))))
    with pytest.raises(ValueError, match="approximation='nystroem' needs the data"):
        KernelPCA(kernel="precomputed", approximation="nystroem").fit(np.eye(4))


def test_inverse_transform_with_alpha_zero_on_duplicates_is_a_named_error():
    dup = np.repeat(X[:5], 2, axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="singular with alpha=0"):
            KernelPCA(2, kernel="linear", alpha=0.0, fit_inverse_transform=True).fit(dup)


# ------------------------------------------------------------- extreme and degenerate data

KERNEL_NAMES = ["rbf", "linear", "poly", "laplacian", "sigmoid", "cosine"]


@pytest.mark.parametrize("solver", ["dense", "arpack", "randomized"])
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("n", [30, 400])
def test_constant_rows_have_the_known_answer(kernel, solver, n):
    # All rows equal: the centred kernel matrix is 0, so every eigenvalue is 0 and every
    # projection 0 (closed form); ARPACK used to stop with "starting vector is zero".
    if solver == "randomized" and kernel == "sigmoid":
        pytest.skip("the randomized solver is for PSD kernels")
    rows = np.repeat(RNG.standard_normal((1, 3)), n, axis=0)
    with pytest.warns(UserWarning, match="0 non-zero eigenvalues, fewer than n_components = 2"):
        kpca = KernelPCA(2, kernel=kernel, solver=solver).fit(rows)
    np.testing.assert_array_equal(kpca.eigenvalues_, 0.0)
    np.testing.assert_array_equal(kpca.transform(rows[:5]), 0.0)
    # The eigenvectors are a fixed orthonormal basis orthogonal to the constant vector.
    V = kpca.eigenvectors_
    np.testing.assert_allclose(V.T @ V, np.eye(2), atol=1e-13)
    np.testing.assert_allclose(V.sum(axis=0), 0.0, atol=1e-12)
    with pytest.warns(UserWarning, match="no component with a non-zero eigenvalue"):
        assert KernelPCA(kernel=kernel, solver=solver).fit(rows).n_components_ == 0


def test_arpack_on_constant_rows_gives_the_same_answer_every_call():
    X1 = np.full((27, 1), 1.26736591)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        counts = {
            KernelPCA(16, kernel="sigmoid", coef0=0, solver="arpack", remove_zero_eig=True,
                      random_state=98).fit(X1).n_components_
            for _ in range(8)
        }
    assert counts == {0}  # a centred matrix of zeros has no non-zero eigenvalue


@pytest.mark.parametrize("solver", ["dense", "arpack"])
def test_arpack_falls_back_on_rank_deficient_matrices(solver):
    # Two distinct points, repeated: the centred linear kernel has rank 1 with eigenvalue
    # n/4 |a - b|^2 (closed form: half the rows at each point).
    a, b = np.array([1.0, 2.0, 0.5]), np.array([-1.0, 0.0, 2.5])
    rows = np.vstack([np.repeat(a[None], 200, 0), np.repeat(b[None], 200, 0)])
    with pytest.warns(UserWarning, match="1 non-zero eigenvalues, fewer than n_components = 3"):
        kpca = KernelPCA(3, kernel="linear", solver=solver).fit(rows)
    np.testing.assert_allclose(kpca.eigenvalues_, [400 / 4 * np.sum((a - b) ** 2), 0.0, 0.0], rtol=1e-12)


@pytest.mark.parametrize("solver", ["dense", "arpack"])
def test_centred_identity_has_eigenvalue_one(solver):
    # gamma = 1000 on standard normal data: K = I, H K H = H, eigenvalue 1 with multiplicity n - 1.
    Z = np.random.default_rng(0).standard_normal((20, 3))
    kpca = KernelPCA(2, kernel="rbf", gamma=1000, solver=solver).fit(Z)
    assert kpca.n_components_ == 2
    np.testing.assert_allclose(kpca.eigenvalues_, [1.0, 1.0], rtol=1e-12)
    assert KernelPCA(kernel="rbf", gamma=1000).fit(Z).n_components_ == 19


@pytest.mark.parametrize("c", [1e-150, 1e-8, 1e8, 1e150])
def test_linear_kernel_pca_of_scaled_data_is_the_scaled_fit(c):
    ref = KernelPCA(3, kernel="linear").fit(X)
    ours = KernelPCA(3, kernel="linear").fit(X * c)
    np.testing.assert_allclose(ours.eigenvalues_ / c**2, ref.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(ours.transform(X_NEW * c) / c, ref.transform(X_NEW), rtol=1e-9,
                               atol=1e-10 * _scale(ref.transform(X_NEW)))


@pytest.mark.parametrize("c", [1e-150, 1e150])
def test_rbf_kernel_pca_with_gamma_scaled_alike_is_unchanged(c):
    ref = KernelPCA(3, gamma=0.3).fit(X)
    ours = KernelPCA(3, gamma=0.3 / c**2).fit(X * c)
    np.testing.assert_allclose(ours.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(ours.transform(X_NEW * c), ref.transform(X_NEW), atol=1e-10)


def test_rbf_kernel_pca_far_from_the_origin():
    # Data on a 2^-10 grid are exact at an offset of 1e9; reference: scikit-learn at the origin.
    Z = np.round(X * 1024) / 1024
    ours = KernelPCA(3, gamma=0.3).fit(Z + 1e9)
    ref = SklearnKernelPCA(3, kernel="rbf", gamma=0.3).fit(Z)
    np.testing.assert_allclose(ours.eigenvalues_, ref.eigenvalues_, rtol=1e-10)


@pytest.mark.parametrize("approximation", [None, "nystroem"])
def test_rbf_at_huge_scale_is_the_centred_identity(approximation):
    # Every pair is far apart on the kernel's scale: K = I (closed form), eigenvalues 1.
    kpca = KernelPCA(2, approximation=approximation, n_approx=20, random_state=0).fit(X[:40] * 1e300)
    np.testing.assert_allclose(kpca.eigenvalues_, [1.0, 1.0], rtol=1e-12)


def test_kernel_overflow_and_underflow_are_named_errors():
    with pytest.raises(ValueError, match="The linear kernel needs the inner products x.y"):
        KernelPCA(2, kernel="linear").fit(X * 1e300)
    fitted = KernelPCA(2, kernel="linear").fit(X * 1e150)
    with pytest.raises(ValueError, match="The linear kernel needs the inner products x.y"):
        fitted.transform(X_NEW * 1e160)
    with pytest.raises(ValueError, match="subnormal in float64"):
        KernelPCA(2, kernel="linear").fit(X * 1e-160)
    with pytest.raises(ValueError, match="phases x W of the random Fourier features overflow"):
        KernelPCA(2, gamma=1e6, approximation="rff", n_approx=20, random_state=0).fit(X[:10] * 1e306)


# ------------------------------------------------------------- scikit-learn API


@parametrize_with_checks(
    [
        KernelPCA(),
        KernelPCA(2, kernel="linear", fit_inverse_transform=True),
        KernelPCA(2, approximation="nystroem", n_approx=10, random_state=0),
        KernelPCA(2, approximation="rff", n_approx=20, random_state=0),
        KernelPCA(2, kernel="precomputed"),
    ]
)
def test_sklearn_compatible(estimator, check):
    check(estimator)
