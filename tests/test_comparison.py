"""Tests of bayespca.comparison: PSIS-LOO on the marginal likelihood, compare, compare_n_components.

NUTS fits dominate the run time, so the fits are module-scoped and small
(2 chains x 300 draws) and reused across tests.
"""

import contextlib
import copy
import dataclasses
import warnings

import arviz as az
import numpy as np
import pytest
from arviz_base import from_dict
from scipy.special import logsumexp
from sklearn.datasets import load_iris
from sklearn.decomposition._pca import _assess_dimension
from sklearn.model_selection import KFold

from bayespca import PPCA, FactorAnalysis
from bayespca.comparison import (
    KHAT_THRESHOLD,
    ComparisonResult,
    ParetoKWarning,
    _cross_validated,
    compare,
    compare_n_components,
    loo,
)
from bayespca.messages import MORE_DRAWS
from bayespca.posterior import to_datatree
from bayespca.psis import relative_efficiency
from bayespca.selection import parallel_analysis

NUTS = dict(num_warmup=200, num_samples=300, num_chains=2)
# Refits for K-fold: one chain is enough for a held-out density.
REFIT = dict(num_warmup=200, num_samples=300, num_chains=1)


@contextlib.contextmanager
def _quiet():
    """Sampling diagnostics of short test chains are not what these tests check."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _mvn_logpdf(X, cov, mean):
    """Row log-densities of N(mean, cov) by dense Cholesky (independent of the Woodbury code)."""
    chol = np.linalg.cholesky(cov)
    z = np.linalg.solve(chol, (X - mean).T)
    return -0.5 * (z**2).sum(0) - np.log(np.diag(chol)).sum() - 0.5 * X.shape[1] * np.log(2 * np.pi)


def _draw_logpdf(loadings, noise, mean, X):
    """log N(x_i | mu_s, W_s W_s^T + diag(psi_s)) for every draw s and row i, observed entries only."""
    out = np.empty((loadings.shape[0], X.shape[0]))
    observed = ~np.isnan(X)
    for s in range(loadings.shape[0]):
        cov = loadings[s] @ loadings[s].T + np.diag(noise[s])
        for i in range(X.shape[0]):
            o = observed[i]
            out[s, i] = _mvn_logpdf(X[i : i + 1, o], cov[np.ix_(o, o)], mean[s, o])[0]
    return out


@pytest.fixture(scope="module")
def three():
    """n=200, d=8, three strong components, isotropic noise (sigma = 1)."""
    rng = np.random.default_rng(0)
    n, d = 200, 8
    w = np.linalg.qr(rng.normal(size=(d, 3)))[0] * [4.0, 3.0, 2.5]
    return rng.normal(size=(n, 3)) @ w.T + rng.normal(size=(n, d)) + 5.0


@pytest.fixture(scope="module")
def result(three):
    with _quiet():
        return compare_n_components(three, range(1, 7), cv=5, random_state=0, **NUTS)


# ------------------------------------------------------------ choosing k
def test_three_components_win_and_fewer_lose_clearly(result):
    comp = result.comparison
    gap3 = -comp.loc[3, "elpd_diff"]
    # Superfluous components cost about one effective parameter each here, so
    # k = 3..6 differ by 0.5-2 with dse 0.3-0.4 and the order among them moves
    # with the seed (a run at 300 warm-up draws put k = 4 ahead by 0.76, dse 0.40).
    # Differences below 4 are "small" (Sivula et al.; ArviZ's diag_diff), which is
    # the tolerance the recommendation rule uses.
    assert comp.loc[3, "rank"] == 0 or gap3 <= max(comp.loc[3, "dse"], 4.0)
    assert (comp.loc[[4, 5, 6], "elpd_diff"].abs() < 4).all() or comp.loc[3, "rank"] == 0
    for k in (1, 2):
        assert -comp.loc[k, "elpd_diff"] > 2 * comp.loc[k, "dse"]
    assert result.n_components == 3
    assert "max(dse, 4)" in result.rule
    assert isinstance(result, ComparisonResult)
    assert result.table.index.name == "n_components"
    assert list(result.table.index) == [1, 2, 3, 4, 5, 6]
    # The Monte Carlo noise of LOO is small at these Pareto k-hat.
    assert result.table["pareto_k_max"].max() < KHAT_THRESHOLD


def test_table_criteria_match_independent_formulas(three, result):
    X, table = three, result.table
    n, d = X.shape
    ell = np.sort(np.linalg.eigvalsh(np.cov(X.T, bias=True)))[::-1]
    for k in table.index:
        # Minka's evidence: scikit-learn's implementation, eigenvalues with n - 1.
        assert table.loc[k, "minka"] == pytest.approx(_assess_dimension(ell * n / (n - 1), k, n), rel=1e-9)
        # Tipping & Bishop's maximised log-likelihood.
        sigma2 = ell[k:].mean()
        loglik = -n / 2 * (d * np.log(2 * np.pi) + np.log(ell[:k]).sum() + (d - k) * np.log(sigma2) + d)
        n_params = d + d * k - k * (k - 1) / 2 + 1
        assert table.loc[k, "aic"] == pytest.approx(-2 * loglik + 2 * n_params, rel=1e-8)
        assert table.loc[k, "bic"] == pytest.approx(-2 * loglik + n_params * np.log(n), rel=1e-8)
    # Gavish & Donoho with unknown noise: omega(beta) ~ 0.56 b^3 - 0.95 b^2 + 1.82 b + 1.43.
    s = np.linalg.svd(X - X.mean(0), compute_uv=False)
    beta = d / n
    omega = 0.56 * beta**3 - 0.95 * beta**2 + 1.82 * beta + 1.43
    rank = int(np.sum(s > omega * np.median(s)))
    assert rank == 3
    assert table["gavish_donoho"].tolist() == [k == rank for k in table.index]


def test_cross_validation_matches_dense_refits(three):
    X = three[:120]
    ks = [1, 3]
    mean, se = _cross_validated(X, ks, PPCA, 4, 7)
    held = np.empty((len(ks), X.shape[0]))
    for train, test in KFold(4, shuffle=True, random_state=7).split(X):
        xt = X[train]
        vals, vecs = np.linalg.eigh(np.cov(xt.T, bias=True))
        vals, vecs = vals[::-1], vecs[:, ::-1]
        for j, k in enumerate(ks):
            sigma2 = vals[k:].mean()
            w = vecs[:, :k] * np.sqrt(vals[:k] - sigma2)
            held[j, test] = _mvn_logpdf(X[test], w @ w.T + sigma2 * np.eye(X.shape[1]), xt.mean(0))
    np.testing.assert_allclose(mean, held.mean(1), rtol=1e-9)
    np.testing.assert_allclose(se, held.std(1, ddof=1) / np.sqrt(X.shape[0]), rtol=1e-9)



def test_default_folds_on_fewer_rows_than_five_are_leave_one_out(three):
    """Four rows cannot take the default 5 folds: each row is held out in turn (no error about ``cv``)."""
    X = three[:4, :2]  # k = 2 = d: refits on 3 rows keep their noise (see test_bad_arguments)
    with _quiet():
        table = compare_n_components(X, [1, 2], random_state=0, num_warmup=50, num_samples=50,
                                     num_chains=1).table
    held = np.empty(len(X))
    for i in range(len(X)):
        xt = np.delete(X, i, axis=0)
        vals, vecs = np.linalg.eigh(np.cov(xt.T, bias=True))
        sigma2 = vals[0]  # k = 1: the smaller eigenvalue
        w = vecs[:, -1:] * np.sqrt(vals[-1] - sigma2)
        held[i] = _mvn_logpdf(X[i:i + 1], w @ w.T + sigma2 * np.eye(X.shape[1]), xt.mean(0))[0]
    np.testing.assert_allclose(table.loc[1, "cv_log_likelihood"], held.mean(), rtol=1e-9)
    np.testing.assert_allclose(table.loc[1, "cv_se"], held.std(ddof=1) / 2, rtol=1e-9)


# ------------------------------------------------------ LOO vs exact K-fold
def test_loo_agrees_with_exact_kfold(three, result):
    X = three
    folds = 3
    elpd_kfold = np.empty(X.shape[0])
    with _quiet():
        for j, (train, test) in enumerate(KFold(folds, shuffle=True, random_state=1).split(X)):
            refit = PPCA(3, method="nuts", random_state=10 + j, **REFIT).fit(X[train])
            g = refit.nuts_.gaussians()
            ll = _draw_logpdf(np.asarray(g.loadings), np.asarray(g.noise), np.asarray(g.mean), X[test])
            elpd_kfold[test] = logsumexp(ll, axis=0) - np.log(ll.shape[0])
    res = result.loo[3]
    assert abs(float(res.elpd) - elpd_kfold.sum()) < 2 * res.se
    # Refits on 2/3 of the rows predict worse, by about p_loo / 2 (p_loo ~ 30 here), never better.
    paired_se = np.std(np.asarray(res.elpd_i) - elpd_kfold, ddof=1) * np.sqrt(X.shape[0])
    assert -2 * paired_se < float(res.elpd) - elpd_kfold.sum() < res.p + 2 * paired_se


# ---------------------------------------------------- rotation invariance
def test_rotated_loadings_leave_loo_and_reff_unchanged(three, result):
    fit = result.models[3].nuts_
    rng = np.random.default_rng(3)
    chains, draws = fit.loadings.shape[:2]
    # A different orthogonal matrix per chain, drifting along the draws: the
    # non-identified W of an unconstrained sampler (chains disagree, W mixes slowly).
    base = [np.linalg.qr(rng.normal(size=(3, 3)))[0] for _ in range(chains)]
    angle = np.cumsum(rng.normal(scale=0.05, size=(chains, draws)), axis=1)
    rot = np.empty((chains, draws, 3, 3))
    for c in range(chains):
        for s in range(draws):
            a, b = np.cos(angle[c, s]), np.sin(angle[c, s])
            rot[c, s] = base[c] @ np.array([[a, -b, 0], [b, a, 0], [0, 0, 1]])
    rotated = dataclasses.replace(fit, loadings=np.einsum("csdk,cskl->csdl", fit.loadings, rot))
    tree, tree_rot = to_datatree(fit, three), to_datatree(rotated, three)
    ll, ll_rot = (t["log_likelihood"]["X"].values for t in (tree, tree_rot))
    assert ll.shape == (chains, draws, three.shape[0]) == (2, 300, 200)
    np.testing.assert_allclose(ll_rot, ll, rtol=1e-10)
    assert relative_efficiency(ll_rot) == pytest.approx(relative_efficiency(ll), rel=1e-8)
    assert float(loo(tree_rot).elpd) == pytest.approx(float(loo(tree).elpd), rel=1e-10)
    # ArviZ's default reff averages the ESS of every posterior variable: the
    # rotated W drags it far below the invariant one.
    ess_w = az.ess(tree_rot["posterior"]["W"].values, method="mean").mean() / (chains * draws)
    assert ess_w < 0.5 * relative_efficiency(ll)


# ------------------------------------------------- ArviZ interoperability
def test_arviz_compare_accepts_outputs(result):
    table = az.compare({k: result.loo[k] for k in (2, 3)}, round_to="none")
    for k in (2, 3):
        assert table.loc[k, "elpd"] == pytest.approx(result.comparison.loc[k, "elpd"], rel=1e-12)
    # The estimators' DataTrees as they are: ArviZ's own reff only moves the PSIS tail.
    with _quiet():
        raw = az.compare({k: result.models[k].posterior_ for k in (2, 3)}, round_to="none")
    for k in (2, 3):
        assert raw.loc[k, "elpd"] == pytest.approx(result.comparison.loc[k, "elpd"], abs=0.5)
    # compare() adds the worst k-hat to ArviZ's columns.
    for col in ("rank", "elpd", "p", "elpd_diff", "weight", "se", "dse", "warning", "pareto_k_max"):
        assert col in result.comparison.columns
    khat = np.asarray(result.loo[4].pareto_k)
    assert result.comparison.loc[4, "pareto_k_max"] == pytest.approx(khat.max())


# ---------------------------------------------------------- FA vs pPCA
def test_fa_beats_ppca_with_heteroscedastic_noise():
    rng = np.random.default_rng(5)
    n, d = 300, 6
    load = rng.normal(size=(d, 1)) * 1.5
    psi = np.array([0.05, 0.1, 0.3, 1.0, 2.0, 4.0])
    X = rng.normal(size=(n, 1)) @ load.T + rng.normal(size=(n, d)) * np.sqrt(psi)
    with _quiet():
        table = compare(
            {
                "fa": FactorAnalysis(1, method="nuts", random_state=0, **NUTS).fit(X),
                "ppca": PPCA(1, method="nuts", random_state=0, **NUTS).fit(X),
            }
        )
    assert table.index[0] == "fa"
    assert -table.loc["ppca", "elpd_diff"] > 2 * table.loc["ppca", "dse"]


def test_ppca_within_one_dse_of_fa_with_isotropic_noise(three, result):
    with _quiet():
        fa = FactorAnalysis(3, method="nuts", random_state=0, **NUTS).fit(three)
    table = compare({"ppca": result.models[3], "fa": fa})
    assert table.index[0] == "ppca" or -table.loc["ppca", "elpd_diff"] <= table.loc["ppca", "dse"]


# -------------------------------------------------------- missing values
def test_missing_values_use_observed_entries():
    rng = np.random.default_rng(2)
    n, d = 120, 5
    X = rng.normal(size=(n, 2)) @ rng.normal(size=(2, d)) * 2 + rng.normal(size=(n, d))
    X[rng.random((n, d)) < 0.1] = np.nan
    with _quiet():
        res = compare_n_components(X, [1, 2], num_warmup=200, num_samples=300, num_chains=1, random_state=0)
    assert res.table["minka"].isna().all()
    assert not res.table["gavish_donoho"].any()
    assert np.isfinite(res.table[["elpd", "se", "bic", "cv_log_likelihood", "cv_se"]]).all().all()
    # Pointwise: LOO of a row is close to (and below) its in-sample lppd, computed
    # here on the observed block with dense linear algebra.
    fit = res.models[2]
    g = fit.nuts_.gaussians()
    ll = _draw_logpdf(np.asarray(g.loadings), np.asarray(g.noise), np.asarray(g.mean), X)
    lppd = logsumexp(ll, axis=0) - np.log(ll.shape[0])
    elpd_i = np.asarray(res.loo[2].elpd_i)
    assert np.all(elpd_i <= lppd + 1e-9)
    assert np.all(lppd - elpd_i < 1.0)
    partial = np.isnan(X).any(1)
    assert partial.sum() > 20
    np.testing.assert_allclose(
        np.asarray(fit.posterior_["log_likelihood"]["X"].values).reshape(-1, n), ll, rtol=1e-9
    )


def test_a_constant_column_leaves_parallel_analysis_out_not_the_comparison():
    # Parallel analysis works on correlations, which a constant column has none of; it used to
    # raise after every k had been sampled.
    rng = np.random.default_rng(3)
    X = rng.normal(size=(80, 1)) @ [[2.0, 1.0, -1.5]] + rng.normal(size=(80, 3))
    X = np.column_stack([X, np.ones(80)])
    with _quiet():
        res = compare_n_components(X, [1, 2], num_warmup=100, num_samples=100, num_chains=1, random_state=0)
    assert not res.table["parallel_analysis"].any()
    assert np.isfinite(res.table[["elpd", "bic", "cv_log_likelihood"]]).all().all()
    with pytest.raises(ValueError, match=r"constant columns \[3\]"):
        parallel_analysis(X)


def test_the_maximum_likelihood_fits_warnings_name_their_k():
    # Iris, FA: k = 1 has a Heywood case (petal length), which the BIC column's ML fit reports with its
    # k like the NUTS fits' warnings; the cross-validation folds' own fits say nothing.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare_n_components(load_iris().data, [1, 2], model="fa", num_warmup=100, num_samples=100,
                             num_chains=1, random_state=0)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    heywood = [m for m in messages if "Heywood" in m]
    assert heywood and all(m.startswith(("n_components=1: ", "n_components=2: ")) for m in heywood), heywood
    assert sum(m.startswith("n_components=1: features [2]") for m in heywood) == 1, heywood


# ----------------------------------------------------------- Pareto k-hat
def _normal_mean_tree(outlier: float, chains: int, draws: int):
    """A normal-mean model's draws of ``mu`` for 30 standard normal rows and one at ``outlier``, and
    ArviZ's own k-hat of its rows (the importance weights of that row are heavy-tailed)."""
    rng = np.random.default_rng(0)
    x = np.append(rng.normal(size=30), outlier)
    mu = x.mean() + rng.normal(size=(chains, draws)) / np.sqrt(x.size)
    tree = from_dict({"posterior": {"mu": mu}, "log_likelihood": {"x": -0.5 * (x - mu[..., None]) ** 2}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tree, np.asarray(az.loo(tree, pointwise=True).pareto_k)


def test_high_khat_warns_with_fixes():
    # Two short chains and a row 20 sd out.
    tree, khat = _normal_mean_tree(20.0, 2, 100)
    assert khat.max() > KHAT_THRESHOLD
    with pytest.warns(ParetoKWarning, match="K-fold") as record:
        res = loo(tree)
    threshold = 1 - 1 / np.log10(200)  # 2 x 100 draws
    assert f"for {int(np.sum(np.asarray(res.pareto_k) > threshold))} of 31 rows" in str(record[0].message)
    assert "sample_more" not in str(record[0].message)  # a DataTree has no chains to continue


def test_khat_threshold_falls_with_the_number_of_draws():
    # Vehtari et al. (2024): with S draws PSIS is reliable up to k-hat min(1 - 1/log10(S), 0.7), 0.667
    # at S = 1000 (what ArviZ's warning flag reads). A row 6 sd out gives k-hat 0.69 here: above that
    # threshold, below 0.7, so loo warns (the table's warning column and loo's own agree).
    tree, khat = _normal_mean_tree(6.0, 4, 250)
    assert 1 - 1 / np.log10(1000) < khat.max() < KHAT_THRESHOLD
    with pytest.warns(ParetoKWarning, match=r"k-hat > 0\.67 \(the threshold for 1000 draws\) for 1 of 31"):
        loo(tree)


def test_rows_psis_cannot_handle_are_scored_by_exact_refits():
    """An outlying row gets k-hat > 0.7; loo refits without it and scores it exactly.

    The refit is the fit's chains moved to the other rows (``fit_warm``, whose
    posterior a test of its own checks against new fits); the score is
    computed here from scratch: ``log mean_s N(x_i | mu_s, C_s)`` over its
    draws by dense Cholesky. The user's fit is left as it was.
    """
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 1)) @ [[2.0, 1.0, -1.0, 0.5]] + 0.5 * rng.normal(size=(40, 4))
    X[7] += [25.0, -25.0, 25.0, -25.0]
    model = PPCA(1, method="nuts", random_state=0, **REFIT)
    with _quiet(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ParetoKWarning)
        model.fit(X)
    with pytest.warns(ParetoKWarning) as record:
        first = loo(model, max_refits=0)  # the k-hat loo itself acts on
    (message,) = [str(w.message) for w in record if w.category is ParetoKWarning]
    assert message.endswith(MORE_DRAWS)  # the user's own fit: its chains can run on
    khat, threshold = np.asarray(first.pareto_k), min(1 - 1 / np.log10(first.n_samples), 0.7)
    bad = np.flatnonzero(khat > threshold)
    assert 7 in bad and bad.size <= 3
    draws = model.loadings_samples_
    with _quiet(), warnings.catch_warnings():
        warnings.simplefilter("error", ParetoKWarning)  # the refits leave no row for it
        res = loo(model)
    assert np.all(np.asarray(res.pareto_k) <= threshold)
    assert model.loadings_samples_ is draws and model.posterior_["observed_data"]["X"].shape == X.shape
    for i in bad:
        with _quiet():
            refit = copy.copy(model).fit_warm(np.delete(X, i, axis=0))
        assert float(np.asarray(res.elpd_i)[i]) == pytest.approx(_row_score(refit, X[i]), rel=1e-10)
    assert float(res.elpd) == pytest.approx(float(np.sum(np.asarray(res.elpd_i))), rel=1e-12)

    # Moved chains that diverge are not trusted: those rows are refitted anew (same options and seed).
    def diverging(self, rows):
        moved = real_warm(self, rows)
        stats = moved.sample_stats_
        moved.sample_stats_ = {**stats, "diverging": np.ones_like(stats["diverging"])}
        return moved

    real_warm = PPCA.fit_warm
    with _quiet(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(PPCA, "fit_warm", diverging)
        anew = loo(model)
    for i in bad:
        with _quiet():
            refit = PPCA(1, method="nuts", random_state=0, **REFIT).fit(np.delete(X, i, axis=0))
        assert float(np.asarray(anew.elpd_i)[i]) == pytest.approx(_row_score(refit, X[i]), rel=1e-10)


def _row_score(refit, row):
    """``log mean_s N(row | mu_s, W_s W_s^T + sigma_s^2 I)`` over a pPCA(1) fit's draws, by dense Cholesky."""
    d = row.size
    ll = _draw_logpdf(
        refit.loadings_samples_.reshape(-1, d, 1),
        np.repeat(refit.noise_variance_samples_.reshape(-1, 1), d, axis=1),
        refit.mean_samples_.reshape(-1, d),
        row[None],
    )[:, 0]
    return logsumexp(ll) - np.log(ll.size)


def test_loo_past_the_pointwise_limit_says_what_it_costs_and_scores_the_rows(three, monkeypatch):
    """posterior_ leaves the draws x rows values out above _MAX_POINTWISE (2e7: 3.2 GB at 200,000
    rows); loo forms them then, after a warning that names their size and the subsampled LOO."""
    import bayespca.probabilistic as probabilistic

    X = three[:50]
    monkeypatch.setattr(probabilistic, "_MAX_POINTWISE", 10)
    with _quiet():
        model = PPCA(1, method="nuts", random_state=0, progress_bar=False, **NUTS).fit(X)
    assert "log_likelihood" not in model.posterior_.children
    with pytest.warns(UserWarning, match=r"all 50 rows needs their 3e\+04 draws x rows .*loo_subsample"):
        got = loo(model, max_refits=0)
    g = model.nuts_.gaussians()
    pointwise = _draw_logpdf(np.asarray(g.loadings), np.asarray(g.noise), np.asarray(g.mean), X)
    tree = from_dict({"posterior": {"sigma2": model.noise_variance_samples_},
                      "log_likelihood": {"X": pointwise.reshape(2, 300, 50)}})
    assert float(got.elpd) == pytest.approx(float(loo(tree, max_refits=0).elpd), rel=1e-10)


def test_compare_n_components_passes_max_refits_to_each_loo():
    # The outlying row of the test above gives PSIS k-hat > 0.7 at every k; with max_refits=0 no k is
    # refitted: each k's elpd is PSIS-LOO of its own fit, and its warning names the option.
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 1)) @ [[2.0, 1.0, -1.0, 0.5]] + 0.5 * rng.normal(size=(40, 4))
    X[7] += [25.0, -25.0, 25.0, -25.0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = compare_n_components(X, [1, 2], cv=2, max_refits=0, random_state=0, **REFIT)
    pareto = [str(w.message) for w in caught if w.category is ParetoKWarning]
    assert any(m.startswith("n_components=1: Pareto") and "more than max_refits=0 rows" in m for m in pareto)
    with _quiet():
        unrefitted, refitted = loo(res.models[1], max_refits=0), loo(res.models[1])
    assert res.table.loc[1, "elpd"] == pytest.approx(float(unrefitted.elpd), rel=1e-12)
    assert abs(float(refitted.elpd) - float(unrefitted.elpd)) > 1e-3  # the refits would have changed it
    with pytest.raises(ValueError, match="max_refits"):
        compare_n_components(X, [1, 2], max_refits=-1)


def test_recommendation_at_the_edge_of_the_range_warns(three):
    with _quiet(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = compare_n_components(three, [1, 2], cv=2, random_state=0, **REFIT)
    assert res.n_components == 2  # three strong components: two are clearly better than one
    assert any("largest offered" in str(w.message) and "up to 8" in str(w.message) for w in caught)


# ----------------------------------------------------------------- errors
def test_svi_fits_are_refused_with_the_fix(three):
    svi = PPCA(2, method="svi", guide="normal", max_iter=100, random_state=0).fit(three)
    with pytest.raises(ValueError, match="method='nuts'"):
        loo(svi)
    with pytest.raises(ValueError, match="method='nuts'"):
        compare_n_components(three, [1, 2], method="svi")


def test_bad_arguments(three, result):
    ml = PPCA(2).fit(three)
    with pytest.raises(ValueError, match=r"^model has no posterior \(method_='closed_form'\); fit it"):
        loo(ml)
    with pytest.raises(ValueError, match=r"^models\['ml'\] has no posterior"):
        compare({"ml": ml, "k=3": result.models[3]})
    with pytest.raises(ValueError, match="at least two"):
        compare({"k=3": result.models[3]})
    with pytest.raises(TypeError, match="models\\['x'\\]"):
        compare({"x": 3, "y": result.models[3]})
    with pytest.raises(ValueError, match="method must be one of"):
        compare(result.loo, method="bma")
    with pytest.raises(ValueError, match="same rows"):
        compare({"a": result.loo[3], "b": loo(to_datatree(result.models[3].nuts_, three[:50]))})
    with pytest.raises(ValueError, match="model must be one of"):
        compare_n_components(three, model="pca")
    with pytest.raises(ValueError, match=r"n_components must be .*\[1, 8\]"):
        compare_n_components(three, [1, 9])  # pPCA: k <= d, one rule with PPCA.fit
    with pytest.raises(ValueError, match=r"n_components must be .*\[1, 7\]"):
        compare_n_components(three, [1, 8], model="fa")
    with pytest.raises(TypeError, match="n_components must be"):
        compare_n_components(three, 3)
    with pytest.raises(ValueError, match=r"no one list serves n_components \[1, 2\]; got anchors=\[0, 1\]"):
        compare_n_components(three, [1, 2], prior="horseshoe", anchors=[0, 1])
    with pytest.raises(ValueError, match="cv must be"):
        compare_n_components(three, [1, 2], cv=1)
    with pytest.raises(ValueError, match="cv must be .* <= 4; got 5"):
        compare_n_components(three[:4, :2], [1, 2], cv=5)  # asked for: refused, not clipped
    with pytest.raises(ValueError, match="at least 2 samples .* got 1"):
        compare_n_components(three[:1], [1, 2])
    assert np.linalg.matrix_rank(three[:3] - three[:3].mean(0)) == 2  # a LOO refit's rows on 4 rows
    with pytest.raises(ValueError, match=r"n_components \[2, 3\]: an exact LOO refit fits 3 rows"):
        compare_n_components(three[:4], [1, 2, 3])
    with pytest.raises(ValueError, match=r"X has 4 samples: the default candidates leave k = \[1\]"):
        compare_n_components(three[:4])  # 1..6 less 2..6: the default is clipped, then found too few
    with pytest.raises(TypeError, match="Unknown fit option"):
        compare_n_components(three, [1, 2], num_draws=10)
    with pytest.raises(ValueError, match="padded_components"):
        compare_n_components(three, [1, 3], padded_components=2)
