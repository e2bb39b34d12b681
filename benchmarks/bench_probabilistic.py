"""Fit time of bayespca's PPCA and FactorAnalysis against scikit-learn, same process.

Usage::

    python benchmarks/bench_probabilistic.py [--repeats 3] [--missing-repeats 1]

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

Times are medians over ``--repeats`` runs, ours and scikit-learn's
interleaved so that load drifts hit both. The first bayespca fit of each
shape compiles its JAX functions; it is timed separately ("cold") and not
part of the median.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.decomposition import PCA as SkPCA
from sklearn.decomposition import FactorAnalysis as SkFA

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


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--missing-repeats", type=int, default=1)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # scikit-learn's ConvergenceWarning at its default tol
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
            f"({np.median(times) / model.n_iter_ * 1e3:.0f} ms each, compile included)  "
            f"loglik {model.log_likelihood_:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
