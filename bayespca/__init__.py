"""bayespca: principal component analysis in all its forms, as a Bayesian workflow.

Importing bayespca switches JAX to 64-bit floats
(``jax.config.update("jax_enable_x64", True)``): the package promises
agreement with LAPACK-based references to ~1e-10, which float32 cannot give.
Import bayespca (or set the flag yourself) before creating JAX arrays.
"""

import jax

jax.config.update("jax_enable_x64", True)

from bayespca.comparison import ComparisonResult, compare, compare_n_components  # noqa: E402
from bayespca.kernel_pca import KernelPCA  # noqa: E402
from bayespca.kernels import FourierMap, Kernel, NystroemMap  # noqa: E402
from bayespca.pca import PCA  # noqa: E402
from bayespca.probabilistic import PPCA, FactorAnalysis  # noqa: E402
from bayespca.rotations import Rotation, procrustes, rotate  # noqa: E402
from bayespca.selection import Selection, select_n_components  # noqa: E402
from bayespca.sparse_pca import SparsePCA, sparse_pca_path  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ComparisonResult",
    "FourierMap",
    "Kernel",
    "KernelPCA",
    "NystroemMap",
    "PCA",
    "PPCA",
    "FactorAnalysis",
    "Rotation",
    "Selection",
    "SparsePCA",
    "__version__",
    "compare",
    "compare_n_components",
    "procrustes",
    "rotate",
    "select_n_components",
    "sparse_pca_path",
]
