"""Choosing the number of principal components.

Every rule looks only at the singular values ``s_1 >= ... >= s_m`` of the
centred data (``m = min(n, d)``), so once a PCA with all components is
fitted, all rules cost nothing more. Notation: ``n`` samples, ``d``
features, ``lambda_j = s_j^2 / (n - 1)`` the sample-covariance eigenvalues
(scikit-learn's ``explained_variance_``) and ``ell_j = s_j^2 / n`` the
maximum-likelihood ones.

========================= ======================================================
method                    rule
========================= ======================================================
``"variance"``            smallest k whose cumulative explained-variance ratio
                          is strictly greater than ``threshold`` (default 0.9)
``"elbow"``               scree elbow: the point farthest below the chord from
                          the first to the last (normalised) eigenvalue; the
                          components before it are kept
``"aic"``, ``"bic"``,     information criteria of Vidal, Ma & Sastry (2016,
``"gaic"``                ch. 2): ``J(k) = sum_{j>k} ell_j + c P(k) sigma^2 / n``
                          with ``P(k) = d k - k^2`` (dimension of the
                          Grassmannian of k-planes), plus ``n k`` for the
                          geometric AIC (Kanatani); ``c = 2`` (AIC, G-AIC) or
                          ``log n`` (BIC)
``"rank"``                rank minimisation by hard threshold:
                          ``min_A |Xc - A|_F^2 + tau rank(A)`` keeps the
                          singular values with ``s_j^2 > tau``
``"gavish-donoho"``       optimal hard threshold (Gavish & Donoho 2014): keep
                          ``s_j > lambda*(beta) sqrt(N) sigma`` (known noise)
                          or ``s_j > omega(beta) median(s)`` (unknown)
``"mle"``                 Minka's (2000) Laplace approximation of the pPCA
                          evidence, exactly as scikit-learn's ``"mle"``
``"profile-likelihood"``  Zhu & Ghodsi (2006): the split of the scree into two
                          Gaussian groups with a common variance that
                          maximises the profile log-likelihood
``"parallel"``            Horn's (1965) parallel analysis: the leading
                          eigenvalues above the 0.95 quantile (``threshold``)
                          of those of random normal data of the same shape
                          (:func:`parallel_analysis`; from singular values,
                          the spectrum normalised to mean 1)
========================= ======================================================

The Grassmann count makes AIC and BIC charge ``c (d - 2k) sigma^2 / n`` for
one more dimension, far less than a noise eigenvalue (about ``sigma^2``)
when ``n >> d``: there they over-select, and they are meant for ``n`` not
much larger than ``d``. The geometric AIC charges about ``2 sigma^2`` per
dimension (the ``n k`` coordinates) and suits ``n >> d``.

Where a rule needs the noise level ``sigma`` and none is given, it uses the
Gavish-Donoho estimate ``sigma_hat = median(s) / sqrt(N mu_beta)`` (``mu_beta``
the Marchenko-Pastur median), which does not depend on k.

Every result also carries the pPCA profile log-likelihood (Tipping & Bishop
1999), the maximised log-likelihood of pPCA with k components,
``L*(k) = -n/2 (d log 2 pi + sum_{j<=k} log ell_j + (d-k) log sigma_k^2 + d)``
with ``sigma_k^2 = sum_{j>k} ell_j / (d - k)``.

References
----------
M. Gavish, D. L. Donoho (2014). The optimal hard threshold for singular values
is 4/sqrt(3). IEEE Trans. Inf. Theory 60(8), 5040-5053.
T. P. Minka (2000). Automatic choice of dimensionality for PCA. NIPS 13.
R. Vidal, Y. Ma, S. S. Sastry (2016). Generalized Principal Component
Analysis, ch. 2. Springer.
M. Zhu, A. Ghodsi (2006). Automatic dimensionality selection from the scree
plot via the use of profile likelihood. Comput. Stat. Data Anal. 51, 918-930.
M. E. Tipping, C. M. Bishop (1999). Probabilistic principal component
analysis. J. R. Stat. Soc. B 61(3), 611-622.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import integrate, optimize, special

from bayespca.linalg import decompose
from bayespca.params import check_bool, check_choice, check_number
from bayespca.statistics import power_of_two_above, prepare

__all__ = [
    "METHODS",
    "OPTIONS",
    "Selection",
    "gavish_donoho_lambda",
    "gavish_donoho_omega",
    "marchenko_pastur_median",
    "minka_log_evidence",
    "parallel_analysis",
    "parallel_from_singular_values",
    "random_eigenvalues",
    "select_from_singular_values",
    "select_n_components",
]

METHODS = (
    "variance",
    "elbow",
    "aic",
    "bic",
    "gaic",
    "rank",
    "gavish-donoho",
    "mle",
    "profile-likelihood",
    "parallel",
)

#: Options of :func:`select_from_singular_values`, and the methods that use each.
_USED_BY = {
    "threshold": ("variance", "parallel"),
    "noise_std": ("gavish-donoho", "aic", "bic", "gaic", "rank"),
    "tau": ("rank",),
}
OPTIONS = tuple(_USED_BY)


@dataclass(frozen=True)
class Selection:
    """The outcome of a rule for choosing the number of components.

    Attributes
    ----------
    method : str
        The rule's name (one of :data:`METHODS`).
    n_components : int
        The chosen k.
    candidates : ndarray of int
        The k at which ``criterion`` is evaluated.
    criterion : ndarray of float
        The rule's value at each candidate (see the module docstring for what
        is maximised or minimised, or compared with ``threshold``).
    threshold : float or None
        The cut-off the rule compares against, when it has one.
    rule : str
        One sentence: how ``n_components`` follows from ``criterion``.
    singular_values : ndarray
        Singular values of the centred data.
    n_samples, n_features : int
    """

    method: str
    n_components: int
    candidates: np.ndarray
    criterion: np.ndarray
    threshold: float | None
    rule: str
    singular_values: np.ndarray = field(repr=False)
    n_samples: int = field(repr=False)
    n_features: int = field(repr=False)

    @property
    def table(self) -> pd.DataFrame:
        """One row per candidate k: eigenvalue, variance ratios, criterion, pPCA log-likelihood."""
        s2 = self.singular_values**2
        total = s2.sum()
        k = self.candidates
        ratio = np.divide(s2, total, out=np.zeros_like(s2), where=total > 0)
        cum = np.concatenate([[0.0], np.cumsum(ratio)])
        ev = np.concatenate([[np.nan], s2 / (self.n_samples - 1)])
        ppca = ppca_profile_log_likelihood(self.singular_values, self.n_samples, self.n_features)
        return pd.DataFrame(
            {
                "n_components": k,
                "eigenvalue": ev[k],
                "cumulative_variance_ratio": cum[k],
                self.method: self.criterion,
                "ppca_log_likelihood": ppca[k],
                "selected": k == self.n_components,
            }
        ).set_index("n_components")

    def _repr_html_(self) -> str:
        return f"<p>{self.method}: n_components = {self.n_components} ({self.rule})</p>" + (
            self.table._repr_html_()
        )


def marchenko_pastur_median(beta: float) -> float:
    """Median of the Marchenko-Pastur law with aspect ratio ``beta`` in (0, 1] and unit variance.

    The law has density ``sqrt((b - t)(t - a)) / (2 pi beta t)`` on
    ``[a, b] = [(1 - sqrt(beta))^2, (1 + sqrt(beta))^2]``; the median is found
    by root-finding on its numerically integrated CDF.

    Examples
    --------
    >>> round(marchenko_pastur_median(1.0), 4)
    0.6528
    """
    return _mp_median(float(beta))


@functools.lru_cache(maxsize=128)
def _mp_median(beta: float) -> float:
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta must be in (0, 1]; got {beta}.")
    lo, hi = (1 - np.sqrt(beta)) ** 2, (1 + np.sqrt(beta)) ** 2

    def density(t):
        return np.sqrt(max((hi - t) * (t - lo), 0.0)) / (2 * np.pi * beta * t)

    def cdf_minus_half(x):
        # Integrate with t = lo + u^2 to remove the square-root endpoint (and
        # the 1/t pole when beta = 1, where lo = 0).
        val, _ = integrate.quad(lambda u: 2 * u * density(lo + u * u), 0.0, np.sqrt(x - lo),
                                epsabs=1e-13, epsrel=1e-13, limit=200)
        return val - 0.5

    return float(optimize.brentq(cdf_minus_half, lo + 1e-15, hi, xtol=1e-14, rtol=1e-14))


def gavish_donoho_lambda(beta: float) -> float:
    """Optimal hard-threshold coefficient for known noise, ``lambda*(beta)``.

    ``lambda*(beta) = sqrt(2 (beta + 1) + 8 beta / ((beta + 1) + sqrt(beta^2 + 14 beta + 1)))``;
    the threshold is ``lambda*(beta) sqrt(N) sigma`` for an ``M x N`` matrix
    (``beta = M / N <= 1``). For square matrices it is ``4 / sqrt(3)``.

    Examples
    --------
    >>> bool(np.isclose(gavish_donoho_lambda(1.0), 4 / np.sqrt(3)))
    True
    """
    b = float(beta)
    return float(np.sqrt(2 * (b + 1) + 8 * b / ((b + 1) + np.sqrt(b * b + 14 * b + 1))))


def gavish_donoho_omega(beta: float) -> float:
    """Optimal hard-threshold coefficient for unknown noise, ``omega(beta) = lambda*(beta) / sqrt(mu_beta)``.

    The threshold is ``omega(beta) * median singular value``.

    Examples
    --------
    >>> round(gavish_donoho_omega(1.0), 3)
    2.858
    """
    return float(gavish_donoho_lambda(beta) / np.sqrt(marchenko_pastur_median(beta)))


def ppca_profile_log_likelihood(singular_values, n_samples: int, n_features: int) -> np.ndarray:
    """Maximised pPCA log-likelihood ``L*(k)`` for k = 0..m (Tipping & Bishop 1999).

    ``L*(k) = -n/2 (d log 2 pi + sum_{j<=k} log ell_j + (d-k) log sigma_k^2 + d)`` with
    ``ell_j = s_j^2 / n`` and ``sigma_k^2 = sum_{j>k} ell_j / (d - k)``; ``-inf``
    where the fitted covariance is singular, ``nan`` for k = d (undefined noise).
    Returns an array of length ``m + 1`` indexed by k.
    """
    n, d = n_samples, n_features
    ell = np.asarray(singular_values, dtype=float) ** 2 / n
    m = ell.size
    out = np.full(m + 1, np.nan)
    total = ell.sum()
    head = np.concatenate([[0.0], np.cumsum(ell)])
    with np.errstate(divide="ignore"):
        log_ell = np.log(ell)
        for k in range(min(m, d - 1) + 1):
            sigma2 = (total - head[k]) / (d - k)
            if sigma2 <= 0 or (k and ell[k - 1] <= 0):
                out[k] = -np.inf
                continue
            out[k] = -0.5 * n * (d * np.log(2 * np.pi) + log_ell[:k].sum()
                                 + (d - k) * np.log(sigma2) + d)
    return out


def _noise_sigma(s: np.ndarray, n: int, d: int) -> float:
    """Gavish-Donoho noise estimate ``median(s) / sqrt(N mu_beta)``."""
    small, large = sorted((n, d))
    return float(np.median(s) / np.sqrt(large * marchenko_pastur_median(small / large)))


def minka_log_evidence(spectrum: np.ndarray, k: int, n: int) -> float:
    """Minka's (2000) Laplace approximation of ``log p(X | k)``, as scikit-learn computes it.

    Parameters
    ----------
    spectrum : ndarray of shape (d,)
        Sample-covariance eigenvalues ``s_j^2 / (n - 1)``, descending.
    k : int
        Number of components, ``1 <= k < d``.
    n : int
        Number of samples.

    Returns
    -------
    float
        ``-inf`` when the k-th eigenvalue is below 1e-15 (scikit-learn's cut).

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> X = load_iris().data
    >>> spectrum = np.linalg.svd(X - X.mean(0), compute_uv=False) ** 2 / 149
    >>> round(minka_log_evidence(spectrum, 2, 150), 4)  # scikit-learn's test value: 420.9353768
    420.9354
    """
    d = spectrum.size
    if spectrum[k - 1] < 1e-15:
        return -np.inf
    i = np.arange(1, k + 1)
    pu = -k * np.log(2.0) + np.sum(special.gammaln((d - i + 1) / 2.0) - np.log(np.pi) * (d - i + 1) / 2.0)
    pl = -n / 2.0 * np.sum(np.log(spectrum[:k]))
    v = max(1e-15, spectrum[k:].sum() / (d - k))
    pv = -np.log(v) * n * (d - k) / 2.0
    m = d * k - k * (k + 1) / 2.0
    pp = np.log(2.0 * np.pi) * (m + k) / 2.0
    tilde = spectrum.copy()
    tilde[k:] = v
    lam_i, lam_j = spectrum[:k, None], spectrum[None, :]
    inv_i, inv_j = 1.0 / tilde[:k, None], 1.0 / tilde[None, :]
    upper = np.arange(d)[None, :] > np.arange(k)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.log((lam_i - lam_j) * (inv_j - inv_i)) + np.log(n)
    pa = np.sum(terms[upper])
    return float(pu + pl + pv + pp - pa / 2.0 - k * np.log(n) / 2.0)


def _profile_two_groups(lam: np.ndarray) -> np.ndarray:
    """Zhu-Ghodsi profile log-likelihood of splitting the scree after position q = 1..m-1."""
    m = lam.size
    out = np.full(m - 1, -np.inf)
    for q in range(1, m):
        a, b = lam[:q], lam[q:]
        ss = ((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()
        var = max(ss / m, 1e-300 * lam.max() ** 2, np.finfo(float).tiny)  # ties, or no variance at all
        out[q - 1] = -0.5 * (m * np.log(2 * np.pi * var) + ss / var)
    return out


def _check_singular_values(singular_values, n: int, d: int) -> np.ndarray:
    s = np.asarray(singular_values, dtype=float)
    m = min(n, d)
    if s.ndim != 1 or s.size != m:
        raise ValueError(
            f"singular_values must hold all min(n_samples, n_features) = {m} values; got shape {s.shape}."
        )
    if not np.all(np.isfinite(s)) or np.any(s < 0) or np.any(np.diff(s) > 0):
        raise ValueError(
            "singular_values must be finite, non-negative and descending; got "
            f"{np.array2string(s, threshold=6)}."
        )
    return s


def _check_options(method: str, threshold, noise_std, tau) -> None:
    given = {"threshold": threshold, "noise_std": noise_std, "tau": tau}
    for name, value in given.items():
        if value is not None and method not in _USED_BY[name]:
            raise ValueError(
                f"{name} is used by method in {list(_USED_BY[name])} only; got {name}={value!r} with "
                f"method={method!r}, which would ignore it."
            )
    check_number(threshold, "threshold", low=0.0, high=1.0, low_open=True, high_open=True, allow_none=True)
    check_number(noise_std, "noise_std", low=0.0, low_open=True, allow_none=True)
    check_number(tau, "tau", low=0.0, allow_none=True)


def select_from_singular_values(
    singular_values,
    n_samples: int,
    n_features: int,
    method: str = "mle",
    *,
    threshold: float | None = None,
    noise_std: float | None = None,
    tau: float | None = None,
) -> Selection:
    """Apply a rule of :data:`METHODS` to the singular values of the centred data.

    Every rule is scale-free: scaling the data by ``c`` scales the singular
    values, ``noise_std`` and ``sqrt(tau)`` by ``c`` and leaves the choice
    unchanged. The rules are evaluated on ``s / u`` (``u`` a power of two
    near ``s_1``, an exact division) and their criteria mapped back, so any
    representable spectrum works; thresholds that scikit-learn's Minka
    evidence applies to eigenvalues (1e-15) are relative to ``u^2``.

    Parameters
    ----------
    singular_values : array-like of shape (m,)
        All ``m = min(n_samples, n_features)`` singular values of the centred
        data: finite, non-negative, descending.
    n_samples : int
        At least 2.
    n_features : int
        At least 1.
    method : str, default="mle"
        See the module docstring.
    threshold : float, optional
        For ``"variance"``: the explained-variance fraction in (0, 1), default 0.9;
        for ``"parallel"``: the quantile of the random eigenvalues, default 0.95.
    noise_std : float, optional
        Known noise standard deviation ``sigma > 0`` for ``"gavish-donoho"``,
        ``"aic"``, ``"bic"``, ``"gaic"`` and ``"rank"``; estimated when None.
    tau : float, optional
        For ``"rank"`` only: the price ``>= 0`` of one unit of rank, on the
        scale of squared singular values; by default the squared largest
        singular value of pure noise, ``(sigma (sqrt(n) + sqrt(d)))^2``.

    Returns
    -------
    Selection

    Raises
    ------
    ValueError
        An unknown method, singular values that are not as above, an option
        out of range or one the method does not use.

    Examples
    --------
    >>> s = np.array([10.0, 8.0, 1.0, 0.9, 0.8])
    >>> select_from_singular_values(s, 100, 5, "variance", threshold=0.95).n_components
    2
    >>> select_from_singular_values(s * 1e-200, 100, 5, "gavish-donoho").n_components
    2
    """
    check_choice(method, "method", METHODS)
    n = check_number(n_samples, "n_samples", integer=True, low=2)
    d = check_number(n_features, "n_features", integer=True, low=1)
    s = _check_singular_values(singular_values, n, d)
    _check_options(method, threshold, noise_std, tau)
    unit = power_of_two_above(s[0])
    working = _rule(s / unit, n, d, method, threshold,
                    None if noise_std is None else noise_std / unit,
                    None if tau is None else tau / unit / unit)
    criterion = working.criterion
    thr = None if working.threshold is None else np.float64(working.threshold)
    with np.errstate(over="ignore"):  # numpy scalars: overflow gives inf, checked below
        if method in ("aic", "bic", "gaic", "rank"):
            criterion, thr = criterion * unit * unit, None if thr is None else thr * unit * unit
        elif method == "gavish-donoho":
            criterion, thr = criterion * unit, thr * unit
        elif method == "mle":  # log-evidence of data in units of u: add the Jacobian
            criterion = criterion - n * d * math.log(unit)
        elif method == "profile-likelihood":  # a Gaussian log-likelihood of u^2-scaled values
            criterion = criterion - 2 * s.size * math.log(unit) if s.size >= 3 else criterion
    if not np.array_equal(np.isfinite(criterion), np.isfinite(working.criterion)) or (
        thr is not None and not np.isfinite(thr)
    ):
        raise ValueError(
            f"The {method!r} criterion of singular values up to {s[0]:.3g} overflows float64; "
            "rescale the data (the choice of n_components does not depend on their scale)."
        )
    thr = None if thr is None else float(thr)
    return Selection(method, working.n_components, working.candidates, criterion, thr, working.rule, s, n, d)


def _rule(s, n, d, method, threshold, noise_std, tau) -> Selection:
    """The rule on singular values ``s`` of moderate size (see :func:`select_from_singular_values`)."""
    if method == "parallel":
        return parallel_from_singular_values(s, n, d, 0.95 if threshold is None else threshold)
    if method in _NOISE_RULES:
        sigma = _noise_sigma(s, n, d) if noise_std is None else float(noise_std)
        k, candidates, criterion, thr, rule = _NOISE_RULES[method](s, n, d, sigma, noise_std, tau, method)
    else:
        k, candidates, criterion, thr, rule = _SPECTRUM_RULES[method](s, n, d, threshold)
    return Selection(method, int(k), np.asarray(candidates), np.asarray(criterion, dtype=float),
                     None if thr is None else float(thr), rule, s, n, d)


# Each rule gives (k, candidates, criterion, threshold or None, the rule in words).
def _variance_rule(s, n, d, threshold):
    s2 = s**2
    thr = 0.9 if threshold is None else float(threshold)
    cum = np.concatenate([[0.0], np.cumsum(s2) / s2.sum()]) if s2.sum() > 0 else np.zeros(s.size + 1)
    above = np.flatnonzero(cum > thr)
    k = int(above[0]) if above.size else s.size
    return k, np.arange(s.size + 1), cum, thr, f"smallest k with cumulative explained-variance ratio > {thr}"


def _elbow_rule(s, n, d, threshold):
    m, s2 = s.size, s**2
    if m < 3:
        return m, np.arange(1, m + 1), np.zeros(m), None, "fewer than 3 eigenvalues: all kept"
    x = np.linspace(0.0, 1.0, m)
    span = s2[0] - s2[-1]
    y = (s2 - s2[-1]) / span if span > 0 else np.zeros(m)
    # Distance below the chord from (0, 1) to (1, 0) of the normalised
    # scree; entry k belongs to eigenvalue k + 1, so argmax is the number kept.
    dist = (1.0 - x) - y
    elbow = int(np.argmax(dist))  # 0-based position of the first "scree" eigenvalue
    return (elbow, np.arange(m), dist, None,
            "k = components before the point farthest below the chord of the normalised scree")


def _mle_rule(s, n, d, threshold):
    if n < d:
        raise ValueError(
            f"method='mle' needs n_samples >= n_features (Minka's evidence uses all d "
            f"eigenvalues); got n_samples={n}, n_features={d}."
        )
    cand = np.arange(1, d)
    if cand.size == 0:
        return 1, [1], [0.0], None, "a single feature: k = 1"
    ll = np.array([minka_log_evidence(s**2 / (n - 1), k, n) for k in cand])
    return cand[int(np.argmax(ll))], cand, ll, None, "argmax over k = 1..d-1 of Minka's Laplace log-evidence"


def _profile_rule(s, n, d, threshold):
    if s.size < 3:
        return 1, [1], [0.0], None, "fewer than 3 eigenvalues: k = 1"
    prof = _profile_two_groups(s**2 / (n - 1))
    cand = np.arange(1, s.size)
    return (cand[int(np.argmax(prof))], cand, prof, None,
            "argmax over the split point of the two-group profile log-likelihood")


def _gavish_donoho_rule(s, n, d, sigma, noise_std, tau, method):
    small, large = sorted((n, d))
    beta = small / large
    if noise_std is None:
        thr = gavish_donoho_omega(beta) * np.median(s)
        how = f"omega(beta={beta:.3g}) x median singular value"
    else:
        thr = gavish_donoho_lambda(beta) * np.sqrt(large) * sigma
        how = f"lambda*(beta={beta:.3g}) sqrt({large}) sigma"
    return int(np.sum(s > thr)), np.arange(1, s.size + 1), s, thr, f"number of singular values > {how}"


def _rank_rule(s, n, d, sigma, noise_std, tau, method):
    s2, ks = s**2, np.arange(s.size + 1)
    t = (sigma * (np.sqrt(n) + np.sqrt(d))) ** 2 if tau is None else float(tau)
    crit = s2.sum() - np.concatenate([[0.0], np.cumsum(s2)]) + t * ks
    return int(np.argmin(crit)), ks, crit, t, "argmin over k of |Xc - A_k|_F^2 + tau k (keeps s_j^2 > tau)"


def _information_rule(s, n, d, sigma, noise_std, tau, method):
    """AIC, BIC or GAIC (Vidal, Ma & Sastry): residual per sample + penalty."""
    s2, ks = s**2, np.arange(s.size + 1)
    kk = ks[: min(s.size, d - 1) + 1] if d > 1 else ks[:1]
    resid = (s2.sum() - np.concatenate([[0.0], np.cumsum(s2)]))[kk] / n
    params = d * kk - kk**2 + (n * kk if method == "gaic" else 0)
    c = np.log(n) if method == "bic" else 2.0
    crit = resid + c * params * sigma**2 / n
    return (kk[int(np.argmin(crit))], kk, crit, None,
            f"argmin over k of residual/n + {'log(n)' if method == 'bic' else '2'} P(k) sigma^2 / n")


_SPECTRUM_RULES = {"variance": _variance_rule, "elbow": _elbow_rule, "mle": _mle_rule,
                   "profile-likelihood": _profile_rule}
_NOISE_RULES = {"gavish-donoho": _gavish_donoho_rule, "rank": _rank_rule, "aic": _information_rule,
                "bic": _information_rule, "gaic": _information_rule}


def select_n_components(X, method: str = "mle", *, standardize: bool = False, **options) -> Selection:
    """Choose the number of principal components of ``X`` by one rule.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    method : str, default="mle"
        One of :data:`METHODS`; see the module docstring for each formula.
    standardize : bool, default=False
        Scale features to unit variance first (as ``PCA(standardize=True)``).
    **options
        ``threshold``, ``noise_std``, ``tau``: see :func:`select_from_singular_values`;
        for ``"parallel"`` (always on the correlation matrix) ``kind``,
        ``n_iter``, ``quantile``, ``random_state`` (default 0, so that the rule
        is a function of the data): see :func:`parallel_analysis`.

    Returns
    -------
    Selection
        ``.n_components`` is the choice, ``.table`` a DataFrame per candidate k.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> select_n_components(load_iris().data, "mle").n_components
    3
    """
    check_choice(method, "method", METHODS)
    check_bool(standardize, "standardize")
    if method == "parallel":  # on the correlation matrix, as psych::fa.parallel
        # A rule is a function of the data: the random reference has a fixed seed unless given.
        return parallel_analysis(X, **{"random_state": _PARALLEL_SEED, **options})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"select_n_components got unknown options {unknown}; accepted: {list(OPTIONS)}.")
    # validate_fit records what it saw on an estimator; this one is named for the messages.
    data = prepare(X, estimator=type("select_n_components", (), {})(), allow_nan=False)
    dec = decompose(data.X, data.mean, None, standardize=standardize)
    s = dec.svd.singular_values * (1.0 if standardize else data.scale)
    return select_from_singular_values(s, data.n, data.d, method, **options)


# ------------------------------------------------------------------------
# Parallel analysis (Horn 1965), as R's psych::fa.parallel (issue 17).
_PARALLEL_KINDS = ("pca", "fa")
# Random data sets of the default reference: psych's n.iter.
_PARALLEL_ITER = 20
# Seed of the reference used by select_from_singular_values, so that the rule is a
# deterministic function of (n, d) like the others.
_PARALLEL_SEED = 0


@dataclass(frozen=True)
class ParallelAnalysis(Selection):
    """The outcome of parallel analysis: data eigenvalues against those of random data.

    A :class:`Selection` whose ``criterion`` holds the data's eigenvalues, with:

    Attributes
    ----------
    kind : {"pca", "fa"}
        Eigenvalues of the correlation matrix, or of the reduced correlation
        matrix with squared multiple correlations on its diagonal.
    random_eigenvalues : ndarray of shape (n_iter, m)
        Those of each random data set, descending.
    reference : ndarray of shape (m,)
        Their ``quantile`` per position (their mean when ``quantile`` is None).
    quantile : float or None
    """

    kind: str = "pca"
    random_eigenvalues: np.ndarray = field(default=None, repr=False)
    reference: np.ndarray = field(default=None, repr=False)
    quantile: float | None = 0.95

    @property
    def table(self) -> pd.DataFrame:
        """:attr:`Selection.table` with the random reference beside the data's eigenvalues."""
        table = super().table
        table["random_reference"] = self.reference[self.candidates - 1]
        return table


def _smc_reduced(corr: np.ndarray) -> np.ndarray:
    """``R`` with its diagonal replaced by squared multiple correlations ``1 - 1 / (R^{-1})_jj``.

    A singular ``R`` (``n <= d``, or collinear columns) has no SMC by this
    formula; the pseudo-inverse's diagonal, floored at 1, stands in for it.
    """
    inv_diag = np.diag(np.linalg.pinv(corr, hermitian=True))
    reduced = corr.copy()
    np.fill_diagonal(reduced, 1.0 - 1.0 / np.maximum(inv_diag, 1.0))
    return reduced


def _correlation_eigenvalues(corr: np.ndarray, kind: str) -> np.ndarray:
    matrix = _smc_reduced(corr) if kind == "fa" else corr
    return np.linalg.eigvalsh(matrix)[::-1]


def random_eigenvalues(n_samples: int, n_features: int, *, kind: str = "pca", n_iter: int = _PARALLEL_ITER,
                       random_state=None) -> np.ndarray:
    """Eigenvalues of the correlation matrices of ``n_iter`` data sets of i.i.d. N(0, 1) entries.

    The scatter matrix of ``n`` centred i.i.d. normal rows is Wishart with
    ``n - 1`` degrees of freedom; when ``n - 1 >= d`` it is drawn directly by
    Bartlett's decomposition (``A = L L^T``, ``L`` lower triangular with
    ``L_jj^2 ~ chi^2(n - 1 - j)`` and standard normal entries below the
    diagonal), at O(d^3) whatever ``n``; otherwise the data are drawn. The
    correlation matrix is ``D^{-1/2} A D^{-1/2}`` with ``D = diag(A)``.

    Parameters
    ----------
    n_samples, n_features : int
        Shape of the data, ``n >= 2``.
    kind : {"pca", "fa"}, default="pca"
        Eigenvalues of the correlation matrix, or of the reduced one (squared
        multiple correlations on the diagonal).
    n_iter : int, default=20
    random_state : None, int, Generator or RandomState

    Returns
    -------
    ndarray of shape (n_iter, n_features)
        Each row descending.

    Examples
    --------
    >>> ev = random_eigenvalues(500, 4, n_iter=200, random_state=0)
    >>> bool(np.allclose(ev.sum(axis=1), 4.0)), bool(1.05 < np.median(ev[:, 0]) < 1.25)
    (True, True)
    """
    from bayespca.params import as_generator, check_choice, check_number

    n = check_number(n_samples, "n_samples", integer=True, low=2)
    d = check_number(n_features, "n_features", integer=True, low=1)
    check_choice(kind, "kind", _PARALLEL_KINDS)
    n_iter = check_number(n_iter, "n_iter", integer=True, low=1)
    rng = as_generator(random_state)
    out = np.empty((n_iter, d))
    rows, cols = np.tril_indices(d, -1)
    for i in range(n_iter):
        if n - 1 >= d:
            chol = np.diag(np.sqrt(rng.chisquare(n - 1 - np.arange(d))))
            chol[rows, cols] = rng.standard_normal(rows.size)
            scatter = chol @ chol.T
        else:
            data = rng.standard_normal((n, d))
            data -= data.mean(axis=0)
            scatter = data.T @ data
        sd = np.sqrt(np.diag(scatter))
        out[i] = _correlation_eigenvalues(scatter / np.outer(sd, sd), kind)
    return out


def _reference(random: np.ndarray, quantile: float | None) -> np.ndarray:
    return random.mean(axis=0) if quantile is None else np.quantile(random, quantile, axis=0)


def _leading_above(values: np.ndarray, reference: np.ndarray) -> int:
    """How many leading values exceed the reference, up to the first that does not (psych's count)."""
    below = np.flatnonzero(~(values > reference))
    return int(below[0]) if below.size else int(values.size)


def _parallel_result(eigenvalues, random, quantile, kind, singular_values, n, d) -> ParallelAnalysis:
    m = singular_values.size
    reference = _reference(random[:, :m], quantile)
    k = _leading_above(eigenvalues[:m], reference)
    what = "mean" if quantile is None else f"{quantile:g} quantile"
    matrix = "reduced correlation matrix (SMC diagonal)" if kind == "fa" else "correlation matrix"
    rule = (f"leading eigenvalues of the {matrix} above the {what} of those of {random.shape[0]} "
            "random normal data sets of the same shape")
    return ParallelAnalysis("parallel", k, np.arange(1, m + 1), eigenvalues[:m], None, rule,
                            singular_values, n, d, kind, random[:, :m], reference, quantile)


@functools.lru_cache(maxsize=32)
def _default_reference(n: int, d: int) -> np.ndarray:
    return random_eigenvalues(n, d, n_iter=_PARALLEL_ITER, random_state=_PARALLEL_SEED)


def parallel_from_singular_values(singular_values, n_samples: int, n_features: int,
                                  quantile: float | None = 0.95) -> ParallelAnalysis:
    """Parallel analysis of a spectrum: ``d s_j^2 / sum s^2`` against random correlation eigenvalues.

    The normalised eigenvalues ``d s_j^2 / sum_l s_l^2`` (mean 1) are those of
    the correlation matrix when the data were standardised (PCA with
    ``standardize=True``), else those of the covariance scaled to mean 1.
    The reference is :func:`random_eigenvalues` with 20 data sets from a
    fixed seed, so the rule depends on ``(n, d)`` only, like the others of
    this module. Used by ``select_from_singular_values(..., "parallel")``
    (``threshold`` is then the quantile).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 2)) @ rng.normal(size=(2, 8)) + rng.normal(size=(300, 8))
    >>> s = np.linalg.svd(X - X.mean(0), compute_uv=False)
    >>> parallel_from_singular_values(s, 300, 8).n_components
    2
    """
    s = np.asarray(singular_values, dtype=float)
    n, d = int(n_samples), int(n_features)
    total = float(np.sum(s**2))
    eigenvalues = d * s**2 / total if total > 0 else np.zeros_like(s)
    return _parallel_result(eigenvalues, _default_reference(n, d), quantile, "pca", s, n, d)


def parallel_analysis(X, *, kind: str = "pca", n_iter: int = _PARALLEL_ITER, quantile: float | None = 0.95,
                      random_state=None) -> ParallelAnalysis:
    """Horn's (1965) parallel analysis, as R's ``psych::fa.parallel``: how many eigenvalues beat noise.

    The eigenvalues of the data's correlation matrix (``kind="pca"``), or of
    its reduced correlation matrix with squared multiple correlations on the
    diagonal (``kind="fa"``, psych's ``SMC=TRUE``), are compared in order
    with the ``quantile`` (psych's ``quant``, default 0.95; None: the mean,
    Horn's original) of those of ``n_iter`` data sets of independent normal
    columns with the same shape (:func:`random_eigenvalues`). The number of
    components or factors is the number of leading data eigenvalues above
    their reference, counted up to the first that is not.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Complete data.
    kind : {"pca", "fa"}, default="pca"
    n_iter : int, default=20
        Random data sets (psych's ``n.iter``).
    quantile : float in (0, 1) or None, default=0.95
    random_state : None, int, Generator or RandomState

    Returns
    -------
    ParallelAnalysis
        ``.n_components``; ``.criterion`` the data's eigenvalues,
        ``.reference`` the random ones' quantiles, ``.table`` both per k.

    Notes
    -----
    psych's FA variant by default (``SMC=FALSE``) uses the eigenvalues of a
    one-factor minres solution's reduced matrix; the SMC diagonal used here
    is the classic choice (Humphreys & Ilgen 1969) and needs no fit.

    References
    ----------
    J. L. Horn (1965). A rationale and test for the number of factors in
    factor analysis. Psychometrika 30(2), 179-185.

    Examples
    --------
    >>> from sklearn.datasets import load_wine
    >>> parallel_analysis(load_wine().data, random_state=0).n_components
    3
    """
    from bayespca.data import as_float_matrix
    from bayespca.params import check_choice, check_number

    check_choice(kind, "kind", _PARALLEL_KINDS)
    check_number(quantile, "quantile", low=0, high=1, low_open=True, high_open=True, allow_none=True)
    arr = as_float_matrix(X, name="X")
    n, d = arr.shape
    if n < 3 or d < 2:
        raise ValueError(
            f"parallel analysis needs at least 3 samples and 2 features; got X of shape {arr.shape}."
        )
    centred = arr - arr.mean(axis=0)
    sd = np.sqrt(np.einsum("ij,ij->j", centred, centred))
    if np.any(sd == 0):
        constant = np.flatnonzero(sd == 0).tolist()
        raise ValueError(f"X has constant columns {constant}: they have no correlation; drop them.")
    standardised = centred / sd
    singular_values = np.linalg.svd(standardised, compute_uv=False) * np.sqrt(n - 1)
    eigenvalues = _correlation_eigenvalues(standardised.T @ standardised, kind)
    random = random_eigenvalues(n, d, kind=kind, n_iter=n_iter, random_state=random_state)
    return _parallel_result(eigenvalues, random, quantile, kind, singular_values, n, d)
