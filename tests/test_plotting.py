"""Tests of bayespca.plotting: the drawn artists carry independently computed numbers."""

import types
import warnings

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import EllipseCollection  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Annotation  # noqa: E402
from sklearn.datasets import load_wine  # noqa: E402
from sklearn.decomposition import PCA as SkPCA  # noqa: E402
from sklearn.decomposition import KernelPCA as SkKernelPCA  # noqa: E402

from bayespca import PCA, PPCA, FactorAnalysis, KernelPCA, select_n_components  # noqa: E402
from bayespca.plotting import (  # noqa: E402
    plot_biplot,
    plot_comparison,
    plot_kernel_pca,
    plot_latent,
    plot_loadings,
    plot_noise,
    plot_scree,
    plot_trace,
)

N, D, K = 60, 5, 2
NAMES = ["a", "b", "c", "d", "e"]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    W = rng.standard_normal((D, K)) * [2.0, 1.0]
    X = rng.standard_normal((N, K)) @ W.T + rng.standard_normal((N, D)) * np.sqrt([0.3, 0.4, 0.5, 0.6, 0.7])
    return pd.DataFrame(X + [1.0, -2.0, 0.0, 3.0, 0.5], columns=NAMES)


def _nuts(cls, X):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sampler warnings of a deliberately tiny run
        return cls(K, method="nuts", num_chains=2, num_warmup=100, num_samples=100, random_state=0).fit(X)


@pytest.fixture(scope="module")
def ppca_nuts(data):
    return _nuts(PPCA, data)


@pytest.fixture(scope="module")
def fa_nuts(data):
    return _nuts(FactorAnalysis, data)


def _ml_ppca_numpy(X):
    """Tipping & Bishop's closed form with numpy: W = V_k (L_k - s2 I)^1/2, sign: largest entry positive."""
    Xc = X - X.mean(0)
    evals, evecs = np.linalg.eigh(Xc.T @ Xc / len(X))
    evals, evecs = evals[::-1], evecs[:, ::-1]
    s2 = evals[K:].mean()
    W = evecs[:, :K] * np.sqrt(evals[:K] - s2)
    W *= np.sign(W[np.argmax(np.abs(W), axis=0), np.arange(K)])
    return W, s2


def _ellipse_axes(cov2, prob):
    r2 = -2 * np.log(1 - prob)
    evals = np.linalg.eigvalsh(cov2)
    return 2 * np.sqrt(r2 * evals[1]), 2 * np.sqrt(r2 * evals[0])


# ------------------------------------------------------------------ scree
def test_scree_from_pca_bars_are_eigenvalues_and_mle_matches_sklearn(data):
    X = data.to_numpy()
    ax = plot_scree(PCA().fit(X), criteria=("mle",))
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    expected = np.linalg.eigvalsh(np.cov(X, rowvar=False))[::-1]
    np.testing.assert_allclose([b.get_height() for b in bars], expected, rtol=1e-10)
    k_mle = SkPCA(n_components="mle").fit(X).n_components_
    (line,) = ax.lines
    assert line.get_label() == f"mle: k = {k_mle}"
    np.testing.assert_allclose(line.get_xdata(), k_mle + 0.5)


def test_scree_from_selection_marks_its_rule(data):
    X = data.to_numpy()
    sel = select_n_components(X, "gavish-donoho")
    ax = plot_scree(sel, criteria=())
    # Gavish & Donoho's cubic approximation of omega(beta), a reference independent of the library's
    # numerical Marchenko-Pastur median.
    beta = D / N
    omega = 0.56 * beta**3 - 0.95 * beta**2 + 1.82 * beta + 1.43
    s = np.linalg.svd(X - X.mean(0), compute_uv=False)
    k = int(np.sum(s > omega * np.median(s)))
    assert [line.get_label() for line in ax.lines] == [f"gavish-donoho: k = {k}"]
    np.testing.assert_allclose([p.get_height() for p in ax.patches], s**2 / (N - 1), rtol=1e-10)


def test_scree_of_truncated_pca_shows_kept_eigenvalues_without_rules(data):
    X = data.to_numpy()
    ax = plot_scree(PCA(2).fit(X))
    expected = np.linalg.eigvalsh(np.cov(X, rowvar=False))[::-1][:2]
    np.testing.assert_allclose([p.get_height() for p in ax.patches], expected, rtol=1e-10)
    assert len(ax.lines) == 0


def test_scree_rejects_unknown_rule_and_source(data):
    with pytest.raises(ValueError, match="criteria.*'nope'"):
        plot_scree(PCA().fit(data), criteria=("nope",))
    with pytest.raises(TypeError, match="source"):
        plot_scree(np.ones(3))


# ----------------------------------------------------------------- biplot
def _arrows(ax):
    return [t for t in ax.texts if isinstance(t, Annotation) and t.arrow_patch is not None]


def test_biplot_pca_arrows_and_scores_match_sklearn(data):
    ax = plot_biplot(PCA(2).fit(data), data, arrow_scale=1.0)
    sk = SkPCA(2).fit(data.to_numpy())
    arrows = _arrows(ax)
    assert len(arrows) == D
    np.testing.assert_allclose([a.xy for a in arrows], sk.components_.T * np.sqrt(sk.explained_variance_),
                               atol=1e-10)
    assert [t.get_text() for t in ax.texts if not isinstance(t, Annotation)] == NAMES
    np.testing.assert_allclose(ax.collections[0].get_offsets(), sk.transform(data.to_numpy()), atol=1e-10)


def test_biplot_ppca_arrows_are_ml_loadings(data):
    W, _ = _ml_ppca_numpy(data.to_numpy())
    ax = plot_biplot(PPCA(K).fit(data), data, components=(1, 0), arrow_scale=2.0)
    np.testing.assert_allclose([a.xy for a in _arrows(ax)], 2.0 * W[:, [1, 0]], atol=1e-8)


def test_biplot_default_scale_reaches_90_percent_of_scores(data):
    model = PCA(2).fit(data)
    ax = plot_biplot(model, data)
    tips = np.array([a.xy for a in _arrows(ax)])
    scores = model.transform(data)
    np.testing.assert_allclose(np.linalg.norm(tips, axis=1).max(), 0.9 * np.abs(scores).max())


def test_biplot_colours_by_category_and_by_number(data):
    groups = np.where(data["a"].to_numpy() > data["a"].median(), "high", "low")
    ax = plot_biplot(PCA(2).fit(data), data, labels=groups)
    legend = ax.get_legend()
    assert sorted(t.get_text() for t in legend.get_texts()) == ["high", "low"]
    sizes = sorted(len(c.get_offsets()) for c in ax.collections)
    assert sizes == sorted([int(np.sum(groups == "high")), int(np.sum(groups == "low"))])
    ax = plot_biplot(PCA(2).fit(data), data, labels=data["a"].to_numpy())
    np.testing.assert_allclose(ax.collections[0].get_array(), data["a"].to_numpy())
    assert len(ax.figure.axes) == 2  # the colour bar


def test_biplot_errors(data):
    with pytest.raises(ValueError, match=r"components.*\(0, 0\)"):
        plot_biplot(PCA(2).fit(data), data, components=(0, 0))
    with pytest.raises(ValueError, match=r"labels.*\(60,\).*\(3,\)"):
        plot_biplot(PCA(2).fit(data), data, labels=[1, 2, 3])
    with pytest.raises(TypeError, match="KernelPCA"):
        plot_biplot(KernelPCA(2).fit(data), data)


@pytest.fixture(params=["ppca_ml", "fa_ml", "fa_promax", "ppca_nuts", "fa_nuts"])
def any_model(request, data):
    if request.param.endswith("nuts"):
        return request.getfixturevalue(request.param)
    if request.param == "ppca_ml":
        return PPCA(K).fit(data)
    return FactorAnalysis(K, rotation=None if request.param == "fa_ml" else "promax").fit(data)


def test_biplot_and_latent_for_each_model_kind(any_model, data):
    ax = plot_biplot(any_model, data, arrow_scale=1.0)
    arrows = _arrows(ax)
    assert len(arrows) == D
    if getattr(any_model, "nuts_", None) is None:
        W = any_model.loadings_
    else:  # the posterior mean of the draws, rotated like the point estimate
        W = any_model.loadings_samples_.mean((0, 1)) @ getattr(any_model, "rotation_matrix_", np.eye(K))
    np.testing.assert_allclose([a.xy for a in arrows], W, rtol=1e-10, atol=1e-12)
    ax = plot_latent(any_model, data, max_ellipses=None)
    assert len(_ellipses(ax)) == N
    np.testing.assert_allclose([e.center for e in _ellipses(ax)], any_model.transform(data), atol=1e-12)


def test_latent_factor_analysis_ellipses_from_numpy(data):
    fa = FactorAnalysis(K, rotation="promax").fit(data)
    W, psi, R = fa.gaussian_.loadings, fa.noise_variance_, fa.rotation_matrix_
    cov = np.linalg.inv(np.eye(K) + W.T @ (W / psi[:, None]))
    r_inv = np.linalg.inv(R)
    width, height = _ellipse_axes(r_inv @ cov @ r_inv.T, 0.9)  # factors rotated: z_rot = R^-1 z
    ax = plot_latent(fa, data, max_ellipses=None)
    np.testing.assert_allclose([e.width for e in _ellipses(ax)], width, rtol=1e-8)
    np.testing.assert_allclose([e.height for e in _ellipses(ax)], height, rtol=1e-8)
    assert ax.get_xlabel() == "factor 1"


# --------------------------------------------------------------- loadings
def test_loadings_heatmap_nuts_mean_and_marked_intervals(fa_nuts):
    ax = plot_loadings(fa_nuts, ci_prob=0.9)
    draws = fa_nuts.loadings_samples_.reshape(-1, D, K)
    np.testing.assert_allclose(ax.images[0].get_array(), draws.mean(0), rtol=1e-12)
    lo, hi = np.percentile(draws, [5, 95], axis=0)
    expected = {(i, j) for i in range(D) for j in range(K) if lo[i, j] > 0 or hi[i, j] < 0}
    marked = {(round(t.get_position()[1]), round(t.get_position()[0])) for t in ax.texts
              if t.get_text().endswith("*")}
    assert marked == expected and expected
    assert [t.get_text() for t in ax.get_yticklabels()] == NAMES


def test_loadings_interval_plot(ppca_nuts):
    ax = plot_loadings(ppca_nuts, kind="interval", ci_prob=0.8)
    draws = ppca_nuts.loadings_samples_.reshape(-1, D, K)
    lo, hi = np.percentile(draws, [10, 90], axis=0)
    assert len(ax.containers) == K
    for j, container in enumerate(ax.containers):
        data_line, _, (bars,) = container.lines
        np.testing.assert_allclose(data_line.get_xdata(), draws[:, :, j].mean(0), rtol=1e-12)
        ends = np.array([seg[:, 0] for seg in bars.get_segments()])
        np.testing.assert_allclose(ends, np.stack([lo[:, j], hi[:, j]], 1), rtol=1e-12)


def test_loadings_of_the_horseshoe_label_the_anchors_zeros_fixed(data):
    """The triangle's zeros (``W_{p_1, 2}`` with anchors p) read "fixed" and have no interval; every
    other loading keeps its posterior mean and interval; a trace of W leaves the zero out of its key and
    density (ArviZ warned it could not estimate one) and raises no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # two short chains
        model = PPCA(K, method="nuts", prior="horseshoe", anchors=(3, 1), num_warmup=100, num_samples=100,
                     num_chains=2, random_state=0, progress_bar=False).fit(data)
    ax = plot_loadings(model)
    fixed = {(round(t.get_position()[1]), round(t.get_position()[0])) for t in ax.texts
             if t.get_text() == "fixed"}
    assert fixed == {(3, 1)} and "fixed: 0" in ax.get_title()
    # By default the marks and intervals are the model's own (support_, loadings_interval_: 90%).
    marked = {(round(t.get_position()[1]), round(t.get_position()[0])) for t in ax.texts
              if t.get_text().endswith("*")}
    assert marked == set(zip(*np.nonzero(model.support_), strict=True)) and marked
    ax = plot_loadings(model, kind="interval")
    ends = np.array([seg[:, 0] for seg in ax.containers[0].lines[2][0].get_segments()])
    np.testing.assert_allclose(ends, model.loadings_interval_[:, 0], rtol=1e-12)
    ax = plot_loadings(model, kind="interval", ci_prob=0.8)
    draws = model.loadings_samples_.reshape(-1, D, K)
    np.testing.assert_allclose(ax.containers[0].lines[0].get_xdata(), draws[:, :, 0].mean(0), rtol=1e-12)
    rows = [j for j in range(D) if j != 3]
    np.testing.assert_allclose(ax.containers[1].lines[0].get_xdata(), draws[:, rows, 1].mean(0), rtol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pc = plot_trace(model, var_names=["W"])
    # The trace keys every loading but the fixed zero, each coloured as its own draws' lines.
    key = pc.viz["plot"]["W"].sel(column="trace").item().get_legend()
    assert key.get_title().get_text() == "W[feature, component]"
    free = [(i, j) for i in range(D) for j in range(K) if (i, j) != (3, 1)]
    assert [t.get_text() for t in key.get_texts()] == [f"{NAMES[i]}, {j}" for i, j in free]
    lines = pc.viz["trace"]["W"].values
    for entry, (i, j) in enumerate(free):
        np.testing.assert_array_equal(lines[1, entry].get_ydata(), model.loadings_samples_[1, :, i, j])
        assert lines[1, entry].get_color() == key.get_lines()[entry].get_color()
    # ArviZ's selection still applies to the dimensions merged.
    pc = plot_trace(model, var_names=["W", "eigenvalues"], coords={"component": [1]})
    key = pc.viz["plot"]["W"].sel(column="trace").item().get_legend()
    assert [t.get_text() for t in key.get_texts()] == [f"{NAMES[i]}, 1" for i in range(D) if i != 3]
    plt.close("all")


def test_svi_horseshoe_loadings_label_the_anchors_zeros_fixed(data):
    """Without draws (SVI, normal guide), the zeros the anchors fix are those of the triangle,
    ``W[p_i, l]`` for ``l > i``: k = 3, anchors (2, 0, 4) fix (2, 1), (2, 2), (0, 2), each an exact 0 of
    ``loadings_``; every other cell shows its loading."""
    model = PPCA(3, method="svi", prior="horseshoe", guide="normal", anchors=(2, 0, 4),
                 random_state=0).fit(data)
    ax = plot_loadings(model)
    fixed = {(round(t.get_position()[1]), round(t.get_position()[0])) for t in ax.texts
             if t.get_text() == "fixed"}
    assert fixed == {(2, 1), (2, 2), (0, 2)} and "fixed: 0" in ax.get_title()
    assert all(model.loadings_[j, c] == 0.0 for j, c in fixed)
    shown = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert shown[(1, 2)].startswith(f"{model.loadings_[1, 2]:.2f}")
    plt.close("all")


def test_loadings_heatmap_ml_and_interval_needs_nuts(data):
    W, _ = _ml_ppca_numpy(data.to_numpy())
    model = PPCA(K).fit(data)
    ax = plot_loadings(model)
    np.testing.assert_allclose(ax.images[0].get_array(), W, atol=1e-8)
    assert not any(t.get_text().endswith("*") for t in ax.texts)
    with pytest.raises(ValueError, match="method='nuts'"):
        plot_loadings(model, kind="interval")
    with pytest.raises(ValueError, match="kind.*'bars'"):
        plot_loadings(model, kind="bars")


# ----------------------------------------------------------- latent space
class _Ellipse(types.SimpleNamespace):
    """One ellipse of the plotted EllipseCollection."""


def _ellipses(ax):
    (coll,) = [c for c in ax.collections if isinstance(c, EllipseCollection)]
    return [
        _Ellipse(width=w, height=h, angle=a, center=c, facecolor=f)
        for w, h, a, c, f in zip(coll.get_widths(), coll.get_heights(), coll.get_angles(),
                                 coll.get_offsets(), coll.get_facecolors(), strict=True)
    ]


def test_latent_ml_ellipses_from_woodbury_free_numpy(data):
    X = data.to_numpy()
    W, s2 = _ml_ppca_numpy(X)
    M = np.eye(K) + W.T @ W / s2
    cov = np.linalg.inv(M)
    means = (X - X.mean(0)) @ W @ cov / s2
    ax = plot_latent(PPCA(K).fit(X), X, prob=0.5, max_ellipses=None)
    ellipses = _ellipses(ax)
    assert len(ellipses) == N
    width, height = _ellipse_axes(cov, 0.5)
    np.testing.assert_allclose([e.width for e in ellipses], width, rtol=1e-8)
    np.testing.assert_allclose([e.height for e in ellipses], height, rtol=1e-8)
    np.testing.assert_allclose([e.center for e in ellipses], means, atol=1e-8)
    np.testing.assert_allclose(ax.collections[0].get_offsets(), means, atol=1e-8)
    # The width runs along the major eigenvector of the covariance.
    major = np.linalg.eigh(cov)[1][:, 1]
    angle = np.radians(ellipses[0].angle)
    np.testing.assert_allclose(abs(np.cos(angle) * major[1] - np.sin(angle) * major[0]), 0, atol=1e-10)


def test_latent_missing_entry_gets_its_own_larger_ellipse(data):
    X = data.to_numpy().copy()
    model = PPCA(K).fit(X)
    W, s2 = model.loadings_, model.noise_variance_
    X[3, [0, 1]] = np.nan
    ax = plot_latent(model, X, max_ellipses=None)
    obs = [2, 3, 4]
    cov_missing = np.linalg.inv(np.eye(K) + W[obs].T @ W[obs] / s2)
    cov_full = np.linalg.inv(np.eye(K) + W.T @ W / s2)
    widths = [e.width for e in _ellipses(ax)]
    np.testing.assert_allclose(widths[3], _ellipse_axes(cov_missing, 0.9)[0], rtol=1e-8)
    np.testing.assert_allclose(widths[0], _ellipse_axes(cov_full, 0.9)[0], rtol=1e-8)
    assert widths[3] > widths[0]


def test_latent_nuts_ellipses_are_mixture_covariances(ppca_nuts, data):
    X = data.iloc[:8]
    Ws = ppca_nuts.loadings_samples_.reshape(-1, D, K)
    s2s = ppca_nuts.noise_variance_samples_.ravel()
    mus = ppca_nuts.mean_samples_.reshape(-1, D)
    first, second = np.zeros((8, K)), np.zeros((8, K, K))
    for W, s2, mu in zip(Ws, s2s, mus, strict=True):
        C = np.linalg.inv(np.eye(K) + W.T @ W / s2)
        m = (X.to_numpy() - mu) @ W @ C / s2
        first += m
        second += C + m[:, :, None] * m[:, None, :]
    mean = first / len(Ws)
    cov = second / len(Ws) - mean[:, :, None] * mean[:, None, :]
    ax = plot_latent(ppca_nuts, X, labels=np.arange(8) % 2)
    ellipses = _ellipses(ax)
    assert len(ellipses) == 8
    expected = np.array([_ellipse_axes(c, 0.9) for c in cov])
    np.testing.assert_allclose([[e.width, e.height] for e in ellipses], expected, rtol=1e-8)
    np.testing.assert_allclose([e.center for e in ellipses], mean, rtol=1e-8, atol=1e-12)
    # Colour by label: the ellipse of each point has its point's colour.
    assert tuple(ellipses[0].facecolor[:3]) != tuple(ellipses[1].facecolor[:3])


def test_latent_rejects_pca(data):
    with pytest.raises(TypeError, match="PPCA or FactorAnalysis"):
        plot_latent(PCA(2).fit(data), data)
    with pytest.raises(ValueError, match="prob"):
        plot_latent(PPCA(2).fit(data), data, prob=1.0)


# ------------------------------------------------------------------ noise
def test_noise_ppca_nuts_histogram_and_interval(ppca_nuts):
    ax = plot_noise(ppca_nuts, bins=20, ci_prob=0.8)
    draws = ppca_nuts.noise_variance_samples_.ravel()
    counts, _ = np.histogram(draws, bins=20)
    (bars,) = ax.containers
    np.testing.assert_array_equal([b.get_height() for b in bars], counts)
    (span,) = [p for p in ax.patches if p not in bars.patches]
    xs = [span.get_x(), span.get_x() + span.get_width()]
    np.testing.assert_allclose(xs, np.percentile(draws, [10, 90]), rtol=1e-12)
    np.testing.assert_allclose(ax.lines[0].get_xdata(), draws.mean())


def test_noise_fa_nuts_intervals_per_feature(fa_nuts):
    ax = plot_noise(fa_nuts)
    draws = fa_nuts.noise_variance_samples_.reshape(-1, D)
    data_line, _, (bars,) = ax.containers[0].lines
    np.testing.assert_allclose(data_line.get_xdata(), draws.mean(0), rtol=1e-12)
    ends = np.array([seg[:, 0] for seg in bars.get_segments()])
    np.testing.assert_allclose(ends, np.percentile(draws, [5, 95], axis=0).T, rtol=1e-12)
    assert [t.get_text() for t in ax.get_yticklabels()] == NAMES


def test_noise_ml_point_estimates(data):
    _, s2 = _ml_ppca_numpy(data.to_numpy())
    ax = plot_noise(PPCA(K).fit(data))
    np.testing.assert_allclose(ax.lines[0].get_xdata(), s2, rtol=1e-8)
    fa = FactorAnalysis(K).fit(data)
    ax = plot_noise(fa)
    # ML uniquenesses: the diagonal of the sample covariance (denominator n) minus that of W W^T.
    ml_var = data.to_numpy().var(0)
    np.testing.assert_allclose(ax.lines[0].get_xdata(), ml_var - np.sum(fa.loadings_**2, 1), rtol=1e-4)
    assert ax.get_xlabel() == "psi (maximum likelihood)"


def test_noise_of_an_svi_fit_is_said_to_be_its_estimate(data):
    """SVI's noise is its own estimate, not the maximum-likelihood one (MAP under the priors):
    said so in pPCA's legend and FA's axis label, and plotted at its value."""
    ppca = PPCA(K, method="svi", random_state=0).fit(data)
    ax = plot_noise(ppca)
    assert ax.get_legend().get_texts()[0].get_text() == "SVI estimate"
    np.testing.assert_allclose(ax.lines[0].get_xdata(), ppca.noise_variance_, rtol=1e-12)
    fa = FactorAnalysis(K, method="svi", random_state=0, rotation="varimax").fit(data)
    ax = plot_noise(fa)
    assert ax.get_xlabel() == "psi (SVI estimate)"  # no rotation changes the noise
    np.testing.assert_allclose(ax.lines[0].get_xdata(), fa.noise_variance_, rtol=1e-12)


# ------------------------------------------------------- model comparison
def _comparison_table():
    ks = pd.Index([1, 2, 3, 4, 5], name="n_components")
    elpd = np.array([-560.0, -470.0, -455.0, -456.5, -458.0])
    best = elpd.max()
    return pd.DataFrame(
        {
            "elpd": elpd,
            "se": [14.0, 12.0, 11.5, 11.6, 11.8],
            "elpd_diff": best - elpd,
            "dse": [9.0, 4.0, 0.0, 1.0, 1.5],
            "p": [6.0, 11.0, 15.0, 18.0, 20.0],
            "weight": [0.0, 0.0, 0.7, 0.2, 0.1],
            "pareto_k_max": [0.2, 0.3, 0.4, 0.5, 0.6],
            "gavish_donoho": [False, True, False, False, False],
        },
        index=ks,
    )


def test_comparison_from_result_bars_equal_table():
    table = _comparison_table()
    result = types.SimpleNamespace(table=table, n_components=2, rule="smallest k within one se of the best")
    ax = plot_comparison(result)
    data_line, _, (bars,) = ax.containers[0].lines
    np.testing.assert_array_equal(data_line.get_xdata(), [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(data_line.get_ydata(), table["elpd"])
    segments = bars.get_segments()
    assert len(segments) == 5
    np.testing.assert_allclose([s[1, 1] - s[0, 1] for s in segments], 2 * table["se"])
    # Gavish-Donoho's k is the recommended one here: one line names both (a dotted line under the
    # dashed one could not be seen); at another k each rule has its own line.
    assert [line.get_label() for line in ax.lines if "k =" in line.get_label()] == [
        "recommended k = 2 (also Gavish-Donoho)"]
    np.testing.assert_array_equal(ax.lines[-1].get_xdata(), 2)
    (caption,) = [t for t in ax.texts if t.get_text().startswith("Recommended k = 2: ")]
    assert "one se" in caption.get_text()
    ax = plot_comparison(types.SimpleNamespace(table=table, n_components=3, rule="r"), ax=plt.figure().gca())
    assert [line.get_label() for line in ax.lines[-2:]] == ["Gavish-Donoho k = 2", "recommended k = 3"]


def test_comparison_from_bare_table_marks_best_elpd():
    table = _comparison_table().iloc[::-1]  # unsorted index still plots in k order
    ax = plot_comparison(table)
    assert ax.lines[-1].get_label() == "recommended k = 3"
    np.testing.assert_array_equal(ax.containers[0].lines[0].get_xdata(), [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match=r"missing \['se'\]"):
        plot_comparison(table.drop(columns="se"))
    with pytest.raises(TypeError, match="ComparisonResult"):
        plot_comparison([1, 2])


# ------------------------------------------------------------- kernel PCA
def test_kernel_pca_embedding_matches_sklearn(data):
    X = data.to_numpy()
    kw = {"kernel": "rbf", "gamma": 0.1}
    sk = SkKernelPCA(3, **kw).fit(X)
    model = KernelPCA(3, **kw).fit(X)
    ax = plot_kernel_pca(model, components=(0, 2))
    np.testing.assert_allclose(ax.collections[0].get_offsets(), sk.transform(X)[:, [0, 2]], atol=1e-8)
    assert ax.get_ylabel() == f"kPC3 (eigenvalue {sk.eigenvalues_[2]:.4g})"
    ax = plot_kernel_pca(model, X[:7] + 0.1, labels=list("aabbccd"))
    offsets = np.concatenate([c.get_offsets() for c in ax.collections])
    np.testing.assert_allclose(offsets, sk.transform(X[:7] + 0.1)[:, :2], atol=1e-8)
    assert len(ax.collections) == 4
    with pytest.raises(TypeError, match="KernelPCA"):
        plot_kernel_pca(PCA(2).fit(X))


# ----------------------------------------------------------- diagnostics
def test_trace_plots_invariant_variables_with_arviz(ppca_nuts):
    pc = plot_trace(ppca_nuts)
    assert set(pc.viz["trace"].data_vars) == {"sigma2", "eigenvalues", "log_lik"}
    lines = pc.viz["trace"]["sigma2"].values
    np.testing.assert_array_equal([line.get_ydata() for line in lines], ppca_nuts.noise_variance_samples_)
    eig = np.linalg.svd(ppca_nuts.loadings_samples_, compute_uv=False) ** 2
    np.testing.assert_allclose(pc.viz["trace"]["eigenvalues"].values[1, 0].get_ydata(), eig[1, :, 0])
    with pytest.raises(ValueError, match="method='nuts'"):
        plot_trace(PPCA(K).fit(np.random.default_rng(0).standard_normal((20, D))))


def test_each_function_draws_on_the_axes_it_is_given(data):
    X = data.to_numpy()
    ppca, pca = PPCA(K).fit(X), PCA().fit(X)
    calls = [
        lambda ax: plot_scree(pca, ax=ax),
        lambda ax: plot_biplot(pca, X, ax=ax),
        lambda ax: plot_loadings(ppca, ax=ax),
        lambda ax: plot_latent(ppca, X, ax=ax),
        lambda ax: plot_noise(ppca, ax=ax),
        lambda ax: plot_comparison(_comparison_table(), ax=ax),
        lambda ax: plot_kernel_pca(KernelPCA(2).fit(X), ax=ax),
    ]
    fig, axes = plt.subplots(1, len(calls))
    for call, ax in zip(calls, axes, strict=True):
        assert call(ax) is ax
    assert all(ax.has_data() for ax in axes)
    assert len(plt.get_fignums()) == 1


# ------------------------------------------------ what a reader sees (wine)
# Each figure as the demo draws it: text must not overlap (extents from the Agg renderer), the saved
# figure must stay within 2:1, a legend must not hide data, and titles must say what is shown.
@pytest.fixture(scope="module")
def wine():
    from sklearn.datasets import load_wine

    bunch = load_wine(as_frame=True)
    X = (bunch.data - bunch.data.mean()) / bunch.data.std()
    return X, pd.Series(np.asarray(bunch.target_names)[bunch.target.to_numpy()], name="cultivar")


def _figures(wine, ppca_nuts, fa_nuts):
    X, cultivar = wine
    table = _comparison_table()
    rule = ("smallest k whose elpd is below the best (k = 3) by at most max(dse, 4): one standard error of "
            "the paired elpd difference, or a difference too small for its dse to be trusted")
    result = types.SimpleNamespace(table=table, n_components=3, rule=rule)
    return {
        "scree": lambda ax: plot_scree(PCA().fit(X), ax=ax),
        "biplot": lambda ax: plot_biplot(PCA(2).fit(X), X, labels=cultivar, ax=ax),
        "fa_loadings": lambda ax: plot_loadings(FactorAnalysis(3, rotation="varimax").fit(X), ax=ax),
        "loadings_heatmap_nuts": lambda ax: plot_loadings(fa_nuts, ax=ax),
        "loadings_intervals": lambda ax: plot_loadings(ppca_nuts, kind="interval", ax=ax),
        "latent": lambda ax: plot_latent(PPCA(3).fit(X), X, labels=cultivar, ax=ax),
        "noise": lambda ax: plot_noise(ppca_nuts, ax=ax),
        "fa_noise": lambda ax: plot_noise(FactorAnalysis(3).fit(X), ax=ax),
        "comparison": lambda ax: plot_comparison(result, ax=ax),
        "kernel_pca": lambda ax: plot_kernel_pca(KernelPCA(2, kernel="rbf", gamma=1 / 26).fit(X),
                                                 labels=cultivar, ax=ax),
    }


FIGURES = ["scree", "biplot", "fa_loadings", "loadings_heatmap_nuts", "loadings_intervals", "latent",
           "noise", "fa_noise", "comparison", "kernel_pca"]


def _texts(fig):
    """(string, box) of every text the Agg renderer draws (tick labels out of view are not drawn)."""
    drawn, draw = [], matplotlib.text.Text.draw

    def record(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            # Text's own extent: an Annotation's would include its arrow.
            drawn.append((self.get_text(), matplotlib.text.Text.get_window_extent(self, renderer)))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.text.Text, "draw", record)
        fig.canvas.draw()
    return drawn


def _overlaps(boxes):
    """Pairs of texts whose boxes share more than a pixel in both directions."""
    pairs = []
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if dx > 1 and dy > 1:
                pairs.append((a, b))
    return pairs


def _saved_aspect(fig):
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    buffer.seek(0)
    height, width = plt.imread(buffer).shape[:2]
    return max(width, height) / min(width, height)


def _data_points(ax):
    """Points (display pixels) of everything plotted: lines sampled densely, markers, scatter points,
    error bars, ellipse outlines; and the boxes of patches."""
    def densified(xy):
        t = np.linspace(0, 1, 50)[:, None]
        return np.concatenate([a + t * (b - a) for a, b in zip(xy[:-1], xy[1:], strict=True)])

    points, boxes = [], []
    for line in ax.get_lines():
        xy = line.get_transform().transform(line.get_xydata())
        drawn = line.get_linestyle() not in ("None", "", " ") and len(xy) > 1
        points.append(densified(xy) if drawn else xy)
    for coll in ax.collections:
        if isinstance(coll, matplotlib.collections.LineCollection):
            points.extend(densified(coll.get_transform().transform(seg)) for seg in coll.get_segments())
        elif isinstance(coll, EllipseCollection):
            phi = np.linspace(0, 2 * np.pi, 60)
            for (cx, cy), w, h, a in zip(coll.get_offsets(), coll.get_widths(), coll.get_heights(),
                                         np.radians(coll.get_angles()), strict=True):
                u, v = w / 2 * np.cos(phi), h / 2 * np.sin(phi)
                outline = np.c_[cx + u * np.cos(a) - v * np.sin(a), cy + u * np.sin(a) + v * np.cos(a)]
                points.append(ax.transData.transform(outline))
        else:
            points.append(coll.get_offset_transform().transform(coll.get_offsets()))
    boxes = [p.get_window_extent() for p in ax.patches]
    return np.concatenate(points) if points else np.empty((0, 2)), boxes


@pytest.mark.parametrize("name", FIGURES)
def test_figure_text_does_not_overlap_aspect_and_legend(name, wine, ppca_nuts, fa_nuts):
    fig, ax = plt.subplots()
    _figures(wine, ppca_nuts, fa_nuts)[name](ax)
    boxes = _texts(fig)
    assert not _overlaps(boxes), _overlaps(boxes)
    assert _saved_aspect(fig) <= 2.0
    legend = ax.get_legend()
    if legend is not None:
        box = legend.get_window_extent(fig.canvas.get_renderer()).padded(-1)
        points, patches = _data_points(ax)
        inside = ((points[:, 0] > box.x0) & (points[:, 0] < box.x1) & (points[:, 1] > box.y0)
                  & (points[:, 1] < box.y1))
        assert not inside.any(), f"the legend hides {int(inside.sum())} plotted points"
        assert not any(box.overlaps(p) for p in patches), "the legend hides a bar or an interval"


def test_biplot_names_inside_the_frame_and_apart(wine):
    X, cultivar = wine
    fig, ax = plt.subplots()
    plot_biplot(PCA(2).fit(X), X, labels=cultivar, ax=ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    names = [t for t in ax.texts if t.get_text() in set(X.columns)]
    assert sorted(t.get_text() for t in names) == sorted(X.columns)
    for text in names:
        box = text.get_window_extent(renderer)
        # Clear of the frame by at least a pixel: no name touches it.
        assert frame.x0 + 1 <= box.x0 and box.x1 <= frame.x1 - 1, text.get_text()
        assert frame.y0 + 1 <= box.y0 and box.y1 <= frame.y1 - 1, text.get_text()
    assert not _overlaps([(t.get_text(), t.get_window_extent(renderer)) for t in names])


def test_titles_name_what_is_shown(wine, ppca_nuts, fa_nuts):
    X, _ = wine
    fa = FactorAnalysis(3, rotation="varimax").fit(X)
    assert plot_loadings(fa).get_title() == "Factor analysis loadings\n(maximum likelihood, varimax rotation)"
    assert plot_loadings(ppca_nuts, kind="interval").get_title() == (
        "pPCA loadings\n(posterior mean and 90% interval)")
    assert plot_noise(fa_nuts).get_title() == "Factor analysis noise variances psi (uniquenesses)"
    assert plot_biplot(PCA(2).fit(X), X).get_title() == "Biplot: PCA scores and loadings"
    ax = plot_latent(PPCA(2).fit(X), X)
    assert ax.get_title().endswith("90% credible ellipses for 20 of 178 points")


def test_scree_legend_lists_every_rule_at_its_k(wine):
    from bayespca.selection import METHODS, select_n_components

    X, _ = wine
    ax = plot_scree(PCA().fit(X))
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    by_k = {}
    for rule in METHODS:
        by_k.setdefault(select_n_components(X, rule).n_components, []).append(rule)
    assert legend == {f"{', '.join(rules)}: k = {k}" for k, rules in by_k.items()}
    assert sum(len(rules) for rules in by_k.values()) == len(METHODS)


def test_latent_subset_ellipses_are_those_of_their_points(data):
    X = data.to_numpy()
    model = PPCA(K).fit(X)
    post = model.latent_posterior(X)
    ax = plot_latent(model, X, max_ellipses=7)
    ellipses = _ellipses(ax)
    assert len(ellipses) == 7
    # Every ellipse sits on one of the points, with that point's ellipse (here all equal: complete data).
    rows = [int(np.argmin(np.linalg.norm(np.asarray(post.mean) - e.center, axis=1))) for e in ellipses]
    np.testing.assert_allclose([e.center for e in ellipses], np.asarray(post.mean)[rows], atol=1e-12)
    width, height = _ellipse_axes(np.asarray(post.covariance).reshape(-1, K, K)[0], 0.9)
    np.testing.assert_allclose([e.width for e in ellipses], width, rtol=1e-8)
    assert len(set(rows)) == 7
    with pytest.raises(ValueError, match="max_ellipses"):
        plot_latent(model, X, max_ellipses=0)


def test_trace_density_panels_are_named_and_keyed(ppca_nuts):
    pc = plot_trace(ppca_nuts)
    plots = pc.viz["plot"]
    assert plots["sigma2"].sel(column="dist").item().get_xlabel() == "noise variance sigma^2"
    assert plots["eigenvalues"].sel(column="dist").item().get_xlabel() == "eigenvalues of W W^T"
    fig = pc.viz["figure"].item()
    (chains,) = fig.legends
    assert [t.get_text() for t in chains.get_texts()] == ["chain 0", "chain 1"]
    key = plots["eigenvalues"].sel(column="trace").item().get_legend()
    assert key.get_title().get_text() == "eigenvalues[component]"
    assert [t.get_text() for t in key.get_texts()] == ["0", "1"]
    # The colour keyed for eigenvalues[1] is the colour of its lines.
    colour = key.get_lines()[1].get_color()
    assert pc.viz["trace"]["eigenvalues"].values[0, 1].get_color() == colour
    assert not _overlaps(_texts(fig))
    assert _saved_aspect(fig) <= 2.0


def test_trace_gives_each_keyed_coordinate_its_own_colour():
    # psi of wine's 13 features: ArviZ's cycle of 10 colours gave features 10-12 the colours of
    # features 0-2, so their key could not tell them apart.
    X = load_wine().data
    X = (X - X.mean(0)) / X.std(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sampler warnings of a deliberately tiny run
        model = FactorAnalysis(2, method="nuts", num_chains=2, num_warmup=100, num_samples=100,
                               random_state=0).fit(X)
    pc = plot_trace(model)
    key = pc.viz["plot"]["psi"].sel(column="trace").item().get_legend()
    assert [t.get_text() for t in key.get_texts()] == [str(j) for j in range(13)]
    keyed = [to_hex(line.get_color()) for line in key.get_lines()]
    assert len(set(keyed)) == 13
    # Each keyed colour is that of the feature's trace, in both chains.
    lines = pc.viz["trace"]["psi"].values
    for chain in range(2):
        assert [to_hex(lines[chain, j].get_color()) for j in range(13)] == keyed


def test_trace_keys_fit_inside_the_figure(fa_nuts):
    # One key per variable, right of its trace (their colours repeat across variables), and the
    # figure widened to hold them: a single key above the panels ran off both sides of it.
    pc = plot_trace(fa_nuts)
    fig = pc.viz["figure"].item()
    fig.canvas.draw()
    inside = fig.bbox
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    assert len(legends) == 3  # chains, psi, eigenvalues
    for legend in legends:
        box = legend.get_window_extent()
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and box.y1 <= inside.y1
    assert not _overlaps(_texts(fig))
