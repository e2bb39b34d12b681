"""bayespca: principal component analysis in all its forms, as a Bayesian workflow.

Importing bayespca switches JAX to 64-bit floats: the package promises
agreement with LAPACK-based references to ~1e-10, which float32 cannot give.
When JAX is already imported this is ``jax.config.update("jax_enable_x64", True)``;
otherwise the environment variable ``JAX_ENABLE_X64=1`` is set, which JAX
reads when it is first imported (child processes inherit it). Import bayespca
(or set the flag yourself) before creating JAX arrays.

The public names are imported on first use (PEP 562 module ``__getattr__``),
so ``import bayespca`` and the ``bayespca`` command's ``--help`` do not pay
for JAX, NumPyro, ArviZ or scikit-learn until a name that needs them is used.
"""

import importlib
import os
import sys

if "jax" in sys.modules:
    sys.modules["jax"].config.update("jax_enable_x64", True)
else:
    os.environ["JAX_ENABLE_X64"] = "1"

__version__ = "0.1.0"

# public name -> the module that defines it
_HOMES = {
    "ComparisonResult": "bayespca.comparison",
    "compare": "bayespca.comparison",
    "compare_n_components": "bayespca.comparison",
    "KernelPCA": "bayespca.kernel_pca",
    "MixturePPCA": "bayespca.mixture",
    "compare_mixtures": "bayespca.mixture",
    "RobustPPCA": "bayespca.robust",
    "parallel_analysis": "bayespca.selection",
    "FourierMap": "bayespca.kernels",
    "Kernel": "bayespca.kernels",
    "NystroemMap": "bayespca.kernels",
    "PCA": "bayespca.pca",
    "PPCA": "bayespca.probabilistic",
    "FactorAnalysis": "bayespca.probabilistic",
    "Rotation": "bayespca.rotations",
    "procrustes": "bayespca.rotations",
    "rotate": "bayespca.rotations",
    "Selection": "bayespca.selection",
    "select_n_components": "bayespca.selection",
    "SparsePCA": "bayespca.sparse_pca",
    "sparse_pca_path": "bayespca.sparse_pca",
}

__all__ = [
    "ComparisonResult",
    "FourierMap",
    "Kernel",
    "KernelPCA",
    "MixturePPCA",
    "NystroemMap",
    "PCA",
    "PPCA",
    "FactorAnalysis",
    "Rotation",
    "RobustPPCA",
    "Selection",
    "SparsePCA",
    "__version__",
    "compare",
    "compare_mixtures",
    "compare_n_components",
    "parallel_analysis",
    "procrustes",
    "rotate",
    "select_n_components",
    "sparse_pca_path",
]


def __getattr__(name):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'bayespca' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOMES))
