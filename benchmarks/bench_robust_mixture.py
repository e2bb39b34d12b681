"""Robust pPCA and mixtures of pPCA against what a user has otherwise, same process.

Usage::

    python benchmarks/bench_robust_mixture.py [--repeats 3] [--nuts-draws 500]

1. Robustness: a 3-dimensional subspace in 20 features (noise sd 0.5),
   2000 rows of which 10% are replaced by gross outliers (sd 20).
   ``RobustPPCA`` (ECME, nu estimated) against scikit-learn's ``PCA`` and
   bayespca's ``PPCA`` on the same rows: time and the largest principal
   angle to the true subspace.
2. Clustering: 3 clusters of 1000 rows, each a 2-plane in 20 features:
   noise sd 0.5 and centres far apart ("separated"), or noise sd 2.5 and
   centres close ("overlapping").
   ``MixturePPCA(3, 2)`` (EM, 1 and 5 k-means++ starts) against
   scikit-learn's ``GaussianMixture(3, covariance_type="full")`` (default:
   one k-means start, ``tol=1e-3``): time, training log-likelihood,
   log-likelihood per row of 3000 new rows from the same clusters, adjusted
   Rand index on the training rows.
3. NUTS: ``RobustPPCA(method="nuts")`` (500 x 10, k = 2, t rows) and
   ``MixturePPCA(method="nuts")`` (3 x 200 x 6, k = 1), 2 chains: wall time
   of the first fit (it compiles the sampler) and of a fit of new rows of
   the same shape (it reuses it), bulk ESS of the invariant quantities and
   min ESS per second of the second fit.
4. Real data (``--iris-seeds``): ``MixturePPCA(3, 1, method="nuts")`` on
   iris at default settings, with the chains run on where they fail the
   users' check and without (the sampler's gate switched off, as before
   the run-on): whether each fit passes (no ``SamplingWarning``), the
   transitions a draw kept, the smallest ESS and the wall time (after one
   fit that compiles).

Times are medians over ``--repeats`` runs (ours and the baseline
interleaved); "cold" is the first bayespca fit of the shape (it compiles
the JAX log-densities). Each timing is taken with the default BLAS threads
and with one (threadpoolctl).
"""

from __future__ import annotations

import argparse
import time
import warnings

import arviz as az
import numpy as np
from scipy.linalg import subspace_angles
from sklearn.decomposition import PCA as SkPCA
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture
from threadpoolctl import threadpool_limits

from bayespca import PPCA, MixturePPCA, RobustPPCA


def contaminated(n=2000, d=20, k=3, share=0.1, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, k)) * np.linspace(3.0, 2.0, k)
    X = rng.normal(size=(n, k)) @ w.T + 0.5 * rng.normal(size=(n, d))
    out = rng.random(n) < share
    X[out] = 20.0 * rng.standard_normal((out.sum(), d))
    return X, w


def clusters(n_per=1000, d=20, k=2, K=3, seed=0, spread=4.0, noise=0.5, test_per=0):
    """Training rows and labels (and ``test_per`` new rows per cluster, when asked)."""
    rng = np.random.default_rng(seed)
    blocks, labels, tests = [], [], []
    for c in range(K):
        w, centre = 2.0 * rng.normal(size=(d, k)), spread * rng.normal(size=d)
        for size, out in ((n_per, blocks), (test_per, tests)):
            out.append(rng.normal(size=(size, k)) @ w.T + noise * rng.normal(size=(size, d)) + centre)
        labels += [c] * n_per
    if test_per:
        return np.vstack(blocks), np.array(labels), np.vstack(tests)
    return np.vstack(blocks), np.array(labels)


def timed(fit):
    start = time.perf_counter()
    out = fit()
    return time.perf_counter() - start, out


def medians(fits, repeats):
    """Cold time of each fit (first call), then interleaved medians and the last results."""
    cold = {name: timed(f)[0] for name, f in fits.items()}
    times = {name: [] for name in fits}
    results = {}
    for _ in range(repeats):
        for name, f in fits.items():
            t, results[name] = timed(f)
            times[name].append(t)
    return cold, {name: float(np.median(t)) for name, t in times.items()}, results


def robustness(repeats):
    X, w = contaminated()
    fits = {
        "RobustPPCA (EM)": lambda: RobustPPCA(3).fit(X),
        "PPCA (closed form)": lambda: PPCA(3).fit(X),
        "sklearn PCA": lambda: SkPCA(3).fit(X),
    }
    print("\n1. Robustness: 2000 x 20, k = 3, 10% gross outliers")
    print(f"{'threads':<8} {'method':<20} {'cold s':>8} {'warm s':>8} {'ratio':>7} {'angle deg':>10}")
    for threads in (None, 1):
        with threadpool_limits(limits=threads):
            cold, warm, res = medians(fits, repeats)
        base = warm["sklearn PCA"]
        for name, model in res.items():
            basis = model.components_.T
            angle = np.degrees(subspace_angles(basis, w)).max()
            label = "default" if threads is None else "1"
            print(f"{label:<8} {name:<20} {cold[name]:8.3f} {warm[name]:8.3f} {warm[name] / base:7.2f} "
                  f"{angle:10.2f}")
        robust = res["RobustPPCA (EM)"]
        print(f"{'':<8} RobustPPCA: nu = {robust.nu_:.2f}, {robust.n_iter_} EM cycles")


def clustering(repeats):
    print("\n2. Clustering: 3 x 1000 x 20, k = 2 per cluster")
    print(f"{'data':<12} {'threads':<8} {'method':<28} {'cold s':>7} {'warm s':>7} {'ratio':>6} "
          f"{'log-lik':>10} {'new rows':>8} {'ARI':>6} {'params':>6}")
    for data, spread, noise in (("separated", 4.0, 0.5), ("overlapping", 1.0, 2.5)):
        X, labels, X_new = clusters(spread=spread, noise=noise, test_per=1000)
        fits = {
            "MixturePPCA(3, 2), 1 start": lambda X=X: MixturePPCA(3, 2, n_init=1, random_state=0).fit(X),
            "MixturePPCA(3, 2), 5 starts": lambda X=X: MixturePPCA(3, 2, random_state=0).fit(X),
            "sklearn GaussianMixture": lambda X=X: GaussianMixture(3, covariance_type="full",
                                                                   random_state=0).fit(X),
        }
        for threads in (None, 1):
            with threadpool_limits(limits=threads):
                cold, warm, res = medians(fits, repeats)
            base = warm["sklearn GaussianMixture"]
            for name, model in res.items():
                if isinstance(model, GaussianMixture):
                    ll, params = model.score(X) * X.shape[0], model._n_parameters()
                else:
                    ll, params = model.log_likelihood_, model.n_parameters_
                label = "default" if threads is None else "1"
                print(f"{data:<12} {label:<8} {name:<28} {cold[name]:7.3f} {warm[name]:7.3f} "
                      f"{warm[name] / base:6.2f} {ll:10.1f} {model.score(X_new):8.3f} "
                      f"{adjusted_rand_score(labels, model.predict(X)):6.3f} {params:6d}")


def ess_report(name, seconds, quantities):
    ess = {q: float(az.ess(v, method="bulk")) for q, v in quantities.items()}
    worst = min(ess, key=ess.get)
    print(f"{name:<28} {seconds:8.1f} " + " ".join(f"{q}={e:.0f}" for q, e in ess.items())
          + f"  min ESS/s = {ess[worst] / seconds:.1f} ({worst})")


def t_rows(seed):
    """500 x 10 rows, a 2-plane with noise 0.5, each row scaled by a Gamma(2, 0.5) draw (t-like tails)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(10, 2)) * [3.0, 2.0]
    u = rng.gamma(2.0, 0.5, 500)
    return (rng.normal(size=(500, 2)) @ w.T + 0.5 * rng.normal(size=(500, 10))) / np.sqrt(u)[:, None]


def nuts(draws):
    print(f"\n3. NUTS, 2 chains x ({draws} warm-up + {draws} draws), wall time: the first fit (compiles) "
          "and a fit of new rows of the same shape")
    options = {"method": "nuts", "num_warmup": draws, "num_samples": draws, "num_chains": 2,
               "random_state": 0}
    rows = (t_rows(1), t_rows(3), *(clusters(n_per=200, d=6, k=1, seed=seed)[0] for seed in (2, 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first, _ = timed(lambda: RobustPPCA(2, **options).fit(rows[0]))
        t, robust = timed(lambda: RobustPPCA(2, **options).fit(rows[1]))
    post = robust.posterior_["posterior"]
    print(f"RobustPPCA first fit {first:.1f} s")
    ess_report("RobustPPCA 500 x 10, k=2", t, {"nu": post["nu"].values, "sigma2": post["sigma2"].values,
                                               "log_lik": post["log_lik"].values})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first, _ = timed(lambda: MixturePPCA(3, 1, **options).fit(rows[2]))
        t, mix = timed(lambda: MixturePPCA(3, 1, **options).fit(rows[3]))
    post = mix.posterior_["posterior"]
    quantities = {f"sigma2[{c}]": post["sigma2"].values[..., c] for c in range(3)}
    quantities["log_lik"] = post["log_lik"].values
    print(f"MixturePPCA first fit {first:.1f} s")
    ess_report("MixturePPCA 600 x 6, K=3 k=1", t, quantities)
    steps = mix.nuts_.sample_stats["n_steps"].mean(), robust.nuts_.sample_stats["n_steps"].mean()
    print(f"leapfrog steps per draw: mixture {steps[0]:.1f}, robust {steps[1]:.1f}")


def iris_mixture(seeds):
    from sklearn.datasets import load_iris

    from bayespca.inference import nuts as runner
    from bayespca.posterior import SamplingWarning, worst_convergence

    X = load_iris().data
    options = {"method": "nuts", "progress_bar": False}
    gate = runner._worth_running_on
    print(f"\n4. MixturePPCA(3, 1) on iris, default settings (4 x 500), seeds 0-{seeds - 1}: run on / not")
    print(f"{'seed':>4} {'passes':>13} {'thinning':>8} {'min ESS':>15} {'wall s':>11}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MixturePPCA(3, 1, random_state=0, **options).fit(X)  # compiles
    passed = [0, 0]
    for seed in range(seeds):
        cells = []
        for on in (True, False):
            runner._worth_running_on = gate if on else (lambda short, thinning=1: False)
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    t, model = timed(lambda seed=seed: MixturePPCA(3, 1, random_state=seed, **options).fit(X))
            finally:
                runner._worth_running_on = gate
            ok = not any(w.category is SamplingWarning for w in caught)
            passed[not on] += ok
            ess = worst_convergence(model.nuts_)[1][1]
            cells.append((ok, model.posterior_["sample_stats"].attrs["thinning"], ess, t))
        (a, ta, ea, wa), (b, _, eb, wb) = cells
        print(f"{seed:>4} {str(a):>6} / {str(b):<5} {ta:>8} {ea:>7.0f} / {eb:<5.0f} {wa:>5.1f} / {wb:<4.1f}")
    print(f"passed: {passed[0]} of {seeds} run on, {passed[1]} of {seeds} without")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nuts-draws", type=int, default=500)
    parser.add_argument("--iris-seeds", type=int, default=8)
    parser.add_argument("--only-iris", action="store_true", help="section 4 alone")
    args = parser.parse_args()
    if not args.only_iris:
        robustness(args.repeats)
        clustering(args.repeats)
        nuts(args.nuts_draws)
    iris_mixture(args.iris_seeds)


if __name__ == "__main__":
    main()
