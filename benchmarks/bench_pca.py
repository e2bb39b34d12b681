"""Fit time of bayespca.PCA against scikit-learn's PCA: cold (fresh process) and warm, default threads.

Usage::

    python benchmarks/bench_pca.py [--repeats 5] [--threads N] [--warm-only | --cold-only]
                                   [--shapes 10000x37,100000x100] [--solvers]

Cold: for each shape, ``--repeats`` fresh processes fit ``bayespca.PCA(k)``
once and as many fit ``sklearn.decomposition.PCA(k)`` once, alternating (imports and data
generation are not timed; the first fit in a process is: it pays for
starting BLAS thread pools and any first-call set-up, as a notebook user
does). Warm: in one process, the two fits interleaved ``--repeats`` times
after one untimed fit of each. Each row prints the medians and their ratio
(target <= 1.0), and the solver bayespca chose; with ``--solvers`` also
the warm median of every bayespca solver, to check that "auto" picks the
fastest.

BLAS threads are left at the machine's default (what users have) unless
``--threads`` is given. NumPy and SciPy each load their own OpenBLAS; the
PCA solvers run on NumPy's only (see :mod:`bayespca.linalg`), as
scikit-learn's PCA does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SHAPES = [
    (100, 5, 2), (150, 4, 2), (300, 10, 3), (1000, 20, 5), (10000, 37, 5), (5000, 200, 10),
    (20000, 100, 10), (100000, 50, 5), (100000, 100, 10), (2000, 2000, 10), (1000, 5000, 10),
    (500, 20000, 10),
]


def make_data(n, d, rank=20, seed=0):
    rng = np.random.default_rng(seed)
    r = min(rank, n, d)
    signal = rng.standard_normal((n, r)) @ (rng.standard_normal((r, d)) * np.linspace(3, 1, r)[:, None])
    return signal + rng.standard_normal((n, d)) + 5.0


def estimator(library, k):
    if library == "bayespca":
        from bayespca import PCA

        return PCA(k, random_state=0)
    from sklearn.decomposition import PCA as SkPCA

    return SkPCA(k, random_state=0)


def timed_fit(library, X, k):
    est = estimator(library, k)
    start = time.perf_counter()
    est.fit(X)
    return time.perf_counter() - start, getattr(est, "solver_", getattr(est, "_fit_svd_solver", ""))


def child(args):
    """One cold fit in this (fresh) process; prints JSON."""
    import sklearn.decomposition  # noqa: F401

    import bayespca  # noqa: F401  (imported before timing, as a user would have)

    X = make_data(args.n, args.d)
    seconds, solver = timed_fit(args.library, X, args.k)
    print(json.dumps({"seconds": seconds, "solver": solver}))


def cold(n, d, k, repeats, threads):
    """Median first-fit time of each library over ``repeats`` fresh processes, interleaved."""
    env = dict(os.environ)
    if threads is not None:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
    out = {"bayespca": [], "sklearn": []}
    for _ in range(repeats):
        for library in out:  # alternating, so load drifts hit both
            cmd = [sys.executable, __file__, "--child", library, "--n", str(n), "--d", str(d), "--k", str(k)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            out[library].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    ours, theirs = ([o["seconds"] for o in out[lib]] for lib in ("bayespca", "sklearn"))
    return float(np.median(ours)), float(np.median(theirs)), out["bayespca"][0]["solver"]


def warm(n, d, k, repeats):
    X = make_data(n, d)
    for library in ("bayespca", "sklearn"):
        timed_fit(library, X, k)
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(timed_fit("bayespca", X, k)[0])
        theirs.append(timed_fit("sklearn", X, k)[0])
    return float(np.median(ours)), float(np.median(theirs)), timed_fit("bayespca", X, k)[1]


def solver_times(n, d, k, repeats):
    """Warm median of each bayespca solver, skipping those that would take minutes or gigabytes."""
    from bayespca import PCA

    X = make_data(n, d)
    parts = []
    for solver in ("full", "covariance", "gram", "randomized"):
        if ((solver == "full" and n * d * min(n, d) > 4e9) or (solver == "gram" and n > 5000)
                or (solver == "covariance" and d > 5000)):
            parts.append(f"{solver}=skipped")
            continue
        times = []
        for _ in range(max(1, repeats // 2)):
            start = time.perf_counter()
            PCA(k, solver=solver, random_state=0).fit(X)
            times.append(time.perf_counter() - start)
        parts.append(f"{solver}={np.median(times):.3f}")
    return " ".join(parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: the machine's)")
    parser.add_argument("--shapes", default=None, help="e.g. 10000x37,100000x100 (k = 10 or min(n, d) // 2)")
    parser.add_argument("--warm-only", action="store_true")
    parser.add_argument("--cold-only", action="store_true")
    parser.add_argument("--solvers", action="store_true", help="also time every bayespca solver (warm)")
    parser.add_argument("--child", choices=["bayespca", "sklearn"], help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--d", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.library = args.child
        child(args)
        return
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        shapes = [(n, d, min(10, max(min(n, d) // 2, 1))) for n, d in shapes]
    if args.threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    print(f"threads: {'default' if args.threads is None else args.threads}, medians of {args.repeats}")
    print(f"{'shape':>16} {'solver':>11} | {'cold ours':>9} {'cold sk':>8} {'ratio':>6} | "
          f"{'warm ours':>9} {'warm sk':>8} {'ratio':>6}")
    for n, d, k in shapes:
        row = f"{f'{n}x{d} k={k}':>16}"
        solver = ""
        cold_part = warm_part = " " * 27
        if not args.warm_only:
            ours, theirs, solver = cold(n, d, k, args.repeats, args.threads)
            cold_part = f"{ours:9.4f} {theirs:8.4f} {ours / theirs:6.2f}"
        if not args.cold_only:
            ours, theirs, solver = warm(n, d, k, args.repeats)
            warm_part = f"{ours:9.4f} {theirs:8.4f} {ours / theirs:6.2f}"
        extra = solver_times(n, d, k, args.repeats) if args.solvers else ""
        print(f"{row} {solver:>11} | {cold_part} | {warm_part}  {extra}", flush=True)


if __name__ == "__main__":
    main()
