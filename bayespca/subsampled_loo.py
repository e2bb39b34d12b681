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

from typing import Any, NamedTuple

import numpy as np

from bayespca.params import check_number, check_seed

__all__ = ["SUBSAMPLE_ABOVE", "SubsampledLOO", "loo_subsample"]

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
    """

    elpd: float
    se: float
    subsampling_se: float
    subsample_size: int
    n_data_points: int
    pareto_k: np.ndarray
    observations: np.ndarray


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
    PSIS-LOO of the sampled rows is ``arviz_stats.loo``; the difference
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
    import xarray as xr
    from arviz_base import from_dict
    from arviz_stats import loo
    from scipy.special import logsumexp

    from bayespca.chunked import is_chunked, lazy_pointwise
    from bayespca.data import check_is_fitted, validate_transform
    from bayespca.posterior import pointwise_log_likelihood

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
    tree = from_dict(
        {"posterior": {"mu": draws.mean}, "log_likelihood": {"X": sampled}},
        dims={"mu": ["feature"], "X": ["obs"]},
    )
    exact = loo(tree, var_name="X", pointwise=True)
    a_all = xr.DataArray(approx, dims=["obs"])
    a_sample = xr.DataArray(approx[rows], dims=["obs"], coords={"obs": exact.elpd_i["obs"].values})
    elpd, subsampling_se, se = exact.elpd_i.azstats.diff_srs_estimator(
        lpd_approx_sample=a_sample, lpd_approx_all=a_all, n_data_points=n
    )
    return SubsampledLOO(float(elpd), float(se), float(subsampling_se), observations, n,
                         np.asarray(exact.pareto_k), rows)
