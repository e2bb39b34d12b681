"""bayespca.SparsePCA against closed forms, scikit-learn, numpy's SVD and ZHT's published example."""

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_diabetes
from sklearn.decomposition import SparsePCA as SkSparsePCA
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import ElasticNet
from sklearn.utils.estimator_checks import parametrize_with_checks

from bayespca.sparse_pca import Scatter, SparsePCA, adjusted_variance, elastic_net_step, sparse_pca_path

SOLVERS = ["covariance", "data"]


def _sparse_factors(seed=0, n=400, d=30, size=5, theta=(9.0, 6.0, 4.0)):
    """Spiked covariance ``V^T diag(theta) V + I`` with k orthonormal loadings of disjoint supports."""
    rng = np.random.default_rng(seed)
    k = len(theta)
    V = np.zeros((k, d))
    perm = rng.permutation(d)
    for j in range(k):
        idx = perm[j * size : (j + 1) * size]
        V[j, idx] = rng.choice([-1.0, 1.0], size) * rng.uniform(0.5, 1.0, size)
        V[j] /= np.linalg.norm(V[j])
    X = (rng.standard_normal((n, k)) * np.sqrt(theta)) @ V + rng.standard_normal((n, d)) + 3.0
    return X, V


def _with_exact_covariance(Sigma, n, seed=0):
    """Data whose sample covariance (ddof=1) is exactly Sigma."""
    Z = np.random.default_rng(seed).standard_normal((n, Sigma.shape[0]))
    Z -= Z.mean(0)
    Z = Z @ np.linalg.inv(np.linalg.cholesky(Z.T @ Z / (n - 1))).T
    return Z @ np.linalg.cholesky(Sigma).T + 10.0


def _zht_covariance():
    """Population covariance of ZHT's synthetic example.

    V1 ~ N(0, 290), V2 ~ N(0, 300), V3 = -0.3 V1 + 0.925 V2 + e with e ~ N(0, 1);
    X1..X4 = V1 + e_i, X5..X8 = V2 + e_i, X9, X10 = V3 + e_i, all e_i ~ N(0, 1).
    """
    to_v = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [-0.3, 0.925, 1.0]])
    cov_v = to_v @ np.diag([290.0, 300.0, 1.0]) @ to_v.T
    to_x = np.zeros((10, 3))
    to_x[:4, 0], to_x[4:8, 1], to_x[8:, 2] = 1.0, 1.0, 1.0
    return to_x @ cov_v @ to_x.T + np.eye(10)


def _match(estimated, truth):
    """Reorder and re-sign estimated rows to the true rows they correlate with most."""
    order = np.abs(estimated @ truth.T).argmax(axis=0)
    out = estimated[order]
    return out * np.sign(np.sum(out * truth, axis=1))[:, None]


def _precision_recall(estimated, truth):
    est, true = estimated != 0, truth != 0
    hits = np.sum(est & true)
    return hits / max(est.sum(), 1), hits / true.sum()


def _polar(M):
    u, _, vt = np.linalg.svd(M, full_matrices=False)
    return u @ vt


# ------------------------------------------------------------------ the B-step and the A-step
@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("alpha, l1_ratio", [(0.3, 0.9), (0.05, 1.0), (1.0, 0.5), (0.7, 0.0)])
def test_b_step_is_sklearn_elastic_net(solver, k, alpha, l1_ratio):
    """For fixed A the B-step is ElasticNet(alpha, l1_ratio, fit_intercept=False) of Xc A on Xc."""
    X, _ = _sparse_factors(seed=1, n=150, d=20)
    n = X.shape[0]
    Xc = X - X.mean(0)
    A = np.linalg.qr(np.random.default_rng(2).standard_normal((20, k)))[0]
    scatter = Scatter(dense=Xc.T @ Xc / n) if solver == "covariance" else Scatter(root=Xc / np.sqrt(n))
    ref = ElasticNet(alpha=alpha, l1_ratio=l1_ratio, fit_intercept=False, tol=1e-15, max_iter=10**6)
    ref = ref.fit(Xc, Xc @ A).coef_.reshape(k, -1).T
    for warm in (np.zeros((20, k)), np.random.default_rng(3).standard_normal((20, k))):
        B, SB, _ = elastic_net_step(scatter, A, warm, alpha * l1_ratio, alpha * (1 - l1_ratio))
        np.testing.assert_allclose(B, ref, rtol=0, atol=1e-8 * np.abs(ref).max())
        np.testing.assert_array_equal(B != 0, np.abs(ref) > 1e-10)
        np.testing.assert_allclose(SB, Xc.T @ Xc @ B / n, rtol=0, atol=1e-10 * np.abs(SB).max())


@pytest.mark.parametrize("alpha", [0.05, 1e-3])
def test_b_step_lasso_with_more_features_than_samples(alpha):
    """Without ridge and with d > n, active sets of n collinear features must be shrunk (null steps)."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((20, 200))
    n = X.shape[0]
    Xc = X - X.mean(0)
    A = np.linalg.svd(Xc, full_matrices=False)[2][:2].T
    B, _, _ = elastic_net_step(Scatter(root=Xc / np.sqrt(n)), A, np.zeros((200, 2)), alpha, 0.0)
    ref = ElasticNet(alpha=alpha, l1_ratio=1.0, fit_intercept=False, tol=1e-15, max_iter=10**6)
    ref = ref.fit(Xc, Xc @ A).coef_.T

    def objective(b, a):
        return np.sum((Xc @ a - Xc @ b) ** 2) / (2 * n) + alpha * np.abs(b).sum()

    for j in range(2):
        assert objective(B[:, j], A[:, j]) <= objective(ref[:, j], A[:, j]) * (1 + 1e-12)
        assert np.count_nonzero(B[:, j]) <= n - 1
    np.testing.assert_allclose(B, ref, atol=1e-6 * np.abs(ref).max())


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("standardize", [False, True])
def test_fitted_model_is_a_fixed_point_of_both_steps(solver, standardize):
    """At convergence coef_ is the elastic net on directions_ and directions_ the Procrustes of S coef_."""
    X, _ = _sparse_factors(seed=3, n=120, d=15, size=4)
    spca = SparsePCA(3, alpha=0.2, l1_ratio=0.8, solver=solver, standardize=standardize, tol=1e-12)
    spca.fit(X)
    Xc = (X - X.mean(0)) / (X.std(0, ddof=1) if standardize else 1.0)
    ref = ElasticNet(alpha=0.2, l1_ratio=0.8, fit_intercept=False, tol=1e-15, max_iter=10**6)
    ref = ref.fit(Xc, Xc @ spca.directions_.T).coef_
    np.testing.assert_allclose(spca.coef_, ref, rtol=0, atol=1e-8 * np.abs(ref).max())
    np.testing.assert_allclose(spca.directions_.T, _polar(Xc.T @ Xc @ spca.coef_.T), atol=1e-8)
    norms = np.linalg.norm(spca.coef_, axis=1)
    np.testing.assert_allclose(spca.components_, spca.coef_ / norms[:, None], atol=1e-15)
    n = X.shape[0]
    B, A = spca.coef_.T, spca.directions_.T
    objective = (np.sum((Xc - Xc @ B @ A.T) ** 2) / (2 * n) + 0.2 * 0.8 * np.abs(B).sum()
                 + 0.2 * 0.2 / 2 * np.sum(B**2))
    np.testing.assert_allclose(spca.objective_, objective, rtol=1e-12)


def test_matches_plain_zht_alternation_built_from_sklearn():
    """A reference ZHT alternation (sklearn ElasticNet for B, numpy SVD for A) reaches the same loadings."""
    X, _ = _sparse_factors(seed=4, n=200, d=12, size=4)
    Xc = X - X.mean(0)
    A = np.linalg.svd(Xc, full_matrices=False)[2][:3].T
    net = ElasticNet(alpha=0.3, l1_ratio=0.9, fit_intercept=False, tol=1e-14, max_iter=10**5)
    for _ in range(200):
        B = net.fit(Xc, Xc @ A).coef_.T
        A_new = _polar(Xc.T @ Xc @ B)
        if np.abs(A_new - A).max() < 1e-13:
            break
        A = A_new
    ref = B / np.linalg.norm(B, axis=0)
    ours = SparsePCA(3, alpha=0.3, l1_ratio=0.9, tol=1e-12).fit(X)
    np.testing.assert_allclose(ours.components_, _match(ref.T, ours.components_), atol=1e-8)


# ------------------------------------------------------------------ ridge identity (ZHT Theorem 3)
@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("alpha", [0.0, 0.5, 20.0])
def test_ridge_only_gives_principal_axes(solver, alpha):
    rng = np.random.default_rng(5)
    rotation = np.linalg.qr(rng.standard_normal((12, 12)))[0]
    X = rng.standard_normal((200, 12)) * np.linspace(4, 1, 12) @ rotation
    n = X.shape[0]
    _, s, vt = np.linalg.svd(X - X.mean(0), full_matrices=False)
    spca = SparsePCA(4, alpha=alpha, l1_ratio=0.0, solver=solver, tol=1e-12).fit(X)
    signs = np.sign(np.sum(spca.components_ * vt[:4], axis=1))
    np.testing.assert_allclose(spca.components_, vt[:4] * signs[:, None], atol=1e-10)
    # B = (S + lambda I)^-1 S V: each column shrunk by s_j / (s_j + lambda), s_j = sigma_j^2 / n.
    eig = s[:4] ** 2 / n
    np.testing.assert_allclose(np.linalg.norm(spca.coef_, axis=1), eig / (eig + alpha), rtol=1e-10)
    # Orthogonal loadings: adjusted variance is the PCA variance sigma_j^2 / (n - 1).
    np.testing.assert_allclose(spca.explained_variance_, s[:4] ** 2 / (n - 1), rtol=1e-10)
    np.testing.assert_allclose(spca.explained_variance_ratio_, s[:4] ** 2 / np.sum(s**2), rtol=1e-10)


@pytest.mark.parametrize(
    "solver, shape", [("covariance", (150, 10)), ("data", (150, 10)), ("data", (25, 60))]
)
def test_ridge_only_from_random_start_finds_the_principal_subspace(solver, shape):
    """From a random start the ridge-only solution spans the leading principal subspace.

    Rotations (A R, B R) leave the ridge criterion unchanged, so only the span is identified.
    """
    rng = np.random.default_rng(6)
    X = rng.standard_normal(shape) * np.linspace(5, 1, shape[1])
    vt = np.linalg.svd(X - X.mean(0), full_matrices=False)[2][:3]
    spca = SparsePCA(3, alpha=0.1, l1_ratio=0.0, solver=solver, init="random", random_state=0,
                     tol=1e-13, max_iter=5000).fit(X)
    basis = np.linalg.qr(spca.components_.T)[0]
    cosines = np.linalg.svd(basis.T @ vt.T, compute_uv=False)
    np.testing.assert_allclose(cosines, 1.0, atol=1e-10)


# ------------------------------------------------------------------ sparse recovery
def test_zht_synthetic_example():
    """ZHT's synthetic example: SPCA with 4 non-zeros per component finds the two hidden factors.

    With the exact covariance, PC1 loads 0.5 on X5..X8 and PC2 0.5 on X1..X4, and their adjusted
    variances are the closed forms var(2 V2 + sum e / 2) = 1201 and var(2 V1 + sum e / 2) = 1161
    (40.9% and 39.5% of the total, as ZHT report).
    """
    Sigma = _zht_covariance()
    X = _with_exact_covariance(Sigma, 1000)
    path = sparse_pca_path(X, 2, n_alphas=25, l1_ratio=0.99)
    four = path.groupby("alpha", sort=False)["n_nonzero"].apply(lambda s: list(s) == [4, 4])
    assert four.any()
    alpha = four.index[four][len(four.index[four]) // 2]
    spca = SparsePCA(2, alpha=alpha, l1_ratio=0.99, tol=1e-10).fit(X)
    expected = np.zeros((2, 10))
    expected[0, 4:8], expected[1, :4] = 0.5, 0.5
    np.testing.assert_allclose(spca.components_, expected, atol=1e-10)
    total = np.trace(Sigma)
    np.testing.assert_allclose(spca.explained_variance_, [4 * 300 + 1, 4 * 290 + 1], rtol=1e-10)
    np.testing.assert_allclose(spca.explained_variance_ratio_, [1201 / total, 1161 / total], rtol=1e-10)
    np.testing.assert_allclose(spca.explained_variance_ratio_.round(3), [0.409, 0.395])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_support_recovery_on_sparse_spiked_model(seed):
    X, V = _sparse_factors(seed)
    spca = SparsePCA(3, alpha=0.5).fit(X)
    estimated = _match(spca.components_, V)
    precision, recall = _precision_recall(estimated, V)
    print(f"seed {seed}: precision {precision:.3f}, recall {recall:.3f}, non-zeros {spca.n_nonzero_}")
    assert precision >= 0.95 and recall >= 0.95
    # The lasso shrinks the kept loadings unequally, so directions are accurate only to the noise level.
    cosines = np.sum(estimated * V, axis=1)
    print(f"         cosines with the true loadings {cosines.round(4)}")
    assert np.all(cosines > 0.95)


def test_same_support_as_sklearn_sparse_pca():
    """scikit-learn penalises the components in a dictionary-learning criterion; on a truly sparse
    problem both criteria select the true support (at their own alpha scales)."""
    X, V = _sparse_factors(0)
    ours = _match(SparsePCA(3, alpha=0.5).fit(X).components_, V)
    theirs = _match(SkSparsePCA(3, alpha=3.0, random_state=0).fit(X).components_, V)
    np.testing.assert_array_equal(ours != 0, theirs != 0)
    np.testing.assert_array_equal(ours != 0, V != 0)
    assert np.abs(ours - theirs).max() < 0.15


# ------------------------------------------------------------------ adjusted variance
def test_adjusted_variance_is_the_residual_variance_after_earlier_components():
    rng = np.random.default_rng(7)
    Z = rng.standard_normal((60, 3)) @ np.array([[1.0, 0.6, 0.2], [0.0, 1.0, -0.5], [0.0, 0.0, 1.0]])
    Z -= Z.mean(0)
    expected = [np.var(Z[:, 0], ddof=1)]
    for j in (1, 2):
        earlier = Z[:, :j]
        residual = Z[:, j] - earlier @ np.linalg.lstsq(earlier, Z[:, j], rcond=None)[0]
        expected.append(np.sum(residual**2) / 59)
    np.testing.assert_allclose(adjusted_variance(Z), expected, rtol=1e-12)
    r = np.corrcoef(Z[:, 0], Z[:, 1])[0, 1]
    second = np.var(Z[:, 1], ddof=1) * (1 - r**2)
    np.testing.assert_allclose(adjusted_variance(Z[:, :2])[1], second, rtol=1e-12)


def _uncorrelated_blocks(n=300, seed=8):
    """Two blocks of three features, exactly uncorrelated across blocks, plus two noise features."""
    rng = np.random.default_rng(seed)
    f = rng.standard_normal((n, 2)) * [3.0, 2.0]
    X = np.c_[f[:, [0, 0, 0]], f[:, [1, 1, 1]]] + 0.3 * rng.standard_normal((n, 6))
    X = np.c_[X, 0.2 * rng.standard_normal((n, 2))]
    X -= X.mean(0)
    first = X[:, :3]
    X[:, 3:] -= first @ np.linalg.lstsq(first, X[:, 3:], rcond=None)[0]
    return X + 5.0


def test_orthogonal_components_adjusted_variance_is_ordinary_variance_and_round_trip():
    X = _uncorrelated_blocks()
    spca = SparsePCA(2, alpha=0.5).fit(X)
    assert set(np.flatnonzero(spca.components_[0])) <= {0, 1, 2}
    assert set(np.flatnonzero(spca.components_[1])) <= {3, 4, 5}
    np.testing.assert_allclose(spca.components_ @ spca.components_.T, np.eye(2), atol=1e-14)
    scores = (X - X.mean(0)) @ spca.components_.T
    np.testing.assert_allclose(np.corrcoef(scores.T)[0, 1], 0.0, atol=1e-12)
    np.testing.assert_allclose(spca.explained_variance_, np.var(scores, axis=0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(spca.explained_variance_ratio_,
                               np.var(scores, axis=0, ddof=1) / np.var(X, axis=0, ddof=1).sum(), rtol=1e-12)
    # Orthonormal loadings: transform is the projection, and inverse_transform inverts it on the span.
    np.testing.assert_allclose(spca.transform(X), scores, atol=1e-12)
    on_span = spca.mean_ + np.random.default_rng(0).standard_normal((7, 2)) @ spca.components_
    np.testing.assert_allclose(spca.inverse_transform(spca.transform(on_span)), on_span, atol=1e-12)
    np.testing.assert_allclose(spca.fit_transform(X), scores, atol=1e-12)


def test_transform_is_least_squares_for_correlated_loadings():
    X = load_diabetes().data
    spca = SparsePCA(3, alpha=0.05, standardize=True).fit(X)
    V = spca.components_
    assert np.abs(V @ V.T - np.eye(3)).max() > 0.05  # genuinely non-orthogonal loadings
    Xs = (X - X.mean(0)) / X.std(0, ddof=1)
    expected = np.linalg.lstsq(V.T, Xs.T, rcond=None)[0].T
    np.testing.assert_allclose(spca.transform(X), expected, atol=1e-10)
    on_span = spca.inverse_transform(np.random.default_rng(1).standard_normal((5, 3)))
    np.testing.assert_allclose(spca.inverse_transform(spca.transform(on_span)), on_span, atol=1e-10)
    # The scores are correlated, so the adjusted variance is below the ordinary one after the first.
    scores = Xs @ V.T
    np.testing.assert_allclose(spca.explained_variance_, adjusted_variance(scores), rtol=1e-12)
    assert spca.explained_variance_[0] == pytest.approx(np.var(scores[:, 0], ddof=1), rel=1e-12)
    assert np.all(spca.explained_variance_[1:] < np.var(scores[:, 1:], axis=0, ddof=1))


# ------------------------------------------------------------------ path, solvers, options
def test_path_starts_at_the_closed_form_alpha_max():
    """All loadings are zero iff alpha l1_ratio >= max |S V_k| at the PCA start (KKT at B = 0)."""
    X, _ = _sparse_factors(seed=10, n=150, d=10, size=3)
    Xc = X - X.mean(0)
    vt = np.linalg.svd(Xc, full_matrices=False)[2][:2]
    SV = Xc.T @ Xc @ vt.T / X.shape[0]
    alpha_max = np.abs(SV).max() / 0.9
    path = sparse_pca_path(X, 2, n_alphas=4, l1_ratio=0.9)
    np.testing.assert_allclose(path["alpha"].iloc[0], alpha_max, rtol=1e-12)
    assert path["n_nonzero"].iloc[:2].tolist() == [0, 0]
    with pytest.warns(UserWarning, match=r"components \[1\] have all-zero loadings"):
        just_below = SparsePCA(2, alpha=alpha_max * (1 - 1e-6), l1_ratio=0.9).fit(X)
    nonzero = np.argwhere(just_below.components_ != 0)
    feature, component = np.unravel_index(np.abs(SV).argmax(), SV.shape)
    assert nonzero.tolist() == [[component, feature]]


def test_path_matches_cold_fits_and_lists_non_zeros():
    X, _ = _sparse_factors(seed=11, n=300, d=15, size=4)
    alphas = [2.0, 0.6, 0.2]
    path = sparse_pca_path(X, 3, alphas=alphas, tol=1e-10)
    assert list(path.columns) == ["alpha", "component", "n_nonzero", "explained_variance",
                                  "explained_variance_ratio", "cumulative_explained_variance_ratio", "n_iter"]
    for alpha in alphas:
        rows = path[path["alpha"] == alpha]
        cold = SparsePCA(3, alpha=alpha, tol=1e-10).fit(X)
        assert rows["n_nonzero"].tolist() == cold.n_nonzero_.tolist()
        np.testing.assert_allclose(rows["explained_variance"], cold.explained_variance_, rtol=1e-7)
        np.testing.assert_allclose(rows["cumulative_explained_variance_ratio"],
                                   np.cumsum(cold.explained_variance_ratio_), rtol=1e-7)


@pytest.mark.parametrize("shape", [(200, 15), (30, 60)])
def test_covariance_and_data_solvers_agree(shape):
    rng = np.random.default_rng(12)
    X = rng.standard_normal((shape[0], 4)) @ rng.standard_normal((4, shape[1])) + rng.standard_normal(shape)
    fits = [SparsePCA(3, alpha=0.3, solver=s, tol=1e-12, max_iter=5000).fit(X) for s in SOLVERS]
    np.testing.assert_allclose(fits[0].components_, fits[1].components_, atol=1e-8)
    np.testing.assert_allclose(fits[0].explained_variance_, fits[1].explained_variance_, rtol=1e-8)
    assert SparsePCA(3).fit(X).solver_ == ("covariance" if shape[1] <= shape[0] else "data")


def test_standardize_is_sparse_pca_of_the_correlation_matrix():
    X, _ = _sparse_factors(seed=13, n=200, d=10, size=3)
    X = X * np.linspace(1, 20, 10)
    Xs = (X - X.mean(0)) / X.std(0, ddof=1)
    ours = SparsePCA(3, alpha=0.1, standardize=True, tol=1e-10).fit(X)
    ref = SparsePCA(3, alpha=0.1, tol=1e-10).fit(Xs)
    np.testing.assert_allclose(ours.components_, ref.components_, atol=1e-9)
    np.testing.assert_allclose(ours.transform(X[:5]), ref.transform(Xs[:5]), atol=1e-9)
    np.testing.assert_allclose(ours.inverse_transform(ours.transform(X[:5])),
                               ref.inverse_transform(ref.transform(Xs[:5])) * X.std(0, ddof=1) + X.mean(0),
                               atol=1e-9)


def test_given_init_is_used_and_made_orthonormal():
    X, V = _sparse_factors(seed=14, n=300, d=20, size=4)
    start = 3.0 * V + 0.01  # not orthonormal, near the truth
    with pytest.warns(ConvergenceWarning):
        spca = SparsePCA(3, alpha=0.5, init=start, max_iter=1).fit(X)
    # One alternation from A0 = polar(start^T): the B-step is the elastic net on that A0.
    A0 = _polar(start.T)
    Xc = X - X.mean(0)
    net = ElasticNet(alpha=0.5, l1_ratio=0.9, fit_intercept=False, tol=1e-15, max_iter=10**6)
    B1 = net.fit(Xc, Xc @ A0).coef_.T
    A1 = _polar(Xc.T @ Xc @ B1)
    B2 = net.fit(Xc, Xc @ A1).coef_.T
    np.testing.assert_allclose(np.abs(spca.coef_), np.abs(B2.T), atol=1e-8 * np.abs(B2).max())


def test_zero_components_are_reported_not_divided_by_zero():
    X = _uncorrelated_blocks()
    # Between the two components' thresholds max|S v_j| / l1_ratio (18.3 and 7.6 here): the weaker
    # component has no loading left.
    Xc = X - X.mean(0)
    vt = np.linalg.svd(Xc, full_matrices=False)[2][:2]
    thresholds = np.abs(Xc.T @ Xc @ vt.T / len(X)).max(axis=0) / 0.9
    with pytest.warns(UserWarning, match=r"components \[1\] have all-zero loadings"):
        spca = SparsePCA(2, alpha=thresholds.mean()).fit(X)
    assert spca.n_nonzero_[0] > 0 and spca.n_nonzero_[1] == 0
    np.testing.assert_array_equal(spca.components_[1], 0.0)
    Z = spca.transform(X)
    assert np.all(np.isfinite(Z)) and np.all(Z[:, 1] == 0)
    np.testing.assert_allclose(Z[:, 0], (X - X.mean(0)) @ spca.components_[0], atol=1e-10)
    assert spca.explained_variance_[1] == 0.0
    with pytest.warns(UserWarning, match=r"components \[0, 1\]"):
        empty = SparsePCA(2, alpha=1e6).fit(X)
    assert np.all(empty.components_ == 0) and np.all(empty.transform(X) == 0)
    np.testing.assert_allclose(empty.inverse_transform(empty.transform(X)), np.tile(X.mean(0), (len(X), 1)))


def test_dataframe_feature_names():
    X, _ = _sparse_factors(seed=15, n=100, d=6, size=2)
    df = pd.DataFrame(X, columns=[f"x{i}" for i in range(6)])
    spca = SparsePCA(2, alpha=0.2).fit(df)
    assert spca.feature_names_in_.tolist() == df.columns.tolist()
    assert spca.get_feature_names_out().tolist() == ["sparsepca0", "sparsepca1"]
    np.testing.assert_allclose(spca.transform(df), SparsePCA(2, alpha=0.2).fit(X).transform(X), atol=1e-12)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "params, error, match",
    [
        ({"n_components": 0}, ValueError, r"n_components must be an int >= 1 or None; got 0"),
        ({"n_components": 9}, ValueError, r"n_components must be .*\[1, 8\]; got 9"),
        ({"n_components": 2.5}, TypeError, r"n_components .* got 2.5"),
        ({"n_components": True}, TypeError, r"n_components"),
        ({"alpha": -1.0}, ValueError, r"alpha must be a finite number >= 0; got -1.0"),
        ({"alpha": np.inf}, ValueError, r"alpha must be a finite number >= 0; got inf"),
        ({"alpha": "big"}, TypeError, r"alpha must be a finite number >= 0; got 'big'"),
        ({"l1_ratio": 1.5}, ValueError, r"l1_ratio must be a finite number >= 0 and <= 1; got 1.5"),
        ({"solver": "lars"}, ValueError, r"solver must be one of .*; got 'lars'"),
        ({"standardize": "yes"}, TypeError, r"standardize must be True or False; got 'yes'"),
        ({"init": "svd"}, ValueError, r"init must be one of \['pca', 'random'\]; got 'svd'"),
        ({"random_state": "seed"}, TypeError, r"random_state must be None, an int >= 0"),
        ({"init": np.ones((2, 3))}, ValueError, r"init must be .* \(2, 8\); got an array of shape \(2, 3\)"),
        ({"init": np.ones((2, 8))}, ValueError, r"init has linearly dependent rows"),
        ({"max_iter": 0}, ValueError, r"max_iter must be an int >= 1; got 0"),
        ({"tol": 0.0}, ValueError, r"tol must be a finite number > 0; got 0.0"),
        ({"tol": float("nan")}, ValueError, r"tol must be a finite number > 0; got nan"),
    ],
)
def test_bad_parameters_are_named(params, error, match):
    X = np.random.default_rng(0).standard_normal((20, 8))
    with pytest.raises(error, match=match):
        SparsePCA(**{"n_components": 2, **params}).fit(X)


def test_bad_data_and_path_arguments_are_named():
    X = np.random.default_rng(0).standard_normal((20, 8))
    with pytest.raises(ValueError, match="X contains NaN"):
        SparsePCA(2).fit(np.where(X > 2, np.nan, X))
    spca = SparsePCA(2).fit(X)
    with pytest.raises(ValueError, match="X has 7 features, but SparsePCA is expecting 8"):
        spca.transform(X[:, :7])
    with pytest.raises(ValueError, match="has 3 columns, but SparsePCA.inverse_transform expects n_comp"):
        spca.inverse_transform(X[:, :3])
    with pytest.raises(ValueError, match="n_alphas must be an int >= 1; got 0"):
        sparse_pca_path(X, 2, n_alphas=0)
    with pytest.raises(ValueError, match=r"alpha_min_ratio must be a finite number > 0 and < 1; got 2"):
        sparse_pca_path(X, 2, alpha_min_ratio=2)
    with pytest.raises(ValueError, match="l1_ratio=0 has no L1 penalty"):
        sparse_pca_path(X, 2, l1_ratio=0.0)
    with pytest.raises(ValueError, match="alphas is empty"):
        sparse_pca_path(X, 2, alphas=[])
    with pytest.raises(ValueError, match="alpha must be a finite number >= 0; got -1.0"):
        sparse_pca_path(X, 2, alphas=[1.0, -1.0])


def test_non_convergence_warns():
    X, _ = _sparse_factors(seed=16, n=100, d=10, size=3)
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        SparsePCA(3, alpha=0.05, max_iter=1).fit(X)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        sparse_pca_path(X, 3, alphas=[0.05], max_iter=1)


# ------------------------------------------------------------------ extreme and degenerate data
@pytest.mark.parametrize("c", [1e-150, 1e-8, 1e8, 1e150])
@pytest.mark.parametrize("solver", SOLVERS)
def test_fit_of_scaled_data_with_penalty_scaled_alike_is_unchanged(c, solver):
    # alpha is on the scale of a covariance: c X with alpha c^2 is the same problem (reference:
    # the unscaled fit).
    X, _ = _sparse_factors(seed=3, n=120, d=12, size=4)
    ref = SparsePCA(3, alpha=0.4, solver=solver).fit(X)
    ours = SparsePCA(3, alpha=0.4 * c**2, solver=solver).fit(X * c)
    np.testing.assert_allclose(ours.components_, ref.components_, atol=1e-9)
    np.testing.assert_array_equal(ours.n_nonzero_, ref.n_nonzero_)
    np.testing.assert_allclose(ours.explained_variance_ / c**2, ref.explained_variance_, rtol=1e-8)
    np.testing.assert_allclose(ours.objective_ / c**2, ref.objective_, rtol=1e-8)
    np.testing.assert_allclose(ours.transform(X * c) / c, ref.transform(X), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("c", [1e-300, 1e300])
def test_spread_outside_float64_variances_is_refused(c):
    with pytest.raises(ValueError, match="X has a spread of about"):
        SparsePCA(2).fit(np.random.default_rng(0).standard_normal((20, 5)) * c)


def test_tiny_ridge_on_rank_deficient_data_gives_principal_axes():
    # n < d and a ridge far below the rounding of S: S + l2 I is singular to working precision.
    # ZHT's Theorem 3 still holds (reference: numpy's SVD).
    rng = np.random.default_rng(1)
    X = rng.standard_normal((6, 10)) * np.linspace(3, 1, 10)
    _, _, vt = np.linalg.svd(X - X.mean(0), full_matrices=False)
    for solver in SOLVERS:
        spca = SparsePCA(3, alpha=1e-30, l1_ratio=0.0, solver=solver).fit(X)
        signs = np.sign(np.sum(spca.components_ * vt[:3], axis=1))
        np.testing.assert_allclose(spca.components_, vt[:3] * signs[:, None], atol=1e-10)


def test_negligible_lasso_with_more_features_than_samples_reaches_the_pca_fit():
    # The data of the "390 feature-sign rounds" report: alpha = 0.1 on data of scale 1e8 is a
    # relative penalty of 1e-17. The criterion is then 1/2 the variance (ddof=0) that k components
    # leave unexplained: 0 for k >= rank = n - 1 (closed form), reached to rounding.
    X = np.random.default_rng(7).standard_normal((7, 8)) * 1e8
    Xc = X - X.mean(0)
    total = np.sum(Xc**2) / 7
    for solver in SOLVERS:
        spca = SparsePCA(7, alpha=0.1, l1_ratio=1.0, solver=solver).fit(X)
        assert abs(spca.objective_) <= 1e-9 * total
        # Xc B A^T = Xc: the rank-6 data are reproduced from their regression on the loadings.
        reproduced = Xc @ spca.coef_.T @ spca.directions_
        np.testing.assert_allclose(reproduced, Xc, rtol=0, atol=1e-6 * np.abs(Xc).max())


def test_constant_data_give_zero_loadings_with_a_warning():
    X = np.full((10, 4), 2.5)
    with pytest.warns(UserWarning, match="all-zero loadings"):
        spca = SparsePCA(2).fit(X)
    np.testing.assert_array_equal(spca.components_, 0.0)
    np.testing.assert_array_equal(spca.transform(X), 0.0)
    np.testing.assert_array_equal(spca.explained_variance_, 0.0)
    with pytest.warns(UserWarning, match="all-zero loadings"):
        std = SparsePCA(2, standardize=True).fit(np.c_[X, np.arange(10.0)])
    np.testing.assert_array_equal(std.scale_[:4], 1.0)  # constant columns keep scale 1


# ------------------------------------------------------------------ scikit-learn compatibility
@pytest.mark.filterwarnings("ignore:SparsePCA components")
@parametrize_with_checks([
    SparsePCA(),
    SparsePCA(2, alpha=0.01, solver="data", init="random", random_state=0),
    SparsePCA(1, l1_ratio=0.0, standardize=True),
])
def test_sklearn_compatible(estimator, check):
    check(estimator)
