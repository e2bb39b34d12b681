"""The BLAS thread policy against threadpoolctl's own report of the loaded BLAS libraries."""

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from bayespca.inference.threads import SERIAL_FLOPS, serial_blas


def _blas_threads():
    return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]


def test_small_work_runs_on_one_thread_and_settings_come_back():
    with threadpool_limits(2, user_api="blas"):
        before = _blas_threads()
        with serial_blas(SERIAL_FLOPS / 10):
            inside = _blas_threads()
            result = np.eye(3) @ np.arange(3.0)
        assert inside == [1] * len(before)
        assert _blas_threads() == before
    np.testing.assert_array_equal(result, [0.0, 1.0, 2.0])


def test_large_work_keeps_the_callers_threads():
    with threadpool_limits(2, user_api="blas"):
        before = _blas_threads()
        with serial_blas(SERIAL_FLOPS):
            assert _blas_threads() == before


def test_settings_come_back_after_an_error():
    with threadpool_limits(2, user_api="blas"):
        before = _blas_threads()
        try:
            with serial_blas(1.0):
                raise RuntimeError("inside")
        except RuntimeError:
            pass
        assert _blas_threads() == before
