"""Full posteriors of pPCA and factor analysis by NUTS on the marginal model.

The sampler sees ``p(W, Psi, mu | X)`` with the latent ``z`` integrated out,
``x_i ~ N(mu, W W^T + Psi)``. Its log-likelihood is computed from
sufficient statistics (:func:`bayespca.gaussian.log_likelihood_from_stats`):
with missing values, rows are grouped by their pattern of observed entries
and each group contributes the likelihood of its observed block from its
own ``(n_p, mean_p, scatter_p)``. A gradient therefore costs O(d^2 k) per
pattern, whatever the number of rows (with more than ``max_patterns``
distinct patterns the per-row masked density of
:func:`bayespca.gaussian.log_prob` is used instead).

``W`` is identified only up to ``W R`` (``R`` orthogonal). ``identification``
chooses how the sampler is kept off that ridge:

``"polar"`` (pPCA default)
    ``W = U diag(l)`` with ``U = Z L^{-T}``, ``Z^T Z = L L^T``: the
    orthonormal factor of an unconstrained ``d x k`` matrix ``Z`` whose
    density depends on ``Z^T Z`` only, so ``U`` is uniform on the Stiefel
    manifold,
    and ``l_1 > ... > l_k > 0``. The likelihood depends on ``U diag(l^2) U^T``
    only, ``l^2`` are the eigenvalues of ``W W^T`` and each column of ``U`` is
    identified up to its sign, which is fixed after sampling (positive inner
    product with the maximum-likelihood column). ``U diag(l) V^T`` is the
    SVD of an unconstrained ``W`` whose ``V`` is integrated out: with a prior
    ``p(W)`` invariant under ``W -> W V`` (the defaults), ``(U, l)`` has
    density ``p(U diag(l)) prod_j l_j^(d-k) prod_{i<j} (l_i^2 - l_j^2)``
    (the SVD's volume element), so the posterior of ``W W^T`` is exactly that
    of the unconstrained model. With ``prior="ard"`` (not rotation-invariant)
    the precision ``alpha_j`` belongs to column ``j`` of ``U diag(l)`` and
    the density is ``p(U diag(l) | alpha)`` with respect to Haar measure and
    Lebesgue measure on ``l`` (the volume element's repulsion between the
    ``l_j`` would keep superfluous components from shrinking together).
``"lower_triangular"`` (FA default)
    ``W_jl = 0`` for ``l > j`` and ``W_jj > 0`` (log scale); the loadings
    prior is evaluated at this ``W`` (its fixed zeros add a constant).
``"procrustes"``
    Unconstrained ``W``; each draw is rotated after sampling onto the
    maximum-likelihood loadings by the orthogonal Procrustes solution
    (:func:`bayespca.rotations.procrustes`), which also fixes order and signs.
``"none"``
    Unconstrained ``W``, raw draws (only rotation-invariant functions of
    them are meaningful).

With the regularised horseshoe (``priors="horseshoe"``,
:class:`bayespca.models.Horseshoe`) the prior on the entries of ``W`` is
not rotation invariant: it breaks every symmetry ``W R`` except the signed
permutations of the columns, and prefers the sparse rotation. ``W`` is
then sampled in the original coordinates, without identification
(``"none"``; a lower-triangular ``W`` would impose zeros that contradict a
sparse support, and the polar or Procrustes alignments would rotate the
sparse basis away), in the non-centred form ``W = tau lambda~ z`` for
the loadings near 0 and centred for the others (see
``_horseshoe_constrain``). The
chains start at the varimax rotation of the maximum-likelihood loadings,
near a sparse mode, and each draw is aligned afterwards by the signed
permutation of its columns closest to the posterior mean (recorded as
``identification="signed_permutation"``).

The mean is sampled in whitened coordinates ``mu = xbar + L_C eta / sqrt(n)``
(``L_C`` the Cholesky factor of the maximum-likelihood covariance), an
affine map that makes the mean's posterior close to ``N(0, I)`` in ``eta``
so diagonal mass-matrix adaptation suffices.

Up to 2000 parameters, the sampler moves ``xi`` with ``theta = theta_ML + S xi``,
``S S^T`` the inverse Hessian of the negative log posterior at the
maximum-likelihood start (the Laplace approximation whitened): NUTS then sees
near unit-scale geometry whatever ``n``, and each chain starts at a draw of
that approximation. (Measured at d=20, k=3: a median 15 leapfrog steps per
draw at n=10^3 and at n=10^5.)

The data (pattern statistics, prior parameters, start, preconditioner) reach
the compiled sampler as arguments: a fit compiles once per configuration
(``d``, ``k``, noise, identification, prior kind, pattern sizes, numbers of
draws and chains, mass and acceptance settings) and later fits of new data
reuse it (measured at n=1000, d=20, k=3, 500+500 draws: 9 s for the first
fit, 0.7 s for the next).
"""

from __future__ import annotations

import functools
import numbers
import warnings
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import solve_triangular
from numpyro.infer import MCMC, NUTS
from numpyro.infer.hmc import hmc

from bayespca.data import as_float_matrix
from bayespca.gaussian import LowRankGaussian, log_likelihood_from_stats, log_prob
from bayespca.linalg import centred_scatter
from bayespca.models import (
    Horseshoe,
    SufficientStatistics,
    _as_site_distribution,
    _canonical_columns,
    _horseshoe_start,
    horseshoe_loadings,
    resolve_priors,
)

__all__ = [
    "IDENTIFICATIONS",
    "MissingPatterns",
    "NUTSFit",
    "SamplingWarning",
    "diagnose",
    "effective_components",
    "fit_nuts",
    "marginal_log_likelihood",
    "missing_patterns",
    "pointwise_log_likelihood",
    "posterior_variables",
    "to_datatree",
]

IDENTIFICATIONS = ("polar", "lower_triangular", "procrustes", "none")
_CHAIN_METHODS = ("sequential", "parallel", "vectorized")
_DEFAULT_IDENTIFICATION = {"isotropic": "polar", "diagonal": "lower_triangular"}


@dataclass(frozen=True)
class MissingPatterns:
    """Rows grouped by their pattern of observed entries, as sufficient statistics.

    Attributes
    ----------
    columns : tuple of ndarray of int
        Observed columns of each pattern.
    stats : tuple of SufficientStatistics
        ``(n_p, mean_p, scatter_p)`` of the observed block of the rows with
        that pattern.
    X, observed : ndarray or None
        The data (NaN replaced by 0) and its mask, kept only when the
        per-row density is used instead (too many patterns).
    """

    columns: tuple
    stats: tuple
    X: np.ndarray | None = None
    observed: np.ndarray | None = None


# A pytree, so that the data reach the compiled sampler as arguments (one compilation serves
# every data set with the same number and sizes of patterns).
jax.tree_util.register_dataclass(
    MissingPatterns, data_fields=["columns", "stats", "X", "observed"], meta_fields=[]
)


def missing_patterns(X: Any, max_patterns: int = 64) -> MissingPatterns:
    """Group the rows of ``X`` by which entries are observed (not NaN).

    Parameters
    ----------
    X : array-like of shape (n, d)
    max_patterns : int, default=64
        Above this many distinct patterns, keep the rows themselves (the
        likelihood is then a sum over rows).

    Returns
    -------
    MissingPatterns

    Examples
    --------
    >>> p = missing_patterns([[1.0, 2.0], [3.0, np.nan], [5.0, 6.0]])
    >>> [c.tolist() for c in p.columns], [int(s.n) for s in p.stats]
    ([[0, 1], [0]], [2, 1])
    """
    arr = as_float_matrix(X, name="X", allow_nan=True)
    observed = ~np.isnan(arr)
    keys, inverse = np.unique(observed, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    if len(keys) > max_patterns:
        return MissingPatterns((), (), np.where(observed, arr, 0.0), observed)
    columns, stats = [], []
    # Patterns ordered by size, the all-observed one usually first.
    for p in np.argsort(-np.bincount(inverse)):
        cols = np.flatnonzero(keys[p])
        if cols.size == 0:
            continue  # a row with nothing observed carries no information
        rows = arr[np.ix_(inverse == p, cols)]
        mean = rows.mean(axis=0)
        columns.append(cols)
        stats.append(SufficientStatistics(rows.shape[0], mean, centred_scatter(rows, mean)))
    return MissingPatterns(tuple(columns), tuple(stats))


def marginal_log_likelihood(g: LowRankGaussian, patterns: MissingPatterns) -> jax.Array:
    """Total marginal log-likelihood ``sum_i log N(x_{i,O_i} | mu_O, W_O W_O^T + Psi_O)``.

    Each pattern contributes :func:`bayespca.gaussian.log_likelihood_from_stats`
    of its observed block; jit- and grad-friendly.

    Examples
    --------
    >>> X = np.array([[0.0, 1.0], [1.0, 3.0], [2.0, np.nan]])
    >>> g = LowRankGaussian(np.array([[0.8], [0.6]]), np.array([0.4, 0.7]), np.array([1.0, 2.0]))
    >>> total = marginal_log_likelihood(g, missing_patterns(X))
    >>> bool(np.isclose(total, log_prob(g, np.nan_to_num(X), ~np.isnan(X)).sum()))
    True
    """
    if patterns.X is not None:
        return jnp.sum(log_prob(g, patterns.X, patterns.observed))
    total = 0.0
    w, noise, mean = (jnp.asarray(a) for a in g)
    for cols, s in zip(patterns.columns, patterns.stats, strict=True):
        if cols.size == w.shape[0]:
            sub = LowRankGaussian(w, noise, mean)
        else:
            sub = LowRankGaussian(w[cols], noise[cols], mean[cols])
        total = total + log_likelihood_from_stats(sub, s.n, s.mean, s.scatter)
    return total


@dataclass
class NUTSFit:
    """Posterior draws of ``(W, Psi, mu)`` and the sampler's statistics.

    Arrays have leading dimensions ``(chain, draw)``.

    Attributes
    ----------
    loadings : ndarray (chain, draw, d, k)
        Identified ``W`` (see ``identification``).
    noise : ndarray (chain, draw, d)
        Noise variances (pPCA: ``sigma^2`` repeated).
    mean : ndarray (chain, draw, d)
    sample_stats : dict of ndarray (chain, draw)
        ``diverging``, ``n_steps`` (leapfrog steps), ``tree_depth``, ``lp``
        (log posterior density, unnormalised, in the sampler's coordinates),
        ``acceptance_rate``.
    reference : LowRankGaussian
        The maximum-likelihood fit the chains started from (and draws are
        aligned to).
    identification : str
    noise_kind : str
    precision : ndarray (chain, draw, k) or None
        ARD precisions of the columns of ``W`` (``prior="ard"`` only).
    shrinkage : ndarray (chain, draw, d, k) or None
        Horseshoe shrinkage factors ``kappa_jl`` of the loadings
        (``priors="horseshoe"`` only; see :class:`bayespca.models.Horseshoe`).
    """

    loadings: np.ndarray
    noise: np.ndarray
    mean: np.ndarray
    sample_stats: dict
    reference: LowRankGaussian
    identification: str
    noise_kind: str
    precision: np.ndarray | None = None
    shrinkage: np.ndarray | None = None

    def gaussians(self) -> LowRankGaussian:
        """All draws as one LowRankGaussian with flattened leading dim (chain * draw)."""
        d, k = self.loadings.shape[-2:]
        return LowRankGaussian(
            self.loadings.reshape(-1, d, k), self.noise.reshape(-1, d), self.mean.reshape(-1, d)
        )


def _check_int(value, name, low):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {value!r}.")
    return int(value)


def _key(random_state) -> jax.Array:
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        return jax.random.key(int(random_state))
    if random_state is None or isinstance(random_state, np.random.Generator):
        return jax.random.key(int(np.random.default_rng(random_state).integers(2**63)))
    raise TypeError(f"random_state must be None, an int or a numpy.random.Generator; got {random_state!r}.")


def _ml_fit(X: np.ndarray, k: int, noise: str, missing: bool) -> LowRankGaussian:
    from bayespca.inference.contract import ModelSpec
    from bayespca.statistics import prepare

    spec = ModelSpec(noise, k)
    if noise == "isotropic" and not missing:
        from bayespca.inference.closed_form import ppca_closed_form

        return ppca_closed_form(prepare(X), spec).gaussian
    from bayespca.inference.em import fit_em

    return fit_em(prepare(X), spec).gaussian


def _lower_triangular(w: np.ndarray) -> np.ndarray:
    """``W Q`` lower triangular with positive diagonal (same ``W W^T``), from the QR of ``W^T``."""
    q, r = np.linalg.qr(w.T)
    lt = r.T
    signs = np.where(np.diag(lt) < 0, -1.0, 1.0)
    return lt * signs


# Width of the radial part of the polar expansion (see _tube_log_density).
_TUBE_WIDTH = 0.2


def _tube_log_density(z: jax.Array) -> jax.Array:
    """Log-density of the expanded matrix ``Z`` of the polar identification, up to a constant.

    ``Z = U R`` (``R`` upper triangular). Any density of the form
    ``g(Z^T Z)`` is invariant under ``Z -> Q Z`` (``Q`` orthogonal), so ``U``
    is uniform on the Stiefel manifold and independent of ``R``; ``g`` only
    sets how the redundant, data-free ``R`` moves. ``Z ~ N(0, I)`` lets
    ``R_jj`` come near 0 when ``d`` is small, where the scale of ``U`` in
    ``Z`` coordinates shrinks with it (a funnel: divergences at d=6, k=2).
    ``g(G) = exp(-|G - I|_F^2 / (8 tau^2))`` keeps ``Z`` in a thin shell,
    ``R`` within a few ``tau`` of ``c I`` (``c`` grows slowly with ``d``).
    """
    gram_dev = z.T @ z - jnp.eye(z.shape[1])
    return -jnp.sum(gram_dev**2) / (8 * _TUBE_WIDTH**2)


class _Parameterisation:
    """Map between the sampler's unconstrained vector and ``(W, noise, mu)``."""

    def __init__(self, d, k, noise, identification, xbar, mean_factor, svd_volume=True):
        self.d, self.k, self.noise, self.identification = d, k, noise, identification
        self.svd_volume = svd_volume
        self.xbar, self.mean_factor = jnp.asarray(xbar), jnp.asarray(mean_factor)
        self.tril = np.tril_indices(d, -1, k)

    def constrain(self, theta):
        """``(W, noise variances, mu, log|Jacobian|, extra prior)`` from unconstrained ``theta``."""
        log_jac, extra = 0.0, 0.0
        if self.identification == "polar":
            z = theta["Z"]
            chol = jnp.linalg.cholesky(z.T @ z)
            u = solve_triangular(chol, z.T, lower=True).T  # Z L^{-T}, orthonormal columns
            # Decreasing positive scales as a reversed cumulative sum of exponentials.
            scales = jnp.cumsum(jnp.exp(theta["log_gaps"])[::-1])[::-1]
            log_jac += jnp.sum(theta["log_gaps"])
            extra += _tube_log_density(z)
            if self.svd_volume:
                # Volume of W = U diag(l) V^T (SVD): prod_j l_j^(d-k) prod_{i<j} (l_i^2 - l_j^2).
                i, j = np.triu_indices(self.k, 1)
                log_jac += (self.d - self.k) * jnp.sum(jnp.log(scales))
                log_jac += jnp.sum(jnp.log(scales[i] - scales[j]) + jnp.log(scales[i] + scales[j]))
            w = u * scales
        elif self.identification == "lower_triangular":
            diag = jnp.exp(theta["log_diag"])
            log_jac += jnp.sum(theta["log_diag"])
            w = jnp.zeros((self.d, self.k)).at[self.tril].set(theta["lower"])
            w = w.at[jnp.arange(self.k), jnp.arange(self.k)].set(diag)
        else:
            w = theta["W"]
        if self.noise == "isotropic":
            sigma = jnp.exp(theta["log_noise"])
            noise_param, psi = sigma, jnp.full(self.d, sigma**2)
        else:
            psi = jnp.exp(theta["log_noise"])
            noise_param = psi
        log_jac += jnp.sum(theta["log_noise"])
        mu = self.xbar + self.mean_factor @ theta["eta"]
        return w, psi, mu, noise_param, log_jac, extra

    def unconstrain(self, w, psi, mu):
        """Inverse of :meth:`constrain` at a point (NumPy)."""
        theta = {}
        if self.identification == "polar":
            scales = np.linalg.norm(w, axis=0)
            order = np.argsort(-scales)
            scales, u = scales[order], (w / np.where(scales > 0, scales, 1.0))[:, order]
            gaps = -np.diff(np.append(scales, 0.0))  # l_j - l_{j+1}, with l_{k+1} = 0
            theta["Z"] = u
            theta["log_gaps"] = np.log(np.maximum(gaps, 1e-3 * max(scales[0], 1e-12)))
        elif self.identification == "lower_triangular":
            lt = _lower_triangular(w)
            theta["lower"] = lt[self.tril]
            theta["log_diag"] = np.log(np.maximum(np.diag(lt), 1e-6))
        else:
            theta["W"] = np.asarray(w)
        theta["log_noise"] = np.log(np.sqrt(psi[0])) if self.noise == "isotropic" else np.log(np.asarray(psi))
        theta["eta"] = np.linalg.solve(np.asarray(self.mean_factor), np.asarray(mu) - self.xbar)
        return theta


# A loading is sampled centred when its start is this many standard errors
# sqrt(psi_j / n) from 0 (see _horseshoe_constrain).
_CENTRED_AT = 4.0


def _log_half_cauchy_of_log(x):
    """Log-density of ``log u`` for ``u ~ C+(0, 1)``: ``log(2 / pi) - log(1 + u^2) + log u``."""
    return jnp.log(2.0 / jnp.pi) - jnp.logaddexp(0.0, 2.0 * x) + x


def _horseshoe_constrain(par, prior: Horseshoe, n: int, centred, standard_error, theta):
    """:meth:`_Parameterisation.constrain` (identification "none") with the horseshoe's ``W``.

    ``theta`` holds ``W_raw`` (d, k), ``W_log_lambda`` (d, k), ``W_log_tau``
    and ``W_log_c2`` (the logs of the unit-free local, global and slab
    variables of :func:`bayespca.models.horseshoe_loadings`) instead of
    ``W``. Where ``centred`` (d, k) is False, ``W_raw`` is ``z`` and
    ``W = tau lambda~ z`` (non-centred: no funnel for the loadings the data
    barely inform, the zeros); where it is True, ``W_raw`` is ``W`` in units
    of its maximum-likelihood standard error ``sqrt(psi_j / n)`` (d, 1),
    with density ``N(W; 0, tau^2 lambda~^2)`` (centred: for loadings the
    data pin down, ``W = tau lambda~ z`` would tie ``z`` to the scales
    along a narrow curved ridge, which costs NUTS hundreds of steps per
    draw). Either way the posterior of ``W`` is the same. Returns
    ``(W, psi, mu, noise_param, log_jac, extra, kappa)``, with the
    horseshoe's log prior density in ``theta`` (Jacobians of the logs
    included) added to ``extra``.
    """
    _, psi, mu, noise_param, log_jac, extra = par.constrain(
        {**theta, "W": jnp.zeros((par.d, par.k))}
    )
    raw, log_local = theta["W_raw"], theta["W_log_lambda"]
    log_global, log_slab = theta["W_log_tau"], theta["W_log_c2"]
    w_unit, kappa = horseshoe_loadings(
        jnp.ones_like(raw), jnp.exp(log_local), jnp.exp(log_global), jnp.exp(log_slab), psi, prior, n
    )  # w_unit = tau lambda~, the prior sd of each loading
    w = jnp.where(centred, standard_error * raw, w_unit * raw)
    # The constant Jacobian standard_error of the centred entries is left out.
    log_raw = -0.5 * jnp.where(centred, (w / w_unit) ** 2 + 2.0 * jnp.log(w_unit), raw**2)
    half = 0.5 * prior.slab_df
    # c^2 / s^2 ~ InvGamma(nu/2, nu/2), on its log (Jacobian c^2 / s^2).
    log_slab_density = -half * log_slab - half * jnp.exp(-log_slab)
    extra = extra + (
        jnp.sum(log_raw)
        + jnp.sum(_log_half_cauchy_of_log(log_local))
        + _log_half_cauchy_of_log(log_global)
        + log_slab_density
    )
    return w, psi, mu, noise_param, log_jac, extra, kappa


def _align_signed_permutations(
    w: np.ndarray, kappa: np.ndarray, reference: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Permute and flip the columns of each draw ``w`` (m, d, k) to match ``reference`` (d, k).

    Column ``l`` of a draw goes to the reference column it has the largest
    absolute inner product with (an assignment problem, solved exactly),
    with the sign of that product; ``kappa`` follows the permutation.
    """
    from scipy.optimize import linear_sum_assignment

    cross = np.einsum("mdk,dl->mkl", w, reference)
    out_w, out_kappa = np.empty_like(w), np.empty_like(kappa)
    for i in range(w.shape[0]):
        rows, cols = linear_sum_assignment(-np.abs(cross[i]))
        signs = np.where(cross[i, rows, cols] < 0, -1.0, 1.0)
        out_w[i][:, cols] = w[i][:, rows] * signs
        out_kappa[i][:, cols] = kappa[i][:, rows]
    return out_w, out_kappa


def _identify_horseshoe(w, kappa, start):
    """Signed-permutation alignment of horseshoe draws, in a canonical order and sign.

    Aligned to the start (varimax) loadings, then twice to the mean of the
    aligned draws; then :func:`bayespca.models._canonical_columns`.
    """
    reference = start
    for _ in range(3):
        w, kappa = _align_signed_permutations(w, kappa, reference)
        reference = w.mean(axis=0)
    return _canonical_columns(w, kappa)


def fit_nuts(
    X: Any,
    n_components: int,
    *,
    noise: str = "isotropic",
    identification: str | None = None,
    priors: Any = None,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    chain_method: str = "sequential",
    target_accept_prob: float = 0.9,
    dense_mass: bool = False,
    max_patterns: int = 64,
    random_state: Any = None,
    progress_bar: bool = False,
) -> NUTSFit:
    """Sample the posterior of pPCA or factor analysis by NUTS on the marginal model.

    Parameters
    ----------
    X : array-like of shape (n, d)
        NaN marks a missing entry (missing at random).
    n_components : int
    noise : {"isotropic", "diagonal"}, default="isotropic"
        pPCA or FA.
    identification : {"polar", "lower_triangular", "procrustes", "none"} or None
        See the module docstring; None: ``"polar"`` for pPCA,
        ``"lower_triangular"`` for FA.
    priors : None, "flat", "ard", "horseshoe", Priors or dict
        As in :func:`bayespca.models.ppca` (defaults:
        :func:`bayespca.models.default_priors`, scale-aware). ``"ard"``:
        Bishop's Bayesian PCA, column ``l`` of ``W`` is ``N(0, I / alpha_l)``
        with ``alpha_l s^2 ~ Gamma(1, 1e-2)`` (``s^2`` the mean column
        variance), so unused columns shrink to zero; other priors default.
        ``"horseshoe"`` or ``Priors(loadings=Horseshoe(...))``: the
        regularised horseshoe on the entries of ``W`` (sparse loadings;
        ``identification`` must be None or ``"none"``, see the module
        docstring); the draws of ``kappa`` go to ``NUTSFit.shrinkage``.
    num_warmup, num_samples, num_chains : int
    chain_method : {"sequential", "parallel", "vectorized"}, default="sequential"
    target_accept_prob : float, default=0.9
    dense_mass : bool, default=False
        Adapt a dense mass matrix. The Laplace whitening already removes the
        posterior correlations of the loadings, noise and mean, so a diagonal
        mass suffices (measured at n=1000, d=20, k=3: 15 leapfrog steps per
        draw either way, but a dense warm-up takes ~170,000 leapfrog steps
        against ~7,700, its first windows estimating an 84 x 84 covariance
        from 25 draws; with the horseshoe, 1000 steps per draw against 80).
    max_patterns : int, default=64
        See :func:`missing_patterns`.
    random_state : int, numpy Generator or None
    progress_bar : bool, default=False

    Returns
    -------
    NUTSFit

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((200, 1)) @ [[2.0, 1.0, -1.0]] + rng.standard_normal((200, 3))
    >>> fit = fit_nuts(X, 1, num_warmup=100, num_samples=100, num_chains=1, random_state=0)
    >>> fit.loadings.shape, bool(0.6 < fit.noise.mean() < 1.4)
    ((1, 100, 3, 1), True)
    >>> dict(to_datatree(fit, X)["log_likelihood"]["X"].sizes)
    {'chain': 1, 'draw': 100, 'obs': 200}
    """
    if noise not in _DEFAULT_IDENTIFICATION:
        raise ValueError(f"noise must be 'isotropic' or 'diagonal'; got {noise!r}.")
    requested_identification = identification
    if identification is None:
        identification = _DEFAULT_IDENTIFICATION[noise]
    if identification not in IDENTIFICATIONS:
        raise ValueError(f"identification must be one of {IDENTIFICATIONS}; got {identification!r}.")
    if chain_method not in _CHAIN_METHODS:
        raise ValueError(f"chain_method must be one of {_CHAIN_METHODS}; got {chain_method!r}.")
    num_warmup = _check_int(num_warmup, "num_warmup", 1)
    num_samples = _check_int(num_samples, "num_samples", 1)
    num_chains = _check_int(num_chains, "num_chains", 1)
    if not isinstance(dense_mass, bool | np.bool_):
        raise ValueError(f"dense_mass must be True or False; got {dense_mass!r}.")
    dense_mass = bool(dense_mass)
    if not (isinstance(target_accept_prob, numbers.Real) and 0 < target_accept_prob < 1):
        raise ValueError(f"target_accept_prob must be a float in (0, 1); got {target_accept_prob!r}.")
    arr = as_float_matrix(X, name="X", allow_nan=True)
    n, d = arr.shape
    k = _check_int(n_components, "n_components", 1)
    if k > d:
        raise ValueError(f"n_components must be at most n_features={d}; got {k}.")
    missing = bool(np.isnan(arr).any())
    ard = isinstance(priors, str) and priors == "ard"
    patterns = missing_patterns(arr, max_patterns)
    if missing:
        prior_set = resolve_priors(None if ard else priors, noise=noise, X=arr, suff_stats=None, d=d)
    else:
        stats = patterns.stats[0]
        prior_set = resolve_priors(None if ard else priors, noise=noise, X=None, suff_stats=stats, d=d)
    horseshoe = prior_set.loadings if isinstance(prior_set.loadings, Horseshoe) else None
    if horseshoe is not None:
        if requested_identification not in (None, "none"):
            raise ValueError(
                "identification must be None or 'none' with the horseshoe prior (W is sampled "
                "in its own coordinates, draws aligned by signed permutations); got "
                f"{requested_identification!r}."
            )
        identification = "none"
    else:
        w_prior = _as_site_distribution(prior_set.loadings, (d, k), "loadings")
    noise_prior = _as_site_distribution(prior_set.noise, () if noise == "isotropic" else (d,), "noise")
    mean_prior = _as_site_distribution(prior_set.mean, (d,), "mean")
    col_var = np.nanvar(arr, axis=0)
    overall_var = float(np.mean(col_var)) if np.mean(col_var) > 0 else 1.0

    ref = _ml_fit(arr, k, noise, missing)
    xbar = np.nanmean(arr, axis=0)
    cov = np.asarray(ref.loadings) @ np.asarray(ref.loadings).T + np.diag(np.asarray(ref.noise))
    mean_factor = np.linalg.cholesky(cov) / np.sqrt(n)
    par = _Parameterisation(d, k, noise, identification, xbar, mean_factor, svd_volume=not ard)
    reference_w = np.asarray(ref.loadings)
    if identification == "lower_triangular":
        reference_w = _lower_triangular(reference_w)
    data = {
        "patterns": patterns,
        "xbar": jnp.asarray(xbar),
        "mean_factor": jnp.asarray(mean_factor),
        "priors": (None if ard or horseshoe is not None else w_prior, noise_prior, mean_prior),
        "overall_var": jnp.asarray(overall_var),
        "horseshoe": None,
    }
    if horseshoe is not None:
        from bayespca.rotations import rotate

        # Start near a sparse mode: varimax is the orthogonal rotation of simple structure.
        reference_w = np.asarray(rotate(reference_w, "varimax").loadings)

        standard_error = np.sqrt(np.asarray(ref.noise) / n)[:, None]
        centred = np.abs(reference_w) > _CENTRED_AT * standard_error
        data["horseshoe"] = (
            Horseshoe(*(jnp.asarray(float(v)) for v in horseshoe)),
            jnp.asarray(float(n)),
            jnp.asarray(centred),
            jnp.asarray(standard_error),
        )

    reference = LowRankGaussian(reference_w, np.asarray(ref.noise), np.asarray(ref.mean))

    start = par.unconstrain(reference_w, np.asarray(ref.noise), np.asarray(ref.mean))
    if ard:
        start["log_alpha"] = -np.log(np.mean(reference_w**2, axis=0) + 1e-3 * overall_var)
    init_scale = 1.0
    if horseshoe is not None:
        del start["W"]
        values = _horseshoe_start(reference_w, np.asarray(ref.noise), horseshoe, n)
        start["W_raw"] = np.where(centred, reference_w / standard_error, values["z"])
        start["W_log_lambda"] = np.log(values["local"])
        start["W_log_tau"] = np.log(values["global_"])
        start["W_log_c2"] = np.log(values["slab"])
    start = {name: np.asarray(v, dtype=float) for name, v in sorted(start.items())}
    layout = tuple((name, v.shape) for name, v in start.items())
    static = _Static(d, k, noise, identification, ard, horseshoe is not None, layout)
    centre = ravel_pytree({name: jnp.asarray(v) for name, v in start.items()})[0]
    if horseshoe is not None:
        # Its coordinates are unit-free already (loadings in standard errors, log scales), and
        # a Laplace fit to the scales' heavy tails misleads; start a few tenths of a unit away.
        factor = jnp.ones(centre.size)
        init_scale = 0.1 * min(1.0, 10.0 / np.sqrt(n))
    elif centre.size <= _MAX_LAPLACE_SIZE:
        factor = _laplace_factor(np.asarray(_hessian(static, data, centre)))
    else:
        factor = _rough_scales(start, n, d)
    data["centre"], data["factor"] = centre, factor

    key = _key(random_state)
    key_init, key_run = jax.random.split(key)
    # Draws from the Laplace approximation (or a few rough posterior sds) around the ML fit.
    init = init_scale * jax.random.normal(key_init, (num_chains, centre.size))
    settings = (num_warmup, num_samples, dense_mass, float(target_accept_prob))
    xi, extra = _run_chains(static, settings, data, init, key_run, chain_method, progress_bar)

    w, psi, mu, log_alpha, kappa = _constrained_draws(static, data, xi.reshape(-1, centre.size))
    w, psi, mu, log_alpha = np.asarray(w), np.asarray(psi), np.asarray(mu), np.asarray(log_alpha)
    shrinkage = None
    if horseshoe is not None:
        w, kappa = _identify_horseshoe(w, np.asarray(kappa), reference_w)
        shrinkage = kappa.reshape(num_chains, num_samples, d, k)
        identification = "signed_permutation"
    else:
        w = _identify(w, reference_w, identification)
    shape = (num_chains, num_samples)
    n_steps = np.asarray(extra["num_steps"]).astype(int)
    sample_stats = {
        "diverging": np.asarray(extra["diverging"]).astype(bool),
        "n_steps": n_steps,
        "tree_depth": np.ceil(np.log2(n_steps + 1)).astype(int),
        "lp": -np.asarray(extra["potential_energy"]),
        "acceptance_rate": np.asarray(extra["accept_prob"]),
    }
    precision = np.exp(log_alpha).reshape(*shape, k) if ard else None
    return NUTSFit(
        w.reshape(*shape, d, k),
        psi.reshape(*shape, d),
        mu.reshape(*shape, d),
        sample_stats,
        reference,
        identification,
        noise,
        precision,
        shrinkage,
    )


# Above this many sampled parameters the Hessian (p x p) is not formed.
_MAX_LAPLACE_SIZE = 2000


@dataclass(frozen=True)
class _Static:
    """What fixes the code and shapes of the sampler's potential (the key of jit's cache).

    Everything else (statistics, priors' parameters, start, preconditioner)
    travels in the ``data`` pytree, so fits of new data with the same
    configuration reuse the compiled sampler. ``layout`` lists the
    ``(name, shape)`` of the unconstrained parameters in ravel order.
    """

    d: int
    k: int
    noise: str
    identification: str
    ard: bool
    horseshoe: bool
    layout: tuple


def _unravel(static: _Static):
    return ravel_pytree({name: jnp.zeros(shape) for name, shape in static.layout})[1]


def _constrain(static: _Static, data: dict, theta: dict):
    """``(W, psi, mu, noise_param, log|Jacobian|, extra prior, kappa)`` from ``theta``."""
    d, k, noise, identification = static.d, static.k, static.noise, static.identification
    par = _Parameterisation(d, k, noise, identification, data["xbar"], data["mean_factor"], not static.ard)
    if static.horseshoe:
        return _horseshoe_constrain(par, *data["horseshoe"], theta)
    return (*par.constrain(theta), None)


def _potential(static: _Static, data: dict, theta: dict) -> jax.Array:
    """Negative log posterior density of the unconstrained ``theta`` (Jacobians included)."""
    w, psi, mu, noise_param, log_jac, extra, _ = _constrain(static, data, theta)
    w_prior, noise_prior, mean_prior = data["priors"]
    if static.horseshoe:
        log_prior = 0.0  # in extra
    elif static.ard:
        alpha = jnp.exp(theta["log_alpha"])
        log_prior = jnp.sum(0.5 * static.d * theta["log_alpha"] - 0.5 * alpha * jnp.sum(w**2, axis=0))
        # alpha s^2 ~ Gamma(1, 1e-2), on log alpha (Jacobian alpha).
        log_prior += jnp.sum(theta["log_alpha"] - 1e-2 * alpha * data["overall_var"])
    else:
        log_prior = w_prior.log_prob(w)
    log_prior += noise_prior.log_prob(noise_param) + mean_prior.log_prob(mu)
    ll = marginal_log_likelihood(LowRankGaussian(w, psi, mu), data["patterns"])
    return -(ll + log_prior + log_jac + extra)


def _theta_of(static: _Static, data: dict, xi: jax.Array) -> dict:
    """``theta = centre + S xi`` (``S`` the Laplace factor, or a vector of scales)."""
    factor = data["factor"]
    step = factor @ xi if factor.ndim == 2 else factor * xi
    return _unravel(static)(data["centre"] + step)


@functools.partial(jax.jit, static_argnums=0)
def _hessian(static: _Static, data: dict, centre: jax.Array) -> jax.Array:
    unravel = _unravel(static)
    return jax.hessian(lambda v: _potential(static, data, unravel(v)))(centre)


def _laplace_factor(hessian: np.ndarray) -> jax.Array:
    """``S`` with ``S S^T`` the inverse of ``hessian`` (eigenvalues floored).

    ``hessian`` is that of the negative log posterior at the ML start
    ``centre``. The sampler runs on ``xi`` with ``theta = centre + S xi``:
    the Laplace approximation at the ML start is then ``N(0, I)`` whatever
    ``n``, so the step size, the mass adaptation and the start jitter see
    the same geometry at n=10^3 and 10^6.
    """
    vals, vecs = np.linalg.eigh(0.5 * (hessian + hessian.T))
    # Flat or curved-down directions (the start is the ML point, not the MAP) get an sd of at most 3.
    floor = max(1e-8 * vals.max(), 0.1)
    return jnp.asarray(vecs / np.sqrt(np.maximum(vals, floor)))


def _sampler_potential(static: _Static, data: dict):
    return lambda xi: _potential(static, data, _theta_of(static, data, xi))


_EXTRA_FIELDS = ("diverging", "num_steps", "potential_energy", "accept_prob")


def _chain(static: _Static, settings: tuple, data: dict, init: jax.Array, key: jax.Array):
    """One NUTS chain (warm-up, then ``num_samples`` draws of ``xi`` and their statistics).

    NumPyro's functional NUTS with the data as model arguments: traced under
    a module-level jit, it compiles once per ``(static, settings)`` and data
    shapes.
    """
    num_warmup, num_samples, dense_mass, target_accept_prob = settings
    init_kernel, sample_kernel = hmc(potential_fn_gen=functools.partial(_sampler_potential, static))
    key = jax.random.split(key)[0]  # as numpyro's NUTS.init does: the same draws as MCMC
    state = init_kernel(
        init,
        num_warmup,
        dense_mass=dense_mass,
        target_accept_prob=target_accept_prob,
        trajectory_length=None,  # NUTS: the tree sets the path length
        model_args=(data,),
        rng_key=key,
    )

    def step(state):
        return sample_kernel(state, model_args=(data,))

    state = jax.lax.fori_loop(0, num_warmup, lambda _, s: step(s), state)

    def draw(state, _):
        state = step(state)
        return state, (state.z, *(getattr(state, f) for f in _EXTRA_FIELDS))

    return jax.lax.scan(draw, state, length=num_samples)[1]


_chain_jit = jax.jit(_chain, static_argnums=(0, 1))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _chains_vectorized(static, settings, data, init, keys):
    return jax.vmap(lambda x, key: _chain(static, settings, data, x, key))(init, keys)


_chains_parallel = jax.pmap(_chain, in_axes=(None, None, None, 0, 0), static_broadcasted_argnums=(0, 1))


def _run_chains(static, settings, data, init, key, chain_method, progress_bar):
    """Draws of ``xi`` (chain, draw, p) and the sampler's statistics (chain, draw) by field."""
    num_chains = init.shape[0]
    if progress_bar:
        # NumPyro's progress bar needs its MCMC driver, which compiles per call.
        num_warmup, num_samples, dense_mass, target_accept_prob = settings
        kernel = NUTS(
            potential_fn=_sampler_potential(static, data),
            target_accept_prob=target_accept_prob,
            dense_mass=dense_mass,
        )
        mcmc = MCMC(
            kernel,
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            chain_method=chain_method,
            progress_bar=True,
        )
        mcmc.run(key, init_params=init[0] if num_chains == 1 else init, extra_fields=_EXTRA_FIELDS)
        extra = mcmc.get_extra_fields(group_by_chain=True)
        return mcmc.get_samples(group_by_chain=True), {f: extra[f] for f in _EXTRA_FIELDS}
    keys = jax.random.split(key, num_chains) if num_chains > 1 else key[None]
    if chain_method == "parallel" and num_chains > jax.local_device_count():
        warnings.warn(
            f"There are not enough devices to run parallel chains: expected {num_chains} but got "
            f"{jax.local_device_count()}. Chains will be drawn sequentially.",
            UserWarning,
            stacklevel=3,
        )
        chain_method = "sequential"
    if chain_method == "vectorized":
        out = _chains_vectorized(static, settings, data, init, keys)
    elif chain_method == "parallel":
        out = _chains_parallel(static, settings, data, init, keys)
    else:
        runs = [_chain_jit(static, settings, data, init[c], keys[c]) for c in range(num_chains)]
        out = jax.tree.map(lambda *a: jnp.stack(a), *runs)
    return out[0], dict(zip(_EXTRA_FIELDS, out[1:], strict=True))


@functools.partial(jax.jit, static_argnums=0)
def _constrained_draws(static: _Static, data: dict, xi: jax.Array):
    """``(W, psi, mu, log_alpha, kappa)`` of each row of ``xi`` (m, p)."""

    def one(x):
        theta = _theta_of(static, data, x)
        w, psi, mu, *_, kappa = _constrain(static, data, theta)
        return w, psi, mu, theta.get("log_alpha", jnp.zeros(0)), kappa

    return jax.vmap(one)(xi)


def _rough_scales(start, n, d) -> jax.Array:
    """Rough posterior sds, used instead of the Laplace factor for large models."""
    size = 0.1 * min(1.0, 10.0 / np.sqrt(n))
    scales = {}
    for name, value in start.items():
        value = np.asarray(value, dtype=float)
        if name == "Z":
            s = size / np.sqrt(d)
        elif name in ("W", "lower"):
            s = size * np.sqrt(np.mean(value**2))
        else:
            s = size
        scales[name] = jnp.full(value.shape, s)
    return ravel_pytree(scales)[0]


def _identify(w: np.ndarray, reference: np.ndarray, identification: str) -> np.ndarray:
    """Post-hoc alignment of draws ``w`` (m, d, k) to the reference loadings."""
    if identification == "procrustes":
        from bayespca.rotations import procrustes

        return procrustes(w, reference)[0]
    if identification == "polar":
        # Columns are ordered by scale; only their signs are free.
        signs = np.where(np.einsum("mdk,dk->mk", w, reference) < 0, -1.0, 1.0)
        return w * signs[:, None, :]
    return w


def pointwise_log_likelihood(fit: NUTSFit, X: np.ndarray) -> np.ndarray:
    """Marginal ``log p(x_i | W, Psi, mu)`` per draw and row, shape (chain, draw, n).

    Rows with missing entries (NaN) get the density of their observed block
    (:func:`bayespca.gaussian.log_prob`).
    """
    arr = np.asarray(X, dtype=float)
    observed = ~np.isnan(arr)
    values, masked = np.where(observed, arr, 0.0), bool((~observed).any())

    def one(g):
        return log_prob(LowRankGaussian(*g), values, observed if masked else None)

    out = jax.lax.map(one, tuple(fit.gaussians()))
    return np.asarray(out).reshape(*fit.loadings.shape[:2], arr.shape[0])


def posterior_variables(fit: NUTSFit) -> dict:
    """Named posterior variables: ``W``, the noise, ``mu`` and the rotation-invariant ones.

    ``eigenvalues`` are those of ``W W^T`` (decreasing, the variance each
    component adds); ``sigma2`` (pPCA) or ``psi`` (FA) the noise variances;
    ``alpha`` the ARD precisions when present; ``inclusion`` (``1 - kappa``,
    the horseshoe's inclusion-like weight of each loading) when present.
    """
    out = {"W": fit.loadings, "mu": fit.mean}
    if fit.noise_kind == "isotropic":
        out["sigma2"] = fit.noise[..., 0]
    else:
        out["psi"] = fit.noise
    out["eigenvalues"] = np.linalg.svd(fit.loadings, compute_uv=False) ** 2
    if fit.precision is not None:
        out["alpha"] = fit.precision
    if fit.shrinkage is not None:
        out["inclusion"] = 1.0 - fit.shrinkage
    return out


def to_datatree(
    fit: NUTSFit,
    X: np.ndarray,
    *,
    feature_names: Any = None,
    log_likelihood: bool = True,
    posterior_predictive: bool = False,
    random_state: Any = None,
):
    """The posterior as an ArviZ DataTree.

    Groups: ``posterior`` (dims ``chain``, ``draw``, ``feature``,
    ``component``; variables of :func:`posterior_variables` plus
    ``log_lik``, the total log-likelihood of the data per draw),
    ``sample_stats`` (``diverging``, ``n_steps``, ``tree_depth``, ``lp``,
    ``acceptance_rate``), ``log_likelihood`` (``X``: the marginal
    ``log p(x_i | W, Psi, mu)``, dims (chain, draw, obs), one value per
    row), ``observed_data`` (``X``, NaN kept) and, on request,
    ``posterior_predictive`` (``X``: one replicated data set per draw).

    See the example of :func:`fit_nuts`.
    """
    from arviz_base import from_dict

    arr = np.asarray(X, dtype=float)
    n, d = arr.shape
    k = fit.loadings.shape[-1]
    coords = {
        "feature": list(feature_names) if feature_names is not None else list(range(d)),
        "component": list(range(k)),
        "obs": list(range(n)),
    }
    dims = {
        "W": ["feature", "component"],
        "mu": ["feature"],
        "psi": ["feature"],
        "eigenvalues": ["component"],
        "alpha": ["component"],
        "inclusion": ["feature", "component"],
    }
    groups = {"posterior": posterior_variables(fit), "sample_stats": dict(fit.sample_stats)}
    if log_likelihood:
        pointwise = pointwise_log_likelihood(fit, arr)
        groups["log_likelihood"] = {"X": pointwise}
        groups["posterior"]["log_lik"] = pointwise.sum(-1)
    else:
        groups["posterior"]["log_lik"] = np.asarray(
            jax.lax.map(
                lambda g: marginal_log_likelihood(LowRankGaussian(*g), missing_patterns(arr)),
                tuple(fit.gaussians()),
            )
        ).reshape(fit.loadings.shape[:2])
    groups["observed_data"] = {"X": arr}
    if posterior_predictive:
        from bayespca.gaussian import sample

        gs = fit.gaussians()
        keys = jax.random.split(_key(random_state), gs.loadings.shape[0])
        reps = jax.lax.map(lambda a: sample(LowRankGaussian(*a[0]), a[1], n), (tuple(gs), keys))
        groups["posterior_predictive"] = {"X": np.asarray(reps).reshape(*fit.loadings.shape[:2], n, d)}
    # "X" is (obs, feature) in observed_data and posterior_predictive; from_dict
    # drops the trailing "feature" for the log_likelihood group (one value per row).
    dims["X"] = ["obs", "feature"]
    return from_dict(groups, coords=coords, dims=dims)


class SamplingWarning(UserWarning):
    """NUTS diagnostics flag a problem (divergences, R-hat, effective sample size)."""


def diagnose(fit: NUTSFit, log_lik: np.ndarray | None = None, *, min_ess_per_chain: int = 100) -> list:
    """Warn (:class:`SamplingWarning`) about divergences, R-hat > 1.01 or low ESS.

    R-hat and bulk/tail ESS are checked on the rotation-invariant quantities
    only (noise variances, eigenvalues of ``W W^T``, total log-likelihood when
    given), which are meaningful whatever the identification. Returns the
    messages.
    """
    import warnings

    import arviz as az

    messages = []
    n_div = int(fit.sample_stats["diverging"].sum())
    if n_div:
        messages.append(
            f"{n_div} divergent transitions after warm-up: the posterior has regions the step "
            "size cannot resolve. Increase target_accept_prob (e.g. 0.95 or 0.99), or use "
            "stronger priors (prior=...)."
        )
    # The horseshoe's inclusion weights follow W's labelling: not invariant either.
    skip = ("W", "mu", "inclusion")
    quantities = {k: v for k, v in posterior_variables(fit).items() if k not in skip}
    if log_lik is not None:
        quantities["log_lik"] = log_lik
    chains = fit.loadings.shape[0]
    worst_rhat, worst_ess = (None, 1.0), (None, np.inf)
    for name, value in quantities.items():
        series = value.reshape(*value.shape[:2], -1)
        for j in range(series.shape[-1]):
            s = series[..., j]
            if np.ptp(s) == 0:
                continue
            rhat = float(az.rhat(s)) if chains > 1 or s.shape[1] >= 4 else 1.0
            rhat = rhat if np.isfinite(rhat) else np.inf  # a stuck chain
            ess = min(float(az.ess(s, method="bulk")), float(az.ess(s, method="tail", prob=0.9)))
            label = name if series.shape[-1] == 1 else f"{name}[{j}]"
            if rhat > worst_rhat[1]:
                worst_rhat = (label, rhat)
            if ess < worst_ess[1]:
                worst_ess = (label, ess)
    if worst_rhat[1] > 1.01:
        messages.append(
            f"R-hat of {worst_rhat[0]} is {worst_rhat[1]:.3f} > 1.01: the chains disagree. "
            "Increase num_warmup and num_samples, run more chains, or check for several modes "
            "(e.g. too many components: try fewer or prior='ard')."
        )
    if worst_ess[1] < min_ess_per_chain * chains:
        messages.append(
            f"Effective sample size of {worst_ess[0]} is {worst_ess[1]:.0f} < "
            f"{min_ess_per_chain * chains} ({min_ess_per_chain} per chain x {chains} chains): "
            "increase num_samples."
        )
    for message in messages:
        warnings.warn(message, SamplingWarning, stacklevel=3)
    return messages


def effective_components(fit: NUTSFit, n_samples: int) -> int:
    """Number of components whose variance stands out of the noise (for ``prior="ard"``).

    Component ``l`` is active when the posterior mean of its eigenvalue of
    ``W W^T`` exceeds ``mean(psi) (2 sqrt(g) + g)``, ``g = d / n``: the
    excess over the noise variance of the largest eigenvalue of a pure-noise
    sample covariance (the Marchenko-Pastur edge ``psi (1 + sqrt(g))^2``).
    ARD shrinks unused components far below it.
    """
    d = fit.loadings.shape[-2]
    eig = (np.linalg.svd(fit.loadings, compute_uv=False) ** 2).mean((0, 1))
    ratio = d / n_samples
    return int(np.sum(eig > fit.noise.mean() * (2 * np.sqrt(ratio) + ratio)))
