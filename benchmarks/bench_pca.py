"""Fit time of bayespca.PCA against scikit-learn's PCA, same process.

Usage::

    python benchmarks/bench_pca.py [--repeats 5] [--solvers]

For each shape it prints the median fit time of ``bayespca.PCA(solver="auto")``
and ``sklearn.decomposition.PCA(svd_solver="auto")`` over ``--repeats`` runs
(interleaved, so load drifts hit both), their ratio (target <= 1.0), and with
``--solvers`` the median of every bayespca solver, to check that "auto" picks
the fastest.

BLAS runs with ``--threads`` threads (default 1) for both libraries:
numpy and scipy each load their own OpenBLAS, and on a shared 2-core
machine their two thread pools hand work to each other so badly that the
same call varies by 10x or more; one thread makes the ratios repeatable.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.decomposition import PCA as SkPCA
from threadpoolctl import threadpool_limits

from bayespca import PCA
from bayespca.linalg import choose_solver

SHAPES = [(20000, 100, 10), (2000, 2000, 10), (100000, 50, 5), (500, 20000, 10)]


def make_data(n, d, rank=20, seed=0):
    rng = np.random.default_rng(seed)
    r = min(rank, n, d)
    signal = rng.standard_normal((n, r)) @ (rng.standard_normal((r, d)) * np.linspace(3, 1, r)[:, None])
    return signal + rng.standard_normal((n, d)) + 5.0


def timed(estimator, X):
    start = time.perf_counter()
    estimator.fit(X)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--solvers", action="store_true", help="also time every bayespca solver")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
    args = parser.parse_args()
    with threadpool_limits(args.threads):
        run(args)


def run(args):
    header = f"{'shape':>18} {'auto->':>11} {'bayespca s':>11} {'sklearn s':>10} {'ratio':>6}"
    print(header + "  solvers (median s)")
    for n, d, k in SHAPES:
        X = make_data(n, d)
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(timed(PCA(k, random_state=0), X))
            theirs.append(timed(SkPCA(k, random_state=0), X))
        extra = ""
        if args.solvers:
            parts = []
            for solver in ("full", "covariance", "gram", "randomized"):
                # Skip solvers that would take minutes or gigabytes at this shape.
                if ((solver == "full" and n * d * min(n, d) > 4e9)
                        or (solver == "gram" and n > 5000) or (solver == "covariance" and d > 5000)):
                    parts.append(f"{solver}=skipped")
                    continue
                t = [timed(PCA(k, solver=solver, random_state=0), X)
                     for _ in range(max(1, args.repeats // 2))]
                parts.append(f"{solver}={np.median(t):.3f}")
            extra = " ".join(parts)
        mo, mt = np.median(ours), np.median(theirs)
        print(f"{f'{n}x{d} k={k}':>18} {choose_solver(n, d, k):>11} {mo:11.3f} {mt:10.3f} "
              f"{mo / mt:6.2f}  {extra}", flush=True)


if __name__ == "__main__":
    main()
