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

import dataclasses
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


@dataclasses.dataclass
class _Report:
    """The report's folder, and the figures written to it in order (each file whole or not at all)."""

    folder: Path
    figures: list[str] = dataclasses.field(default_factory=list)

    def save(self, fig, name: str, dpi: int = 110) -> None:
        with atomic_output(self.folder / name) as tmp:
            fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
        self.figures.append(name)

    def plot(self, name: str, draw) -> None:
        """A 6.4 x 4.8 in figure of ``draw(ax)``, saved as ``name``."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6.4, 4.8))
        draw(fig.subplots())
        self.save(fig, name)

    def csv(self, table: pd.DataFrame, name: str) -> None:
        with atomic_output(self.folder / name) as tmp:
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
    from sklearn.datasets import load_wine
    from tqdm.auto import tqdm

    from bayespca import PCA, KernelPCA
    from bayespca.plotting import plot_biplot, plot_kernel_pca

    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    report = _Report(folder)
    wine = load_wine(as_frame=True)
    X = (wine.data - wine.data.mean()) / wine.data.std()
    cultivar = np.asarray(wine.target_names)[wine.target.to_numpy()]
    n, d = X.shape
    chains, draws = (2, 100) if small else (4, 500)
    steps = tqdm(total=6, desc="bayespca demo", disable=not progress)
    selection, k = _choose_k(X, report)
    steps.update()
    biplot, labels = PCA(2).fit(X), pd.Series(cultivar, name="cultivar")
    report.plot("biplot.png", lambda ax: plot_biplot(biplot, X, labels=labels, ax=ax))
    steps.update()
    summary = _bayesian_ppca(X, k, cultivar, report, (chains, draws), random_state, progress)
    steps.update()
    _factor_analysis(X, k, report)
    steps.update()
    kpca = KernelPCA(2, kernel="rbf", gamma=1.0 / (2 * d)).fit(X)
    report.plot("kernel_pca.png", lambda ax: plot_kernel_pca(kpca, labels=cultivar, ax=ax))
    steps.update()
    comparison_note = _comparison(X, report, small, random_state, progress)
    steps.update()
    steps.close()

    lines = [
        "# bayespca demo: wine recognition data",
        "",
        f"{n} wines x {d} standardised chemical measurements (scikit-learn's `load_wine`), "
        f"3 cultivars. Gavish-Donoho keeps k = {selection.loc['gavish-donoho', 'n_components']}; "
        f"the models below use k = {k}. "
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
        *[f"![{name}]({name})" for name in report.figures],
        "",
    ]
    with atomic_output(folder / "report.md") as tmp:
        tmp.write_text("\n".join(lines))
    return folder


def _choose_k(X: pd.DataFrame, report: _Report) -> tuple[pd.DataFrame, int]:
    """Step 1: k by every rule (scree plot, ``selection.csv``); the models use Gavish-Donoho's, at least 2."""
    from bayespca import PCA
    from bayespca.plotting import plot_scree
    from bayespca.selection import METHODS, select_from_singular_values

    pca = PCA().fit(X)
    s, n, d = pca.singular_values_, pca.n_samples_, pca.n_features_in_
    chosen = {rule: select_from_singular_values(s, n, d, rule).n_components for rule in METHODS}
    report.plot("scree.png", lambda ax: plot_scree(pca, ax=ax))
    selection = pd.DataFrame({"n_components": chosen}).rename_axis("rule")
    report.csv(selection, "selection.csv")
    return selection, max(2, chosen["gavish-donoho"])


def _bayesian_ppca(X, k: int, cultivar, report: _Report, size: tuple, random_state, progress) -> pd.DataFrame:
    """Step 3: pPCA by NUTS (``size`` = chains, draws): its plots, and its summary (``summary.csv``)."""
    import matplotlib.pyplot as plt

    from bayespca import PPCA
    from bayespca.plotting import plot_latent, plot_loadings, plot_noise, plot_trace

    chains, draws = size
    ppca = PPCA(
        k, method="nuts", num_chains=chains, num_samples=draws, num_warmup=draws,
        random_state=random_state, progress_bar=progress,
    ).fit(X)
    report.plot("loadings.png", lambda ax: plot_loadings(ppca, ax=ax))
    report.plot("loadings_intervals.png", lambda ax: plot_loadings(ppca, kind="interval", ax=ax))
    report.plot("latent.png", lambda ax: plot_latent(ppca, X, labels=cultivar, ax=ax))
    report.plot("noise.png", lambda ax: plot_noise(ppca, ax=ax))
    trace = plot_trace(ppca).viz["figure"].item()
    report.save(trace, "trace.png", dpi=90)
    plt.close(trace)
    summary = ppca.summary()
    for column in ("ess_bulk", "ess_tail"):  # effective sample sizes are counts
        summary[column] = summary[column].round()
    report.csv(summary, "summary.csv")
    return summary


def _factor_analysis(X, k: int, report: _Report) -> None:
    """Step 4: maximum-likelihood factor analysis with a varimax rotation: loadings and uniquenesses."""
    from bayespca import FactorAnalysis
    from bayespca.plotting import plot_loadings, plot_noise

    fa = FactorAnalysis(k, rotation="varimax").fit(X)
    report.plot("fa_loadings.png", lambda ax: plot_loadings(fa, ax=ax))
    report.plot("fa_noise.png", lambda ax: plot_noise(fa, ax=ax))


def _comparison(X, report: _Report, small: bool, random_state, progress) -> str:
    """Step 6: elpd against k (``comparison.csv`` and its plot); the report's section."""
    from bayespca.comparison import compare_n_components
    from bayespca.plotting import plot_comparison

    # Four chains, as NUTS fits default to: with two, R-hat at k = 2 and 3 crossed 1.01 on some machines.
    ks, chains, draws = (range(1, 4), 2, 200) if small else (range(1, 6), 4, 500)
    options = {"num_chains": chains, "num_samples": draws, "num_warmup": max(draws, 250)}
    result = compare_n_components(
        X, n_components=ks, model="ppca", random_state=random_state, progress_bar=progress,
        **options,
    )
    report.csv(result.table, "comparison.csv")
    report.plot("comparison.png", lambda ax: plot_comparison(result, ax=ax))
    return (
        f"## Model comparison\n\nRecommended k = {result.n_components} ({result.rule}).\n\n"
        + _markdown(result.table)
    )
