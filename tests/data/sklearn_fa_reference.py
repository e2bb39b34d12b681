"""Reference for tests/test_factor_analysis_ml.py: scikit-learn's FactorAnalysis on its own datasets.

For iris, wine, diabetes and breast cancer, raw and standardised (population
standard deviation), and every number of factors from 1 to the Ledermann
bound, the total log-likelihood that ``FactorAnalysis(k, tol=1e-8,
svd_method="lapack", max_iter=20000)`` reaches (``score(X) * n``), with its
iteration count. Issue 19 asks bayespca's maximum likelihood never to be
below it.

Reproduce from the repository root (about an hour on one core; most fits
run to max_iter)::

    OPENBLAS_NUM_THREADS=1 python tests/data/sklearn_fa_reference.py
"""

import json
import warnings
from pathlib import Path

import numpy as np
import sklearn
from sklearn import datasets
from sklearn.decomposition import FactorAnalysis

from bayespca.probabilistic import ledermann_bound

DATASETS = ("iris", "wine", "diabetes", "breast_cancer")


def main():
    warnings.simplefilter("ignore")  # ConvergenceWarning at max_iter
    fits = {}
    for name in DATASETS:
        X = getattr(datasets, f"load_{name}")().data
        for scaling in ("raw", "std"):
            Z = X if scaling == "raw" else (X - X.mean(axis=0)) / X.std(axis=0)
            for k in range(1, ledermann_bound(X.shape[1]) + 1):
                fa = FactorAnalysis(k, tol=1e-8, svd_method="lapack", max_iter=20000).fit(Z)
                fits[f"{name}/{scaling}/{k}"] = {
                    "log_likelihood": float(fa.score(Z) * Z.shape[0]),
                    "n_iter": int(fa.n_iter_),
                }
                print(name, scaling, k, fits[f"{name}/{scaling}/{k}"], flush=True)
    out = {"sklearn_version": sklearn.__version__, "numpy_version": np.__version__, "fits": fits}
    path = Path(__file__).with_suffix(".json")
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
