"""NUTS on scikit-learn's real data sets: divergences, R-hat, ESS and cost per (data, model, k, seed).

Run: PYTHONPATH=. python benchmarks/bench_nuts_real.py [options]   (one BLAS thread)

The panel of issue 12 (item 4): PPCA and FactorAnalysis by ``method="nuts"`` with their default
settings (4 chains x 500 warm-up + 500 draws), on iris, wine, diabetes and breast cancer, raw and
standardised, k = 1 .. d - 1 for pPCA and k = 1 .. min(d - 1, Ledermann bound) for FA, several
seeds. Each row is one fit through the public estimators; the columns are

* ``div``: divergent transitions after warm-up (all chains);
* ``rhat``: the largest rank-normalised split R-hat over the invariants (noise variances,
  eigenvalues of ``W W^T``, total log-likelihood), with the worst one named;
* ``ess``: the smallest bulk ESS over the same invariants;
* ``chance``: how often chains that mix as each one's own autocorrelation (of the draws and of
  their distances from the median) says would show an ``rhat`` at least the one seen
  (:func:`chance_of_rhat`); near 0 when chains disagree more than their own mixing explains, not
  small when a crossing of 1.01 is what 4 x 500 draws of that many invariants give by chance (a
  row failing only on R-hat with a chance of 0.3 is noise);
* ``ess/s``: ``ess`` divided by the wall time of the fit (the first fit of a shape compiles);
* ``steps``: median leapfrog steps per draw (all chains; of the transition each draw kept ends);
* ``thin``: transitions a draw: 2-4 where chains that failed the check ran on and kept every
  2nd-4th draw (``sample_stats.attrs["thinning"]``), 1 otherwise;
* ``wall``: seconds for ``fit`` (sampling, ArviZ conversion and diagnostics included).

A row passes when div = 0, rhat < 1.01 and ess > 400. The full panel takes hours on one core;
``--datasets``, ``--models``, ``--k``, ``--seeds`` and ``--scalings`` pick a subset, and
``--csv`` appends the rows to a file. ``--panel quick`` runs instead a fixed cross-section
(about 15 minutes on two busy cores): iris pPCA k = 1..3 raw and standardised, wine pPCA k = 5, 8
and FA k = 4 standardised, diabetes FA k = 1, 4 raw and standardised, and ARD (Bishop's Bayesian
PCA, ``prior="ard"``) with k = 8 on planted data (n = 300, d = 10, 3 true components, noise sd
0.5; the data of the ARD test), whose ``neff`` column is ``n_effective_components_`` (3 wanted);
issue 12 asks that its median leapfrog steps per draw stay at or below 63. ``--panel horseshoe``
runs ``prior="horseshoe"`` on iris, wine, diabetes and breast cancer (pPCA k = 2-4, FA k = 2, 3)
twice per cell: with the default identification (the triangle on pivoted anchors) and with
``identification="none"`` (``W`` free, the default before it: the baseline), and prints their totals
side by side; its ``wrhat`` column is the largest R-hat over the entries of ``W`` (identified by the
triangle; aligned by signed permutations under ``"none"``). Examples::

    python benchmarks/bench_nuts_real.py --panel quick --seeds 0 1
    python benchmarks/bench_nuts_real.py --panel horseshoe --seeds 0 1 2
    python benchmarks/bench_nuts_real.py --datasets iris --seeds 0          # a minute
    python benchmarks/bench_nuts_real.py --datasets iris wine --models fa --k 1 2 3
    python benchmarks/bench_nuts_real.py --panel quick --models fa --identification polar
"""

from __future__ import annotations

import argparse
import csv
import os
import time
import warnings

import arviz as az
import numpy as np
from arviz_stats.base import array_stats
from sklearn import datasets
from threadpoolctl import threadpool_limits

from bayespca import PPCA, FactorAnalysis
from bayespca.convergence import ess_bulk, rank_rhat
from bayespca.probabilistic import ledermann_bound


def planted(n: int = 300, d: int = 10, k: int = 3, noise_sd: float = 0.5) -> np.ndarray:
    """Data with ``k`` components (column scales 2.5, 2.0, 1.5) and isotropic noise, seed 0."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(d, k)) * np.linspace(2.5, 1.5, k)
    return rng.normal(size=(n, k)) @ w.T + noise_sd * rng.normal(size=(n, d))


LOADERS = {
    "iris": lambda: datasets.load_iris().data,
    "wine": lambda: datasets.load_wine().data,
    "diabetes": lambda: datasets.load_diabetes(scaled=False).data,
    "breast_cancer": lambda: datasets.load_breast_cancer().data,
    "planted": planted,
}
REAL = ("iris", "wine", "diabetes", "breast_cancer")
MODELS = {"ppca": PPCA, "fa": FactorAnalysis, "ard": PPCA}
# (data, scaling, model, k values) of --panel quick.
QUICK_PANEL = (
    ("iris", "raw", "ppca", (1, 2, 3)),
    ("iris", "std", "ppca", (1, 2, 3)),
    ("wine", "std", "ppca", (5, 8)),
    ("wine", "std", "fa", (4,)),
    ("diabetes", "raw", "fa", (1, 4)),
    ("diabetes", "std", "fa", (1, 4)),
    ("planted", "raw", "ard", (8,)),
)
# (data, scaling, model, k values) of --panel horseshoe, each run at both identifications.
HORSESHOE_PANEL = (
    ("iris", "raw", "ppca", (2, 3)),
    ("iris", "std", "ppca", (2,)),
    ("wine", "std", "ppca", (2, 3, 4)),
    ("wine", "std", "fa", (2, 3)),
    ("diabetes", "std", "ppca", (2, 3)),
    ("breast_cancer", "std", "ppca", (2, 3)),
)
PANELS = {"quick": QUICK_PANEL, "horseshoe": HORSESHOE_PANEL}
COLUMNS = (
    "data", "scaling", "model", "k", "seed", "ident", "div", "rhat", "worst", "ess", "chance", "ess/s",
    "steps", "thin", "wall", "wrhat", "neff",
)


def load(name: str, scaling: str) -> np.ndarray:
    """The data set as float64, raw or standardised (mean 0, sd 1 with denominator n)."""
    X = np.asarray(LOADERS[name](), dtype=float)
    if scaling == "std":
        X = (X - X.mean(0)) / X.std(0)
    return X


def k_values(model: str, d: int) -> list[int]:
    """pPCA and ARD: 1 .. d - 1; FA: 1 .. min(d - 1, Ledermann bound)."""
    top = min(d - 1, ledermann_bound(d)) if model == "fa" else d - 1
    return list(range(1, max(top, 1) + 1))


def invariants(posterior) -> dict:
    """Rotation-invariant series (chain, draw) by name, from the ``posterior`` group."""
    out = {}
    for name in ("sigma2", "psi", "eigenvalues", "log_lik"):
        if name not in posterior:
            continue
        values = np.asarray(posterior[name])
        series = values.reshape(*values.shape[:2], -1)
        for j in range(series.shape[-1]):
            out[name if series.shape[-1] == 1 else f"{name}[{j}]"] = series[..., j]
    return out


def _ar1(phi: np.ndarray, reps: int, n: int, rng) -> np.ndarray:
    """Stationary AR(1) series, shape (reps, *phi.shape, n), unit variance, coefficients ``phi``."""
    noise = rng.standard_normal((reps, *phi.shape, n))
    sim = np.empty_like(noise)
    sim[..., 0] = noise[..., 0]
    scale = np.sqrt(1.0 - phi**2)
    for t in range(1, n):
        sim[..., t] = phi * sim[..., t - 1] + scale * noise[..., t]
    return sim


def _phi(ess: np.ndarray, n: int) -> np.ndarray:
    """The AR(1) coefficient whose ESS over ``n`` draws, ``n (1 - phi) / (1 + phi)``, is ``ess``."""
    return np.clip((n - ess) / (n + ess), -0.9, 0.999)


def chance_of_rhat(series: np.ndarray, reps: int = 200, seed: int = 0) -> float:
    """P(max R-hat >= the one seen) for independent stationary chains mixing as these do, by simulation.

    ``series`` (m, chains, draws): m invariants. The rank-normalised R-hat of a quantity is the larger
    of two: that of its draws (bulk) and that of their distances from the median (folded), and NUTS
    mixes the two differently. The draws of a location are often antithetic (iris pPCA k = 2: bulk
    tau 0.7-0.9) while their distances from the median are not (folded tau 1.6-2.1: the scale of a
    draw follows the energy, which mixes slowly). So each chain c of quantity j gets two stationary
    AR(1) series, one with the bulk ESS of that chain alone (:func:`bayespca.convergence.ess_bulk`,
    its two halves against each other) and one with the bulk ESS of its folded draws, and the null's
    R-hat of quantity j is the larger of their rank-normalised split R-hats. The null keeps each
    chain's mixing but puts every chain on one stationary law. The quantities are taken as
    independent; correlated ones make fewer chances to cross, so this overstates the chance when they
    are. Near 0: the chains disagree beyond their own mixing as one chain's ESS sees it (which stops
    at short lags): a stuck chain, a mode not shared, or a drift over hundreds of draws.

    Calibration on chains that mix: iris raw pPCA k = 2, 30 seeds, 4 consecutive blocks of 4 x 500
    draws each (at 4 x 20000 draws the log-likelihood's autocorrelations beyond lag 5 are within
    0.011 of 0). The chance of those 120 blocks has quantiles 0.08 (5%), 0.35, 0.56, 0.79 (75%), and
    3% fall below 0.05. With one AR(1) a chain matched to the bulk ESS alone (the earlier null) they
    were 0.035, 0.14, 0.26, 0.44, with 11% below 0.05: too small, as that null misses the folded
    draws' slower mixing.
    """
    m, chains, n = series.shape
    median = np.median(series.reshape(m, -1), axis=1)[:, None, None]
    folded = np.abs(series - median)
    rng = np.random.default_rng(seed)
    null = np.zeros(reps)
    for part in (series, folded):
        own = np.stack([ess_bulk(part[:, c:c + 1]) for c in range(chains)], axis=1)  # (m, chains)
        sim = _ar1(_phi(own, n), reps, n, rng)
        rhat = array_stats.rhat(sim, chain_axis=-2, draw_axis=-1, method="z_scale")  # (reps, m)
        null = np.maximum(null, rhat.max(axis=1))
    return float(np.mean(null >= np.max(rank_rhat(series))))


def run_one(X, model: str, k: int, seed: int, options: dict) -> dict:
    """One fit with the estimator's defaults (``options`` passed on); its row of the table."""
    if model == "ard":
        options = {**options, "prior": "ard"}
    estimator = MODELS[model](k, method="nuts", random_state=seed, **options)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the SamplingWarning's content is what we tabulate
        estimator.fit(X)
    wall = time.perf_counter() - start
    tree = estimator.posterior_
    stats = tree["sample_stats"]
    rhat, worst, ess = 1.0, "", np.inf
    series_by_name = {name: s for name, s in invariants(tree["posterior"]).items() if np.ptp(s) > 0}
    for name, series in series_by_name.items():
        r = float(az.rhat(series))
        r = r if np.isfinite(r) else np.inf
        if r > rhat:
            rhat, worst = r, name
        ess = min(ess, float(az.ess(series, method="bulk")))
    w = np.asarray(tree["posterior"]["W"])
    w = w.reshape(*w.shape[:2], -1)[..., np.ptp(w.reshape(*w.shape[:2], -1), axis=(0, 1)) > 0]
    steps = np.asarray(stats["n_steps"])
    chains = (
        f"steps/chain {np.median(steps, axis=1).tolist()} div/chain "
        f"{np.asarray(stats['diverging']).sum(axis=1).tolist()}"
    )
    if worst:
        chains += f" mean of {worst}/chain {np.round(series_by_name[worst].mean(axis=1), 4).tolist()}"
    return {
        "chains": chains,
        "div": int(np.asarray(stats["diverging"]).sum()),
        "rhat": rhat,
        "worst": worst,
        "ess": ess,
        "chance": chance_of_rhat(np.stack(list(series_by_name.values()))),
        "ess/s": ess / wall,
        "steps": float(np.median(np.asarray(stats["n_steps"]))),
        "thin": int(stats.attrs.get("thinning", 1)),
        "wall": wall,
        "wrhat": max((float(az.rhat(w[..., j])) for j in range(w.shape[-1])), default=1.0),
        "neff": getattr(estimator, "n_effective_components_", ""),
    }


def passes(row: dict) -> bool:
    return row["div"] == 0 and row["rhat"] < 1.01 and row["ess"] > 400


def cells(args) -> list[tuple[str, str, str, int]]:
    """(data, scaling, model, k) of each fit to run: the quick panel or the product of the options."""
    if args.panel is not None:
        chosen = [
            (name, scaling, model, ks)
            for name, scaling, model, ks in PANELS[args.panel]
            if model in (args.models or MODELS) and name in (args.datasets or LOADERS)
        ]
    else:
        chosen = [
            (name, scaling, model, None)
            for name in args.datasets or REAL
            for scaling in args.scalings
            for model in args.models or ("ppca", "fa")
        ]
    out = []
    for name, scaling, model, ks in chosen:
        d = load(name, scaling).shape[1]
        for k in args.k or ks or k_values(model, d):
            if args.max_k is None or k <= args.max_k:
                out.append((name, scaling, model, k))
    return out


def print_row(row: dict) -> None:
    print(
        f"{row['data']:13s} {row['scaling']:5s} {row['model']:5s} {row['k']:3d} {row['seed']:4d} "
        f"{row['ident']:>8s} {row['div']:5d} {row['rhat']:6.3f} {row['worst']:>15s} {row['ess']:6.0f} "
        f"{row['chance']:6.2f} {row['ess/s']:7.1f} {row['steps']:5.0f} {row['thin']:4d} {row['wall']:6.1f} "
        f"{row['wrhat']:6.3f} {row['neff']!s:>4s}{'' if passes(row) else '  FAIL'}",
        flush=True,
    )


def print_totals(rows: list) -> None:
    """Passes, divergences, steps and the extremes per model and identification."""
    failed = [r for r in rows if not passes(r)]
    print(
        f"{len(rows) - len(failed)} of {len(rows)} fits pass (div = 0, R-hat < 1.01, bulk ESS > 400); "
        f"total wall {sum(r['wall'] for r in rows):.0f} s"
    )
    for group in dict.fromkeys((r["model"], r["ident"]) for r in rows):
        mine = [r for r in rows if (r["model"], r["ident"]) == group]
        print(
            f"  {group[0]} ({group[1]}): {sum(passes(r) for r in mine)} of {len(mine)} pass, "
            f"{sum(r['div'] for r in mine)} divergences, median steps/draw "
            f"{np.median([r['steps'] for r in mine]):.0f}, max R-hat {max(r['rhat'] for r in mine):.3f}, "
            f"min ESS {min(r['ess'] for r in mine):.0f}, ran on {sum(r['thin'] > 1 for r in mine)}, "
            f"median ESS/s {np.median([r['ess/s'] for r in mine]):.1f}, "
            f"max R-hat of W {max(r['wrhat'] for r in mine):.3f}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--panel", default=None, choices=list(PANELS), help="a fixed cross-section")
    parser.add_argument("--datasets", nargs="+", default=None, choices=list(LOADERS))
    parser.add_argument("--scalings", nargs="+", default=["raw", "std"], choices=["raw", "std"])
    parser.add_argument("--models", nargs="+", default=None, choices=list(MODELS))
    parser.add_argument("--k", nargs="+", type=int, default=None, help="k values (default: all allowed)")
    parser.add_argument("--max-k", type=int, default=None, help="skip k above this")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--identification", default=None, help="passed to the estimator")
    parser.add_argument("--prior", default=None, help="passed to the estimator")
    parser.add_argument("--csv", default=None, help="append rows to this file")
    parser.add_argument("--verbose", action="store_true", help="per-chain steps, divergences, worst mean")
    args = parser.parse_args()
    options = {} if args.prior is None else {"prior": args.prior}
    identifications = [args.identification]
    if args.panel == "horseshoe":
        options["prior"] = "horseshoe"
        identifications = [args.identification] if args.identification else [None, "none"]
    print(
        f"{'data':13s} {'scale':5s} {'model':5s} {'k':>3s} {'seed':>4s} {'ident':>8s} {'div':>5s} "
        f"{'rhat':>6s} {'worst':>15s} {'ess':>6s} {'chance':>6s} {'ess/s':>7s} {'steps':>5s} {'thin':>4s} "
        f"{'wall':>6s} {'wrhat':>6s} {'neff':>4s}",
        flush=True,
    )
    rows, writer = [], None
    handle = open(args.csv, "a", newline="") if args.csv else None
    if handle is not None:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        if os.path.getsize(args.csv) == 0:
            writer.writeheader()
    with threadpool_limits(limits=1, user_api="blas"):
        for name, scaling, model, k in cells(args):
            X = load(name, scaling)
            for seed, ident in ((s, i) for s in args.seeds for i in identifications):
                row = {"data": name, "scaling": scaling, "model": model, "k": k, "seed": seed,
                       "ident": ident or "default"}
                chosen = options if ident is None else {**options, "identification": ident}
                row.update(run_one(X, model, k, seed, chosen))
                rows.append(row)
                print_row(row)
                if args.verbose:
                    print(f"    {row['chains']}", flush=True)
                if writer is not None:
                    writer.writerow(row)
                    handle.flush()
    if handle is not None:
        handle.close()
    print_totals(rows)


if __name__ == "__main__":
    main()
