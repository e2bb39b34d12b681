"""Regularised horseshoe on the loadings: PPCA / FactorAnalysis with prior="horseshoe"."""

import itertools
import warnings

import numpy as np
import pandas as pd
import pytest

from bayespca.inference.contract import ModelSpec
from bayespca.inference.nuts import fit_nuts
from bayespca.inference.svi import fit_svi
from bayespca.posterior import SamplingWarning
from bayespca.priors import Horseshoe, Priors, horseshoe_loadings
from bayespca.probabilistic import PPCA, FactorAnalysis
from bayespca.statistics import prepare

N, D, K, NOISE_SD = 200, 20, 2, 0.5


@pytest.fixture(scope="module")
def data():
    """d = 20, k = 2, 6 non-zero loadings per column on disjoint features (30% non-zero)."""
    rng = np.random.default_rng(0)
    w = np.zeros((D, K))
    for col, rows in enumerate((slice(0, 6), slice(6, 12))):
        w[rows, col] = rng.choice([-1.0, 1.0], 6) * rng.uniform(1.0, 2.0, 6)
    X = rng.normal(size=(N, K)) @ w.T + NOISE_SD * rng.normal(size=(N, D)) + 3.0
    return X, w


@pytest.fixture(scope="module")
def ppca_nuts(data):
    X, _ = data
    model = PPCA(
        K,
        method="nuts",
        prior="horseshoe",
        num_warmup=300,
        num_samples=300,
        num_chains=2,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # two short chains
        return model.fit(X)


@pytest.fixture(scope="module")
def fa_svi(data):
    X, _ = data
    return FactorAnalysis(K, method="svi", prior="horseshoe", guide="normal", random_state=0).fit(X)


def _match_truth(estimate, truth):
    """The signed column permutation of ``estimate`` (d, k) closest to ``truth`` (d, k)."""
    best = None
    for perm in itertools.permutations(range(truth.shape[1])):
        cand = estimate[:, list(perm)]
        signs = np.where(np.sum(cand * truth, axis=0) < 0, -1.0, 1.0)
        err = np.sum((cand * signs - truth) ** 2)
        if best is None or err < best[0]:
            best = (err, list(perm), signs)
    return best[1], best[2]


def _precision_recall(selected, truth):
    hits = np.sum(selected & truth)
    return hits / max(selected.sum(), 1), hits / truth.sum()


@pytest.mark.parametrize("fixture", ["ppca_nuts", "fa_svi"])
def test_support_recovered(fixture, data, request):
    model = request.getfixturevalue(fixture)
    _, w = data
    perm, _ = _match_truth(model.loadings_, w)
    selected = model.support_[:, perm]
    precision, recall = _precision_recall(selected, w != 0)
    print(f"{fixture}: precision {precision:.3f}, recall {recall:.3f}")
    assert precision >= 0.9
    assert recall >= 0.9


@pytest.mark.parametrize("fixture", ["ppca_nuts", "fa_svi"])
def test_zero_loadings_intervals_contain_zero(fixture, data, request):
    model = request.getfixturevalue(fixture)
    _, w = data
    perm, _ = _match_truth(model.loadings_, w)
    lo, hi = model.loadings_interval_[:, perm, 0], model.loadings_interval_[:, perm, 1]
    zeros = w == 0
    assert np.all((lo[zeros] <= 0) & (hi[zeros] >= 0))
    # support_ is exactly "the 90% interval excludes 0".
    assert np.array_equal(model.support_[:, perm], (lo > 0) | (hi < 0))


@pytest.mark.parametrize("fixture", ["ppca_nuts", "fa_svi"])
def test_nonzero_loadings_near_truth(fixture, data, request):
    model = request.getfixturevalue(fixture)
    X, w = data
    perm, signs = _match_truth(model.loadings_, w)
    estimate = model.loadings_[:, perm] * signs
    nonzero = w != 0
    # Reference: least squares of each feature on the true factor scores is not
    # available (z is latent), so compare with the truth at a tolerance of a few
    # sampling standard errors (sd of a loading ~ sqrt(psi / n) ~ 0.035, plus the
    # error of the loading's scale, ~ |w| / sqrt(2 n) ~ 0.1 for |w| = 2).
    err = np.abs(estimate - w)
    assert np.max(err[nonzero]) < 0.3
    assert np.median(err[nonzero] / np.abs(w[nonzero])) < 0.1
    # Zeros shrunk to 0: within a few standard errors of the noise.
    assert np.max(err[~nonzero]) < 4 * NOISE_SD / np.sqrt(N)


@pytest.mark.parametrize("fixture", ["ppca_nuts", "fa_svi"])
def test_inclusion_separates_support(fixture, data, request):
    model = request.getfixturevalue(fixture)
    _, w = data
    perm, _ = _match_truth(model.loadings_, w)
    inclusion = model.inclusion_[:, perm]
    assert inclusion.shape == (D, K)
    # Every true loading is ranked above every zero (AUC = 1), and the kept ones are near 1.
    assert inclusion[w != 0].min() > inclusion[w == 0].max()
    assert inclusion[w != 0].min() > 0.95


def test_summary_reports_inclusion(ppca_nuts, data):
    """The free entries' inclusion in the table. The triangle's one structural zero at k = 2 is the
    first anchor's loading on the second column; that anchor is the row of largest norm of the ML
    loadings (scikit-learn's PCA: ``V (Lambda - sigma^2)^{1/2}``), neither in the table nor included."""
    from sklearn.decomposition import PCA

    X, _ = data
    pca = PCA(K).fit(X)
    ml = pca.components_.T * np.sqrt(pca.explained_variance_ * (N - 1) / N - pca.noise_variance_)
    anchor = int(np.argmax(np.linalg.norm(ml, axis=1)))
    table = ppca_nuts.summary()
    free = [(j, c) for j in range(D) for c in range(K) if (j, c) != (anchor, 1)]
    got = table.loc[[f"inclusion[{j}, {c}]" for j, c in free], "mean"].to_numpy(float)
    np.testing.assert_allclose(got, [ppca_nuts.inclusion_[j, c] for j, c in free], atol=1e-2)
    assert f"inclusion[{anchor}, 1]" not in table.index and f"W[{anchor}, 1]" not in table.index
    assert ppca_nuts.identification_ == "lower_triangular"
    assert ppca_nuts.inclusion_[anchor, 1] == 0.0 and ppca_nuts.loadings_[anchor, 1] == 0.0


def test_tau0_gives_p0_expected_nonzeros():
    """Piironen & Vehtari: at tau = tau_0 and no slab, E[sum_j (1 - kappa_j)] = p0.

    With lambda ~ C+(0, 1) and a = n tau^2 / sigma^2, E[1 - kappa] =
    sqrt(a) / (1 + sqrt(a)); at tau_0 = p0 / (d - p0) sigma / sqrt(n) that is p0 / d.
    """
    rng = np.random.default_rng(1)
    m, d, p0, n, sigma2 = 100_000, 20, 5.0, 200, 0.3
    local = np.abs(rng.standard_cauchy((m, d, 1)))
    noise = np.full((m, d), sigma2)
    w, kappa = horseshoe_loadings(
        np.ones((m, d, 1)), local, np.ones(m), np.full(m, 1e12), noise, Horseshoe(p0, 1.0), n
    )
    m_eff = np.asarray(1.0 - kappa).sum(axis=(1, 2))
    assert m_eff.mean() == pytest.approx(p0, abs=4 * m_eff.std() / np.sqrt(m))
    # Regularisation: lambda~^2 = c^2 lambda^2 / (c^2 + tau^2 lambda^2), so W = tau lambda~ z.
    tau, c2 = p0 / (d - p0) * np.sqrt(sigma2 / n), 2.0**2
    w2 = horseshoe_loadings(np.ones((d, 1)), local[0], 1.0, 1.0, np.full(d, sigma2), Horseshoe(p0, 2.0), n)[0]
    expected = tau * np.sqrt(c2 * local[0] ** 2 / (c2 + tau**2 * local[0] ** 2))
    assert np.allclose(np.asarray(w2), expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("prior", "match"),
    [
        (
            Priors(loadings=Horseshoe(p0=0)),
            "p0 must be a number in \\(0, n_features\\) = \\(0, 20\\) or None; got 0",
        ),
        (Priors(loadings=Horseshoe(p0=20)), "p0 must be .*got 20"),
        (Priors(loadings=Horseshoe(p0="many")), "p0 must be .*got 'many'"),
        ({"loadings": Horseshoe(slab_scale=-1.0)}, "slab_scale must be a finite number > 0.*got -1.0"),
        (Priors(loadings=Horseshoe(slab_df=0.0)), "slab_df must be a finite number > 0; got 0.0"),
        ("horse", "prior must be None, 'flat', 'ard', 'horseshoe'.*got 'horse'"),
    ],
)
@pytest.mark.parametrize("fit", ["nuts", "svi"])
def test_bad_prior_arguments(prior, match, fit, data):
    X, _ = data
    with pytest.raises(ValueError, match=match):
        if fit == "nuts":
            fit_nuts(prepare(X), ModelSpec("isotropic", K, prior), num_warmup=1, num_samples=1, num_chains=1)
        else:
            fit_svi(prepare(X), ModelSpec("isotropic", K, prior), guide="normal", num_steps=1)


def test_bad_combinations(data):
    X, _ = data
    needs = "prior='horseshoe' needs method='nuts' or 'svi'.*method='closed_form'"
    with pytest.raises(ValueError, match=needs):
        PPCA(K, prior="horseshoe").fit(X)
    with pytest.raises(ValueError, match="guide must be 'normal' or 'lowrank'.*got guide='delta'"):
        PPCA(K, method="svi", prior="horseshoe").fit(X)
    with pytest.raises(ValueError, match="one of \\['lower_triangular', 'none'\\].*got 'polar'"):
        PPCA(K, method="nuts", prior="horseshoe", identification="polar").fit(X)
    with pytest.raises(ValueError, match="rotation must be None with prior='horseshoe'.*'varimax'"):
        FactorAnalysis(K, method="svi", guide="normal", prior="horseshoe", rotation="varimax").fit(X)


def test_nuts_potential_matches_numpyro_model(ppca_nuts, data):
    """The runner's reparameterised model (loadings the data pin down sampled centred, in
    Laplace-free unit coordinates) and NumPyro's NUTS on the plain model function (all
    loadings non-centred) target the same posterior, the model given the anchors of the
    ML loadings (here from scikit-learn) as the runner pivots them."""
    import functools

    import jax
    from numpyro.infer import MCMC, NUTS
    from sklearn.decomposition import PCA

    from bayespca.models import pivot_anchors, ppca
    from bayespca.statistics import sufficient_statistics

    X, _ = data
    pca = PCA(K).fit(X)
    ml = pca.components_.T * np.sqrt(pca.explained_variance_ * (N - 1) / N - pca.noise_variance_)
    anchors = pivot_anchors(ml, np.full(D, pca.noise_variance_))
    model = functools.partial(ppca, n_components=K, prior="horseshoe", anchors=anchors)
    mcmc = MCMC(NUTS(model, target_accept_prob=0.95), num_warmup=300, num_samples=300, progress_bar=False)
    mcmc.run(jax.random.key(3), suff_stats=sufficient_statistics(X))
    draws = mcmc.get_samples()
    reference = np.asarray(draws["W"]).mean(0)
    perm, signs = _match_truth(reference, ppca_nuts.loadings_)
    assert np.max(np.abs(reference[:, perm] * signs - ppca_nuts.loadings_)) < 0.05
    sigma2 = np.asarray(draws["sigma"]) ** 2
    assert sigma2.mean() == pytest.approx(ppca_nuts.noise_variance_samples_.mean(), rel=0.02)
    inclusion = 1.0 - np.asarray(draws["kappa"]).mean(0)[:, perm]
    assert np.max(np.abs(inclusion - ppca_nuts.inclusion_)) < 0.15


def test_horseshoe_prior_forms_resolve_alike(data):
    """"horseshoe", a bare Horseshoe and Priors(loadings=Horseshoe()) give the same defaults:
    p0 = d / 4 and the slab at the root mean column sd of the data."""
    from bayespca.priors import as_priors, data_scales, resolve

    X, _ = data
    expected = Horseshoe(D / 4, float(np.sqrt(X.var(axis=0).mean())), 4.0)
    for prior in ("horseshoe", Horseshoe(), Priors(loadings=Horseshoe()), {"loadings": Horseshoe()}):
        got = resolve(as_priors(prior), "isotropic", data_scales(X)).loadings
        assert got.p0 == expected.p0 and got.slab_df == expected.slab_df
        assert float(got.slab_scale) == pytest.approx(expected.slab_scale, rel=1e-12)


def test_horseshoe_nuts_default_target_rarely_diverges(ppca_nuts):
    """The estimators' default target under the horseshoe is 0.99, where its funnels rarely diverge.

    On these data, 2 chains x 300 draws: seeds 0-15 gave 0-2 divergent transitions of 600 at 0.99
    (two builds whose rounding differs: which seed diverges changes, the rate does not), against
    2-34 at 0.9 and 21-48 at 0.8 (seeds 0-5).
    """
    assert ppca_nuts._target_accept_prob() == 0.99
    assert int(ppca_nuts.sample_stats_["diverging"].sum()) <= 2


def test_anchors_given_are_the_structural_zeros_and_reach_the_loo_refits(data):
    """Anchors a user names are the triangle's: ``W_{p_i l} = 0`` for ``l > i`` exactly, by NUTS
    and SVI, and reported as ``anchors_``; exact LOO refits keep the fit's anchors rather than
    pivot again on fewer rows (a different model where the pivot's choice is close)."""
    from bayespca.comparison import _Refit

    X, _ = data
    quick = {"num_warmup": 100, "num_samples": 100, "num_chains": 1, "random_state": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # one short chain
        nuts = PPCA(K, method="nuts", prior="horseshoe", anchors=[5, 11], **quick).fit(X)
    svi = FactorAnalysis(K, method="svi", prior="horseshoe", guide="normal", anchors=(11, 5),
                         random_state=0).fit(X)
    assert nuts.anchors_ == (5, 11) and svi.anchors_ == (11, 5)
    assert nuts.identification_ == svi.identification_ == "lower_triangular"  # by NUTS and SVI alike
    assert np.all(nuts.loadings_samples_[..., 5, 1] == 0.0) and svi.loadings_[11, 1] == 0.0
    assert np.count_nonzero(nuts.loadings_ == 0.0) == 1 and np.abs(nuts.loadings_[11, 1]) > 0.5

    # A DataFrame's column names stand for their indices (in any 1-d container): the same fit.
    frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])])
    for given in (["f11", "f5"], pd.Index([11, 5]), np.array(["f11", 5], dtype=object)):
        named = FactorAnalysis(K, method="svi", prior="horseshoe", guide="normal", anchors=given,
                               random_state=0).fit(frame)
        assert named.anchors_ == (11, 5)
        np.testing.assert_array_equal(named.loadings_, svi.loadings_)

    pivoted = PPCA(K, method="nuts", prior="horseshoe", **quick)
    pivoted.anchors_ = (7, 2)  # as if its fit had chosen them
    refit = _Refit.__new__(_Refit)  # the refit step alone, without a tree
    refit.model = pivoted
    assert refit.sample(X[1:]).anchors_ == (7, 2)
