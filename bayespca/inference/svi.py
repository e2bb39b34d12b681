"""Stochastic variational inference for pPCA and factor analysis.

:func:`fit_svi` fits the *marginal* model of :mod:`bayespca.models`
(z integrated out) with NumPyro's SVI and one of three guides:

* ``"delta"`` (``AutoDelta``): a point, the MAP; with ``prior="flat"`` the
  maximum-likelihood estimate;
* ``"normal"`` (``AutoNormal``): an independent Normal per parameter, in
  the unconstrained space;
* ``"lowrank"`` (``AutoLowRankMultivariateNormal``): a Normal with
  low-rank-plus-diagonal covariance over all parameters.

Four choices make it converge in a few hundred cheap steps rather than
tens of thousands of costly ones:

1. *Standardised coordinates.* The optimiser works on
   ``(X - m) / s`` (``m`` the column means, ``s`` the root mean column
   variance; for factor analysis with loadings priors stated per feature,
   the default and flat ones, ``s_j`` each column's standard deviation),
   with the priors carried over exactly by the affine change of variables,
   so one learning rate suits every data set. Results are mapped back to
   data units. (FA is equivariant under rescaling each feature, but Adam's
   steps are not: with one ``s`` on raw breast cancer, whose feature
   variances span 1e-5 to 1e5, FA by SVI stopped at 5000 steps 54% below the
   maximum likelihood.)
2. *Data initialisation.* ``W`` starts at the top-k principal directions of
   the centred data (missing entries filled with column means), scaled as in
   the closed-form pPCA solution; the noise at the mean discarded eigenvalue
   (pPCA) or the unexplained variance per feature (FA); ``mu`` at the column
   means. For complete-data pPCA this *is* the maximum-likelihood point.
3. *Adam with an exponentially decaying step*, ``lr_t = lr * 1e-3^(t / num_steps)``:
   a constant Adam step never settles on a deterministic objective (it
   oscillates at the scale of the step), which is what stalls a naive SVI
   fit at a relative log-likelihood gap of 1e-5 to 1e-4.
4. *Sufficient statistics.* Complete data over all rows enter the
   likelihood only through ``(n, mean, scatter)``, and data with missing
   values in at most 64 patterns through each pattern's; such fits use the
   model's ``suff_stats`` form: O(d^2 k) per step and pattern, whatever n.
   Minibatches (and more patterns) use the per-row density.

Stochastic objectives (Normal guides, minibatches) are judged on longer
windows and summarised by their averaged iterates (Polyak-Ruppert), which
sit much closer to the optimum than the last one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import OrderedDict
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDelta, AutoLowRankMultivariateNormal, AutoNormal
from numpyro.infer.initialization import init_to_value

from bayespca import priors as prior_classes
from bayespca.cache import enable_compilation_cache, release_compiled_programs
from bayespca.chunked import in_memory, is_chunked, sample_rows
from bayespca.gaussian import LowRankGaussian, canonical_loadings, log_likelihood_from_stats, log_prob
from bayespca.inference.closed_form import check_rows_leave_noise
from bayespca.inference.contract import Draws, Fit, ModelSpec
from bayespca.inference.threads import serial_blas
from bayespca.linalg import centred_scatter
from bayespca.messages import progress
from bayespca.models import (
    MODELS,
    identification_for,
    lower_entries,
    lower_triangular,
    marginal_log_likelihood,
    pivot_anchors,
)
from bayespca.params import GUIDES, as_generator, as_key, check_choice, check_number, check_svi_options
from bayespca.statistics import (
    PATTERN_MULTIPLE,
    MissingPatterns,
    Prepared,
    SufficientStatistics,
    columns_divided,
    stack_patterns,
)

__all__ = ["SVIResult", "fit_svi", "map_by_svi"]

# Samplers and optimisers compile once per configuration; keep the programs between processes.
enable_compilation_cache()

_GUIDES = dict(zip(GUIDES, (AutoDelta, AutoNormal, AutoLowRankMultivariateNormal), strict=True))
_NOISE_SITE = {"isotropic": "sigma", "diagonal": "psi"}
# Final step size as a fraction of the first.
_LR_DECAY = 1e-3
# Steps per compiled chunk: the convergence test and progress bar run between chunks.
_CHUNK = 100
# Rows of each sample that the minibatches of a chunk of steps are drawn from, on Dask input
# (at least 20 minibatches' worth).
_SAMPLE_ROWS = 20_000
# Guide draws behind the horseshoe's point estimate and shrinkage summaries.
_HORSESHOE_DRAWS = 2000
# Chunks per convergence window for a stochastic objective (guide draws or
# minibatches): the drift over a window grows with its length faster than the
# Monte Carlo error of its mean, so longer windows make the test stricter.
_STOCHASTIC_WINDOW = 5
# Loadings priors stated per feature: FA with them is equivariant under rescaling each feature.
_PER_FEATURE = (type(None), prior_classes.Normal, prior_classes.Flat)


@dataclasses.dataclass(frozen=True)
class SVIResult:
    """What an SVI fit adds to its :class:`~bayespca.inference.contract.Fit` (``Fit.details``).

    Attributes
    ----------
    guide : numpyro AutoGuide
        The fitted guide (in standardised coordinates).
    params : dict
        The guide's parameters (standardised coordinates).
    noise : {"isotropic", "diagonal"}
    shift, scale : ndarray of shape (d,); float or ndarray of shape (d,)
        Standardisation: data = shift + scale * standardised (a scale per
        feature for FA with per-feature loadings priors).
    """

    guide: Any
    params: dict
    noise: str
    shift: np.ndarray
    scale: float | np.ndarray

    def sample_posterior(self, num_samples: int, random_state: Any = None) -> LowRankGaussian:
        """Draw ``(W, psi, mu)`` from the fitted guide, in data units.

        Parameters
        ----------
        num_samples : int
        random_state : None, int, Generator or RandomState

        Returns
        -------
        LowRankGaussian
            Arrays with a leading axis of length ``num_samples``:
            loadings (S, d, k), noise (S, d), mean (S, d). For the delta guide
            all draws equal the point estimate.
        """
        num_samples = check_number(num_samples, "num_samples", integer=True, low=1)
        draws = self.guide.sample_posterior(as_key(random_state), self.params, sample_shape=(num_samples,))
        return _to_data_units(draws, self.noise, self.shift, self.scale)


def _to_data_units(values: dict, noise: str, shift: np.ndarray, scale: Any) -> LowRankGaussian:
    """Map standardised ``W``, noise and ``mu`` (any leading batch axes) to data units."""
    W = np.asarray(values["W"], dtype=np.float64) * (scale if np.ndim(scale) == 0 else scale[:, None])
    mu = shift + scale * np.asarray(values["mu"], dtype=np.float64)
    if noise == "isotropic":
        sigma = np.asarray(values["sigma"], dtype=np.float64)
        psi = np.broadcast_to((scale * sigma)[..., None] ** 2, mu.shape).copy()
    else:
        psi = np.asarray(values["psi"], dtype=np.float64) * scale**2
    return LowRankGaussian(W, psi, mu)


def _standardised_priors(
    priors: prior_classes.Priors, noise: str, shift: np.ndarray, scale: Any, d: int, k: int
) -> tuple[prior_classes.Priors, float]:
    """The same (resolved, data-unit) priors expressed on standardised parameters.

    If ``theta ~ p`` in data units, the standardised ``(theta - a) / b`` has
    the pushforward density; ``TransformedDistribution`` carries the
    Jacobian, loadings priors rescale their own hyper-parameters. Improper
    priors stay flat. Also returns the log of the factor by which the
    standardised prior density exceeds the original. ``scale`` is a number,
    or one per feature (FA with per-feature loadings priors: every site
    then has the features' units, ``W`` row by row).
    """
    mean_log_scale = float(np.mean(np.log(scale)))  # per entry of a (d,)- or (d, k)-shaped site
    loadings = priors.loadings.to_units(scale if np.ndim(scale) == 0 else scale[:, None])
    log_jacobian = loadings.site_units(d, k) * mean_log_scale if loadings.proper else 0.0

    def push(prior, power, loc=0.0):
        nonlocal log_jacobian
        if isinstance(prior, dist.ImproperUniform):
            return prior
        log_jacobian += power * math.prod(prior.event_shape) * mean_log_scale
        return prior_classes.pushforward(prior, scale ** (-power), loc)

    # sigma is a standard deviation (scales as x); psi is a variance (as x^2).
    noise_power = 1 if noise == "isotropic" else 2
    std = prior_classes.Priors(
        loadings, push(priors.noise, noise_power), push(priors.mean, 1, -shift / scale)
    )
    return std, log_jacobian


def _initial_values(eig: np.ndarray, axes: np.ndarray, variances: np.ndarray, k: int, noise: str) -> dict:
    """Closed-form pPCA of the (column-mean filled) standardised data, from its covariance spectrum.

    ``W = V_k (Lambda_k - sigma^2)^{1/2}``, ``sigma^2`` the mean discarded
    eigenvalue (``eig``, decreasing, of the 1/n covariance; ``axes`` its
    eigenvectors as columns); for FA, ``psi_j`` is the variance of feature
    ``j`` left unexplained by ``W``. Filling missing entries with the mean
    shrinks the variances, so floors keep the noise positive.
    """
    d = eig.size
    floor = 1e-3 * max(eig.mean(), 1e-12)
    sigma2 = max(eig[k:].mean(), floor) if k < d else floor
    W = axes[:, :k] * np.sqrt(np.maximum(eig[:k] - sigma2, floor))
    values = {"W": W, "mu": np.zeros(d)}
    if noise == "isotropic":
        values["sigma"] = np.sqrt(sigma2)
    else:
        values["psi"] = np.maximum(variances - np.sum(W**2, axis=1), floor)
    return values


def _spectrum_of_rows(Xs: np.ndarray, observed: np.ndarray | None):
    """Eigenvalues, eigenvectors and variances of the 1/n covariance of the mean-filled rows (by SVD)."""
    n, d = Xs.shape
    filled = Xs if observed is None else np.where(observed, Xs, 0.0)
    _, sv, vt = np.linalg.svd(filled, full_matrices=False)
    eig = np.zeros(d)
    eig[: sv.size] = sv**2 / n
    axes = np.zeros((d, d))
    axes[:, : sv.size] = vt.T
    return eig, axes, filled.var(axis=0)


def _spectrum_of_statistics(stats: SufficientStatistics):
    """The same from the statistics of complete data (no rows)."""
    cov = np.asarray(stats.scatter) / stats.n
    eig, axes = np.linalg.eigh(cov)
    return np.clip(eig[::-1], 0.0, None), axes[:, ::-1], np.diag(cov).copy()


def _converged(previous: np.ndarray, current: np.ndarray, tol: float) -> bool:
    """Whether the mean loss stopped changing between two windows of steps.

    Passes when the change of the window means is below ``tol`` relative to
    the loss, or below twice its Monte Carlo standard error (a stochastic
    ELBO stops improving visibly long before its relative change is tiny).
    The step-to-step noise variance is estimated from successive
    differences, which a steady downward trend barely affects.
    """
    change = abs(current.mean() - previous.mean())
    noise_var = 0.5 * np.mean(np.diff(np.concatenate([previous, current])) ** 2)
    stderr = math.sqrt(noise_var * (1.0 / previous.size + 1.0 / current.size))
    return bool(change <= tol * abs(current.mean()) or change <= 2.0 * stderr)


def fit_svi(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    guide: str = "delta",
    num_steps: int = 5000,
    learning_rate: float = 0.05,
    batch_size: int | None = None,
    tol: float = 1e-7,
    random_state: Any = None,
    progress_bar: bool | None = None,
    init: str = "svd",
) -> Fit:
    """Fit pPCA or factor analysis by stochastic variational inference.

    Maximises the ELBO of the marginal model ``x_i ~ N(mu, W W^T + Psi)``
    (:func:`bayespca.models.ppca` or :func:`~bayespca.models.factor_analysis`)
    over the guide's parameters with Adam, whose step decays exponentially
    from ``learning_rate`` to ``1e-3 * learning_rate`` over ``num_steps``.
    The optimiser works in standardised coordinates (see the module
    docstring); every argument and result is in data units.

    Parameters
    ----------
    prepared : Prepared
        Data (:func:`bayespca.statistics.prepare`); NaN marks a missing entry
        (missing at random): each row then contributes the density of its
        observed entries.
    spec : ModelSpec
        ``noise`` (pPCA or FA), ``n_components`` (``1 <= k <= d``) and
        ``prior`` (read by :func:`bayespca.priors.as_priors`): None for the
        scale-aware defaults, ``"flat"`` for improper flat priors (then the
        delta guide gives the maximum-likelihood estimate), ``"ard"``,
        ``"horseshoe"`` (it needs ``guide="normal"`` or ``"lowrank"``: the
        MAP of a horseshoe is no sparse estimate, the density is unbounded at
        0; it starts from the varimax rotation of the initial loadings and
        fills ``Fit.draws``).
    guide : {"delta", "normal", "lowrank"}, default="delta"
        ``AutoDelta`` (MAP point), ``AutoNormal`` or
        ``AutoLowRankMultivariateNormal``.
    num_steps : int, default=5000
        Maximum number of steps.
    learning_rate : float, default=0.05
        Initial Adam step, in standardised units.
    batch_size : int, optional
        Rows per step, drawn uniformly with replacement in the plate
        ``"obs"``, likelihood scaled by ``n / batch_size``; None uses all
        rows. Complete data over all rows are fitted through their
        sufficient statistics at O(d^2 k) per step whatever n, which no
        minibatch beats: minibatches pay off only for data with missing
        values and very large n. On complete Dask data each chunk of 100
        steps draws its minibatches from a new uniform sample of
        ``max(20000, 20 batch_size)`` rows (:func:`bayespca.chunked.sample_rows`),
        the likelihood still scaled to all ``n`` rows; the rows never all
        come to the client.
    tol : float, default=1e-7
        Convergence: the mean loss of the last 100 steps changed by less than
        ``tol`` relative to the previous 100, or by less than twice its
        Monte Carlo standard error, twice in a row.
    random_state : None, int, numpy Generator or RandomState
        Seeds the guide's draws, the minibatches and ``init="random"``.
    progress_bar : bool or None, default=None
        A tqdm progress bar with the current loss; None shows it in a
        terminal or a notebook only.
    init : {"svd", "random"}, default="svd"
        Start from the closed-form pPCA of the mean-filled data, or from
        small random loadings (to study the optimiser).

    Returns
    -------
    Fit
        In data units; ``trace`` holds the loss per step, ``details`` an
        :class:`SVIResult` (the guide, to draw from), ``draws`` the guide's
        draws with the horseshoe.

    Raises
    ------
    ValueError
        Bad arguments (named), or a non-finite loss.

    Notes
    -----
    MAP under the default priors is not the maximum-likelihood point: the
    priors pull ``W`` towards 0 by an amount of relative order ``1/n``, which
    lowers the log-likelihood by O(number of parameters / n) nats (a relative
    1.6e-6 at n = 1000, d = 20, k = 3); use ``prior="flat"`` to fit the
    likelihood exactly.

    The compiled optimisation loop is cached for the last few problem
    configurations (shapes and options, not data values), so refitting data
    of the same shape skips XLA compilation, which otherwise dominates small
    fits. The loop runs with one BLAS thread, restored after.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 2)) @ rng.normal(size=(2, 5)) + 0.3 * rng.normal(size=(200, 5))
    >>> from bayespca.statistics import prepare
    >>> fit = fit_svi(prepare(X), ModelSpec("isotropic", 2, prior="flat"), random_state=0)
    >>> evals = np.linalg.eigvalsh(np.cov(X.T, bias=True))
    >>> bool(np.isclose(fit.gaussian.noise[0], evals[:3].mean(), rtol=1e-6))
    True
    """
    n, d = prepared.n, prepared.d
    noise, k = spec.noise, spec.n_components
    num_steps, learning_rate, tol, batch_size = _checked_options(
        prepared, spec, guide, init, num_steps, learning_rate, tol, batch_size
    )
    release_compiled_programs()
    given = prior_classes.as_priors(spec.prior)
    if isinstance(given.loadings, prior_classes.Horseshoe):
        given.loadings.check(d)
    per_feature = noise == "diagonal" and isinstance(given.loadings, _PER_FEATURE)
    data = _standardised_data(prepared, per_feature, minibatches=batch_size is not None)
    data_priors = prior_classes.resolve_at_data(given, noise, **data.scale_source)[1]
    horseshoe = isinstance(data_priors.loadings, prior_classes.Horseshoe)
    sampled_rows = data.rows is None and batch_size is not None
    _check_horseshoe(horseshoe, guide, sampled_rows)
    std_priors, prior_jacobian = _standardised_priors(data_priors, noise, data.shift, data.scale, d, k)
    rng = as_generator(random_state)
    structure = _structure(data, spec, data_priors.loadings) if horseshoe else None
    model, sampler = _svi_model(prepared, spec, data, batch_size, sampled_rows, rng, structure)
    start = _start(data, spec, std_priors.loadings, init, structure, rng, n)
    auto_guide = _guide(guide, model, start, n)

    schedule = functools.partial(_decaying_step, lr=learning_rate, num_steps=num_steps)
    svi = SVI(model, auto_guide, numpyro.optim.Adam(schedule), Trace_ELBO())
    key = as_key(rng)
    model_args, use_stats = _model_args(data, sampler, batch_size, std_priors, prepared.missing is not None)
    # A deterministic objective (delta guide, all rows) ends at its optimum;
    # a stochastic one is judged on longer windows and summarised by its
    # averaged iterates.
    stochastic = guide != "delta" or batch_size is not None
    config = (noise, guide, None if use_stats else n, d, k, batch_size, structure,
              prepared.missing is not None, sampler is not None, num_steps, learning_rate,
              jax.tree_util.tree_structure(std_priors))
    # The LAPACK calls in the loop are small (k x k, or triangular solves with
    # k rows): threading them only adds synchronisation, and on a machine with
    # more busy threads than cores it made each call ~100x slower (measured).
    with serial_blas(0):
        state = svi.init(key, *model_args[0], **model_args[1])
        window = _STOCHASTIC_WINDOW if stochastic else 1
        state, losses, converged, averaged = _run(
            svi, config, state, model_args, num_steps, tol, progress_bar, window, sampler
        )
    _check_finite(losses)
    params = averaged if stochastic else svi.get_params(state)
    g, draws = _point_and_draws(auto_guide, params, data, noise, structure, rng)
    offset = _loss_offset(data, std_priors.loadings, prior_jacobian, guide, noise, k)
    details = SVIResult(auto_guide, params, noise, data.shift, data.scale)
    fit_ll = data.log_likelihood(g)
    return Fit(g, fit_ll, "svi", losses.size, converged, losses + offset, np.zeros(d, bool), draws, details)


def _guide(guide: str, model, start: dict, n: int):
    """The autoguide named ``guide``, centred at ``start``."""
    guide_kwargs = {"init_loc_fn": init_to_value(values=start)}
    if guide != "delta":
        # Posterior sds of standardised parameters are O(1/sqrt(n)).
        guide_kwargs["init_scale"] = min(0.1, 1.0 / math.sqrt(n))
    return _GUIDES[guide](model, **guide_kwargs)


def _check_finite(losses: np.ndarray) -> None:
    if not np.all(np.isfinite(losses)):
        raise ValueError(
            f"SVI loss became non-finite at step {int(np.argmin(np.isfinite(losses)))}; "
            "lower learning_rate or use init='svd'."
        )


def _checked_options(prepared, spec, guide, init, num_steps, learning_rate, tol, batch_size) -> tuple:
    """``(num_steps, learning_rate, tol, batch_size)`` checked (None for all rows); refuses a noiseless k."""
    batch_size = check_svi_options(guide, batch_size, prepared.n)
    check_choice(init, "init", ("svd", "random"))
    num_steps = check_number(num_steps, "num_steps", integer=True, low=1)
    learning_rate = check_number(learning_rate, "learning_rate", low=0, low_open=True)
    tol = check_number(tol, "tol", low=0, low_open=True)
    if spec.noise == "isotropic":  # a d x d eigenproblem, before any compiling
        check_rows_leave_noise(prepared, spec.n_components)
    return num_steps, learning_rate, tol, None if batch_size == prepared.n else batch_size


def _check_horseshoe(horseshoe: bool, guide: str, sampled_rows: bool) -> None:
    """Refuse the horseshoe with a point guide, or with minibatches of rows drawn from Dask."""
    if horseshoe and guide == "delta":
        raise ValueError(
            "guide must be 'normal' or 'lowrank' with the horseshoe prior (its MAP is not a "
            "sparse estimate); got guide='delta'."
        )
    if horseshoe and sampled_rows:
        raise ValueError(
            "prior='horseshoe' with batch_size on Dask input is not supported (its global scale "
            "depends on the rows the model sees); use batch_size=None, which fits from the statistics."
        )


def _svi_model(prepared, spec, data, batch_size, sampled_rows, rng, structure):
    """The NumPyro model, with its minibatches; and the row sampler of Dask data.

    ``W`` in its own coordinates, or with the horseshoe ``structure``, the model's
    ``(identification, anchors)``.
    """
    n = prepared.n
    identification, anchors = ("none", None) if structure is None else structure
    model = functools.partial(
        MODELS[spec.noise], n_components=spec.n_components, identification=identification, anchors=anchors,
        subsample_size=batch_size, has_missing=prepared.missing is not None,
    )
    if sampled_rows:
        size = min(n, max(_SAMPLE_ROWS, 20 * batch_size))
        sampler = _RowSample(prepared, data.shift, data.scale, size, rng)
        scaled = _with_rows_drawn_with_replacement(model, sampler.size, batch_size)
        return _LikelihoodScale(scaled, n / sampler.size), sampler
    if batch_size is not None:
        return _with_rows_drawn_with_replacement(model, n, batch_size), None
    return model, None


def _structure(data: _Data, spec: ModelSpec, loadings_prior) -> tuple:
    """The horseshoe model's ``(identification, anchors)``: the anchors asked for, or pivoted from
    the closed-form loadings as the NUTS runner does (:func:`bayespca.models.pivot_anchors`)."""
    ident = identification_for(spec.identification, spec.noise, loadings_prior)
    if ident != "lower_triangular" or spec.anchors is not None:
        return ident, spec.anchors
    values = _initial_values(*data.spectrum, spec.n_components, spec.noise)
    return ident, pivot_anchors(values["W"], _start_variances(values, spec.noise, data.shift.size))


def _start_variances(values: dict, noise: str, d: int) -> np.ndarray:
    """The noise variances (d,) of start ``values`` (pPCA's site is the standard deviation)."""
    return np.broadcast_to(values[_NOISE_SITE[noise]] ** (2 if noise == "isotropic" else 1), (d,))


def _start(data: _Data, spec: ModelSpec, loadings_prior, init: str, horseshoe: tuple | None, rng, n) -> dict:
    """The guide's initial sites (standardised): closed-form pPCA, or small random loadings.

    ``horseshoe``: the horseshoe model's ``(identification, anchors)`` (None: another prior), whose
    start is the loadings made triangular on the anchors, or rotated by varimax towards a sparse mode.
    """
    noise, d = spec.noise, data.shift.size
    values = _initial_values(*data.spectrum, spec.n_components, noise)
    if init == "random":
        values["W"] = 0.1 * rng.standard_normal((d, spec.n_components))
        values[_NOISE_SITE[noise]] = np.ones(()) if noise == "isotropic" else np.ones(d)
    w0 = values.pop("W")
    noise0 = _start_variances(values, noise, d)
    if horseshoe is not None and horseshoe[0] == "lower_triangular":
        w0 = lower_triangular(w0, horseshoe[1])
        values.update(loadings_prior.start(w0, noise0, n, free=lower_entries(*w0.shape, horseshoe[1])))
        return values
    if horseshoe is not None:
        from bayespca.rotations import rotate

        w0 = np.asarray(rotate(w0, "varimax").loadings)
    values.update(loadings_prior.start(w0, noise0, n))
    return values


def _model_args(data: _Data, sampler, batch_size: int | None, std_priors, has_missing: bool) -> tuple:
    """The model's ``(args, kwargs)``, and whether they are the sufficient statistics."""
    from_statistics = data.rows is None
    # Complete data over all rows enter the likelihood only through
    # (n, mean, scatter): one step then costs O(d^2 k), whatever n.
    use_stats = batch_size is None and (not has_missing or from_statistics)
    if use_stats:
        stats = data.stats if from_statistics else SufficientStatistics(
            np.float64(data.rows.shape[0]), data.rows.mean(axis=0),
            centred_scatter(data.rows, data.rows.mean(0)),
        )
        return ((None,), {"prior": std_priors, "suff_stats": stats}), True
    rows = sampler.draw() if sampler is not None else data.rows  # NaN at missing entries
    return ((jnp.asarray(rows),), {"prior": std_priors}), False


def _point_and_draws(auto_guide, params: dict, data: _Data, noise: str, horseshoe: tuple | None, rng):
    """The guide's median in data units (canonical loadings), and with the horseshoe (its model's
    ``(identification, anchors)``, else None) its draws."""
    point = _to_data_units(auto_guide.median(params), noise, data.shift, data.scale)
    draws = None
    if horseshoe is not None:
        sites = auto_guide.sample_posterior(as_key(rng), params, sample_shape=(_HORSESHOE_DRAWS,))
        sampled = _to_data_units(sites, noise, data.shift, data.scale)
        w, kappa = np.asarray(sampled.loadings), np.asarray(sites["kappa"])
        identification, anchors = horseshoe
        if identification == "lower_triangular":  # the guide's one sign mode, W_{p_l l} > 0 on average
            w = w * np.where(np.diagonal(w.mean(axis=0)[list(anchors)]) < 0, -1.0, 1.0)
        else:
            w, kappa = prior_classes.canonical_columns(w, kappa)
            identification = "signed_permutation"
        point = LowRankGaussian(w.mean(axis=0), point.noise, point.mean)
        draws = Draws(
            w[None], np.asarray(sampled.noise)[None], np.asarray(sampled.mean)[None],
            identification, noise, extra={"kappa": kappa[None]}, anchors=anchors,
        )
    else:
        point = canonical_loadings(point)
    return LowRankGaussian(*(np.asarray(a, dtype=float) for a in point)), draws


def _loss_offset(data: _Data, loadings_prior, prior_jacobian: float, guide: str, noise: str, k: int) -> float:
    """What turns the standardised loss into the loss in data units.

    Standardising multiplies the data density by scale^n_obs, the
    transformed priors' density by scale^prior_jacobian, and divides the
    guide's density by scale^(units of its sites), which the entropy of a
    non-degenerate guide carries.
    """
    d = data.shift.size
    site_units = loadings_prior.site_units(d, k) + d + (1 if noise == "isotropic" else 2 * d)
    entropy = 0 if guide == "delta" else site_units * float(np.mean(np.log(data.scale)))
    return float(np.sum(data.counts * np.log(data.scale))) + prior_jacobian - entropy


def map_by_svi(
    model,
    start: dict,
    model_args: tuple,
    config: tuple,
    *,
    num_steps: int,
    learning_rate: float,
    tol: float = 1e-7,
    random_state: Any = None,
    progress_bar: bool | None = None,
) -> tuple[dict, np.ndarray, bool]:
    """The MAP of a NumPyro model by SVI with a delta guide, run as :func:`fit_svi` runs it.

    Adam with the step ``lr_t = learning_rate * 1e-3^(t / num_steps)``, from
    ``start``, in compiled chunks of 100 steps with a progress bar, until the
    mean loss of a chunk changes by less than ``tol`` relative to the
    previous one (or by less than twice its Monte Carlo error) twice in a
    row, or ``num_steps``. The chunks' program is compiled once per
    ``config`` and kept: everything that varies between fits of one
    configuration (data, prior numbers) must be in ``model_args``.

    Parameters
    ----------
    model : callable
        A NumPyro model function; its static options bound (``functools.partial``).
    start : dict
        Constrained start of every latent site.
    model_args : tuple
        ``(args, kwargs)`` of the model (arrays and pytrees).
    config : tuple
        Hashable; fixes the model's code, shapes, ``num_steps`` and
        ``learning_rate`` (the key of the kept programs).
    num_steps, learning_rate, tol, random_state, progress_bar
        As in :func:`fit_svi`.

    Returns
    -------
    point : dict
        The constrained sites at the last step.
    losses : ndarray
        Loss (negative log joint) per step.
    converged : bool

    Examples
    --------
    The MAP of ``mu ~ N(0, 10^2)``, ``x_i ~ N(mu, 1)`` is ``sum(x) / (n + 1 / 100)``:

    >>> def model(x):
    ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     numpyro.sample("x", dist.Normal(mu, 1.0), obs=x)
    >>> x = jnp.array([1.0, 2.0, 4.0])
    >>> point, _, _ = map_by_svi(model, {"mu": 0.0}, ((x,), {}), ("doc",), num_steps=2000,
    ...                          learning_rate=0.1, progress_bar=False)
    >>> round(float(point["mu"]), 4), round(7 / (3 + 1 / 100), 4)
    (2.3256, 2.3256)
    """
    release_compiled_programs()
    guide = AutoDelta(model, init_loc_fn=init_to_value(values=start))
    schedule = functools.partial(_decaying_step, lr=learning_rate, num_steps=num_steps)
    svi = SVI(model, guide, numpyro.optim.Adam(schedule), Trace_ELBO())
    with serial_blas(0):  # small products: see fit_svi
        state = svi.init(as_key(random_state), *model_args[0], **model_args[1])
        state, losses, converged, _ = _run(svi, config, state, model_args, num_steps, tol, progress_bar, 1)
    return guide.median(svi.get_params(state)), losses, converged


def _with_rows_drawn_with_replacement(model, n: int, batch_size: int):
    """The model with its plate ``"obs"`` subsampled by uniform draws with replacement.

    NumPyro's own plate draws without replacement by a sequential partial
    Fisher-Yates shuffle on CPU, whose cost (~10 us per drawn row) dwarfs the
    likelihood; ``n / batch_size`` times the sum over rows drawn with
    replacement is just as unbiased, at O(batch_size).
    """

    def subsampled(*args, **kwargs):
        rows = jax.random.randint(numpyro.prng_key(), (batch_size,), 0, n)
        with handlers.substitute(data={"obs": rows}):
            model(*args, **kwargs)

    return subsampled


def _decaying_step(i, *, lr: float, num_steps: int):
    return lr * _LR_DECAY ** (i / num_steps)


# Compiled chunk runners, by problem configuration: a second fit of the same
# shape and options (cross-validation, a grid over priors) skips the XLA
# compilation, which costs more than the fit itself on small data. Each entry
# keeps its SVI object (and the data it was traced with) alive, hence few.
_RUNNERS: OrderedDict = OrderedDict()
_RUNNERS_KEPT = 4


class _RowSample:
    """Standardised samples of ``size`` rows of Dask data, drawn chunk by chunk on the workers.

    Each draw is uniform over all ``n`` rows (with replacement), so a
    minibatch of it, its likelihood scaled by ``n / batch``, is an unbiased
    estimate of the full data's.
    """

    def __init__(self, prepared: Prepared, shift: np.ndarray, scale: float, size: int, rng):
        self.rows, self.unit = prepared.X, prepared.scale
        self.shift, self.scale, self.size, self.rng = shift, scale, size, rng

    def draw(self) -> jax.Array:
        sample = sample_rows(self.rows, self.size, self.rng) * self.unit
        return jnp.asarray((sample - self.shift) / self.scale)


class _LikelihoodScale(numpyro.primitives.Messenger):
    """Scales the log-density of the data site ``X`` only: a sample of rows stands for all of them."""

    def __init__(self, fn, factor: float):
        self.factor = factor
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] == "X":
            msg["scale"] = self.factor if msg.get("scale") is None else self.factor * msg["scale"]


class _Data(NamedTuple):
    """The data as SVI sees them: standardised ``(x - shift) / scale``, as rows or statistics."""

    shift: np.ndarray  # column means (data units)
    scale: float | np.ndarray  # root mean column variance, or each column's sd
    counts: np.ndarray  # observed entries per column
    spectrum: tuple  # of the standardised 1/n covariance: _initial_values' arguments
    scale_source: dict  # the data in units, as prior_classes.resolve_at_data reads them (for the priors)
    rows: np.ndarray | None  # standardised rows, NaN at missing entries (None: statistics)
    stats: SufficientStatistics | None  # standardised (complete Dask data)
    log_likelihood: Any  # LowRankGaussian in data units -> total log-likelihood


def _standardised_data(prepared: Prepared, per_feature: bool, minibatches: bool) -> _Data:
    """The data standardised once, from the rows or from the statistics.

    ``per_feature``: each column divided by its own sd, else all by their
    root mean variance.

    Complete Dask data stay on the workers (their reduced statistics here;
    minibatches are drawn by :class:`_RowSample`), and so do Dask data with
    missing values in at most 64 patterns (their per-pattern statistics).
    Missing values in grouped patterns are fitted from those statistics
    whenever no minibatches are asked for. Other Dask input comes to the
    client (:func:`bayespca.chunked.in_memory` warns, and refuses above its
    limit).
    """
    n, d, missing = prepared.n, prepared.d, prepared.missing
    if missing is not None and (is_chunked(prepared.X) or not minibatches):
        patterns = prepared.patterns
        if patterns.X is None:
            return _standardised_patterns(prepared, patterns, per_feature)
    if is_chunked(prepared.X) and missing is None:
        stats, s = prepared.stats, prepared.scale  # exact to data units: s is a power of two
        mean, scatter = np.asarray(stats.mean) * s, np.asarray(stats.scatter) * s**2
        scale = _scale(np.diag(scatter) / n, per_feature)
        unit = np.broadcast_to(scale, (d,))
        std = SufficientStatistics(np.float64(n), np.zeros(d), scatter / np.outer(unit, unit))
        source = {"suff_stats": SufficientStatistics(n, mean, scatter), "n_features": d}
        return _Data(mean, scale, np.full(d, n), _spectrum_of_statistics(std), source, None, std,
                     lambda g: float(log_likelihood_from_stats(g, n, mean, scatter)))
    rows = prepared.X
    if is_chunked(rows):
        rows = in_memory(rows, "SVI with missing values")
    arr = rows * prepared.scale  # exact: its own standardisation follows
    nan = np.isnan(arr)
    observed = ~nan if missing is not None else None
    shift = np.nanmean(arr, axis=0)
    scale = _scale(np.nanvar(arr, axis=0), per_feature)
    xs = np.where(nan, 0.0, (arr - shift) / scale)
    counts = n - nan.sum(axis=0)
    return _Data(shift, scale, counts, _spectrum_of_rows(xs, observed), {"X": arr},
                 np.where(nan, np.nan, xs), None,
                 lambda g: float(np.sum(log_prob(g, np.where(nan, 0.0, arr), observed))))


def _standardised_patterns(prepared: Prepared, patterns: MissingPatterns, per_feature: bool) -> _Data:
    """:class:`_Data` from the statistics of each pattern of observed entries (no rows)."""
    n, d, s = prepared.n, prepared.d, prepared.scale
    shift = np.asarray(prepared.mean) * s
    scale = _scale(np.asarray(prepared.variances) * s**2, per_feature)
    in_data = columns_divided(patterns, np.full(d, 1.0 / s))  # exact: s is a power of two
    unit = np.broadcast_to(scale, (d,))
    std = stack_patterns(columns_divided(in_data, unit, shift), multiple=PATTERN_MULTIPLE)
    # The mean-filled rows' (x - shift) / scale, 0 where missing: their 1/n covariance from the patterns.
    filled = std.scatter.sum(axis=0) + np.einsum("p,pi,pj->ij", std.n, std.mean, std.mean)
    spectrum = _spectrum_of_statistics(SufficientStatistics(n, np.zeros(d), filled))
    source = {"suff_stats": in_data, "n_features": d}
    counts = np.einsum("p,pj->j", std.n, std.observed)  # observed entries per column
    return _Data(shift, scale, counts, spectrum, source, None, std,
                 lambda g: float(marginal_log_likelihood(g, in_data)))


def _scale(variances: np.ndarray, per_feature: bool) -> float | np.ndarray:
    """The root mean of the column variances (1 if 0), or each column's sd (that where a column's is 0)."""
    overall = float(np.sqrt(np.mean(variances)))
    overall = overall if overall > 0 else 1.0
    return np.where(variances > 0, np.sqrt(variances), overall) if per_feature else overall


def _chunk_runner(svi: SVI, config: tuple, length: int):
    """A jitted ``run(state, (args, kwargs)) -> (state, losses, mean params)`` of ``length`` steps.

    Everything data-dependent is a model argument passed at run time, never a
    baked-in constant, so the runner built for one fit serves every fit with
    the same ``config`` (its SVI object has the same sites, shapes and
    constraints).
    """
    key = (config, length)
    if key in _RUNNERS:
        _RUNNERS.move_to_end(key)
        return _RUNNERS[key]

    def step(carry, _, model_args):
        state, total = carry
        state, loss = svi.update(state, *model_args[0], **model_args[1])
        current = svi.optim.get_params(state.optim_state)
        return (state, jax.tree.map(jnp.add, total, current)), loss

    @jax.jit
    def run(state, model_args):
        zeros = jax.tree.map(jnp.zeros_like, svi.optim.get_params(state.optim_state))
        body = functools.partial(step, model_args=model_args)
        (state, total), losses = jax.lax.scan(body, (state, zeros), None, length=length)
        return state, losses, jax.tree.map(lambda t: t / length, total)

    _RUNNERS[key] = run
    while len(_RUNNERS) > _RUNNERS_KEPT:
        _RUNNERS.popitem(last=False)
    return run


def _run(
    svi: SVI,
    config: tuple,
    state,
    model_args: tuple,
    num_steps: int,
    tol: float,
    progress_bar: bool | None,
    window: int,
    sampler: _RowSample | None = None,
):
    """Run SVI in compiled chunks of steps, testing convergence between chunks.

    With a ``sampler``, each chunk of steps draws its minibatches from a
    new sample of rows (the model's data argument).

    The test compares the mean loss over the last ``window`` chunks with
    that over the ``window`` chunks before. Returns the final state, the
    losses, whether the test passed, and the mean of the (unconstrained)
    parameters over the last ``window`` chunks: with a stochastic objective
    the iterates jitter around the optimum at the scale of the step, and
    their average (Polyak-Ruppert) is much closer to it.
    """
    chunk = min(_CHUNK, num_steps)
    bar = progress(progress_bar, total=num_steps, desc="SVI")
    windows: list[np.ndarray] = []
    averages: list = []
    passes = 0
    converged = False
    done = 0
    try:
        while done < num_steps:
            length = min(chunk, num_steps - done)
            if sampler is not None and done:
                model_args = ((sampler.draw(),), model_args[1])
            state, loss, average = _chunk_runner(svi, config, length)(state, model_args)
            loss = np.asarray(loss)
            windows.append(loss)
            averages.append(average)
            done += length
            if bar is not None:
                bar.update(length)
                bar.set_postfix(loss=f"{loss.mean():.6g}")
            if not np.all(np.isfinite(loss)):
                break
            if len(windows) >= 2 * window and length == chunk:
                previous = np.concatenate(windows[-2 * window : -window])
                current = np.concatenate(windows[-window:])
                passes = passes + 1 if _converged(previous, current, tol) else 0
                if passes >= 2:
                    converged = True
                    break
    finally:
        if bar is not None:
            bar.close()
    last = averages[-window:]
    average = jax.tree.map(lambda *chunks: sum(chunks) / len(chunks), *last)
    return state, np.concatenate(windows), converged, svi.constrain_fn(average)
