"""Closed-form maximum-likelihood probabilistic PCA (Tipping & Bishop 1999).

For complete data the pPCA likelihood is maximised in closed form by the
eigendecomposition of the sample covariance ``S = Xc^T Xc / n`` (the ML
denominator ``n``): with eigenvalues ``lambda_1 >= ... >= lambda_d`` and
eigenvectors ``U``,

    sigma^2 = (lambda_{k+1} + ... + lambda_d) / (d - k),
    W = U_k (Lambda_k - sigma^2 I)^{1/2},        mu = xbar,

and the maximum log-likelihood is

    L* = -n/2 [d log(2 pi) + sum_{j<=k} log lambda_j + (d - k) log sigma^2 + d].

``sigma^2`` needs only the total variance ``tr S`` and the k leading
eigenvalues, so only k eigenpairs are computed (by the d x d scatter, the
n x n Gram matrix or a thin SVD, whichever is cheapest).

Differences from scikit-learn's ``PCA``: scikit-learn divides by ``n - 1``,
so its ``noise_variance_`` and ``explained_variance_`` are ``n / (n - 1)``
times these and its ``score`` is slightly below the maximum; and when
``n <= d`` it averages the discarded eigenvalues over ``min(n, d) - k``
rather than ``d - k``. Here ``sigma^2`` averages over all ``d - k``
discarded eigenvalues, including the ``d - rank`` zeros of a rank-deficient
``S`` (at most ``n - 1`` eigenvalues are non-zero): that is the maximiser of
the likelihood.

References
----------
M. E. Tipping, C. M. Bishop (1999). Probabilistic principal component
analysis. J. R. Stat. Soc. B 61(3), 611-622.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from bayespca.gaussian import LowRankGaussian
from bayespca.inference.contract import Fit, ModelSpec
from bayespca.inference.threads import serial_blas
from bayespca.linalg import choose_solver, svd_full, svd_gram
from bayespca.messages import warn
from bayespca.statistics import Prepared, scatter_spectrum

__all__ = [
    "SpectrumFit", "check_n_components", "check_rows_leave_noise", "noise_floor", "ppca_closed_form",
    "ppca_from_spectrum",
]

_LOG_2PI = np.log(2.0 * np.pi)


def noise_floor(variances: np.ndarray, relative: float) -> np.ndarray:
    """Lower bound on each noise variance: ``relative * var_j`` (of ``1e-6 * mean(var)`` if ``var_j = 0``).

    Keeps ``psi_j`` (and the likelihood) finite where the ML value is 0: a
    constant feature, duplicated features, or a Heywood case. Proportional
    to each feature's own variance, however small, so that a fit of the
    data with each feature rescaled is the rescaled fit (factor analysis is
    equivariant under that); a constant feature gets a positive bound on
    the scale of the data (1 when every feature is constant). A feature
    whose bound ``relative * var_j`` would fall below float64's normal
    range (``var_j`` under about ``2e-308 / relative`` in working units,
    i.e. spread some 1e-150 times below the data's) is bounded as a
    constant one: float64 cannot hold its bound, and a bound that rounds
    to 0 would let ``psi_j`` reach 0. Its bound then exceeds its variance,
    which :func:`~bayespca.inference.factor_ml.fit_covariance` reads as
    "no loading".

    Parameters
    ----------
    variances : ndarray of shape (d,)
        Per-feature variances of the data.
    relative : float
        The bound as a fraction of each variance, in ``(0, 1)``.

    Examples
    --------
    >>> noise_floor(np.array([2.0, 1e-20, 0.0]), 1e-6)
    array([2.00000000e-06, 1.00000000e-26, 6.66666667e-13])
    >>> noise_floor(np.array([2.0, 1e-310]), 1e-6)  # the second as constant: 1e-316 is subnormal
    array([2.e-06, 1.e-12])
    """
    tiny = np.finfo(float).tiny
    scale = float(np.mean(variances))
    if not scale * 1e-6 * relative >= tiny:
        scale = 1.0
    return relative * np.where(variances * relative >= tiny, variances, 1e-6 * scale)


def check_rows_leave_noise(prepared: Prepared, n_components: int) -> None:
    """Refuse a posterior of pPCA whose ``k < d`` components reproduce the centred data exactly.

    Where the centred data have rank ``r <= k < d`` (fewer rows than
    features, or features that are exact combinations of others), the
    likelihood grows without bound as ``sigma -> 0``: with ``W`` holding
    the data's ``r`` directions it behaves as ``sigma^(-n (d - r))``,
    against a volume of ``W`` and ``mu`` near that subspace that shrinks as
    ``sigma^((k + 1)(d - r))``. Under a prior of ``sigma`` whose density
    stays positive at 0 (the default half-normal) the posterior is then
    improper for ``n >= k + 2`` and a funnel into ``sigma = 0`` below that.
    NUTS cannot sample either: n = 200, d = 10, a feature the sum of two
    others, k = 9: 1023 leapfrog steps a draw, draws of ``sigma^2`` near
    1e-15, 162 s; n = 20, d = 50, k = 19: 988 divergent transitions of
    2000, 824 s. ``k = d`` is not refused: ``W W^T`` can then equal the
    sample covariance, and the likelihood stays bounded.

    The rank is numerical: eigenvalues of the scatter at or below
    ``max(n, d) eps lambda_1`` (its rounding) count as 0. The ML noise
    floor would not do: raw breast cancer data are of full rank, but
    their two smallest eigenvalues (7e-7, 2e-6) lie below 1e-10 of the
    mean variance (1.5e4). With missing entries the rank depends on how
    they are filled, and only the bound that holds for every filling is
    checked: ``n`` rows span at most ``n - 1`` dimensions, so ``k >= n - 1``
    is refused. Fewer components can still fit the observed entries
    exactly (20 x 50 with 5% missing at random: k = 18); the EM fit that
    starts the sampler then warns that ``sigma^2`` reached its floor.

    Raises
    ------
    ValueError
        Naming ``n_components`` and what to do instead.
    """
    n, d = prepared.n, prepared.d
    if n_components >= d:
        return
    if prepared.missing is not None:
        if n_components >= n - 1:
            why = f"{n} rows span at most {n - 1} dimensions, however their missing entries are filled"
            raise ValueError(_noiseless_message(n_components, d, why, f"Use at most {n - 2} components."))
        return
    eigenvalues = np.linalg.eigvalsh(np.asarray(prepared.stats.scatter, dtype=float))  # ascending
    rounding = max(n, d) * np.finfo(float).eps * max(float(eigenvalues[-1]), 0.0)
    if eigenvalues[-(n_components + 1)] <= rounding:
        remedy = "Use fewer components, or drop features that are exact combinations of others."
        raise ValueError(_noiseless_message(n_components, d, f"their rank is at most {n_components}", remedy))


def _noiseless_message(k: int, d: int, why: str, remedy: str) -> str:
    return (
        f"n_components = {k} components reproduce the centred data exactly ({why}; below the {d} "
        "features): the likelihood grows without bound as the noise goes to 0, so pPCA's posterior piles "
        f"up at sigma = 0, where neither NUTS nor SVI can fit it. {remedy}"
    )


def check_n_components(n_components, upper: int, what: str) -> int:
    """Validate an integer number of components in ``[1, upper]``."""
    accepted = f"an int in [1, {upper}] ({what})"
    if isinstance(n_components, bool | np.bool_) or not isinstance(n_components, numbers.Integral):
        raise TypeError(f"n_components must be {accepted}; got {n_components!r}.")
    if not 1 <= n_components <= upper:
        raise ValueError(f"n_components must be {accepted}; got {n_components}.")
    return int(n_components)


class SpectrumFit(NamedTuple):
    """The pPCA maximum of :func:`ppca_from_spectrum`.

    Attributes
    ----------
    loadings : ndarray of shape (d, k)
        ``U_k (Lambda_k - sigma^2 I)^{1/2}`` (columns of eigenvalues at or below ``sigma^2`` are 0).
    sigma2 : float
        The noise variance, at least the floor.
    residual : float
        Sum of the discarded eigenvalues (0 when it is rounding noise).
    at_floor : bool
        ``sigma^2`` was raised to the floor.
    """

    loadings: np.ndarray
    sigma2: float
    residual: float
    at_floor: bool


def ppca_from_spectrum(lam: np.ndarray, axes: np.ndarray, total: float, bound: float) -> SpectrumFit:
    """Tipping and Bishop's maximum from the ``k`` leading eigenpairs of a covariance and its trace.

    ``sigma^2 = (tr S - sum_{j<=k} lambda_j) / (d - k)`` (at least ``bound``),
    ``W = U_k (max(Lambda_k, sigma^2) - sigma^2)^{1/2}``.

    Parameters
    ----------
    lam : ndarray of shape (k,)
        Leading eigenvalues, decreasing (zeros beyond the rank).
    axes : ndarray of shape (d, k)
        Their eigenvectors.
    total : float
        ``tr S``.
    bound : float
        Lower bound of ``sigma^2``.

    Examples
    --------
    >>> fit = ppca_from_spectrum(np.array([5.0]), np.array([[1.0], [0.0]]), 6.0, 1e-10)
    >>> fit.loadings.ravel().tolist(), fit.sigma2
    ([2.0, 0.0], 1.0)
    """
    d, k = axes.shape
    residual = total - float(np.sum(lam))
    if k == d or residual <= 8 * d * np.finfo(float).eps * total:
        residual = 0.0  # rounding noise, which would be divided by a floored sigma^2
    sigma2 = residual / (d - k) if k < d else 0.0
    at_floor = not sigma2 > bound
    sigma2 = max(sigma2, bound)
    loadings = axes * np.sqrt(np.maximum(lam, sigma2) - sigma2)
    return SpectrumFit(loadings, sigma2, residual, at_floor)


def ppca_closed_form(prepared: Prepared, spec: ModelSpec, *, floor: float = 1e-10) -> Fit:
    """Maximum-likelihood probabilistic PCA in closed form (complete data).

    Parameters
    ----------
    prepared : Prepared
        Complete data (no NaN), from :func:`bayespca.statistics.prepare`.
    spec : ModelSpec
        ``noise="isotropic"``; ``n_components`` ``k`` in ``[1, d]``. With
        ``k = d`` (or ``k >= rank``) the ML noise variance is 0 and is held
        at the floor.
    floor : float, default=1e-10
        Lower bound on ``sigma^2`` relative to the mean feature variance
        (:func:`noise_floor`).

    Returns
    -------
    Fit
        In data units. ``W`` has orthogonal columns of decreasing norm;
        ``at_floor`` is True everywhere when ``sigma^2`` was raised to the
        floor.

    Notes
    -----
    With ``c_j = max(lambda_j, sigma^2)`` the log-likelihood is evaluated as

        -n/2 [d log 2pi + sum_{j<=k} log c_j + (d-k) log sigma^2
              + sum_{j<=k} lambda_j / c_j + (tr S - sum_{j<=k} lambda_j) / sigma^2],

    which is ``L*`` above unless the floor is active.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((500, 2)) @ [[3.0, 0, 0, 0], [0, 2.0, 0, 0]]
    >>> X = X + 0.5 * rng.standard_normal((500, 4))
    >>> from bayespca.statistics import prepare
    >>> fit = ppca_closed_form(prepare(X), ModelSpec("isotropic", 2))
    >>> round(float(fit.gaussian.noise[0]), 3)  # the data have noise variance 0.25
    0.264
    """
    if spec.noise != "isotropic" or prepared.missing is not None:
        raise ValueError(
            "The closed form is pPCA of complete data (noise='isotropic', no NaN); got "
            f"noise={spec.noise!r} and {0 if prepared.missing is None else int(prepared.missing.sum())} "
            "missing entries: use EM."
        )
    mean, n, d = prepared.mean, prepared.n, prepared.d
    k = check_n_components(spec.n_components, d, "n_features")
    rank_max = min(n, d)
    r = min(k, rank_max)
    solver = choose_solver(n, d, None) if isinstance(prepared.data, np.ndarray) else "statistics"
    # The solver's own work: for the covariance solver the scatter is formed already and what is left
    # is a d x d eigenproblem, which threads only slow down (SciPy's OpenBLAS threads then wait for
    # the cores that NumPy's, used by the scatter, still spin on; 20000 x 100 on a busy 2-core box:
    # 44 ms a fit with the n d^2 estimate, 15 ms with d^3, scikit-learn's PCA 13-16 ms).
    flops = d**3 if solver in ("statistics", "covariance") else n * d * min(n, d)
    with serial_blas(flops):
        # The scatter from prepare (complete data, d <= n) or a backend's reduction (bayespca.chunked).
        if solver in ("statistics", "covariance"):
            svd = scatter_spectrum(prepared.stats, r)
        elif solver == "full":
            svd = svd_full(prepared.X, mean)
        elif solver == "gram":
            svd = svd_gram(prepared.X, mean, r)
    lam = np.zeros(k)
    lam[:r] = svd.singular_values[:r] ** 2 / n
    total = svd.total_ss / n
    axes = np.zeros((d, k))
    axes[:, :r] = svd.components[:r].T
    bound = float(noise_floor(np.array([total / d]), floor)[0])
    sol = ppca_from_spectrum(lam, axes, total, bound)
    sigma2, at_floor = sol.sigma2, sol.at_floor
    c = np.maximum(lam, sigma2)
    loglike = -0.5 * n * (
        d * _LOG_2PI
        + np.sum(np.log(c))
        + (d - k) * np.log(sigma2)
        + np.sum(lam / c)
        + sol.residual / sigma2
    )
    if at_floor:
        warn(
            f"The ML noise variance is 0 (n_components = {k} >= rank of the centred data); "
            f"sigma^2 is held at its lower bound {sigma2 * prepared.scale**2:.3g} "
            f"({floor:g} x mean feature variance).",
            UserWarning,
        )
    g = LowRankGaussian(sol.loadings, np.full(d, sigma2), mean)
    fit = Fit(g, float(loglike), "closed_form", 1, True, np.array([loglike]), np.full(d, at_floor))
    return fit.to_data_units(prepared.scale, prepared.total_observed)
