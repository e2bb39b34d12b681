"""PCA of a sparse matrix too big to densify: bayespca against scikit-learn, same process.

Usage::

    python benchmarks/bench_sparse.py [--n 1000000] [--d 100000] [--density 1e-4] [--repeats 1] [--flat]

The matrix (``n x d`` at ``density``, uniform values; 10^6 x 10^5 at 1e-4
is 10^7 nonzeros, 160 MB sparse, 800 GB dense) is built once. Its first
five columns are weighted 100, 80, 60, 50, 40 (as in
``tests/test_sparse_input.py``), so the five leading singular values stand
well clear of the bulk and every method can find them; ``--flat`` leaves
all columns at weight 1, a spectrum without a gap, on which a randomized
solver of fixed depth underestimates the leading values (ARPACK iterates
to convergence). Timed, fit
of 5 components, interleaved ``--repeats`` times (medians, ratio to
bayespca; above 1 means slower than bayespca):

* ``bayespca.PCA(solver="randomized")``: centred implicitly inside the
  products (block Krylov depth 3);
* scikit-learn ``PCA(svd_solver="arpack")``: also centres implicitly
  (its sparse support, scikit-learn >= 1.4); ``"covariance_eigh"`` would
  form a dense d x d matrix (80 GB here) and is not run;
* scikit-learn ``TruncatedSVD`` (randomized, 5 iterations): does NOT
  centre, so it answers another question (the SVD of X, whose first axis
  is the mean direction); shown because it is what users pick for sparse
  data. Its singular values are printed next to the others for that reason.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse
import sklearn
from sklearn.decomposition import PCA as SkPCA
from sklearn.decomposition import TruncatedSVD

from bayespca import PCA

K = 5


def make_matrix(n: int, d: int, density: float, flat: bool, seed: int = 0) -> scipy.sparse.csr_array:
    rng = np.random.default_rng(seed)
    nnz = int(n * d * density)
    rows, cols = rng.integers(0, n, nnz), rng.integers(0, d, nnz)
    X = scipy.sparse.csr_array(scipy.sparse.coo_array((rng.random(nnz), (rows, cols)), (n, d)))
    if flat:
        return X
    weights = np.ones(d)
    weights[:K] = [100.0, 80.0, 60.0, 50.0, 40.0]
    return scipy.sparse.csr_array(X @ scipy.sparse.diags_array(weights))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10**6)
    parser.add_argument("--d", type=int, default=10**5)
    parser.add_argument("--density", type=float, default=1e-4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--flat", action="store_true", help="no planted leading columns")
    args = parser.parse_args()
    X = make_matrix(args.n, args.d, args.density, args.flat)
    size = (X.data.nbytes + X.indices.nbytes) / 1e6
    print(f"X: {args.n} x {args.d}, {X.nnz} nonzeros, {size:.0f} MB sparse, "
          f"{args.n * args.d * 8 / 1e9:.0f} GB dense; scikit-learn {sklearn.__version__}")
    fits = {
        "bayespca PCA randomized": lambda: PCA(K, solver="randomized", random_state=0)
        .fit(X).singular_values_,
        "sklearn PCA arpack": lambda: SkPCA(K, svd_solver="arpack", random_state=0).fit(X).singular_values_,
        "sklearn TruncatedSVD (no centring)": lambda: TruncatedSVD(K, random_state=0).fit(X).singular_values_,
    }
    times = {name: [] for name in fits}
    values = {}
    for _ in range(args.repeats):
        for name, fit in fits.items():
            start = time.perf_counter()
            values[name] = fit()
            times[name].append(time.perf_counter() - start)
    base = float(np.median(times["bayespca PCA randomized"]))
    print(f"{'method':38s} {'median s':>9s} {'ratio':>6s}  singular values")
    for name in fits:
        t = float(np.median(times[name]))
        print(f"{name:38s} {t:9.2f} {t / base:6.2f}  {np.round(values[name], 3)}")


if __name__ == "__main__":
    main()
