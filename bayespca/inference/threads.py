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
"""

from __future__ import annotations

import contextlib

__all__ = ["SERIAL_FLOPS", "serial_blas"]

SERIAL_FLOPS = 3e7  # work below which BLAS runs on one thread
_CONTROLLER: list = []  # threadpoolctl's controller, built on first use (0.7 ms)


def serial_blas(flops: float):
    """A context in which BLAS runs on one thread when ``flops`` (the work inside) is small.

    Parameters
    ----------
    flops : float
        Estimated floating-point operations of the largest call inside.

    Returns
    -------
    context manager
        threadpoolctl's limit (about 10 us to enter), or a null context.

    Examples
    --------
    >>> import numpy as np
    >>> with serial_blas(1e3):
    ...     float((np.eye(3) @ np.ones(3)).sum())
    3.0
    """
    if flops >= SERIAL_FLOPS:
        return contextlib.nullcontext()
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="blas")
