"""Parallel analysis (Horn 1965, as psych::fa.parallel): planted ranks and Monte Carlo references."""

import numpy as np
import pytest

from bayespca import PCA, select_n_components
from bayespca.selection import parallel_analysis, random_eigenvalues, select_from_singular_values


def _planted(n=400, d=12, rank=3, seed=0):
    rng = np.random.default_rng(seed)
    axes = np.linalg.qr(rng.normal(size=(d, rank)))[0]  # orthonormal: eigenvalues d [1, .64, .36] + noise
    loadings = axes * np.sqrt(d) * np.linspace(1.0, 0.6, rank)
    return rng.normal(size=(n, rank)) @ loadings.T + rng.normal(size=(n, d)) * rng.uniform(0.8, 1.5, d)


def _monte_carlo(n, d, kind, size, seed):
    """Eigenvalues of correlation matrices of random normal data, drawn as data (not as Wishart)."""
    rng = np.random.default_rng(seed)
    out = np.empty((size, d))
    for i in range(size):
        corr = np.corrcoef(rng.standard_normal((n, d)), rowvar=False)
        if kind == "fa":
            np.fill_diagonal(corr, 1.0 - 1.0 / np.diag(np.linalg.inv(corr)))
        out[i] = np.linalg.eigvalsh(corr)[::-1]
    return out


@pytest.mark.parametrize("kind", ["pca", "fa"])
def test_planted_rank_is_selected(kind):
    X = _planted()
    result = parallel_analysis(X, kind=kind, random_state=0)
    assert result.n_components == 3, result.table
    # The data eigenvalues are those of the correlation matrix (reduced for FA) by numpy.
    corr = np.corrcoef(X, rowvar=False)
    if kind == "fa":
        np.fill_diagonal(corr, 1.0 - 1.0 / np.diag(np.linalg.inv(corr)))
    np.testing.assert_allclose(result.criterion, np.linalg.eigvalsh(corr)[::-1], atol=1e-12)


@pytest.mark.parametrize(("n", "d", "kind"), [(60, 8, "pca"), (60, 8, "fa"), (10, 15, "pca")])
def test_random_quantiles_match_a_monte_carlo_recomputation(n, d, kind):
    # Bartlett's Wishart draws (n - 1 >= d) or data draws (n <= d) against correlation matrices of
    # drawn data; the 0.95 quantile's Monte Carlo sd is sqrt(q (1 - q) / m) / density, which the
    # pooled spread of the two samples bounds: 5 such sds is a 1e-6 two-sided test per position.
    size = 3000
    ours = random_eigenvalues(n, d, kind=kind, n_iter=size, random_state=1)
    reference = _monte_carlo(n, d, kind, size, seed=2)
    for j in range(min(n, d) - 1):
        q_ours, q_ref = np.quantile(ours[:, j], 0.95), np.quantile(reference[:, j], 0.95)
        lo, hi = np.quantile(np.concatenate([ours[:, j], reference[:, j]]), [0.94, 0.96])
        sd = (hi - lo) / 0.02 * np.sqrt(0.95 * 0.05 / size)
        assert abs(q_ours - q_ref) < 5 * np.sqrt(2) * sd, (j, q_ours, q_ref, sd)
        assert ours[:, j].mean() == pytest.approx(reference[:, j].mean(), abs=5 * np.sqrt(2 / size)
                                                  * reference[:, j].std())


def test_rule_of_select_n_components_and_pca():
    X = _planted(seed=3)
    standardised = (X - X.mean(0)) / X.std(0)
    assert select_n_components(X, "parallel").n_components == 3
    assert PCA("parallel", standardize=True).fit(X).n_components_ == 3
    # From singular values of standardised data, the criterion is the correlation matrix's spectrum.
    s = np.linalg.svd(standardised, compute_uv=False)
    sel = select_from_singular_values(s, *X.shape, "parallel")
    np.testing.assert_allclose(sel.criterion, np.linalg.eigvalsh(np.corrcoef(X, rowvar=False))[::-1],
                               atol=1e-12)
    assert sel.n_components == 3


def test_pure_noise_keeps_nothing_and_errors_are_named():
    X = np.random.default_rng(4).standard_normal((200, 10))
    assert parallel_analysis(X, random_state=0).n_components == 0
    with pytest.raises(ValueError, match="kind must be one of"):
        parallel_analysis(X, kind="pc")
    with pytest.raises(ValueError, match="quantile must be"):
        parallel_analysis(X, quantile=1.5)
    X[:, 2] = 1.0
    with pytest.raises(ValueError, match=r"constant columns \[2\]"):
        parallel_analysis(X)
