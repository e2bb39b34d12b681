"""R-hat and effective sample sizes of many quantities at once, as ArviZ defines them.

Every NUTS fit checks its draws before it returns (:func:`bayespca.posterior.diagnose`).
ArviZ (``arviz_stats``) computes these statistics one quantity at a time, and importing it
loads xarray and pandas: 0.35 s of a first fit that takes about 5 s. The same definitions
are computed here with NumPy and SciPy, for all the quantities of a fit in one pass;
``arviz_stats`` stays the reference (the tests compare the two to 1e-10).

Definitions (Vehtari, Gelman, Simpson, Carpenter & Buerkner 2021). Each chain is split in
two halves (the middle draw of an odd chain dropped). Draws are rank-normalised over all
chains: ``z = Phi^-1((r - 3/8) / (S + 1/4))``, ``r`` the average rank among the ``S``
draws. For ``M`` chains of ``N`` draws with means ``m_c``, variances ``s_c^2`` (ddof 1),

    R = sqrt(((N - 1) / N W + B / N) / W),   W = mean(s_c^2),  B = N var(m_c) (ddof 1),

and the rank-normalised R-hat is the larger of ``R(z)`` for the split draws and for
their distances from the median (the folded draws, which see a difference of scale).
The effective sample size of ``x`` (split chains) is ``M N / tau`` with

    tau = -1 + 2 sum_{t < 2T} rho_t + rho_{2T},
    rho_t = 1 - (W' - mean_c acov_c(t)) / var+,

``acov_c`` the chain's autocovariance (denominator ``N``), ``W'`` its lag-0 mean times
``N / (N - 1)``, ``var+ = W' (N - 1) / N + var(m_c)``, and the sum truncated by Geyer's
initial positive sequence (pairs ``rho_{2j} + rho_{2j+1}`` until the first that is not
positive, made non-increasing: the initial monotone sequence; the next even lag added
when positive), with ``tau`` at least ``1 / log10(M N)``. The bulk ESS is that of the
rank-normalised split draws, the mean ESS that of the split draws themselves; the tail
ESS the smaller of those of the indicators
``x <= q_0.1`` and ``x <= q_0.9`` (quantiles of all the draws, NumPy's linear method),
as ``arviz_stats.ess(x, method="tail", prob=0.9)`` computes it.

References
----------
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Buerkner (2021). Rank-normalization,
folding, and localization: an improved R-hat for assessing convergence of MCMC. Bayesian
Analysis 16(2), 667-718.
C. J. Geyer (1992). Practical Markov chain Monte Carlo. Statistical Science 7(4), 473-483.
"""

from __future__ import annotations

import numpy as np
import scipy.fft
import scipy.special
import scipy.stats

__all__ = ["ess_bulk", "ess_mean", "ess_tail", "rank_rhat"]

_MIN_DRAWS = 4  # fewer draws a chain: NaN, as ArviZ
_BLOCK_VALUES = 1 << 18  # draws of the quantities whose statistics are computed at once


def _split(series: np.ndarray) -> np.ndarray:
    """(m, chains, draws) -> (m, 2 chains, draws // 2): each chain's two halves."""
    half = series.shape[2] // 2
    return np.concatenate([series[:, :, :half], series[:, :, series.shape[2] - half:]], axis=1)


def _z_scale(series: np.ndarray) -> np.ndarray:
    """Rank-normalised draws, each quantity ranked over all its chains."""
    flat = series.reshape(series.shape[0], -1)
    ranks = scipy.stats.rankdata(flat, method="average", axis=1)
    return scipy.special.ndtri((ranks - 0.375) / (flat.shape[1] + 0.25)).reshape(series.shape)


def _rhat(series: np.ndarray) -> np.ndarray:
    n = series.shape[2]
    between = n * np.var(series.mean(axis=2), axis=1, ddof=1)
    within = np.var(series, axis=2, ddof=1).mean(axis=1)
    return np.sqrt((between / within + n - 1) / n)


def _valid(series: np.ndarray, min_chains: int) -> np.ndarray:
    """Quantities ArviZ would compute: no NaN, enough chains and draws."""
    enough = series.shape[1] >= min_chains and series.shape[2] >= _MIN_DRAWS
    return ~np.isnan(series).any(axis=(1, 2)) & enough


def _per_quantity(series, min_chains: int, statistic) -> np.ndarray:
    """``statistic`` of the valid quantities of ``series`` (m, chains, draws); NaN for the others.

    Quantities go in blocks of at most :data:`_BLOCK_VALUES` draws, which keeps the work
    arrays (the FFT's are several times the block) small. At once, the pointwise
    log-likelihood of LOO (1000 rows of 4 x 500 draws) took 0.45-0.65 s on its first call
    after a fit, against 0.06-0.09 s in blocks (why the first call was slow, fresh memory
    or otherwise, was not pinned down); each quantity's statistic is its own.
    """
    series = np.asarray(series, dtype=float)
    out = np.full(series.shape[0], np.nan)
    valid = np.flatnonzero(_valid(series, min_chains))
    size = max(1, _BLOCK_VALUES // max(series[0].size, 1))
    for start in range(0, valid.size, size):
        block = valid[start:start + size]
        out[block] = statistic(series[block])
    return out


def rank_rhat(series: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat of each quantity (module notes).

    Parameters
    ----------
    series : ndarray of shape (m, chains, draws)
        ``m`` scalar quantities.

    Returns
    -------
    ndarray of shape (m,)
        NaN for a quantity with a NaN draw, or with fewer than 2 chains or 4 draws.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> mixed, stuck = rng.standard_normal((4, 500)), rng.standard_normal((4, 500))
    >>> stuck[0] += 3.0
    >>> (rank_rhat(np.stack([mixed, stuck])) > 1.01).tolist()  # the second's chain 0 is shifted
    [False, True]
    """
    return _per_quantity(series, 2, _folded_rhat)


def _folded_rhat(series):
    split = _split(series)
    median = np.median(split.reshape(split.shape[0], -1), axis=1)[:, None, None]
    return np.maximum(_rhat(_z_scale(split)), _rhat(_z_scale(np.abs(split - median))))


def ess_bulk(series: np.ndarray) -> np.ndarray:
    """Bulk effective sample size of each quantity (module notes); shapes as :func:`rank_rhat`.

    NaN for a quantity with a NaN draw or fewer than 4 draws a chain.

    Examples
    --------
    Independent draws have an ESS near their number:

    >>> draws = np.random.default_rng(0).standard_normal((1, 4, 500))
    >>> bool(1500 < ess_bulk(draws)[0] < 2500)
    True
    """
    return _per_quantity(series, 1, lambda x: _ess(_z_scale(_split(x))))


def ess_mean(series: np.ndarray) -> np.ndarray:
    """Effective sample size of each quantity's mean: that of its split draws, not rank-normalised.

    ``arviz_stats.ess(x, method="mean")``; shapes and NaN as :func:`ess_bulk`.

    Examples
    --------
    >>> draws = np.random.default_rng(0).standard_normal((1, 4, 500))
    >>> bool(1500 < ess_mean(draws)[0] < 2500)
    True
    """
    return _per_quantity(series, 1, lambda x: _ess(_split(x)))


def ess_tail(series: np.ndarray, prob: float = 0.9) -> np.ndarray:
    """Tail effective sample size: the smaller of the ESS of the ``1 - prob`` and ``prob`` quantiles.

    ArviZ's array interface reads ``prob`` so (``arviz_stats.ess(..., method="tail",
    prob=0.9)``: the 10% and 90% quantiles). Shapes and NaN as :func:`ess_bulk`.

    Examples
    --------
    Independent draws against random walks (each draw a step from the last):

    >>> steps = np.random.default_rng(0).standard_normal((1, 4, 500))
    >>> bool(1500 < ess_tail(steps)[0] < 2500), bool(ess_tail(steps.cumsum(axis=2))[0] < 50)
    (True, True)
    """

    def tails(x):
        flat = x.reshape(x.shape[0], -1)
        below = [x <= np.quantile(flat, p, axis=1)[:, None, None] for p in sorted((prob, 1.0 - prob))]
        return np.minimum(*(_ess(_split(b.astype(float))) for b in below))

    return _per_quantity(series, 1, tails)


def _autocovariance(series: np.ndarray) -> np.ndarray:
    """Each chain's autocovariance at every lag (denominator the number of draws), by FFT."""
    n = series.shape[-1]
    centred = series - series.mean(axis=-1, keepdims=True)
    size = scipy.fft.next_fast_len(2 * n)
    spectrum = np.fft.rfft(centred, n=size, axis=-1)
    return np.fft.irfft(spectrum * np.conjugate(spectrum), n=size, axis=-1)[..., :n] / n


def _ess(series: np.ndarray) -> np.ndarray:
    """ESS of each quantity of ``series`` (m, chains, draws), Geyer's truncation (module notes)."""
    m, chains, n = series.shape
    out = np.full(m, float(chains * n))  # a constant quantity: every draw counts
    varying = np.ptp(series.reshape(m, -1), axis=1) >= np.finfo(float).resolution
    if not varying.any():
        return out
    x = series[varying]
    acov = _autocovariance(x).mean(axis=1)  # (m', lags): averaged over chains
    mean_var = acov[:, 0] * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if chains > 1:
        var_plus = var_plus + np.var(x.mean(axis=2), axis=1, ddof=1)
    rho = 1.0 - (mean_var[:, None] - acov) / var_plus[:, None]
    rho[:, 0] = 1.0
    out[varying] = chains * n / _geyer_tau(rho, n, chains * n)
    return out


def _geyer_tau(rho: np.ndarray, n: int, total: int) -> np.ndarray:
    """``tau`` from autocorrelations ``rho`` (m, n): initial positive then monotone sequence.

    Pair ``j`` is ``(rho_2j, rho_2j+1)``; pairs are read while the previous one's sum is
    positive, up to the last pair ``j`` with ``2 j - 1 < n - 3``, so ``last`` is the first
    pair whose sum is not positive, or that last pair (0 when pair 0's sum is not positive). The pairs before
    it enter ``tau`` as a running minimum; ``rho`` at lag ``2 last`` is added when positive
    or when its pair's sum is not negative (the reference implementation keeps it then).
    """
    pairs = (n - 1) // 2  # pairs 0 .. pairs - 1: the last one read has lags n - 3, n - 2 or below
    pair_rho = rho[:, : 2 * pairs].reshape(rho.shape[0], pairs, 2)
    sums = pair_rho.sum(axis=2)
    if pairs < 2:  # nothing past the first pair is read
        last = np.zeros(rho.shape[0], int)
    else:  # pair j >= 1 is read while pair j - 1 was positive
        stops = sums[:, 1:] <= 0.0
        stops[:, -1] = True
        last = np.where(sums[:, 0] > 0.0, 1 + np.argmax(stops, axis=1), 0)
    kept = np.arange(pairs)[None, :] < last[:, None]
    monotone = np.minimum.accumulate(np.where(kept, sums, np.inf), axis=1)
    rows = np.arange(rho.shape[0])
    even, odd = rho[rows, 2 * last], rho[rows, np.minimum(2 * last + 1, n - 1)]
    tail = np.where((even > 0) | (even + odd >= 0), even, 0.0)
    tau = -1.0 + 2.0 * np.sum(np.where(kept, monotone, 0.0), axis=1) + tail
    tau = np.maximum(tau, 1.0 / np.log10(total))
    return np.where(np.isnan(rho).any(axis=1), np.nan, tau)
