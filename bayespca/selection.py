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
from bayespca.statistics import prepare

__all__ = [
    "METHODS",
    "OPTIONS",
    "Selection",
    "gavish_donoho_lambda",
    "gavish_donoho_omega",
    "marchenko_pastur_median",
    "minka_log_evidence",
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
)

#: Options of :func:`select_from_singular_values`, and the methods that use each.
_USED_BY = {
    "threshold": ("variance",),
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
        For ``"variance"`` only: the explained-variance fraction in (0, 1), default 0.9.
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
    unit = math.ldexp(1.0, math.frexp(s[0])[1]) if s[0] > 0 else 1.0
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
    m = s.size
    s2 = s**2
    total = s2.sum()

    def result(k, candidates, criterion, thr, rule):
        return Selection(method, int(k), np.asarray(candidates), np.asarray(criterion, dtype=float),
                         None if thr is None else float(thr), rule, s, n, d)

    ks = np.arange(m + 1)
    if method == "variance":
        thr = 0.9 if threshold is None else float(threshold)
        cum = np.concatenate([[0.0], np.cumsum(s2) / total]) if total > 0 else np.zeros(m + 1)
        above = np.flatnonzero(cum > thr)
        k = int(above[0]) if above.size else m
        return result(k, ks, cum, thr, f"smallest k with cumulative explained-variance ratio > {thr}")
    if method == "elbow":
        if m < 3:
            return result(m, ks[1:], np.zeros(m), None, "fewer than 3 eigenvalues: all kept")
        x = np.linspace(0.0, 1.0, m)
        span = s2[0] - s2[-1]
        y = (s2 - s2[-1]) / span if span > 0 else np.zeros(m)
        # Distance below the chord from (0, 1) to (1, 0) of the normalised
        # scree; entry k belongs to eigenvalue k + 1, so argmax is the number kept.
        dist = (1.0 - x) - y
        elbow = int(np.argmax(dist))  # 0-based position of the first "scree" eigenvalue
        return result(elbow, ks[:m], dist, None,
                      "k = components before the point farthest below the chord of the normalised scree")
    if method == "mle":
        if n < d:
            raise ValueError(
                f"method='mle' needs n_samples >= n_features (Minka's evidence uses all d "
                f"eigenvalues); got n_samples={n}, n_features={d}."
            )
        spectrum = s2 / (n - 1)
        cand = np.arange(1, d)
        if cand.size == 0:
            return result(1, [1], [0.0], None, "a single feature: k = 1")
        ll = np.array([minka_log_evidence(spectrum, k, n) for k in cand])
        return result(cand[int(np.argmax(ll))], cand, ll, None,
                      "argmax over k = 1..d-1 of Minka's Laplace log-evidence")
    if method == "profile-likelihood":
        if m < 3:
            return result(1, [1], [0.0], None, "fewer than 3 eigenvalues: k = 1")
        prof = _profile_two_groups(s2 / (n - 1))
        cand = np.arange(1, m)
        return result(cand[int(np.argmax(prof))], cand, prof, None,
                      "argmax over the split point of the two-group profile log-likelihood")

    sigma = _noise_sigma(s, n, d) if noise_std is None else float(noise_std)
    if method == "gavish-donoho":
        small, large = sorted((n, d))
        beta = small / large
        if noise_std is None:
            thr = gavish_donoho_omega(beta) * np.median(s)
            how = f"omega(beta={beta:.3g}) x median singular value"
        else:
            thr = gavish_donoho_lambda(beta) * np.sqrt(large) * sigma
            how = f"lambda*(beta={beta:.3g}) sqrt({large}) sigma"
        return result(int(np.sum(s > thr)), ks[1:], s, thr, f"number of singular values > {how}")
    if method == "rank":
        t = (sigma * (np.sqrt(n) + np.sqrt(d))) ** 2 if tau is None else float(tau)
        tail = total - np.concatenate([[0.0], np.cumsum(s2)])
        crit = tail + t * ks
        return result(int(np.argmin(crit)), ks, crit, t,
                      "argmin over k of |Xc - A_k|_F^2 + tau k (keeps s_j^2 > tau)")
    # Information criteria (Vidal, Ma & Sastry): residual per sample + penalty.
    kk = ks[: min(m, d - 1) + 1] if d > 1 else ks[:1]
    resid = (total - np.concatenate([[0.0], np.cumsum(s2)]))[kk] / n
    params = d * kk - kk**2 + (n * kk if method == "gaic" else 0)
    c = np.log(n) if method == "bic" else 2.0
    crit = resid + c * params * sigma**2 / n
    return result(kk[int(np.argmin(crit))], kk, crit, None,
                  f"argmin over k of residual/n + {'log(n)' if method == 'bic' else '2'} P(k) sigma^2 / n")


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
        ``threshold``, ``noise_std``, ``tau``: see :func:`select_from_singular_values`.

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
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"select_n_components got unknown options {unknown}; accepted: {list(OPTIONS)}.")
    # validate_fit records what it saw on an estimator; this one is named for the messages.
    data = prepare(X, estimator=type("select_n_components", (), {})(), allow_nan=False)
    dec = decompose(data.X, data.mean, None, standardize=standardize)
    s = dec.svd.singular_values * (1.0 if standardize else data.scale)
    return select_from_singular_values(s, data.n, data.d, method, **options)
