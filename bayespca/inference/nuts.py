"""Full posteriors of pPCA and factor analysis by NUTS, on the models of :mod:`bayespca.models`.

The sampler's potential energy is that of the NumPyro model function
(:func:`bayespca.models.ppca` or :func:`~bayespca.models.factor_analysis`,
with the identification and priors of the fit), fed the data's sufficient
statistics (:class:`bayespca.statistics.MissingPatterns` with missing
values): a gradient costs O(d^2 k) per missing pattern, whatever the number
of rows. NumPyro's ``MCMC(NUTS(model))`` on the same model samples the same
posterior; this runner adds three things that make it fast:

1. *Laplace-whitened coordinates.* With ``theta`` the model's unconstrained
   sites and ``theta_0`` the maximum-likelihood point, the sampler moves
   ``xi`` with ``theta = theta_0 + S xi``, ``S S^T`` the inverse Hessian of
   the potential at ``theta_0`` (eigenvalues floored): NUTS sees
   near-unit-scale geometry whatever ``n`` or the data's units, and each
   chain starts at a draw of that approximation. An affine map: the
   posterior is unchanged.
2. *Working units.* Fits run on ``X / scale`` (a power of two,
   :mod:`bayespca.statistics`), with priors stated in data units moved to
   those units (:func:`bayespca.priors.to_units`); draws are mapped back.
3. *Compile once.* The statistics, priors' numbers, start and
   preconditioner reach the compiled sampler as arguments; only the
   configuration (noise, k, identification, prior kind, layout of the
   parameters, pattern sizes, numbers of draws and chains, mass and
   acceptance settings) is compiled in, so a fit of new data with the same
   configuration reuses it (measured at n=1000, d=20, k=3, 500+500 draws:
   9 s for the first fit, under 1 s for the next).

After sampling, draws of ``W`` are identified for reporting: ``"polar"``
fixes each column's sign by its inner product with the ML loadings,
``"procrustes"`` rotates each draw onto them
(:func:`bayespca.rotations.procrustes`), and the horseshoe aligns draws by
signed permutations of the columns (:meth:`bayespca.priors.Horseshoe.align`,
recorded as ``"signed_permutation"``).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer import MCMC, NUTS
from numpyro.infer.hmc import hmc
from numpyro.infer.util import constrain_fn, potential_energy, unconstrain_fn

from bayespca import priors as prior_classes
from bayespca.gaussian import LowRankGaussian
from bayespca.inference.contract import Draws, Fit, ModelSpec
from bayespca.models import MODELS, identification_for, initial_values, marginal_log_likelihood
from bayespca.params import as_key, check_bool, check_choice, check_number
from bayespca.statistics import Prepared

__all__ = ["CHAIN_METHODS", "fit_nuts"]

CHAIN_METHODS = ("sequential", "parallel", "vectorized")
# Above this many sampled parameters the Hessian (p x p) is not formed.
_MAX_LAPLACE_SIZE = 2000
# A horseshoe loading is sampled centred when its start is this many standard errors from 0.
_CENTRED_AT = 4.0
_EXTRA_FIELDS = ("diverging", "num_steps", "potential_energy", "accept_prob", "energy")


@dataclass(frozen=True)
class _Static:
    """What fixes the code and shapes of the potential (the key of jit's cache).

    Everything else (statistics, priors' numbers, start, preconditioner)
    travels in the ``data`` pytree. ``layout`` lists the ``(name, shape)``
    of the unconstrained sites in ravel order.
    """

    noise: str
    k: int
    identification: str
    layout: tuple


def _unravel(static: _Static):
    return ravel_pytree({name: jnp.zeros(shape) for name, shape in static.layout})[1]


def _model_kwargs(static: _Static, data: dict) -> dict:
    return {
        "n_components": static.k,
        "prior": data["prior"],
        "identification": static.identification,
        "suff_stats": data["stats"],
        "reparam": data["reparam"],
    }


def _potential(static: _Static, data: dict, theta: dict) -> jax.Array:
    """The model's potential energy (negative log joint, Jacobians included) at ``theta``."""
    return potential_energy(MODELS[static.noise], (), _model_kwargs(static, data), theta)


def _theta_of(static: _Static, data: dict, xi: jax.Array) -> dict:
    """``theta = centre + S xi`` (``S`` the Laplace factor, or a vector of scales)."""
    factor = data["factor"]
    step = factor @ xi if factor.ndim == 2 else factor * xi
    return _unravel(static)(data["centre"] + step)


def _sampler_potential(static: _Static, data: dict):
    return lambda xi: _potential(static, data, _theta_of(static, data, xi))


@functools.partial(jax.jit, static_argnums=0)
def _hessian(static: _Static, data: dict, centre: jax.Array) -> jax.Array:
    unravel = _unravel(static)
    return jax.hessian(lambda v: _potential(static, data, unravel(v)))(centre)


def _laplace_factor(hessian: np.ndarray) -> jax.Array:
    """``S`` with ``S S^T`` the inverse of ``hessian`` (eigenvalues floored).

    Flat or curved-down directions (the start is the ML point, not the
    MAP) get a standard deviation of at most ``sqrt(10)``.
    """
    vals, vecs = np.linalg.eigh(0.5 * (hessian + hessian.T))
    floor = max(1e-8 * vals.max(), 0.1)
    return jnp.asarray(vecs / np.sqrt(np.maximum(vals, floor)))


def _chain(static: _Static, settings: tuple, data: dict, init: jax.Array, key: jax.Array):
    """One NUTS chain: warm-up, then ``num_samples`` draws of ``xi`` and their statistics.

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
        stats = tuple(getattr(state, f) for f in _EXTRA_FIELDS)
        return state, (state.z, *stats, state.adapt_state.step_size)

    return jax.lax.scan(draw, state, length=num_samples)[1]


_chain_jit = jax.jit(_chain, static_argnums=(0, 1))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _chains_vectorized(static, settings, data, init, keys):
    return jax.vmap(lambda x, key: _chain(static, settings, data, x, key))(init, keys)


_chains_parallel = jax.pmap(_chain, in_axes=(None, None, None, 0, 0), static_broadcasted_argnums=(0, 1))


def _run_chains(static, settings, data, init, key, chain_method, progress_bar):
    """Draws of ``xi`` (chain, draw, p) and the sampler's statistics (chain, draw) by field."""
    num_chains = init.shape[0]
    fields = (*_EXTRA_FIELDS, "step_size")
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
        mcmc.run(
            key, init_params=init[0] if num_chains == 1 else init,
            extra_fields=(*_EXTRA_FIELDS, "adapt_state.step_size"),
        )
        extra = mcmc.get_extra_fields(group_by_chain=True)
        extra["step_size"] = extra.pop("adapt_state.step_size")
        return mcmc.get_samples(group_by_chain=True), {f: extra[f] for f in fields}
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
    return out[0], dict(zip(fields, out[1:], strict=True))


_KEPT_SITES = ("W", "sigma", "psi", "mu", "alpha", "kappa")


@functools.partial(jax.jit, static_argnums=0)
def _constrained_draws(static: _Static, data: dict, xi: jax.Array) -> dict:
    """The model's sites (``W``, noise, ``mu`` and prior extras) at each row of ``xi`` (m, p)."""
    model = MODELS[static.noise]
    kwargs = _model_kwargs(static, data)

    def one(x):
        values = constrain_fn(model, (), kwargs, _theta_of(static, data, x), return_deterministic=True)
        return {name: values[name] for name in _KEPT_SITES if name in values}

    return jax.lax.map(one, xi)


def _rough_scales(start: dict, n: int, variances: np.ndarray) -> jax.Array:
    """Rough posterior sds of the unconstrained sites, used instead of the Laplace factor for large models."""
    size = 0.1 * min(1.0, 10.0 / np.sqrt(n))
    scales = {}
    for name, value in start.items():
        value = np.asarray(value, dtype=float)
        if name == "Z":
            s = size / np.sqrt(value.shape[0])
        elif name in ("W", "W_lower"):
            s = size * np.sqrt(np.mean(value**2))
        elif name == "mu":
            s = np.sqrt(variances / n)
        else:
            s = size
        scales[name] = jnp.broadcast_to(jnp.asarray(s, dtype=float), value.shape)
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


def _ml_start(prepared: Prepared, spec: ModelSpec) -> LowRankGaussian:
    """The maximum-likelihood fit in working units: where the chains start."""
    ml_spec = ModelSpec(spec.noise, spec.n_components)
    if spec.noise == "isotropic" and prepared.missing is None:
        from bayespca.inference.closed_form import ppca_closed_form

        fit = ppca_closed_form(prepared, ml_spec)
    else:
        from bayespca.inference.em import fit_em

        fit = fit_em(prepared, ml_spec)
    s = prepared.scale
    return LowRankGaussian(*(np.asarray(a) for a in (fit.gaussian.loadings / s, fit.gaussian.noise / s**2,
                                                      fit.gaussian.mean / s)))


def _check_options(num_warmup, num_samples, num_chains, chain_method, target_accept_prob, dense_mass):
    for value, name in ((num_warmup, "num_warmup"), (num_samples, "num_samples"), (num_chains, "num_chains")):
        check_number(value, name, integer=True, low=1)
    check_choice(chain_method, "chain_method", CHAIN_METHODS)
    check_number(target_accept_prob, "target_accept_prob", low=0, high=1, low_open=True, high_open=True)
    check_bool(dense_mass, "dense_mass")


def fit_nuts(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    chain_method: str = "sequential",
    target_accept_prob: float = 0.9,
    dense_mass: bool = False,
    random_state: Any = None,
    progress_bar: bool = False,
) -> Fit:
    """Sample the posterior of pPCA or factor analysis by NUTS on the marginal model.

    Parameters
    ----------
    prepared : Prepared
        Data (:func:`bayespca.statistics.prepare`); NaN marks a missing entry.
    spec : ModelSpec
        ``noise``, ``n_components``, ``prior`` (read by
        :func:`bayespca.priors.as_priors`, in data units) and
        ``identification`` (see :mod:`bayespca.models`).
    num_warmup, num_samples, num_chains : int
    chain_method : {"sequential", "parallel", "vectorized"}, default="sequential"
    target_accept_prob : float, default=0.9
    dense_mass : bool, default=False
        Adapt a dense mass matrix. The Laplace whitening already removes the
        posterior correlations, so a diagonal mass suffices (measured at
        n=1000, d=20, k=3: 15 leapfrog steps per draw either way, but a dense
        warm-up takes ~20x more leapfrog steps, its first windows estimating
        an 84 x 84 covariance from 25 draws).
    random_state : None, int, numpy Generator or RandomState
    progress_bar : bool, default=False

    Returns
    -------
    Fit
        In data units: ``draws`` (chain, draw, ...) with sampler statistics
        ``diverging``, ``n_steps``, ``tree_depth``, ``lp``,
        ``acceptance_rate``, ``energy``, ``step_size``; ``gaussian`` the
        posterior mean of ``(W, Psi, mu)``; ``log_likelihood`` there;
        ``converged`` False when a transition diverged.

    Examples
    --------
    >>> from bayespca.statistics import prepare
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((200, 1)) @ [[2.0, 1.0, -1.0]] + rng.standard_normal((200, 3))
    >>> fit = fit_nuts(prepare(X), ModelSpec("isotropic", 1), num_warmup=100, num_samples=100,
    ...                num_chains=1, random_state=0)
    >>> fit.draws.loadings.shape, bool(0.6 < fit.draws.noise.mean() < 1.4)
    ((1, 100, 3, 1), True)
    """
    _check_options(num_warmup, num_samples, num_chains, chain_method, target_accept_prob, dense_mass)
    key = as_key(random_state)
    n, d, k, noise = prepared.n, prepared.d, spec.n_components, spec.noise
    priors = prior_classes.to_units(prior_classes.as_priors(spec.prior), noise, prepared.scale)
    if isinstance(priors.loadings, prior_classes.Horseshoe):
        priors.loadings.check(d)
    stats = prepared.stats if prepared.missing is None else prepared.patterns
    resolved = prior_classes.resolve(priors, noise, prior_classes.data_scales(suff_stats=stats, n_features=d))
    loadings = jax.tree.map(np.asarray, resolved.loadings)
    identification = identification_for(spec.identification, noise, loadings)

    ml = _ml_start(prepared, spec)
    reference_w = np.asarray(ml.loadings)
    reparam = None
    if isinstance(loadings, prior_classes.Horseshoe):
        from bayespca.rotations import rotate

        # Start near a sparse mode: varimax is the orthogonal rotation of simple structure.
        reference_w = np.asarray(rotate(reference_w, "varimax").loadings)
        standard_error = np.sqrt(np.asarray(ml.noise) / n)[:, None]
        reparam = prior_classes.HorseshoeReparam(
            jnp.asarray(np.abs(reference_w) > _CENTRED_AT * standard_error), jnp.asarray(standard_error)
        )
    elif identification == "lower_triangular":
        from bayespca.models import lower_triangular

        reference_w = lower_triangular(reference_w)
    start_point = LowRankGaussian(reference_w, np.asarray(ml.noise), np.asarray(ml.mean))
    values = initial_values(identification, loadings, start_point, noise, n)
    if reparam is not None:
        values["W_z"] = np.where(reparam.centred, reference_w / reparam.standard_error, values["W_z"])
    data = {"prior": priors, "stats": stats, "reparam": reparam}
    kwargs = {"n_components": k, "prior": priors, "identification": identification,
              "suff_stats": stats, "reparam": reparam}
    theta = unconstrain_fn(MODELS[noise], (), kwargs, values)
    theta = {name: np.asarray(v, dtype=float) for name, v in sorted(theta.items())}
    static = _Static(noise, k, identification, tuple((name, v.shape) for name, v in theta.items()))
    centre = ravel_pytree({name: jnp.asarray(v) for name, v in theta.items()})[0]
    init_scale = 1.0
    if reparam is not None:
        # Its coordinates are unit-free already (loadings in standard errors, log scales), and
        # a Laplace fit to the scales' heavy tails misleads; start a few tenths of a unit away.
        factor = jnp.ones(centre.size)
        init_scale = 0.1 * min(1.0, 10.0 / np.sqrt(n))
    elif centre.size <= _MAX_LAPLACE_SIZE:
        factor = _laplace_factor(np.asarray(_hessian(static, data, centre)))
    else:
        factor = _rough_scales(theta, n, prepared.variances)
    data["centre"], data["factor"] = centre, factor

    key_init, key_run = jax.random.split(key)
    # Draws from the Laplace approximation (or a few rough posterior sds) around the ML fit.
    init = init_scale * jax.random.normal(key_init, (num_chains, centre.size))
    settings = (int(num_warmup), int(num_samples), bool(dense_mass), float(target_accept_prob))
    xi, extra = _run_chains(static, settings, data, init, key_run, chain_method, progress_bar)
    sites = jax.tree.map(np.asarray, _constrained_draws(static, data, xi.reshape(-1, centre.size)))
    draws = _draws(sites, extra, identification, reference_w, start_point, noise, (num_chains, num_samples))
    return _posterior_fit(draws, stats, n).to_data_units(prepared.scale, prepared.total_observed)


def _draws(sites, extra, identification, reference_w, start_point, noise, shape) -> Draws:
    """Identified draws (chain, draw, ...) and sampler statistics, in working units."""
    w = sites["W"]
    d, k = w.shape[-2:]
    if noise == "isotropic":
        psi = np.broadcast_to(sites["sigma"][:, None] ** 2, (w.shape[0], d))
    else:
        psi = sites["psi"]
    prior_extra = {}
    if "kappa" in sites:
        w, kappa = prior_classes.Horseshoe.align(w, sites["kappa"], reference_w)
        prior_extra["kappa"] = kappa.reshape(*shape, d, k)
        identification = "signed_permutation"
    else:
        w = _identify(w, reference_w, identification)
    if "alpha" in sites:
        prior_extra["alpha"] = sites["alpha"].reshape(*shape, k)
    n_steps = np.asarray(extra["num_steps"]).astype(int)
    sample_stats = {
        "diverging": np.asarray(extra["diverging"]).astype(bool),
        "n_steps": n_steps,
        "tree_depth": np.ceil(np.log2(n_steps + 1)).astype(int),
        "lp": -np.asarray(extra["potential_energy"]),
        "acceptance_rate": np.asarray(extra["accept_prob"]),
        "energy": np.asarray(extra["energy"]),
        "step_size": np.asarray(extra["step_size"]),
    }
    return Draws(
        w.reshape(*shape, d, k), np.array(psi).reshape(*shape, d), sites["mu"].reshape(*shape, d),
        identification, noise, sample_stats, start_point, prior_extra,
    )


def _posterior_fit(draws: Draws, stats: Any, n: int) -> Fit:
    """The Fit of a posterior: its mean as the point estimate, the log-likelihood there."""
    g = LowRankGaussian(draws.loadings.mean((0, 1)), draws.noise.mean((0, 1)), draws.mean.mean((0, 1)))
    ll = float(marginal_log_likelihood(g, stats))
    n_draws = draws.loadings.shape[0] * draws.loadings.shape[1]
    converged = not draws.sample_stats["diverging"].any()
    return Fit(g, ll, "nuts", n_draws, converged, np.array([ll]), np.zeros(g.noise.shape, bool), draws)
