"""Fit time of bayespca's PPCA and FactorAnalysis against scikit-learn, same process.

Usage::

    python benchmarks/bench_probabilistic.py [--repeats 3] [--missing-repeats 1] [--real-data] [--real-only]

Data: a k-factor model with heteroscedastic noise (psi_j uniform in [0.2, 2])
plus an offset, at 20000 x 100 (k = 10) and 100000 x 50 (k = 5).

* FactorAnalysis (EM, default settings) against
  ``sklearn.decomposition.FactorAnalysis`` (default settings: randomized SVD,
  ``tol=1e-2``), with both total log-likelihoods; target ratio <= 0.5 at
  equal or better log-likelihood.
* PPCA (closed form) against ``sklearn.decomposition.PCA`` (default
  solver); target ratio <= 1.0.
* PPCA and FactorAnalysis by EM with 20% of the entries missing completely
  at random, 20000 x 100, k = 10: time and EM updates.

* With ``--real-data`` (issue 19): ``FactorAnalysis`` against
  scikit-learn's defaults on iris, wine, diabetes and breast cancer, raw and
  standardised, every ``k`` up to the Ledermann bound: the log-likelihood
  difference (target: never negative) and the time ratio, cold (the first
  fit of that data in the process) and warm (median of ``--repeats``).

Times are medians over ``--repeats`` runs, ours and scikit-learn's
interleaved so that load drifts hit both. Maximum-likelihood fits compile
nothing (NumPy/SciPy), so "cold" (the first fit of each shape, timed
separately) differs from warm only by first-use costs; fresh-process
numbers are in ``bench_cold.py``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.decomposition import PCA as SkPCA
from sklearn.decomposition import FactorAnalysis as SkFA
from threadpoolctl import threadpool_limits

from bayespca.probabilistic import PPCA, FactorAnalysis

SHAPES = [(20000, 100, 10), (100000, 50, 5)]


def make_data(n, d, k, seed=0):
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((d, k)) * np.linspace(2.0, 0.5, k)
    psi = rng.uniform(0.2, 2.0, d)
    noise = rng.standard_normal((n, d)) * np.sqrt(psi)
    return rng.standard_normal((n, k)) @ loadings.T + noise + 3.0


def timed(fit):
    start = time.perf_counter()
    model = fit()
    return time.perf_counter() - start, model


def compare(name, ours, theirs, X, repeats, loglike_theirs):
    cold, model = timed(ours)
    times_ours, times_theirs = [], []
    for _ in range(repeats):
        t, model = timed(ours)
        times_ours.append(t)
        t, sk = timed(theirs)
        times_theirs.append(t)
    mo, mt = np.median(times_ours), np.median(times_theirs)
    ll_ours = model.log_likelihood_
    ll_theirs = loglike_theirs(sk)
    print(
        f"{name:<26} {cold:8.3f} {mo:8.3f} {mt:9.3f} {mo / mt:6.2f}  "
        f"{ll_ours:16.4f} {ll_theirs:16.4f} {ll_ours - ll_theirs:+10.4f}  "
        f"{model.n_iter_:5d} {getattr(sk, 'n_iter_', 1):5d}",
        flush=True,
    )


def real_data(repeats):
    """Issue 19's table: FA against scikit-learn's defaults on scikit-learn's datasets."""
    from sklearn import datasets

    from bayespca.probabilistic import ledermann_bound

    print(
        f"\n{'data':<22} {'k':>2} {'loglik ours - sk':>16} {'cold ours':>9} {'cold sk':>8} {'ratio':>6}"
        f" {'warm ours':>9} {'warm sk':>8} {'ratio':>6}"
    )
    worst = np.inf
    for name in ("iris", "wine", "diabetes", "breast_cancer"):
        raw = getattr(datasets, f"load_{name}")().data
        for scaling in ("raw", "std"):
            X = raw if scaling == "raw" else (raw - raw.mean(axis=0)) / raw.std(axis=0)
            for k in range(1, ledermann_bound(X.shape[1]) + 1):
                cold_ours, ours = timed(lambda X=X, k=k: FactorAnalysis(k).fit(X))
                cold_sk, sk = timed(lambda X=X, k=k: SkFA(k).fit(X))
                warm_ours, warm_sk = [], []
                for _ in range(repeats):
                    warm_ours.append(timed(lambda X=X, k=k: FactorAnalysis(k).fit(X))[0])
                    warm_sk.append(timed(lambda X=X, k=k: SkFA(k).fit(X))[0])
                gap = ours.log_likelihood_ - sk.score(X) * X.shape[0]
                worst = min(worst, gap)
                wo, ws = np.median(warm_ours), np.median(warm_sk)
                print(
                    f"{name + '/' + scaling:<22} {k:2d} {gap:+16.4f} {cold_ours:9.4f} {cold_sk:8.4f}"
                    f" {cold_ours / cold_sk:6.2f} {wo:9.4f} {ws:8.4f} {wo / ws:6.2f}",
                    flush=True,
                )
    print(f"smallest log-likelihood difference (ours - scikit-learn): {worst:+.4g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--missing-repeats", type=int, default=1)
    parser.add_argument("--real-data", action="store_true", help="also issue 19's real-data table")
    parser.add_argument("--real-only", action="store_true", help="only the real-data table")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # scikit-learn's ConvergenceWarning at its default tol
    if args.real_only:
        real_data(args.repeats)
        return
    print(
        f"{'fit':<26} {'cold s':>8} {'ours s':>8} {'sklearn s':>9} {'ratio':>6}  "
        f"{'loglik ours':>16} {'loglik sklearn':>16} {'diff':>10}  {'iters':>5} {'sk it':>5}"
    )
    for n, d, k in SHAPES:
        X = make_data(n, d, k)
        compare(
            f"FA {n}x{d} k={k}",
            lambda X=X, k=k: FactorAnalysis(k).fit(X),
            lambda X=X, k=k: SkFA(k).fit(X),
            X,
            args.repeats,
            lambda sk, X=X: sk.score(X) * X.shape[0],
        )
        compare(
            f"PPCA/PCA {n}x{d} k={k}",
            lambda X=X, k=k: PPCA(k).fit(X),
            lambda X=X, k=k: SkPCA(k).fit(X),
            X,
            args.repeats,
            lambda sk, X=X: sk.score(X) * X.shape[0],
        )
    if args.real_data:
        real_data(args.repeats)
    if args.missing_repeats < 1:
        return
    n, d, k = SHAPES[0]
    X = make_data(n, d, k)
    hidden = np.random.default_rng(1).random(X.shape) < 0.2
    Xm = np.where(hidden, np.nan, X)
    reps = args.missing_repeats
    print(f"\nEM with 20% missing entries (MCAR), {n}x{d} k={k}, median of {reps}:")
    for cls in (PPCA, FactorAnalysis):
        times = []
        for _ in range(args.missing_repeats):
            t, model = timed(lambda cls=cls: cls(k).fit(Xm))
            times.append(t)
        print(
            f"  {cls.__name__:<15} {np.median(times):8.2f} s  {model.n_iter_:4d} EM updates  "
            f"({np.median(times) / model.n_iter_ * 1e3:.0f} ms each)  "
            f"loglik {model.log_likelihood_:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    # One BLAS thread for both libraries: numpy's and scipy's OpenBLAS pools
    # contend on a shared 2-core machine and make timings erratic (bench_pca.py).
    with threadpool_limits(1):
        main()
