"""PSIS-LOO for data too large for one log-likelihood per row and draw: subsampled LOO.

Full PSIS-LOO fits a Pareto tail to the ``S`` draws of every one of the
``n`` rows. Magnusson et al. (2019) estimate the same ``elpd_loo`` from a
simple random subsample of ``m`` rows with the difference estimator

    elpd_hat = sum_i a_i + (n / m) sum_{j in sample} (elpd_loo_j - a_j),

``a_i = log (1/S) sum_s p(x_i | theta_s)`` a cheap approximation for every
row, and report the standard error of the subsampling. ArviZ implements it
(``arviz_stats.loo_subsample``), but needs the ``S x n`` pointwise values
in memory; here they come from :func:`bayespca.chunked.lazy_pointwise`
on Dask input, ``a_i`` is a chunk-wise reduction and PSIS runs on the
``m`` sampled rows only.

References
----------
M. Magnusson, M. Riis Andersen, J. Jonasson, A. Vehtari (2019). Bayesian
leave-one-out cross-validation for large data. ICML, PMLR 97, 4244-4253.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from bayespca.params import check_number, check_seed

__all__ = ["SUBSAMPLE_ABOVE", "SubsampledLOO", "compare_subsampled", "loo_subsample"]

#: Rows x draws above which :func:`loo_subsample` is the LOO to use (full PSIS-LOO below).
SUBSAMPLE_ABOVE = 20_000_000


class SubsampledLOO(NamedTuple):
    """The outcome of :func:`loo_subsample`.

    Attributes
    ----------
    elpd : float
        Difference estimate of ``elpd_loo``.
    se : float
        Its standard error (data and subsampling).
    subsampling_se : float
        The part of ``se`` due to the subsample.
    subsample_size : int
    n_data_points : int
    pareto_k : ndarray of shape (subsample_size,)
        PSIS shapes of the sampled rows.
    observations : ndarray of int
        The sampled rows.
    elpd_i : ndarray of shape (subsample_size,)
        PSIS-LOO ``elpd_loo`` of the sampled rows.
    approximation : ndarray of shape (n_data_points,)
        ``a_i = log (1/S) sum_s p(x_i | theta_s)`` of every row (their sum
        is the in-sample ``lpd``).
    good_k : float
        The k-hat above which PSIS is unreliable for the ``S`` draws,
        ``min(1 - 1 / log10(S), 0.7)`` (ArviZ's ``good_k``).
    """

    elpd: float
    se: float
    subsampling_se: float
    subsample_size: int
    n_data_points: int
    pareto_k: np.ndarray
    observations: np.ndarray
    elpd_i: np.ndarray
    approximation: np.ndarray
    good_k: float


def loo_subsample(model: Any, X: Any, *, observations: int = 400, seed: Any = 0) -> SubsampledLOO:
    """Subsampled PSIS-LOO of a model fitted with ``method="nuts"`` (Magnusson et al. 2019).

    Parameters
    ----------
    model : PPCA or FactorAnalysis
        Fitted with ``method="nuts"``.
    X : ndarray or dask.array.Array of shape (n, d)
        The training data (the rows the posterior was fitted to). On Dask
        input the pointwise log-likelihood stays lazy: the approximation
        ``a_i`` is reduced chunk by chunk, and only the sampled rows'
        values (``S x m``) come to the client.
    observations : int, default=400
        Subsample size ``m`` (rows drawn without replacement).
    seed : int, default=0
        Seed of the subsample.

    Returns
    -------
    SubsampledLOO

    Notes
    -----
    PSIS-LOO of the sampled rows is :func:`bayespca.psis.psis_loo` (ArviZ's ``loo``); the difference
    estimator and its standard errors are ArviZ's (``azstats.diff_srs_estimator``),
    the computation of ``arviz_stats.loo_subsample`` with the approximation
    reduced by Dask.

    Examples
    --------
    >>> from bayespca import PPCA
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 1)) @ [[2.0, 1.0, -1.0]] + rng.normal(size=(300, 3))
    >>> model = PPCA(1, method="nuts", num_warmup=100, num_samples=100, num_chains=1,
    ...              random_state=0).fit(X)
    >>> result = loo_subsample(model, X, observations=100)
    >>> bool(result.subsampling_se > 0), result.subsample_size
    (True, 100)
    """
    from scipy.special import logsumexp
    from xarray import DataArray

    from bayespca.chunked import is_chunked, lazy_pointwise
    from bayespca.data import check_is_fitted, validate_transform
    from bayespca.posterior import pointwise_log_likelihood
    from bayespca.psis import psis_loo

    check_is_fitted(model, "gaussian_")
    draws = getattr(model, "nuts_", None)
    if draws is None:
        raise ValueError(f"loo_subsample needs a posterior: fit with method='nuts' (got {model.method_!r}).")
    observations = check_number(observations, "observations", integer=True, low=2)
    check_seed(seed, "seed")
    if is_chunked(X):
        pointwise = lazy_pointwise(draws, X)
    else:
        pointwise = pointwise_log_likelihood(draws, validate_transform(model, X, allow_nan=True).X)
    n = pointwise.shape[-1]
    if observations > n:
        raise ValueError(f"observations must be at most the number of rows ({n}); got {observations}.")
    rows = np.sort(np.random.default_rng(seed).choice(n, observations, replace=False))
    n_draws = pointwise.shape[0] * pointwise.shape[1]
    flat = pointwise.reshape(n_draws, n)
    if is_chunked(X):
        approx = flat.map_blocks(lambda b: logsumexp(b, axis=0)[None], chunks=((1,), flat.chunks[1]))
        approx, sampled = approx[0].compute(), np.asarray(pointwise[..., rows].compute())
    else:
        approx, sampled = logsumexp(flat, axis=0), pointwise[..., rows]
    approx = approx - np.log(n_draws)
    exact = psis_loo(DataArray(sampled, dims=["chain", "draw", "obs"]))
    elpd, subsampling_se, se = _difference_estimate(np.asarray(exact.elpd_i), approx[rows], approx)
    return SubsampledLOO(elpd, se, subsampling_se, observations, n, np.asarray(exact.pareto_k), rows,
                         np.asarray(exact.elpd_i), approx, float(exact.good_k))


def _difference_estimate(sampled: np.ndarray, approx_sampled: np.ndarray, approx_all: np.ndarray):
    """``(estimate, subsampling se, se)`` of ``sum_i v_i`` from ``v`` on a simple random sample of rows.

    ArviZ's difference estimator (``azstats.diff_srs_estimator``, Magnusson
    et al. 2019), with ``approx_*`` the cheap approximation of ``v``.
    """
    import xarray as xr

    elpd, subsampling_se, se = xr.DataArray(sampled, dims=["obs"]).azstats.diff_srs_estimator(
        lpd_approx_sample=xr.DataArray(approx_sampled, dims=["obs"]),
        lpd_approx_all=xr.DataArray(approx_all, dims=["obs"]),
        n_data_points=approx_all.size,
    )
    return float(elpd), float(subsampling_se), float(se)


def compare_subsampled(results: Mapping[Any, SubsampledLOO]) -> pd.DataFrame:
    """Models ranked by subsampled PSIS-LOO, with paired differences by the difference estimator.

    For models fitted to the same rows and scored on the same subsample
    (same ``seed`` and ``observations``), the difference to the best model
    is estimated as the elpd itself, from the sampled rows' differences
    ``elpd_loo_i(best) - elpd_loo_i(m)`` and those of the approximations
    ``a_i`` of every row: ``dse`` is the standard error of that paired
    difference (data and subsampling), ``subsampling_dse`` its subsampling
    part. ``p = sum_i a_i - elpd`` (``lpd - elpd_loo``).

    Parameters
    ----------
    results : mapping of name -> SubsampledLOO
        From :func:`loo_subsample` with the same subsample.

    Returns
    -------
    pandas.DataFrame
        Best first: ``rank``, ``elpd``, ``p``, ``elpd_diff`` (``elpd - best``,
        <= 0), ``weight`` (NaN: stacking needs every row's ``elpd_loo``),
        ``se``, ``dse``, ``subsampling_dse``, ``warning`` (a sampled row
        with ``k-hat`` above ``good_k``, the threshold for its number of
        draws, as :func:`arviz.compare`) and ``pareto_k_max``.

    Examples
    --------
    >>> rows = np.array([0, 2])
    >>> a = SubsampledLOO(-10.0, 1.0, 0.1, 2, 4, np.zeros(2), rows, np.array([-2.0, -3.0]),
    ...                   np.array([-2.0, -2.5, -3.0, -2.5]), 0.67)
    >>> b = a._replace(elpd=-12.0, elpd_i=a.elpd_i - 0.5, approximation=a.approximation - 0.5)
    >>> table = compare_subsampled({"a": a, "b": b})
    >>> list(table.index), float(table.loc["b", "elpd_diff"])
    (['a', 'b'], -2.0)
    """
    names = sorted(results, key=lambda name: -results[name].elpd)
    best = results[names[0]]
    rows = []
    for name in names:
        r = results[name]
        if not np.array_equal(r.observations, best.observations) or r.n_data_points != best.n_data_points:
            raise ValueError(
                "results must score the same rows on the same subsample (loo_subsample with the same "
                f"seed and observations); {name!r} and {names[0]!r} differ."
            )
        if r is best:
            diff, sub_dse, dse = 0.0, 0.0, 0.0
        else:
            diff, sub_dse, dse = _difference_estimate(
                r.elpd_i - best.elpd_i, (r.approximation - best.approximation)[r.observations],
                r.approximation - best.approximation,
            )
        khat = float(np.nanmax(r.pareto_k))
        rows.append({"elpd": r.elpd, "p": float(r.approximation.sum()) - r.elpd, "elpd_diff": diff,
                     "weight": np.nan, "se": r.se, "dse": dse, "subsampling_dse": sub_dse,
                     "warning": khat > r.good_k, "pareto_k_max": khat})
    table = pd.DataFrame(rows, index=pd.Index(names))
    table.insert(0, "rank", np.arange(len(names)))
    return table
