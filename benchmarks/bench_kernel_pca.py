"""Kernel PCA benchmarks: bayespca against scikit-learn, and the Nystroem approximation.

Default run (about 2-3 minutes on 2 cores)::

    PYTHONPATH=. python benchmarks/bench_kernel_pca.py

1. Fit time of ``bayespca.KernelPCA`` against ``sklearn.decomposition.KernelPCA``
   (its ``eigen_solver="auto"``), rbf kernel, d=20, k=10, n=3000 and 6000:
   median of ``--repeats`` interleaved runs in this process, ratio
   bayespca / sklearn (target <= 1.0), and agreement of the eigenvalues.
2. Nystroem (m=500 landmarks) at n=100000 against exact bayespca at n=10000:
   median time, peak memory traced by ``tracemalloc`` (NumPy allocations,
   measured in a separate untimed run), and the approximation error of
   Nystroem m=500 against the exact fit on the same n=10000 points
   (relative eigenvalue error and largest principal angle between the
   projections of the training points).

``--solvers`` instead times the three exact eigensolvers on the same centred
rbf Gram matrices over a grid of (n, k); it is the evidence for the
``solver="auto"`` rule in ``bayespca/kernel_pca.py``.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np
import scipy.linalg
from sklearn.decomposition import KernelPCA as SklearnKernelPCA
from threadpoolctl import threadpool_limits

import bayespca  # noqa: F401  (sets JAX to float64)
from bayespca.kernel_pca import (
    KernelPCA,
    _centre_gram,
    _eigh_arpack,
    _eigh_dense,
    _eigh_randomized,
)
from bayespca.kernels import Kernel


def _data(n, d, seed):
    return np.random.default_rng(seed).standard_normal((n, d))


def _median_time(func, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _peak_mib(func):
    tracemalloc.start()
    try:
        func()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def _max_angle_deg(a, b):
    """Largest principal angle between the column spaces of a and b."""
    return float(np.degrees(scipy.linalg.subspace_angles(a, b).max()))


def bench_vs_sklearn(repeats):
    print(f"\n## Fit time, rbf kernel, d=20, k=10 (median of {repeats} runs, same process)\n")
    print("| n | sklearn auto (s) | bayespca auto (s) | ratio bayespca/sklearn | solvers | "
          "max rel. eigenvalue diff |")
    print("|---|---|---|---|---|---|")
    k = 10
    for n in (3000, 6000):
        X = _data(n, 20, seed=n)
        ours, theirs = [], []
        for _ in range(repeats):  # interleaved, so both see the same machine load
            start = time.perf_counter()
            sk = SklearnKernelPCA(k, kernel="rbf", eigen_solver="auto", random_state=0).fit(X)
            theirs.append(time.perf_counter() - start)
            start = time.perf_counter()
            bp = KernelPCA(k, kernel="rbf", random_state=0).fit(X)
            ours.append(time.perf_counter() - start)
        t_sk, t_bp = np.median(theirs), np.median(ours)
        diff = np.max(np.abs(bp.eigenvalues_ - sk.eigenvalues_) / sk.eigenvalues_)
        sk_solver = "arpack" if n > 200 and k < 10 else "dense"  # sklearn's auto rule
        print(f"| {n} | {t_sk:.3f} | {t_bp:.3f} | {t_bp / t_sk:.2f} | "
              f"sklearn {sk_solver}, bayespca {bp.solver_} | {diff:.1e} |")


def bench_nystroem(repeats):
    k, m = 10, 500
    print(f"\n## Nystroem m={m} at n=100000 vs exact at n=10000 (rbf, d=20, k={k})\n")
    X_big = _data(100_000, 20, seed=1)
    X_ref = _data(10_000, 20, seed=2)

    def exact():
        return KernelPCA(k, kernel="rbf", random_state=0).fit(X_ref)

    def nystroem(X):
        return KernelPCA(k, kernel="rbf", approximation="nystroem", n_approx=m,
                         random_state=0).fit(X)

    t_exact = _median_time(exact, repeats)
    t_nys = _median_time(lambda: nystroem(X_big), repeats)
    # Untimed runs under tracemalloc, whose fits are reused for the errors.
    fits = {}
    mem_exact = _peak_mib(lambda: fits.setdefault("exact", exact()))
    mem_nys = _peak_mib(lambda: fits.setdefault("big", nystroem(X_big)))
    ref, big = fits["exact"], fits["big"]
    approx = nystroem(X_ref)
    eig_err = np.max(np.abs(approx.eigenvalues_ - ref.eigenvalues_) / ref.eigenvalues_)
    angle = _max_angle_deg(approx.eigenvectors_, ref.eigenvectors_)
    # The spectrum of K/n converges to that of the kernel's integral operator,
    # so the two sample sizes are comparable after dividing by n.
    op_err = np.max(np.abs(big.eigenvalues_ / 100_000 - ref.eigenvalues_ / 10_000)
                    / (ref.eigenvalues_ / 10_000))

    print("| fit | time (s) | peak traced memory (MiB) |")
    print("|---|---|---|")
    print(f"| exact, n=10000 | {t_exact:.2f} | {mem_exact:.0f} |")
    print(f"| Nystroem m={m}, n=100000 | {t_nys:.2f} | {mem_nys:.0f} |")
    print(f"| ratio Nystroem(n=1e5) / exact(n=1e4) | {t_nys / t_exact:.2f} | "
          f"{mem_nys / mem_exact:.2f} |")
    print(f"\nApproximation error of Nystroem m={m} vs exact on the same n=10000 points: "
          f"max relative eigenvalue error {eig_err:.2e}, largest principal angle between "
          f"the {k}-dimensional projections {angle:.2f} deg.")
    print(f"Eigenvalues / n, Nystroem at n=100000 vs exact at n=10000: max relative "
          f"difference {op_err:.2e} (sampling + approximation).")


def bench_solvers(repeats):
    print("\n## Exact eigensolvers on the centred rbf Gram matrix (d=20), seconds, "
          f"median of {repeats}\n")
    print("| n | k | dense | arpack | randomized | randomized rel. eigenvalue error | "
          "fastest exact | auto picks |")
    print("|---|---|---|---|---|---|---|---|")
    from bayespca.kernel_pca import choose_kernel_solver

    kernel = Kernel("rbf")
    for n in (200, 500, 1000, 2000):
        K = kernel(_data(n, 20, seed=n))
        _centre_gram(K)
        for k in sorted({2, 10, 50, n // 10, n // 5}):
            if k >= n - 1:
                continue
            times, evals = {}, {}
            for name, solve in (
                ("dense", lambda K=K, k=k: _eigh_dense(K.copy(), k)),
                ("arpack", lambda K=K, k=k: _eigh_arpack(K, k, 0)),
                ("randomized", lambda K=K, k=k: _eigh_randomized(K, k, 0, kernel)),
            ):
                times[name] = _median_time(solve, repeats)
                evals[name] = np.sort(solve()[0])[::-1]
            err = np.max(np.abs(evals["randomized"] - evals["dense"]) / evals["dense"][0])
            fastest = min(("dense", "arpack"), key=times.get)
            print(f"| {n} | {k} | {times['dense']:.4f} | {times['arpack']:.4f} | "
                  f"{times['randomized']:.4f} | {err:.1e} | {fastest} | {choose_kernel_solver(n, k)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--solvers", action="store_true",
                        help="time the exact eigensolvers over a grid of (n, k) instead")
    args = parser.parse_args()
    if args.solvers:
        bench_solvers(args.repeats)
        return
    bench_vs_sklearn(args.repeats)
    bench_nystroem(args.repeats)


if __name__ == "__main__":
    # One BLAS thread for both libraries: numpy's and scipy's OpenBLAS pools
    # contend on a shared 2-core machine and make timings erratic (bench_pca.py).
    with threadpool_limits(1):
        main()
