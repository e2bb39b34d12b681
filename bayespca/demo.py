"""The whole workflow on a real data set, written as a small report (``bayespca demo``).

The data are scikit-learn's bundled wine recognition data (178 wines, 13
chemical measurements, 3 cultivars; no download), standardised. The steps:

1. choose ``k`` by every rule of :mod:`bayespca.selection` (scree plot);
   the demo keeps the Gavish-Donoho ``k``;
2. PCA biplot coloured by cultivar;
3. Bayesian pPCA by NUTS with that ``k``: loadings with credible
   intervals, latent space with posterior ellipses, posterior of ``sigma^2``,
   ArviZ trace plots and summary;
4. factor analysis (maximum likelihood, varimax) loadings and uniquenesses;
5. kernel PCA (RBF) embedding;
6. elpd against ``k`` by :func:`bayespca.comparison.compare_n_components`
   (NUTS, PSIS-LOO on the marginal likelihood).

The folder receives PNG plots, ``selection.csv``, ``summary.csv`` (the
posterior summary, effective sample sizes rounded to counts) and
``report.md`` linking everything; each file is written whole or not at all
(:func:`bayespca.cli.atomic_output`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bayespca.cli import atomic_output

__all__ = ["run_demo"]


def _markdown(table: pd.DataFrame, digits: int = 4) -> str:
    """A DataFrame as a GitHub Markdown table (index as the first column)."""

    def cell(value):
        if isinstance(value, float | np.floating) and float(value).is_integer() and abs(value) < 1e15:
            return str(int(value))
        if isinstance(value, float | np.floating):
            return f"{value:.{digits}g}"
        return str(value)

    header = [str(table.index.name or "")] + [str(c) for c in table.columns]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, values in table.iterrows():
        rows.append("| " + " | ".join([cell(index)] + [cell(v) for v in values]) + " |")
    return "\n".join(rows)


def _save(fig, folder: Path, name: str, figures: list, dpi: int = 110) -> None:
    with atomic_output(folder / name) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    figures.append(name)


def _write_csv(table: pd.DataFrame, path: Path) -> None:
    with atomic_output(path) as tmp:
        table.to_csv(tmp)


def run_demo(out="bayespca-demo", *, small=False, random_state=0, progress=False) -> Path:
    """Run the workflow on the wine data and write the report to ``out``; return its absolute path.

    Parameters
    ----------
    out : str or Path, default="bayespca-demo"
        Report folder, created if needed (files in it are overwritten).
    small : bool, default=False
        2 chains x 100 draws (100 warm-up) instead of 4 x 500 (500): a quick run.
    random_state : int, default=0
    progress : bool, default=False
        A progress bar over the steps (on stderr).

    Returns
    -------
    pathlib.Path
    """
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure
    from sklearn.datasets import load_wine
    from tqdm.auto import tqdm

    from bayespca import PCA, PPCA, FactorAnalysis, KernelPCA
    from bayespca.plotting import (
        plot_biplot,
        plot_kernel_pca,
        plot_latent,
        plot_loadings,
        plot_noise,
        plot_scree,
        plot_trace,
    )
    from bayespca.selection import METHODS, select_from_singular_values

    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    wine = load_wine(as_frame=True)
    X = (wine.data - wine.data.mean()) / wine.data.std()
    cultivar = np.asarray(wine.target_names)[wine.target.to_numpy()]
    chains, draws = (2, 100) if small else (4, 500)
    figures: list[str] = []
    steps = tqdm(total=6, desc="bayespca demo", disable=not progress)

    def figure():
        fig = Figure(figsize=(6.4, 4.8))
        return fig, fig.subplots()

    # 1. choosing k
    pca = PCA().fit(X)
    s, n, d = pca.singular_values_, pca.n_samples_, pca.n_features_in_
    chosen = {rule: select_from_singular_values(s, n, d, rule).n_components for rule in METHODS}
    k = max(2, chosen["gavish-donoho"])
    fig, ax = figure()
    plot_scree(pca, ax=ax)
    _save(fig, folder, "scree.png", figures)
    selection = pd.DataFrame({"n_components": chosen}).rename_axis("rule")
    _write_csv(selection, folder / "selection.csv")
    steps.update()

    # 2. PCA biplot
    fig, ax = figure()
    plot_biplot(PCA(2).fit(X), X, labels=pd.Series(cultivar, name="cultivar"), ax=ax)
    _save(fig, folder, "biplot.png", figures)
    steps.update()

    # 3. Bayesian pPCA by NUTS
    ppca = PPCA(
        k, method="nuts", num_chains=chains, num_samples=draws, num_warmup=draws,
        random_state=random_state, progress_bar=progress,
    ).fit(X)
    for name, plot in (
        ("loadings.png", lambda ax: plot_loadings(ppca, ax=ax)),
        ("loadings_intervals.png", lambda ax: plot_loadings(ppca, kind="interval", ax=ax)),
        ("latent.png", lambda ax: plot_latent(ppca, X, labels=cultivar, ax=ax)),
        ("noise.png", lambda ax: plot_noise(ppca, ax=ax)),
    ):
        fig, ax = figure()
        plot(ax)
        _save(fig, folder, name, figures)
    trace = plot_trace(ppca).viz["figure"].item()
    _save(trace, folder, "trace.png", figures, dpi=90)
    plt.close(trace)
    summary = ppca.summary()
    for column in ("ess_bulk", "ess_tail"):  # effective sample sizes are counts
        summary[column] = summary[column].round()
    _write_csv(summary, folder / "summary.csv")
    steps.update()

    # 4. factor analysis with a varimax rotation
    fa = FactorAnalysis(k, rotation="varimax").fit(X)
    fig, ax = figure()
    plot_loadings(fa, ax=ax)
    _save(fig, folder, "fa_loadings.png", figures)
    fig, ax = figure()
    plot_noise(fa, ax=ax)
    _save(fig, folder, "fa_noise.png", figures)
    steps.update()

    # 5. kernel PCA
    fig, ax = figure()
    plot_kernel_pca(KernelPCA(2, kernel="rbf", gamma=1.0 / (2 * d)).fit(X), labels=cultivar, ax=ax)
    _save(fig, folder, "kernel_pca.png", figures)
    steps.update()

    # 6. elpd against k
    comparison_note = _comparison(X, folder, figures, small, random_state, progress, figure)
    steps.update()
    steps.close()

    lines = [
        "# bayespca demo: wine recognition data",
        "",
        f"{n} wines x {d} standardised chemical measurements (scikit-learn's `load_wine`), "
        f"3 cultivars. Gavish-Donoho keeps k = {chosen['gavish-donoho']}; the models below use k = {k}. "
        f"NUTS: {chains} chains x {draws} draws ({draws} warm-up), seed {random_state}.",
        "",
        "## Number of components by rule",
        "",
        _markdown(selection),
        "",
        "## Posterior summary (pPCA, NUTS)",
        "",
        _markdown(summary),
        "",
        comparison_note,
        "",
        "## Plots",
        "",
        *[f"![{name}]({name})" for name in figures],
        "",
    ]
    with atomic_output(folder / "report.md") as tmp:
        tmp.write_text("\n".join(lines))
    return folder


def _comparison(X, folder, figures, small, random_state, progress, figure) -> str:
    from bayespca.comparison import compare_n_components
    from bayespca.plotting import plot_comparison

    ks, draws = (range(1, 4), 200) if small else (range(1, 6), 500)
    options = {"num_chains": 2, "num_samples": draws, "num_warmup": max(draws, 250)}
    result = compare_n_components(
        X, n_components=ks, model="ppca", random_state=random_state, progress_bar=progress,
        **options,
    )
    _write_csv(result.table, folder / "comparison.csv")
    fig, ax = figure()
    plot_comparison(result, ax=ax)
    _save(fig, folder, "comparison.png", figures)
    return (
        f"## Model comparison\n\nRecommended k = {result.n_components} ({result.rule}).\n\n"
        + _markdown(result.table)
    )
