"""ESS per second and leapfrog steps per draw: bayespca's NUTS against naive NumPyro models.

Run: PYTHONPATH=. python benchmarks/bench_nuts.py [--quick | --wide | --more]   (one BLAS thread)

``--wide`` instead times pPCA on wider data (d = 30, 50, 100) with the chains whitened by the
rotated Laplace factor (:mod:`bayespca.inference.rotated_factor`) and by the dense one.
``--more`` times ``sample_more(500)`` (the chains run on) against the user's alternative, a
new fit with twice the draws, on synthetic and real data.

Models, all on the same data (n=1000, d=20, k=3) in the same process, one chain each:

* ``bayespca``: :func:`bayespca.inference.nuts.fit_nuts` (sufficient statistics, polar
  identification, Laplace-whitened coordinates, diagonal mass): a first call (which compiles),
  then warm calls on new data of the same shapes (the compiled sampler is reused), at n=1000
  and at n=100000;
* ``explicit z``: NumPyro NUTS on :func:`bayespca.models.ppca` with ``latent="explicit"``;
* ``row-by-row``: NumPyro NUTS on a marginal model with one ``MultivariateNormal`` per row.

ESS/s = minimum ESS (bulk and tail) over the invariant quantities (sigma^2 and the
eigenvalues of W W^T), and separately over the identified loadings (bayespca's only; the
naive models' W is not identified), divided by the wall time of the call (compilation
included where the call compiles: the first bayespca call and every naive NumPyro run).
"""

from __future__ import annotations

import argparse
import functools
import time

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS
from threadpoolctl import threadpool_limits

from bayespca.inference.contract import ModelSpec
from bayespca.inference.nuts import fit_nuts
from bayespca.models import ppca
from bayespca.statistics import prepare


def _data(n, d=20, k=3, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, k)) * np.array([3.0, 2.0, 1.5])
    return rng.normal(size=(n, k)) @ w.T + 0.7 * rng.normal(size=(n, d)) + 5.0


def _min_ess(series_list):
    out = np.inf
    for s in series_list:
        s = np.asarray(s)[None] if np.ndim(s) == 1 else np.asarray(s)
        out = min(out, float(az.ess(s, method="bulk")), float(az.ess(s, method="tail", prob=0.9)))
    return out


def _invariants(w, sigma2):
    eig = np.linalg.svd(w, compute_uv=False) ** 2  # (..., k)
    return [sigma2, *np.moveaxis(eig, -1, 0)]


def row_by_row(X, k):
    n, d = X.shape
    s = float(np.sqrt(np.mean(np.var(X, axis=0))))
    W = numpyro.sample("W", dist.Normal(0.0, s).expand((d, k)).to_event(2))
    sigma = numpyro.sample("sigma", dist.HalfNormal(s))
    mu = numpyro.sample("mu", dist.Normal(jnp.mean(X, 0), 10 * s).to_event(1))
    cov = W @ W.T + sigma**2 * jnp.eye(d)
    with numpyro.plate("obs", n):
        numpyro.sample("X", dist.MultivariateNormal(mu, cov), obs=X)


def _naive(model, X, warmup, samples, seed):
    mcmc = MCMC(NUTS(model), num_warmup=warmup, num_samples=samples, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.key(seed), X, extra_fields=("num_steps",))
    s = mcmc.get_samples()
    jax.block_until_ready(s)
    wall = time.perf_counter() - start
    inv = _invariants(np.asarray(s["W"]), np.asarray(s["sigma"]) ** 2)
    steps = float(np.median(mcmc.get_extra_fields()["num_steps"]))
    return wall, steps, _min_ess(inv), np.nan


def _ours(X, warmup, samples, seed):
    start = time.perf_counter()
    spec = ModelSpec("isotropic", 3)
    fit = fit_nuts(prepare(X), spec, num_warmup=warmup, num_samples=samples, num_chains=1, random_state=seed)
    wall = time.perf_counter() - start
    draws = fit.draws
    inv = _invariants(draws.loadings[0], draws.noise[0, :, 0])
    loadings = draws.loadings[0].reshape(samples, -1).T
    steps = float(np.median(draws.sample_stats["n_steps"]))
    return wall, steps, _min_ess(inv), _min_ess(loadings)


WIDE_SHAPES = ((1000, 30, 5), (2000, 50, 5), (5000, 100, 10))


def _wide_fit(X, k, chains, draws, seed):
    """Wall time, median leapfrog steps per draw and min bulk ESS of the invariants of one warm fit."""
    start = time.perf_counter()
    fit = fit_nuts(prepare(X), ModelSpec("isotropic", k), num_warmup=draws, num_samples=draws,
                   num_chains=chains, random_state=seed, progress_bar=False)
    wall = time.perf_counter() - start
    draws_ = fit.draws
    eig = np.linalg.svd(draws_.loadings, compute_uv=False) ** 2
    series = [draws_.noise[..., 0], *np.moveaxis(eig, -1, 0)]
    ess = min(float(az.ess(np.asarray(s), method="bulk")) for s in series)
    return wall, float(np.median(draws_.sample_stats["n_steps"])), ess


def wide(chains, draws):
    """pPCA by NUTS on wider data: the rotated Laplace factor against the dense one, same process.

    Warm fits (each configuration compiled by a short fit first), default threads. The dense
    factor is forced by raising the runner's size threshold.
    """
    from bayespca.inference import nuts

    print(f"\npPCA, {chains} chains x ({draws} + {draws}), warm, rotated vs dense Laplace factor")
    print(f"{'n x d, k':>16} {'p':>5} {'factor':>8} {'wall s':>8} {'steps':>6} {'min ESS':>8} "
          f"{'ESS/s':>7} {'dense/rotated wall':>19}")
    threshold = nuts._ROTATED_ABOVE
    for n, d, k in WIDE_SHAPES:
        rng = np.random.default_rng(d)
        w = rng.normal(size=(d, k)) * np.linspace(3.0, 1.0, k)
        X = rng.normal(size=(n, k)) @ w.T + rng.normal(size=(n, d))
        p = d * k + k + d + 1
        walls = {}
        for label, above in (("rotated", threshold), ("dense", 10**9)):
            nuts._ROTATED_ABOVE = above
            fit_nuts(prepare(X), ModelSpec("isotropic", k), num_warmup=2, num_samples=2, num_chains=chains,
                     random_state=0, progress_bar=False)  # compiles
            wall, steps, ess = _wide_fit(X, k, chains, draws, 0)
            walls[label] = wall
            ratio = f"{walls['dense'] / walls['rotated']:19.1f}" if label == "dense" else ""
            print(f"{f'{n} x {d}, {k}':>16} {p:5d} {label:>8} {wall:8.1f} {steps:6.0f} {ess:8.0f} "
                  f"{ess / wall:7.1f}{ratio}", flush=True)
        nuts._ROTATED_ABOVE = threshold


def _more_cases():
    from sklearn.datasets import load_diabetes, load_wine

    from bayespca import PPCA, FactorAnalysis

    def standardised(load):
        X = load().data
        return (X - X.mean(0)) / X.std(0)

    return (
        ("PPCA(3), 1000 x 20", PPCA, 3, _data(1000)),
        ("FA(5), diabetes std", FactorAnalysis, 5, standardised(load_diabetes)),
        ("PPCA(6), wine std", PPCA, 6, standardised(load_wine)),
    )


def _min_bulk_ess(model):
    w = model.loadings_samples_
    eig = np.linalg.svd(w, compute_uv=False) ** 2
    noise = np.asarray(model.noise_variance_samples_).reshape(*w.shape[:2], -1)
    series = [*np.moveaxis(noise, -1, 0), *np.moveaxis(eig, -1, 0)]
    return min(float(az.ess(np.asarray(s), method="bulk")) for s in series)


def more(repeats):
    """``sample_more(500)`` after a default fit (4 x (500 + 500)) against a fit of 4 x (500 + 1000).

    Warm (each configuration compiled by a first fit), default threads, medians of ``repeats``;
    ESS is the smallest bulk ESS over the noise variances and the eigenvalues of W W^T.
    """
    import warnings

    print(f"\nMore draws, warm, default threads, medians of {repeats}: sample_more(500) after a default fit "
          "vs a new fit with num_samples=1000")
    print(f"{'data, model':>22} {'fit s':>7} {'more s':>7} {'refit s':>8} {'refit/more':>10} "
          f"{'ESS fit':>8} {'ESS +more':>9} {'ESS refit':>9}")
    for label, estimator, k, X in _more_cases():
        options = {"method": "nuts", "random_state": 0, "progress_bar": False}
        times = {"fit": [], "more": [], "refit": []}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            estimator(k, **options).fit(X)  # compiles
            for _ in range(repeats):
                start = time.perf_counter()
                model = estimator(k, **options).fit(X)
                times["fit"].append(time.perf_counter() - start)
                ess_fit = _min_bulk_ess(model)
                start = time.perf_counter()
                model.sample_more(500)
                times["more"].append(time.perf_counter() - start)
                start = time.perf_counter()
                refit = estimator(k, num_samples=1000, **options).fit(X)
                times["refit"].append(time.perf_counter() - start)
        fit_s, more_s, refit_s = (float(np.median(times[key])) for key in ("fit", "more", "refit"))
        print(f"{label:>22} {fit_s:7.2f} {more_s:7.2f} {refit_s:8.2f} {refit_s / more_s:10.1f} "
              f"{ess_fit:8.0f} {_min_bulk_ess(model):9.0f} {_min_bulk_ess(refit):9.0f}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick", action="store_true", help="200+200 draws (naive models 100+100), skip explicit z"
    )
    parser.add_argument(
        "--wide", action="store_true",
        help="only the table of wider data (rotated vs dense Laplace factor, 4 chains x (500 + 500))",
    )
    parser.add_argument("--more", action="store_true", help="only the sample_more table")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the --more table")
    args = parser.parse_args()
    if args.more:
        more(args.repeats)
        return
    if args.wide:
        wide(4, 500)
        return
    warmup = samples = 200 if args.quick else 500
    naive = 100 if args.quick else warmup
    X = _data(1000)
    print(
        f"bayespca {warmup}+{samples} draws, naive models {naive}+{naive}; 1 chain; "
        "wall includes compile for '1st call' and the naive models"
    )
    print(
        f"{'model':24s} {'wall s':>8s} {'steps/draw':>10s} {'minESS inv':>10s} {'ESS/s inv':>9s} "
        f"{'ESS/s W':>8s} {'ours/this':>9s}",
        flush=True,
    )
    runs = [
        ("bayespca n=1000 1st call", lambda: _ours(X, warmup, samples, 0)),
        ("bayespca n=1000 warm", lambda: _ours(_data(1000, seed=1), warmup, samples, 1)),
        ("bayespca n=100000 warm", lambda: _ours(_data(100_000), warmup, samples, 0)),
        ("row-by-row MVN n=1000", lambda: _naive(functools.partial(row_by_row, k=3), X, naive, naive, 0)),
    ]
    if not args.quick:
        explicit = functools.partial(ppca, n_components=3, latent="explicit", identification="none")
        runs.append(("explicit z n=1000", lambda: _naive(explicit, X, naive, naive, 0)))
    base, walls, rates = None, {}, {}
    for name, run in runs:
        with threadpool_limits(1):
            wall, steps, ess_inv, ess_w = run()
        walls[name] = wall
        rate = rates[name] = ess_inv / wall
        base = rate if base is None else base
        print(
            f"{name:24s} {wall:8.1f} {steps:10.0f} {ess_inv:10.0f} {rate:9.2f} "
            f"{ess_w / wall:8.2f} {base / rate:9.1f}",
            flush=True,
        )
    ratio = walls["bayespca n=100000 warm"] / walls["bayespca n=1000 warm"]
    print(f"wall n=100000 / n=1000 (both warm): {ratio:.2f}")
    if "explicit z n=1000" in rates:
        for name in ("bayespca n=1000 1st call", "bayespca n=1000 warm"):
            print(f"ESS/s {name} / explicit z: {rates[name] / rates['explicit z n=1000']:.0f}x")


if __name__ == "__main__":
    main()
