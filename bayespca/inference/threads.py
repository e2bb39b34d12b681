"""How many BLAS threads small dense problems get: one.

Maximum-likelihood fits of small problems make many small LAPACK/BLAS calls
(a thin SVD, Newton on a d x d matrix). OpenBLAS spreads each call above a
few thousand flops over all its threads, and on a machine whose cores are
busy each such call can wait milliseconds for a thread to be scheduled:
measured on a loaded 2-core machine, a 1000 x 10 thin SVD took 23 ms on two
threads and 0.3 ms on one; a 1 x 1 triangular solve with 150 right-hand
sides 8 ms and 2 us. Below a few tens of millions of flops a second
thread cannot pay for itself anyway, so such work runs on one thread, and
the caller's settings are restored afterwards.

The OpenBLAS builds NumPy and SciPy load are found once, beside their
wheels or else from the process's memory map, and set through their own
``*_set_num_threads``: about 1 us per call. (threadpoolctl does the same
for every library, but finding them costs 18 ms in a process that has
loaded JAX's ~230 shared libraries; it is the fallback where that lookup
fails, e.g. another BLAS or another OS.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

__all__ = ["SERIAL_FLOPS", "serial_blas"]

SERIAL_FLOPS = 3e7  # work below which BLAS runs on one thread
_FUNCTIONS = (
    ("openblas_get_num_threads", "openblas_set_num_threads"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
)
_BACKENDS: list = []  # [("openblas", handles)] or [("threadpoolctl", controller)], on first use


def _vendored_openblas() -> list:
    """The OpenBLAS builds bundled in the imported NumPy and SciPy wheels, where already loaded.

    A wheel keeps its OpenBLAS beside the package (``numpy.libs``, or
    ``numpy/.dylibs`` on macOS). Looking there costs 0.3 ms where
    reading ``/proc/self/maps`` costs 2-3 ms, a third of a first small fit;
    ``RTLD_NOLOAD`` only returns a library the process has loaded.
    """
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is None:
        return []
    paths = []
    for name in ("numpy", "scipy"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            site = os.path.dirname(os.path.dirname(module.__file__))
            for folder in (os.path.join(site, f"{name}.libs"), os.path.join(site, name, ".dylibs")):
                if os.path.isdir(folder):
                    paths += [os.path.join(folder, f) for f in os.listdir(folder) if "openblas" in f.lower()]
    libs = []
    for path in sorted(paths):
        try:
            libs.append(ctypes.CDLL(path, mode=noload))
        except OSError:  # bundled but not loaded
            continue
    return libs


def _mapped_openblas() -> list | None:
    """Every OpenBLAS mapped into this process, from ``/proc/self/maps``; None where that fails."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return None
    try:
        return [ctypes.CDLL(path) for path in sorted(paths)]
    except OSError:
        return None


def _openblas_handles():
    """``(get, set)`` thread functions of every OpenBLAS NumPy and SciPy use, or None."""
    libs = _vendored_openblas() or _mapped_openblas()
    handles = []
    for lib in libs or ():
        found = next((names for names in _FUNCTIONS if hasattr(lib, names[1])), None)
        if found is None:
            return None
        get, set_ = (getattr(lib, name) for name in found)
        get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
        handles.append((get, set_))
    return handles or None


def _backend():
    if not _BACKENDS:
        handles = _openblas_handles()
        if handles is not None:
            _BACKENDS.append(("openblas", handles))
        else:
            from threadpoolctl import ThreadpoolController

            _BACKENDS.append(("threadpoolctl", ThreadpoolController()))
    return _BACKENDS[0]


@contextlib.contextmanager
def _one_thread(handles):
    saved = [get() for get, _ in handles]
    for _, set_ in handles:
        set_(1)
    try:
        yield
    finally:
        for (_, set_), count in zip(handles, saved, strict=True):
            set_(count)


def serial_blas(flops: float):
    """A context in which BLAS runs on one thread when ``flops`` (the work inside) is small.

    Parameters
    ----------
    flops : float
        Estimated floating-point operations of the largest call inside.

    Returns
    -------
    context manager
        Restores the thread counts it changed on exit; a null context for
        large work.

    Examples
    --------
    >>> import numpy as np
    >>> with serial_blas(1e3):
    ...     float((np.eye(3) @ np.ones(3)).sum())
    3.0
    """
    if flops >= SERIAL_FLOPS:
        return contextlib.nullcontext()
    kind, backend = _backend()
    if kind == "openblas":
        return _one_thread(backend)
    return backend.limit(limits=1, user_api="blas")
