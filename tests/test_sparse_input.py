"""scipy.sparse input, implicitly centred: estimators equal their dense fits; a matrix too big to densify."""

import warnings

import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.linalg
from sklearn.datasets import load_digits

from bayespca import PCA, PPCA, FactorAnalysis, KernelPCA, SparsePCA
from bayespca.linalg import svd_randomized

FORMATS = [scipy.sparse.csr_matrix, scipy.sparse.csc_matrix, scipy.sparse.csr_array]


def _digits():
    """sklearn's digits: 49% exact zeros, all-zero columns included."""
    return load_digits().data


def _uneven():
    """A random sparse matrix whose density falls from 60% in the first columns to 1% in the last."""
    rng = np.random.default_rng(0)
    n, d = 400, 30
    keep = rng.random((n, d)) < np.linspace(0.6, 0.01, d)
    return np.where(keep, rng.standard_normal((n, d)) * np.arange(1, d + 1) ** -0.5 + 1.0, 0.0)


DATA = {"digits": _digits, "uneven": _uneven}


def _close(a, b, tol=1e-10):
    a, b = np.asarray(a), np.asarray(b)
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max())


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("solver", ["covariance", "gram", "auto"])
@pytest.mark.parametrize("standardize", [False, True])
def test_pca_sparse_equals_dense(data, solver, standardize):
    X = DATA[data]()
    dense = PCA(5, solver=solver, standardize=standardize, random_state=0).fit(X)
    dense_scores = PCA(5, solver=solver, standardize=standardize, random_state=0).fit_transform(X)
    for fmt in FORMATS:
        sparse = PCA(5, solver=solver, standardize=standardize, random_state=0).fit(fmt(X))
        for name in ("components_", "explained_variance_", "singular_values_", "mean_", "scale_",
                     "explained_variance_ratio_", "noise_variance_"):
            _close(getattr(sparse, name), getattr(dense, name))
        _close(sparse.transform(fmt(X)), dense.transform(X))
        _close(sparse.score_samples(fmt(X)), dense.score_samples(X))
        _close(sparse.fit_transform(fmt(X)), dense_scores)


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("fmt", FORMATS)
def test_randomized_sparse_equals_dense_on_the_same_basis(data, fmt):
    """Sparse input keeps its Krylov basis on the smaller side (d here): the dense solver on that side.

    Same sketch, same products up to rounding; the Ritz step differs (the
    L x L Gram on sparse input, a thin SVD on dense), which changes the
    leading values by ~eps (s_1 / s_5)^2 only.
    """
    X = DATA[data]()
    mean = X.mean(axis=0)
    dense = svd_randomized(X, mean, 5, random_state=0, basis="rows")
    sparse = svd_randomized(fmt(X), mean, 5, random_state=0)
    _close(sparse.singular_values, dense.singular_values)
    _close(sparse.components, dense.components)
    _close(sparse.scores, dense.scores)
    _close(sparse.total_ss, dense.total_ss)


@pytest.mark.parametrize("standardize", [False, True])
def test_pca_randomized_sparse_is_exact_when_its_basis_spans_the_rows(standardize):
    """On 30 features the 4 Krylov blocks of 15 columns span the whole row space: the exact SVD."""
    X = _uneven()
    dense = PCA(5, solver="full", standardize=standardize).fit(X)
    for fmt in FORMATS:
        sparse = PCA(5, solver="randomized", standardize=standardize, random_state=0).fit(fmt(X))
        for name in ("components_", "explained_variance_", "mean_", "scale_", "noise_variance_"):
            _close(getattr(sparse, name), getattr(dense, name))
        _close(sparse.fit_transform(fmt(X)), dense.transform(X))


@pytest.mark.parametrize("data", DATA)
def test_pca_sparse_whole_spectrum(data):
    """n_components=None and a selection rule need every eigenvalue: the covariance solver of the scatter."""
    X = DATA[data]()
    for k in (None, "mle"):
        dense, sparse = PCA(k, solver="covariance").fit(X), PCA(k).fit(scipy.sparse.csr_array(X))
        assert sparse.solver_ == "covariance" and sparse.n_components_ == dense.n_components_
        _close(sparse.explained_variance_, dense.explained_variance_)


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("fmt", FORMATS)
def test_ppca_and_fa_sparse_equal_dense(data, fmt):
    X = DATA[data]()
    X = X[:, X.std(axis=0) > 0]  # FA needs every feature to vary
    estimators = [PPCA(4, method="closed_form"), PPCA(4, method="em"), FactorAnalysis(3, method="em")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Heywood cases of FA on digits: the same on both inputs
        for est in estimators:
            dense = est.fit(X)
            g, ll, z, s = dense.gaussian_, dense.log_likelihood_, dense.transform(X), dense.score_samples(X)
            sparse = est.fit(fmt(X))
            for a, b in zip(sparse.gaussian_, g, strict=True):
                _close(a, b)
            assert abs(sparse.log_likelihood_ - ll) <= 1e-10 * abs(ll)
            _close(sparse.transform(fmt(X)), z)
            _close(sparse.score_samples(fmt(X)), s)


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_kernel_pca_sparse_equals_dense(data, fmt):
    X = DATA[data]()[:300]
    dense = KernelPCA(4, kernel="linear").fit(X)
    sparse = KernelPCA(4, kernel="linear").fit(fmt(X))
    _close(sparse.eigenvalues_, dense.eigenvalues_)
    _close(sparse.eigenvectors_, dense.eigenvectors_)
    _close(sparse.transform(fmt(X[:50])), dense.transform(X[:50]))


def test_pca_on_a_matrix_too_big_to_densify():
    """10^6 x 10^5 at 0.01% density (120 MB sparse, 800 GB dense) against ARPACK on the centred operator.

    Five columns weighted 100, 80, 60, 50, 40 carry singular values of about
    5.8 x their weight (100 entries uniform on [0, 1] each); the rest, the
    bulk, stays below ~8. With that gap (ratio ~30 at the fifth value) block
    Krylov of depth 3 converges to rounding, so the randomized solver must
    give ARPACK's values to 1e-9 and the same axes.
    """
    n, d = 10**6, 10**5
    rng = np.random.default_rng(0)
    nnz = n * d // 10**4  # entries at random positions (a repeated position sums), uniform on [0, 1]
    X = scipy.sparse.coo_array((rng.random(nnz), (rng.integers(0, n, nnz), rng.integers(0, d, nnz))), (n, d))
    weights = np.ones(d)
    weights[:5] = [100.0, 80.0, 60.0, 50.0, 40.0]
    X = scipy.sparse.csr_array(X @ scipy.sparse.diags_array(weights))
    pca = PCA(5, solver="auto", random_state=0).fit(X)
    assert pca.solver_ == "randomized"
    mean = np.asarray(X.sum(axis=0)).ravel() / n
    op = scipy.sparse.linalg.LinearOperator(
        (n, d), dtype=float,
        matvec=lambda v: X @ np.ravel(v) - mean @ np.ravel(v),
        rmatvec=lambda u: X.T @ np.ravel(u) - mean * np.sum(u),
    )
    _, s, vt = scipy.sparse.linalg.svds(op, k=5, random_state=0)
    order = np.argsort(s)[::-1]
    np.testing.assert_allclose(pca.singular_values_, s[order], rtol=1e-9)
    overlap = np.abs(pca.components_ @ vt[order].T)
    np.testing.assert_allclose(np.diag(overlap), 1.0, atol=1e-9)


def test_nan_in_sparse_data_is_refused():
    X = scipy.sparse.csr_matrix(np.array([[1.0, 0.0], [0.0, np.nan], [2.0, 1.0]]))
    for est in (PCA(1), PPCA(1), KernelPCA(1, kernel="linear")):
        with pytest.raises(ValueError, match="sparse and stores NaN"):
            est.fit(X)


def test_unsupported_estimators_name_themselves():
    X = scipy.sparse.csr_matrix(_digits()[:100])
    with pytest.raises(TypeError, match="SparsePCA does not accept sparse input"):
        SparsePCA(2).fit(X)
    with pytest.raises(TypeError, match="KernelPCA with kernel='rbf' does not accept sparse input"):
        KernelPCA(2, kernel="rbf").fit(X)
    with pytest.raises(TypeError, match=r"PPCA\(method='nuts'\) does not accept sparse input"):
        PPCA(2, method="nuts").fit(X)
    with pytest.raises(ValueError, match="solver='full' needs the centred data as a dense matrix"):
        PCA(2, solver="full").fit(X)
