"""Dask input (bayespca.chunked) against the in-memory NumPy path, on a distributed LocalCluster.

Reference: the NumPy result of the same estimator on the same rows. Data on
a dyadic grid (small integers, n a power of two) make every sum exact, so
any chunking gives the very bits of the NumPy statistics; there even NUTS,
whose trajectories amplify rounding differences, must give the same draws.
"""

import warnings

import arviz_stats as azs
import numpy as np
import pandas as pd
import pytest

da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

from bayespca import PCA, PPCA, FactorAnalysis  # noqa: E402
from bayespca.statistics import prepare  # noqa: E402

# Row chunks (uneven last chunk) and column chunks (split along both axes).
CHUNKINGS = [(100, -1), (257, (2, 3)), (64, 1)]


@pytest.fixture(scope="module", autouse=True)
def client():
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def _factor_data(n=1000, d=5, k=2, seed=0, integer=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k)) @ rng.normal(size=(k, d)) * 2
    X += rng.normal(size=(n, d)) * np.sqrt(np.linspace(0.2, 0.7, d)) + 10
    return np.round(4 * X) if integer else X


def _close(a, b, tol=1e-10):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_statistics_equal_numpy(chunks):
    X = _factor_data(n=1003)
    p, q = prepare(da.from_array(X, chunks=chunks)), prepare(X)
    assert p.scale == q.scale and p.n == q.n
    _close(p.stats.scatter, q.stats.scatter, 1e-13)
    _close(p.mean, q.mean, 1e-14)
    _close(p.variances, q.variances, 1e-13)


def test_statistics_bitwise_on_exact_data():
    X = _factor_data(n=2048, integer=True)
    p, q = prepare(da.from_array(X, chunks=(300, (2, 3)))), prepare(X)
    assert np.array_equal(p.stats.scatter, q.stats.scatter)
    assert np.array_equal(p.mean, q.mean) and np.array_equal(p.variances, q.variances)


def test_statistics_when_the_first_chunk_misplaces_the_centre():
    # Complete data take one pass about the first chunk's rounded means. Here
    # feature 0 is constant (5.0) in that chunk and varies by 1e-9 after it:
    # about a centre 1e9 sds from its mean the one-pass variance would be
    # rounding error, so the moments must be taken again about the mean.
    X = _factor_data(n=1000)
    X[:, 0] = 5.0
    X[100:, 0] += 1e-9 * np.random.default_rng(3).normal(size=900)
    p, q = prepare(da.from_array(X, chunks=100)), prepare(X)
    _close(p.variances, q.variances, 1e-10)
    _close(p.stats.scatter, q.stats.scatter, 1e-10)
    np.testing.assert_allclose(p.variances[0], q.variances[0], rtol=1e-10)  # _close's atol hides it
    np.testing.assert_allclose(p.variances[0], np.var(X[:, 0]) / p.scale**2, rtol=1e-6)


@pytest.mark.parametrize("fraction", [0.03, 0.15])  # few patterns (grouped), many (> 64: the rows)
def test_missing_patterns_equal_numpy(fraction):
    X = _factor_data(n=900, d=7)
    X[np.random.default_rng(1).random(X.shape) < fraction] = np.nan
    p, q = prepare(da.from_array(X, chunks=(128, (3, 4)))), prepare(X)
    _close(p.mean, q.mean, 1e-14)
    _close(p.variances, q.variances, 1e-13)
    assert np.array_equal(p.n_observed, q.n_observed)
    pp, qp = p.patterns, q.patterns
    assert len(pp.columns) == len(qp.columns)
    for cp, cq, sp, sq in zip(pp.columns, qp.columns, pp.stats, qp.stats, strict=True):
        assert np.array_equal(cp, cq) and sp.n == sq.n
        _close(sp.mean, sq.mean, 1e-13)
        _close(sp.scatter, sq.scatter, 1e-12)
    if qp.X is not None:  # above 64 patterns both keep the rows
        _close(pp.X.compute(), qp.X)
        assert np.array_equal(pp.observed.compute(), qp.observed)


def test_dataframe_keeps_names_and_refuses_bad_input():
    X = _factor_data(n=300)
    frame = pd.DataFrame(X, columns=list("abcde"))
    model = PPCA(2).fit(dd.from_pandas(frame, npartitions=3))
    assert list(model.feature_names_in_) == list("abcde")
    _close(model.components_, PPCA(2).fit(frame).components_)
    bad = X.copy()
    bad[5, 1] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        PPCA(2).fit(da.from_array(bad, chunks=100))
    bad[5, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        PCA(2).fit(da.from_array(bad, chunks=100))


@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize(
    "make", [lambda: PPCA(2), lambda: PPCA(2, method="em"), lambda: FactorAnalysis(2)],
    ids=["ppca-closed-form", "ppca-em", "fa-em"],
)
def test_maximum_likelihood_equals_numpy(make, chunks):
    X = _factor_data(n=1003)
    a, b = make().fit(X), make().fit(da.from_array(X, chunks=chunks))
    for got, want in zip(b.gaussian_, a.gaussian_, strict=True):
        _close(got, want)
    assert b.log_likelihood_ == pytest.approx(a.log_likelihood_, rel=1e-12)


@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("estimator", [PPCA, FactorAnalysis])
def test_em_with_missing_values_keeps_the_rows_on_the_workers(estimator, chunks):
    X = _factor_data(n=1003)
    X[np.random.default_rng(1).random(X.shape) < 0.15] = np.nan
    a = estimator(2, method="em").fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. bayespca.chunked.in_memory's warning that rows travel
        b = estimator(2, method="em").fit(da.from_array(X, chunks=chunks))
    # Both stop within EM's tolerance (1e-9, the estimated distance to the fixed point) of one point.
    for got, want in zip(b.gaussian_, a.gaussian_, strict=True):
        _close(got, want, tol=1e-8)
    assert b.log_likelihood_ == pytest.approx(a.log_likelihood_, rel=1e-10)


@pytest.mark.parametrize("estimator", [PPCA, FactorAnalysis])
def test_svi_from_the_statistics_reaches_maximum_likelihood(estimator):
    # Complete Dask data, all rows per step: SVI reads only the reduced statistics. With flat
    # priors the delta guide's optimum is the ML fit, the reference (closed form / factor_ml).
    X = _factor_data(n=1003)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no rows brought to the client
        fit = estimator(2, method="svi", prior="flat", random_state=0).fit(da.from_array(X, chunks=(300, 5)))
    ml = estimator(2).fit(X)
    assert fit.log_likelihood_ == pytest.approx(ml.log_likelihood_, rel=1e-9)
    _close(fit.get_covariance(), ml.get_covariance(), tol=1e-5)


@pytest.mark.parametrize("estimator", [PPCA, FactorAnalysis])
def test_svi_with_missing_values_from_the_pattern_statistics(estimator):
    # 23 patterns of observed entries: SVI reads each pattern's reduced statistics and no
    # rows come to the client. References: the in-memory fit (its patterns grouped from the
    # rows by NumPy), and with flat priors the observed-data ML that EM reaches, within
    # SVI's stopping rule (relative change of the mean loss < 1e-7).
    X = _factor_data(n=1003)
    X[np.random.default_rng(2).random(X.shape) < 0.1] = np.nan
    chunked = da.from_array(X, chunks=(300, (2, 3)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = estimator(2, method="svi", random_state=0).fit(chunked)
        flat = estimator(2, method="svi", prior="flat", random_state=0).fit(chunked)
    ref = estimator(2, method="svi", random_state=0).fit(X)
    assert fit.log_likelihood_ == pytest.approx(ref.log_likelihood_, rel=1e-12)
    _close(fit.get_covariance(), ref.get_covariance(), 1e-10)
    em = estimator(2, method="em", tol=1e-12, max_iter=100_000).fit(X)
    assert flat.log_likelihood_ == pytest.approx(em.log_likelihood_, rel=1e-7)


def test_svi_minibatches_with_missing_values_drawn_on_the_workers():
    # Minibatches with NaN entries come from rows sampled chunk by chunk (20,000 of the
    # 40,000, likelihood scaled by n / 20,000): no rows travel whole, and the fit's
    # observed-data log-likelihood is within the in-memory minibatch tolerance (1e-3) of
    # the ML that EM reaches.
    rng = np.random.default_rng(6)
    n, d = 40_000, 6
    X = rng.normal(size=(n, 1)) @ rng.normal(size=(1, d)) + 0.5 * rng.normal(size=(n, d)) + 3
    X[rng.random(X.shape) < 0.1] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = PPCA(1, method="svi", guide="normal", prior="flat", batch_size=200, max_iter=3000,
                   random_state=0).fit(da.from_array(X, chunks=(15_000, d)))
    ml = PPCA(1, method="em").fit(X).log_likelihood_
    assert abs(fit.log_likelihood_ - ml) / abs(ml) < 1e-3


def test_svi_with_more_than_64_missing_patterns_brings_the_rows_with_a_warning():
    X = _factor_data(n=1003, d=8)
    X[np.random.default_rng(2).random(X.shape) < 0.3] = np.nan
    with pytest.warns(UserWarning, match="SVI with missing values needs all rows in memory"):
        fit = PPCA(2, method="svi", random_state=0).fit(da.from_array(X, chunks=300))
    assert fit.log_likelihood_ == pytest.approx(PPCA(2, method="svi", random_state=0)
                                                .fit(X).log_likelihood_, rel=1e-12)


@pytest.mark.parametrize("estimator", [PPCA, FactorAnalysis])
def test_nuts_same_draws(estimator):
    # NUTS reads only the statistics. On exact data they are the very bits of
    # the in-memory ones (test_statistics_bitwise_on_exact_data), so the same
    # seed gives the same draws, although NUTS trajectories would amplify
    # any rounding difference.
    X = _factor_data(n=2048, integer=True)
    options = dict(method="nuts", num_warmup=200, num_samples=200, num_chains=2, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short chains: sampling warnings are expected
        ref, fit = (estimator(2, **options).fit(data) for data in (X, da.from_array(X, chunks=(300, (2, 3)))))
    for got, want in ((fit.loadings_samples_, ref.loadings_samples_),
                      (fit.noise_variance_samples_, ref.noise_variance_samples_),
                      (fit.mean_samples_, ref.mean_samples_)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


@pytest.mark.parametrize("solver", ["auto", "covariance", "full", "randomized"])
@pytest.mark.parametrize("standardize", [False, True])
def test_pca_equals_numpy(solver, standardize):
    X = _factor_data(n=1003, d=6, k=3)
    X[:, 3:] = X[:, :3] @ np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 2.0], [1.0, 0.0, 1.0]])  # rank 3
    a = PCA(3, solver="full", standardize=standardize).fit(X)
    b = PCA(3, solver=solver, standardize=standardize, random_state=0).fit(da.from_array(X, chunks=(250, 3)))
    _close(b.components_, a.components_)
    _close(b.explained_variance_, a.explained_variance_)
    _close(b.mean_, a.mean_)


def test_row_level_methods_are_lazy_and_equal_numpy():
    X = _factor_data(n=1003)
    X[np.random.default_rng(2).random(X.shape) < 0.05] = np.nan
    D = da.from_array(X, chunks=(300, (2, 3)))
    model = PPCA(2).fit(X)
    for name in ("transform", "score_samples", "impute"):
        lazy = getattr(model, name)(D)
        assert isinstance(lazy, da.Array) and lazy.chunks[0] == D.chunks[0]
        _close(lazy.compute(), getattr(model, name)(X))
    filled, var = model.impute(D, return_variance=True)
    _close(var.compute(), model.impute(X, return_variance=True)[1])
    assert model.score(D) == pytest.approx(model.score(X), rel=1e-12)
    Z = model.transform(X)
    _close(model.inverse_transform(da.from_array(Z, chunks=(300, 2))).compute(), model.inverse_transform(Z))
    pca = PCA(2).fit(np.nan_to_num(X))
    Xc = da.from_array(np.nan_to_num(X), chunks=(300, 5))
    _close(pca.transform(Xc).compute(), pca.transform(np.nan_to_num(X)))
    _close(pca.score_samples(Xc).compute(), pca.score_samples(np.nan_to_num(X)))


def test_subsampled_loo_agrees_with_full_loo():
    from arviz_stats import loo

    from bayespca.subsampled_loo import loo_subsample

    X = _factor_data(n=2000, d=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PPCA(2, method="nuts", num_warmup=100, num_samples=100, num_chains=1, random_state=0).fit(X)
    full = loo(model.posterior_)
    lazy = loo_subsample(model, da.from_array(X, chunks=(300, 4)), observations=300, seed=0)
    eager = loo_subsample(model, X, observations=300, seed=0)
    assert lazy.elpd == pytest.approx(eager.elpd, rel=1e-12)  # Dask reduction = in-memory values
    assert abs(lazy.elpd - full.elpd) <= lazy.se
    assert abs(lazy.elpd - full.elpd) <= 2 * lazy.subsampling_se
    # 100 draws: PSIS is unreliable above k-hat 1 - 1/log10(100) = 0.5 (Vehtari et al. 2024).
    assert lazy.good_k == eager.good_k == pytest.approx(0.5)


def test_compare_subsampled_flags_k_hat_above_the_threshold_for_the_draws():
    from bayespca.subsampled_loo import SubsampledLOO, compare_subsampled

    rows = np.array([0, 2])
    approximation = np.array([-2.0, -2.5, -3.0, -2.5])
    # k-hat 0.6: reliable at 2000 draws (threshold 0.7), not at 100 (0.5).
    khat, elpd_i = np.array([0.1, 0.6]), np.array([-2.0, -3.0])
    good_k = min(1 - 1 / np.log10(100), 0.7)
    a = SubsampledLOO(-10.0, 1.0, 0.1, 2, 4, khat, rows, elpd_i, approximation, good_k)
    b = a._replace(elpd=-12.0, elpd_i=a.elpd_i - 0.5, approximation=approximation - 0.5,
                   good_k=min(1 - 1 / np.log10(2000), 0.7))
    table = compare_subsampled({"a": a, "b": b})
    assert table["warning"].to_dict() == {"a": True, "b": False}


def _full_loo_of(model, X):
    """PSIS-LOO of every row on the model's own draws: the reference of the subsampled estimate."""
    from arviz_base import from_dict

    from bayespca.posterior import pointwise_log_likelihood

    tree = from_dict({"posterior": {"mu": model.nuts_.mean},
                      "log_likelihood": {"X": pointwise_log_likelihood(model.nuts_, X)}},
                     dims={"mu": ["feature"], "X": ["obs"]})
    return azs.loo(tree, var_name="X", pointwise=True)


def _check_subsampled(result, X, ks):
    """Each k's elpd and its difference to the best within 3 subsampling se of full PSIS-LOO on its draws."""
    full = {k: _full_loo_of(result.models[k], X) for k in ks}
    best = int(result.comparison.index[0])
    for k in ks:
        sub = result.loo[k]
        assert abs(sub.elpd - full[k].elpd) <= 3 * sub.subsampling_se
        exact_diff = float(np.sum(np.asarray(full[k].elpd_i) - np.asarray(full[best].elpd_i)))
        row = result.table.loc[k]
        assert abs(row["elpd_diff"] - exact_diff) <= 3 * row["subsampling_dse"] + 1e-9
        assert row["p"] == pytest.approx(float(np.sum(sub.approximation)) - sub.elpd)
    assert np.isnan(result.table["weight"]).all()


def test_compare_n_components_on_dask_subsamples_loo():
    from bayespca import compare_n_components

    rng = np.random.default_rng(3)  # pPCA data: two components, isotropic noise
    X = rng.normal(size=(2000, 2)) @ rng.normal(size=(2, 4)) * 2 + rng.normal(size=(2000, 4)) + 10
    ks = [1, 2, 3]
    kw = {"num_warmup": 150, "num_samples": 150, "num_chains": 2, "random_state": 0, "progress_bar": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = compare_n_components(da.from_array(X, chunks=(300, 4)), ks, observations=300, **kw)
    assert result.n_components == 2  # the planted number of factors
    _check_subsampled(result, X, ks)
    # The ML criteria from the reduced statistics: BIC from NumPy fits' log-likelihoods.
    for k in ks:
        loglik = PPCA(k).fit(X).log_likelihood_
        params = 4 + 4 * k - k * (k - 1) // 2 + 1
        assert result.table.loc[k, "bic"] == pytest.approx(-2 * loglik + params * np.log(2000), rel=1e-10)
    assert result.table["cv_log_likelihood"].isna().all()  # folds need the rows in memory
    assert result.table["gavish_donoho"].sum() == 1


def test_compare_n_components_subsamples_loo_of_large_numpy_input(monkeypatch):
    import bayespca.subsampled_loo
    from bayespca import compare_n_components

    # Rows x draws above the threshold (lowered here, 2e7 by default) switch to subsampled LOO.
    monkeypatch.setattr(bayespca.subsampled_loo, "SUBSAMPLE_ABOVE", 1000)
    X = _factor_data(n=2000, d=4)
    kw = {"num_warmup": 150, "num_samples": 150, "num_chains": 2, "random_state": 0, "progress_bar": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = compare_n_components(X, [1, 2], observations=300, **kw)
    _check_subsampled(result, X, [1, 2])
    assert np.isfinite(result.table["cv_log_likelihood"]).all()


def test_command_line_reads_parquet_and_zarr(tmp_path, capsys):
    from bayespca.cli import main

    X = _factor_data(n=500)
    frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(X.shape[1])])
    frame.to_csv(tmp_path / "d.csv", index=False)
    frame.to_parquet(tmp_path / "d.parquet")
    da.from_array(X, chunks=128).to_zarr(str(tmp_path / "d.zarr"))
    lines = {}
    for name in ("d.csv", "d.parquet", "d.zarr"):
        command = ["fit", str(tmp_path / name), "--n-components", "2", "--method", "closed_form"]
        assert main(command) in (0, None)
        lines[name] = [line for line in capsys.readouterr().out.splitlines() if "log-likelihood" in line]
    assert lines["d.parquet"] == lines["d.csv"] == lines["d.zarr"]
