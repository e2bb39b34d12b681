"""Full posteriors of pPCA and factor analysis by NUTS, on the models of :mod:`bayespca.models`.

The sampler's potential energy is that of the NumPyro model function
(:func:`bayespca.models.ppca` or :func:`~bayespca.models.factor_analysis`,
with the identification and priors of the fit), fed the data's sufficient
statistics (with missing values, those of each pattern, stacked:
:class:`bayespca.statistics.StackedPatterns`): a gradient costs O(d^2 k)
per missing pattern, whatever the number of rows. NumPyro's
``MCMC(NUTS(model))`` on the same model samples the same posterior; this
runner adds three things that make it fast:

1. *Laplace-whitened coordinates.* With ``theta`` the model's unconstrained
   sites and ``theta_0`` the maximum-likelihood point, the sampler moves
   ``xi`` with ``theta = theta_0 + S xi``, ``S S^T`` the inverse Hessian of
   the potential at ``theta_0`` (eigenvalues floored, and equilibrated by
   the diagonal first where they span more than a double resolves,
   :func:`~bayespca.inference.laplace.modified_eigen`): NUTS sees
   near-unit-scale geometry whatever ``n`` or the data's units, and each
   chain starts at a draw of that approximation. An affine map: the
   posterior is unchanged. A polar column whose direction the data leave
   free (one beyond the data's rank) gets the polar expansion's own scale
   there instead: the Laplace approximation at the mode misdescribes a
   direction that roams its sphere
   (:func:`~bayespca.inference.laplace.localized_factor`; d = 20, rank 3,
   k = 4: 27 -> 18 leapfrog steps a draw). So do two columns whose relative
   rotation the data leave loose (close eigenvalues), in their plane only
   (diabetes, standardised, k = 6: the divergent transitions went). A dense
   ``S`` costs ``O(p^2)`` per gradient, which dominates from a few hundred
   parameters on (:mod:`bayespca.inference.laplace`); for pPCA the Laplace
   covariance is exactly block-structured once ``Z`` and ``mu`` are rotated
   by the data's principal axes, and above :data:`_ROTATED_ABOVE`
   parameters (from 30 features) ``S`` is that ``O(d^2 k)`` factor
   (:mod:`bayespca.inference.rotated_factor`; d = 100, k = 10: fits 6.7
   times faster).
2. *Working units.* Fits run on ``X / scale`` (a power of two,
   :mod:`bayespca.statistics`), with priors stated in data units moved to
   those units (:func:`bayespca.priors.to_units`); draws are mapped back.
3. *Compile once.* The statistics, priors' numbers, start and
   preconditioner reach the compiled sampler as arguments; only the
   configuration (noise, k, identification, prior kind, layout of the
   parameters, the number of missing patterns rounded up to a multiple of
   8, numbers of draws and chains, mass and acceptance settings) is
   compiled in, so a fit of new data with the same
   configuration reuses it. Each chain runs the one-chain program, which
   compiles in half the time of a vectorized one, on threads, chains at
   once on a CPU's cores (measured at n=1000, d=20, k=3, 4 chains of
   500 + 500 draws, 2 cores: 4.6-5.7 s for the first fit, 0.6 s for the
   next, each gradient of the sampled density 9.5 us). Where the fit's
   signal-to-noise ratios are moderate (:data:`_UNREFINED_BELOW`), the
   programs are compiled without the precision's refinement
   (:mod:`bayespca.gaussian`, notes 3.), a smaller program. The chains'
   transitions compile on a thread while the mode search runs (from the
   shapes it will give: :func:`_compile_ahead`); and fits of several k can
   share them, ``W`` padded with inactive columns to the largest k
   (``padded_components``; the models' ``active_components``).

The same runner samples the models whose likelihood reads the rows (the
Student-t pPCA, the mixture of pPCA: :func:`sample_model`), with the rows
as an argument of the compiled programs.

Weak factors. The polar coordinates of FA's ``W`` are singular where two
factor scales meet (their directions turn into each other freely) and at a
zero scale. Near the Ledermann bound the posterior of FA reaches there: a
weak factor moves between the features it explains through states where its
scale meets the next one's, and chains in polar coordinates cross between
those states only rarely (diabetes, standardised, 5 factors: R-hat
1.03-1.09, bulk ESS 38-103). ``W``'s own coordinates have no singularity.
With the default identification, FA is therefore sampled again in them when
the Laplace approximation reaches the singularity (a log gap between scales
with standard deviation above :data:`_DEGENERATE_GAP`) and the polar chains
fail the convergence check that would warn the user or had a divergent
transition; the draws are reported in the polar orientation either way.
There the posterior is constant along the rotations ``W R``, and chains
wander the whole orbit (breast cancer, standardised, FA k = 19: 160-180
degrees from the start, at the tree depth limit of 511 leapfrog steps a
draw); the model's ``gauge`` (:func:`bayespca.models.gauge_log_density`,
about the ML loadings) holds them near one orientation, leaving the
posterior of the invariants exactly as it was (the same fit, seed 2: 127
leapfrog steps a draw instead of 511, 581 s instead of 1,485 on one core,
both passing the check). The gauge depends on ``W``'s orientation alone: it
jumps where ``det(W^T B)`` changes sign, a wall through every ``W`` with a
zero column. Where the polar draws reach a zero scale, the chains in
``W``'s coordinates run without it (wine standardised, FA k = 8 at its
Ledermann bound, seed 2: 63 leapfrog steps a draw, against 1023 gauged),
and where the gauged chains fail the check by more than running on can
mend, they run again without it; the better of the runs is kept; a run with
divergent transitions is not kept over one without that running on could
mend.

A weak last component of pPCA. Where the data leave the last scale ``l_k``
weak, its polar coordinate ``log l_k`` has a long tail towards 0, along
which the component's direction turns ever more freely: a funnel (wine,
standardised, k = 12 = d - 1: R-hat up to 1.022 and ESS 135-390 on the
smallest eigenvalue of ``W W^T`` at 3 seeds of 5). When the polar chains fail
the users' check on that eigenvalue, pPCA is sampled again with the last
column in Cartesian form (:func:`bayespca.models.ppca`'s
``last_column_scale``; same posterior), smooth through 0, and those draws
are kept if they mix better (divergent transitions count first). It is a
second run rather than the first chart: where the last direction roams but
its scale is well determined (n = 1000, d = 20, rank 3, k = 4) the Cartesian
column lies on a thin shell, which NUTS crossed in 127 leapfrog steps a draw
against 15.

After sampling, draws of ``W`` are identified for reporting: ``"polar"``
fixes each column's sign by its inner product with the ML loadings (for FA
after rotating each draw to ``factanal``'s orientation, ``W^T Psi^{-1} W``
diagonal and decreasing: a function of ``W W^T`` and ``Psi``, so identified,
and the orientation of the ML loadings it is compared with),
``"procrustes"`` rotates each draw onto them
(:func:`bayespca.rotations.procrustes`). The horseshoe's triangle on pivoted
anchors (:func:`bayespca.models.pivot_anchors`) leaves each column's sign,
fixed as ``"polar"`` fixes it; with ``"none"`` it aligns draws by signed
permutations of the columns (:meth:`bayespca.priors.Horseshoe.align`,
recorded as ``"signed_permutation"``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer.hmc import hmc
from numpyro.infer.util import ParamInfo, constrain_fn, potential_energy, unconstrain_fn

from bayespca import priors as prior_classes
from bayespca.cache import enable_compilation_cache, release_compiled_programs
from bayespca.convergence import ess_mean
from bayespca.gaussian import LowRankGaussian, canonical_loadings, capacitance_norm
from bayespca.inference import chain_runner, closed_form, laplace, rotated_factor
from bayespca.inference.contract import Draws, Fit, ModelSpec
from bayespca.inference.rotated_factor import RotatedFactor
from bayespca.inference.threads import serial_blas
from bayespca.messages import progress
from bayespca.models import (
    MODELS,
    draws_marginal_log_likelihood,
    identification_for,
    initial_values,
    lower_triangular,
    marginal_log_likelihood,
    pivot_anchors,
)
from bayespca.params import as_key, check_number, check_sampler_options
from bayespca.posterior import shortfall, worst_convergence, worst_of
from bayespca.statistics import (
    PATTERN_MULTIPLE,
    Prepared,
    SufficientStatistics,
    check_representable,
    columns_divided,
    stack_patterns,
)

__all__ = [
    "Chains",
    "align_signs",
    "continue_chains",
    "continue_on",
    "fit_nuts",
    "sample_model",
    "sample_statistics",
]

# Samplers and optimisers compile once per configuration; keep the programs between processes.
enable_compilation_cache()

# Above this many sampled parameters the Hessian (p x p) is not formed.
_MAX_LAPLACE_SIZE = 2000
# A horseshoe loading is sampled centred when its start is this many standard errors from 0. Nearer,
# the horseshoe can still shrink it to 0, a funnel in centred form: at 4, raw iris and standardised
# wine, k = 3 and 4, gave 2-8 divergent transitions in 4 x 500 draws (the entries the draws shrank
# at each one); at 8, none (seeds 0-2).
_CENTRED_AT = 8.0
# Laplace sd of a log gap between FA's polar scales above which chains that fail the convergence
# check run again in W's own coordinates (diabetes and wine, 5 factors or more: 0.32-0.5; the
# well-mixing cells of 4 factors or fewer: at most 0.26).
_DEGENERATE_GAP = 0.3
# Sampled parameters above which, and features from which, pPCA's rotated Laplace factor replaces
# the dense one: below, the dense p x p product is the cheaper (gradient of the sampled density,
# one thread: d=30, k=3, p=124: 187 us dense, 243 us rotated; d=30, k=5, p=186: 242 / 198 us;
# d=50, k=5: 421 / 267 us). Wine (d=13), pPCA k=11 and 12 (p=168, 182): fits 8.6-9.0 s dense,
# 8.1-21.4 s rotated, its many small operations outweighing a 182 x 182 product.
_ROTATED_ABOVE = 160
_ROTATED_FROM_FEATURES = 30
_EXTRA_FIELDS = ("diverging", "num_steps", "potential_energy", "accept_prob", "energy")
# lambda_max(M) (gaussian.capacitance_norm) at the ML point, then at the mode, up to which the
# model's programs leave the precision's refinement out (model option refine_precision=False).
# Without it the log-likelihood's error is about eps * n * lambda_max(M) (n = 1000, 1e4: 2e-9 nats)
# and a gradient's in Psi about eps * lambda_max(M)^2 relative (3e-9 at 9e3; test_gaussian): two
# orders of magnitude of lambda_max(M) to spare before a trajectory would notice (pPCA at 1e9, 300 x 5,
# sampled unrefined: the same posterior of sigma^2, no divergence). On scikit-learn's four data sets
# it is below at the FA modes (their ML points, mostly Heywood cases, search with it) but breast
# cancer's from 15 factors, at every standardised pPCA but breast cancer's k >= 27, and above at raw
# wine's and breast cancer's pPCA from k = 2. The first fit at d=20, k=3: 5.3 -> 4.0 s.
_UNREFINED_BELOW = 1e4


@dataclass(frozen=True)
class _Static:
    """What fixes the code and shapes of the potential (the key of jit's cache).

    ``model`` is a model function of :mod:`bayespca.models` and ``options``
    the keyword arguments that fix its code or shapes, as sorted ``(name,
    value)`` pairs. Everything else (the model's other keyword arguments,
    data or statistics and priors among them, in ``data["kwargs"]``; start;
    preconditioner) travels in the ``data`` pytree. ``layout`` lists the
    ``(name, shape)`` of the unconstrained sites in ravel order.
    """

    model: Callable
    options: tuple
    layout: tuple


def _unravel(static: _Static):
    return ravel_pytree({name: jnp.zeros(shape) for name, shape in static.layout})[1]


def _ravel(sites: dict) -> np.ndarray:
    """The sites as one vector in :func:`_unravel`'s order (``ravel_pytree``'s: sorted names), in NumPy."""
    return np.concatenate([np.ravel(sites[name]) for name in sorted(sites)])


def _model_kwargs(static: _Static, data: dict) -> dict:
    return {**dict(static.options), **data["kwargs"]}


def _potential(static: _Static, data: dict, theta: dict) -> jax.Array:
    """The model's potential energy (negative log joint, Jacobians included) at ``theta``."""
    return potential_energy(static.model, (), _model_kwargs(static, data), theta)


def _times(static: _Static, factor, xi):
    """``S xi`` for each row ``xi``: ``S`` the Laplace factor (dense, or rotated:
    :mod:`bayespca.inference.rotated_factor`), or a vector of scales (diagonal)."""
    if isinstance(factor, RotatedFactor):
        return rotated_factor.apply(static.layout, factor, xi)
    if factor.ndim == 1:
        return xi * factor
    # S xi as a matrix-vector product: written xi @ S^T, the compiled sampler transposed S (a copy
    # of p^2 values) at every gradient, inside the tree's loops where XLA does not hoist it
    # (d=20, k=3: 110 -> 70 us a leapfrog step).
    return (factor @ xi[..., None])[..., 0]


def _adjoint(static: _Static, factor, g):
    """``S^T g`` for each row ``g``: how a gradient in ``theta`` becomes one in ``xi``."""
    if isinstance(factor, RotatedFactor):
        return rotated_factor.apply_transpose(static.layout, factor, g)
    return g @ factor if factor.ndim == 2 else g * factor


def _theta_of(static: _Static, data: dict, xi: jax.Array) -> dict:
    """``theta = centre + S xi`` (``S`` the Laplace factor, or a vector of scales)."""
    return _unravel(static)(data["centre"] + _times(static, data["factor"], xi))


@functools.partial(jax.jit, static_argnums=0)
def _unconstrained(static: _Static, data: dict, values: dict) -> dict:
    """The unconstrained coordinates of the model's sites at ``values`` (``static.layout`` unused).

    Compiled: run eagerly, the model's operations each compiled a small
    program of their own (about a hundred, 2 s in every new process).
    """
    return unconstrain_fn(static.model, (), _model_kwargs(static, data), values)


def _sampler_potential(static: _Static, data: dict):
    return lambda xi: _potential(static, data, _theta_of(static, data, xi))


# LLVM's expensive passes cost a quarter of the compile time of these programs and buy no speed
# measurably (d=20, k=3: compile 3.4 -> 2.5 s, gradient 128 -> 132 us).
_COMPILER_OPTIONS = {"xla_llvm_disable_expensive_passes": True}


@functools.partial(jax.jit, static_argnums=0, compiler_options=_COMPILER_OPTIONS)
def _batch_values_and_gradients(static: _Static, data: dict, points: jax.Array, count: jax.Array):
    """The potential and its gradient in ``theta`` at the first ``count`` rows of ``points``.

    One compiled program per configuration serves every evaluation of the mode search and
    of the chains' starts: ``points`` always has :func:`_batch_rows` rows and the loop runs
    ``count`` times. Called once per point, the gradient's program cost ~0.3 ms of dispatch
    and set-up for ~0.1 ms of arithmetic (breast cancer standardised, FA k=3), and the
    Hessian took ``2 p`` such calls.
    """
    unravel = _unravel(static)
    value_and_grad = jax.value_and_grad(lambda v: _potential(static, data, unravel(v)))

    def body(i, out):
        value, grad = value_and_grad(points[i])
        return out[0].at[i].set(value), out[1].at[i].set(grad)

    return jax.lax.fori_loop(0, count, body, (jnp.zeros(points.shape[0]), jnp.zeros_like(points)))


# Rows of a batch of gradients at most: the dispatch of a call is then under 1% of its arithmetic at
# any size, and a single point (a Newton line search) moves no more than 64 x p values.
_BATCH_ROWS = 64


def _batch_rows(static: _Static) -> int:
    """Rows of :func:`_batch_values_and_gradients`' points: the ``2 p`` of a Hessian, at most 64."""
    return min(2 * sum(int(np.prod(shape)) for _, shape in static.layout), _BATCH_ROWS)


def _values_and_gradients(static: _Static, data: dict, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The potential (m,) and its gradient (m, p) in ``theta`` at each row of ``points`` (m, p), in NumPy."""
    points = np.atleast_2d(np.asarray(points, dtype=float))
    rows = _batch_rows(static)
    values, gradients = [], []
    for start in range(0, points.shape[0], rows):
        chunk = points[start:start + rows]
        padded = np.zeros((rows, points.shape[1]))
        padded[:len(chunk)] = chunk
        value, gradient = _batch_values_and_gradients(static, data, padded, np.int32(len(chunk)))
        values.append(np.asarray(value)[:len(chunk)])
        gradients.append(np.asarray(gradient)[:len(chunk)])
    return np.concatenate(values), np.concatenate(gradients)


def _value_and_gradient(static: _Static, data: dict, point: np.ndarray) -> tuple[float, np.ndarray]:
    values, gradients = _values_and_gradients(static, data, point)
    return float(values[0]), gradients[0]


def _hessian(static: _Static, data: dict, centre: np.ndarray) -> np.ndarray:
    """Hessian of the potential at ``centre`` by central differences of its gradient.

    ``2 p`` gradients in calls of the compiled batch: at d=20, k=3 (p=84)
    the whole costs less than compiling ``jax.hessian`` (about a third of its
    compile time), and its relative error (~1e-10) is far below what a
    preconditioner needs.
    """
    centre = np.asarray(centre, dtype=float)
    steps = 1e-5 * np.maximum(1.0, np.abs(centre))
    shifts = np.diag(steps)
    _, gradients = _values_and_gradients(static, data, np.concatenate([centre + shifts, centre - shifts]))
    p = centre.size
    hessian = (gradients[:p] - gradients[p:]) / (2 * steps[:, None])
    return 0.5 * (hessian + hessian.T)


# Newton's method for the mode: at most this many steps, each at most this long (in theta).
_MODE_MAX_STEPS, _MODE_MAX_STEP_NORM = 50, 3.0


def _mode(static: _Static, data: dict, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mode of the sampled density, by damped Newton from the ML ``start``, and the Hessian there.

    The ML fit is not the mode of the density NUTS samples (priors,
    Jacobians, the polar expansion), and on real data it can be far from
    it: a factor-analysis fit with a Heywood case (``psi_j`` at its floor)
    puts ``log psi_j`` where the Hessian says nothing about the posterior,
    and chains drawn from that Laplace approximation start in a minor mode
    (diabetes, FA k=1: one chain of four 10 nats below the others, R-hat
    1.5). Steps use the Hessian with its eigenvalues replaced by
    ``max(|lambda|, 0.1)`` (saddles and flat directions are left downhill;
    :func:`~bayespca.inference.laplace.modified_eigen`), at most 3 long, with backtracking to
    sufficient decrease.
    """
    x = np.asarray(start, dtype=float)
    value, grad = _value_and_gradient(static, data, x)
    hessian = _hessian(static, data, x)
    for _ in range(_MODE_MAX_STEPS):
        vals, vecs = laplace.modified_eigen(hessian, absolute=True)
        step = -vecs @ ((vecs.T @ grad) / vals)
        step *= min(1.0, _MODE_MAX_STEP_NORM / max(float(np.linalg.norm(step)), 1e-300))
        decrease = -float(grad @ step)
        if not decrease > 1e-8:
            break
        t = 1.0
        while t > 1e-6:
            new_value, new_grad = _value_and_gradient(static, data, x + t * step)
            if np.isfinite(new_value) and new_value <= value - 1e-4 * t * decrease:
                break
            t *= 0.5
        else:
            break
        x, value, grad = x + t * step, new_value, new_grad
        hessian = _hessian(static, data, x)
    return x, hessian


def _best_mode(static: _Static, data: dict, starts: list) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_mode` from each start; the one of highest density, and its Hessian."""
    modes = [_mode(static, data, start) for start in starts]
    values = _values_and_gradients(static, data, np.array([x for x, _ in modes]))[0]
    return modes[int(np.nanargmin(values))]


# An ML noise variance below this fraction of its prior mean marks a Heywood case (FA).
_HEYWOOD_FRACTION = 0.01


def _raised_noise(ml: LowRankGaussian, noise_prior) -> LowRankGaussian | None:
    """The ML fit with each Heywood noise variance raised to its prior mean; None without one.

    A Heywood case (``psi_j`` at its floor) is a maximum of the likelihood on
    the boundary; with the prior, the density there can keep a minor mode
    beside the main one. Measured on breast cancer, standardised, FA k=5:
    Newton from the ML point stopped at ``psi_16 ~ 0.03``, 36 nats of log
    density below the mode at ``psi_16 ~ 0.31``, and chains started there
    stayed (R-hat 1.7). The second start lets :func:`_best_mode` find both.
    """
    try:
        mean = np.broadcast_to(np.asarray(noise_prior.mean, dtype=float), np.shape(ml.noise))
    except NotImplementedError:  # a prior without a mean in closed form (a user's, pushed forward)
        return None
    low = np.isfinite(mean) & (np.asarray(ml.noise) < _HEYWOOD_FRACTION * mean)
    if not low.any():
        return None
    return ml._replace(noise=np.where(low, mean, ml.noise))


def _localized_factor(
    static: _Static, data: dict, hessian: np.ndarray, free: int, centre: np.ndarray
) -> np.ndarray:
    """:func:`~bayespca.inference.laplace.localized_factor` at the mode ``centre``, read off the layout.

    ``free`` columns of ``Z`` lie within the noise (:func:`~bayespca.inference.laplace.free_columns`);
    a Cartesian last column (``last_column_scale``) is left to the Hessian. Without ``Z``, the plain
    :func:`~bayespca.inference.laplace.laplace_factor`.
    """
    offset = _site_offset(static, "Z")
    if offset is None:
        return laplace.laplace_factor(hessian)
    d, width = dict(static.layout)["Z"]
    active = data["kwargs"]["active_components"]
    oriented = width if active is None else int(active)
    if data["kwargs"]["last_column_scale"] is not None:
        oriented -= 1
    index = offset + np.arange(d)[:, None] * width + np.arange(width)  # where Z[i, j] is
    return laplace.localized_factor(hessian, index, np.asarray(centre)[index], oriented, min(free, oriented))


def _site_offset(static: _Static, site: str) -> int | None:
    """Where ``site`` starts in the raveled parameters (``static.layout``'s order); None if absent."""
    offset = 0
    for name, shape in static.layout:
        if name == site:
            return offset
        offset += int(np.prod(shape))
    return None


# Iterations per compiled call: progress is reported between calls, and the number of
# draws is not compiled in (a fit with other num_samples reuses the program).
_CHUNK = 50


def _kernel(static: _Static, settings: tuple, data: dict, z: jax.Array, key: jax.Array):
    """NumPyro's functional NUTS configured for ``settings``, and its initial state at ``z``.

    The sample kernel reads the warm-up schedule the init kernel sets up, so
    both come from one call; where only the kernel is needed the initial
    state goes unused and XLA drops its computation.
    """
    num_warmup, dense_mass, target_accept_prob = settings
    init_kernel, sample_kernel = hmc(potential_fn_gen=functools.partial(_sampler_potential, static))
    state = init_kernel(
        z,
        num_warmup,
        dense_mass=dense_mass,
        target_accept_prob=target_accept_prob,
        trajectory_length=None,  # NUTS: the tree sets the path length
        model_args=(data,),
        rng_key=jax.random.split(key)[0],  # as numpyro's NUTS.init: the same draws as MCMC
    )
    return sample_kernel, state


def _start(static, settings, data, init, key):
    """The initial NUTS state of a chain started at ``init``, a ``ParamInfo`` (point, potential, gradient).

    Given the potential and its gradient, this program holds no copy of the
    model: compiling it costs a fraction of what it did with one (d=20,
    k=3: 1.2 -> 0.35 s), and they come from :func:`_batch_values_and_gradients`,
    compiled for the mode search already.
    """
    return _kernel(static, settings, data, init, key)[1]


def _advance(static, settings, data, state):
    """``_CHUNK`` NUTS transitions (warm-up or sampling: the state's counter decides)."""
    sample_kernel, _ = _kernel(static, settings, data, state.z, state.rng_key)

    def body(state, _):
        state = sample_kernel(state, model_args=(data,))
        stats = tuple(getattr(state, f) for f in _EXTRA_FIELDS)
        return state, (state.z, *stats, state.adapt_state.step_size)

    return jax.lax.scan(body, state, length=_CHUNK)


_JIT = {"static_argnums": (0, 1), "compiler_options": _COMPILER_OPTIONS}
_start_one = jax.jit(_start, **_JIT)
_advance_one = jax.jit(_advance, **_JIT)
_start_all = jax.jit(jax.vmap(_start, in_axes=(None, None, None, 0, 0)), **_JIT)
_advance_all = jax.jit(jax.vmap(_advance, in_axes=(None, None, None, 0)), **_JIT)


@functools.partial(jax.jit, static_argnums=1)
def _chain_seeds(key: jax.Array, num_chains: int):
    """A seed for the chains' starts, and their keys together and one by one.

    One compiled program per number of chains, whatever the model's size
    (the starts are drawn by NumPy from the seed): run eagerly, each of
    these operations compiled a program of its own in every new process.
    """
    key_init, key_run = jax.random.split(key)
    keys = jax.random.split(key_run, num_chains) if num_chains > 1 else key_run[None]
    return jax.random.key_data(key_init), keys, tuple(keys[c] for c in range(num_chains))


def _run_chains(static, settings, data, start, lengths, chain_method, progress_bar, label="NUTS"):
    """Draws of ``xi`` (chain, draw, p), the sampler's statistics (chain, draw) by field, in NumPy,
    and the chains' final states.

    ``start`` is ``(init, keys, chain_keys)``: the initial points (chain, p)
    with their potentials and gradients (:func:`_param_info`) and the keys
    of :func:`_chain_seeds`. ``lengths`` is ``(num_warmup,
    num_samples)``. The chains run as one vectorized program
    (``"vectorized"``), or each as the one-chain program: one after the
    other (``"sequential"``) or several at once on threads (``"parallel"``,
    the same draws). Either way in compiled chunks of ``_CHUNK``
    transitions; the warm-up's are dropped.
    """
    init, keys, chain_keys = start
    num_chains = init.z.shape[0]
    num_warmup, num_samples = lengths
    chunks = -(-(num_warmup + num_samples) // _CHUNK)
    if chain_method == "vectorized":
        states = _start_all(static, settings, data, init, keys)
    else:
        states = [_start_one(static, settings, data, jax.tree.map(lambda a, c=c: a[c], init), chain_keys[c])
                  for c in range(num_chains)]
    out, states = _advanced(static, settings, data, states, chunks, chain_method, progress_bar, label)
    xi, extra = _kept(out, num_warmup, num_samples)
    return xi, extra, states


def _advanced(static, settings, data, states, chunks, chain_method, progress_bar, label):
    """``chunks`` compiled chunks of transitions from ``states`` (one batched state where
    ``"vectorized"``, else one per chain): their outputs (chain, draw, ...) and the final states.
    The progress bar, ``label``, counts every transition of every chain."""
    num_chains = len(states) if isinstance(states, list) else states.z.shape[0]
    bar = progress(progress_bar, total=num_chains * chunks * _CHUNK, desc=label, unit="it")
    with chain_runner.Interrupt() as interrupt, bar if bar is not None else contextlib.nullcontext():
        if chain_method == "vectorized":
            advance = functools.partial(_advance_all, static, settings, data)
            done = chain_runner.in_chunks(advance, states, chunks, 1, bar, interrupt)
        else:
            workers = 1 if chain_method == "sequential" else min(len(states), chain_runner.usable_cpus())
            advance = functools.partial(_advance_one, static, settings, data)
            runs = chain_runner.on_threads(advance, states, chunks, bar, workers, interrupt)
        interrupt.raise_if_seen()
    if chain_method == "vectorized":
        return done
    return jax.tree.map(lambda *a: np.stack(a), *(out for out, _ in runs)), [state for _, state in runs]


def _kept(out: tuple, skip: int, count: int, step: int = 1) -> tuple[np.ndarray, dict]:
    """``xi`` and the statistics by field of ``count`` transitions after the first ``skip``, every
    ``step``-th (the ``step``-th, ``2 step``-th, ...); ``diverging`` says whether any of the ``step``
    transitions each draw ends diverged, so that thinning hides no divergence."""
    xi, *extra = (a[:, skip + step - 1:skip + step * count:step] for a in out)
    fields = dict(zip((*_EXTRA_FIELDS, "step_size"), extra, strict=True))
    every = out[1 + _EXTRA_FIELDS.index("diverging")][:, skip:skip + step * count]
    fields["diverging"] = every.reshape(every.shape[0], count, step).any(axis=-1)
    return xi, fields


# The progress bar of a second run, which the first run's chains failing the users' check started.
_AGAIN = "NUTS again, check failed: "


# The sites of pPCA and FA that fit_nuts reads back (not the coordinates of W).
_KEPT_SITES = ("W", "sigma", "psi", "mu", "alpha", "kappa")


@functools.partial(jax.jit, static_argnums=(0, 3))
def _constrained_draws(static: _Static, data: dict, xi: jax.Array, kept: tuple | None) -> dict:
    """The model's sites named in ``kept`` (None: all, deterministic ones included) at each row of ``xi``."""
    kwargs = _model_kwargs(static, data)

    def one(x):
        values = constrain_fn(static.model, (), kwargs, _theta_of(static, data, x), return_deterministic=True)
        return {name: v for name, v in values.items() if kept is None or name in kept}

    return jax.lax.map(one, xi)


def _param_info(static: _Static, data: dict, xi: np.ndarray) -> ParamInfo:
    """Each chain's start ``xi`` (chain, p) with the sampled potential and its gradient in ``xi`` there.

    The potential of ``xi`` is the model's at ``theta = centre + S xi``
    (a linear map: no Jacobian), and its gradient is ``S^T`` times the
    model's gradient in ``theta``.
    """
    factor = data["factor"]
    model_data = {"kwargs": data["kwargs"]}  # as the mode search had it: the same compiled program
    values, gradients = _values_and_gradients(static, model_data, data["centre"] + _times(static, factor, xi))
    return ParamInfo(xi, values, _adjoint(static, factor, gradients))


@dataclass(frozen=True)
class Chains:
    """Where the chains of a NUTS fit stopped, and what turns further draws into a fit.

    ``static``, ``data`` and ``settings`` are the sampler's configuration
    (compiled in), its arguments and its settings (:func:`_settings`);
    ``states`` NumPyro's state of each chain (one batched state where
    ``chain_method`` is ``"vectorized"``). :func:`fit_nuts` adds how it
    reports draws: ``report`` (:func:`_draws`), the sampling ``units``
    (per feature, or None), the statistics in working units, the
    ``prepared`` data and the model's ``spec``; ``own_metric`` says the
    sampler whitens by a metric corrected by the chains' own draws
    (:func:`_with_pilot_metric`) rather than the Laplace fit. :func:`continue_chains` runs the chains on
    from here, :func:`continue_on` on other rows. :func:`sample_model` sets ``to_draws``, which turns its
    model's sites and the statistics (chain, draw, ...) into draws, in place of ``report``.
    """

    static: _Static
    data: dict
    settings: tuple
    chain_method: str
    states: Any
    report: tuple = ()
    units: np.ndarray | None = None
    stats: Any = None
    prepared: Prepared | None = None
    spec: ModelSpec | None = None
    own_metric: bool = False
    to_draws: Callable | None = None

    @property
    def target_accept_prob(self) -> float:
        """The acceptance rate the chains' step sizes were adapted to."""
        return self.settings[2]


def _sample(static: _Static, data: dict, run: tuple, key: jax.Array, init_scale: float, kept: tuple | None,
            search: _Static | None = None, label: str = "NUTS"):
    """Constrained draws (chain * draw, ...), sampler statistics, the :class:`Chains` and the draws of
    ``xi`` (chain, draw, p), chains started around the centre.

    ``run`` is ``(num_warmup, num_samples, num_chains, chain_method,
    target_accept_prob, dense_mass, progress_bar)``; each chain starts at
    ``init_scale`` times a standard normal draw in the whitened coordinates
    (1: a draw of the Laplace approximation), its potential and gradient
    from the mode search's program (``search``, default ``static``).
    """
    num_warmup, num_samples, num_chains, chain_method, target_accept_prob, dense_mass, progress_bar = run
    settings = _settings(run)
    lengths = (int(num_warmup), int(num_samples))
    size = data["centre"].size
    seed, keys, chain_keys = _chain_seeds(key, num_chains)
    normal = np.random.default_rng(np.asarray(seed)).standard_normal((num_chains, size))
    start = (_param_info(search or static, data, init_scale * normal), keys, chain_keys)
    xi, extra, states = _run_chains(static, settings, data, start, lengths, chain_method, progress_bar, label)
    sites = _constrained_draws(static, data, xi.reshape(-1, size), kept)
    # The arguments as they are now: a later run of the same fit sets some of them anew.
    arguments = {**data, "kwargs": dict(data["kwargs"])}
    chains = Chains(static, arguments, settings, chain_method, states)
    return jax.tree.map(np.asarray, sites), sample_statistics(extra), chains, np.asarray(xi)


def _settings(run: tuple) -> tuple:
    """The sampler's compiled-in settings ``(num_warmup, dense_mass, target_accept_prob)`` from ``run``."""
    return int(run[0]), bool(run[5]), float(run[4])


def _compile_ahead(run: tuple, key: jax.Array, kept: tuple | None, static: _Static, data: dict):
    """Start compiling the mode search's and the chains' programs for ``static`` on threads; a callable
    that finishes, or None.

    The mode search and the Laplace factor fill ``data`` with values of known shapes (a
    dense factor: :func:`_may_rotate` false), so the two largest programs of a fit, the
    mode search's gradients and the chains' transitions, can compile from the shapes. Only
    XLA's compilations run on the threads: the models are traced here, on the calling thread
    (NumPyro's effect handlers are one stack per process), the transitions' while the
    gradients' program compiles; this returns once that one is compiled, for the mode
    search that follows. The callable returned, called once the mode search is done,
    compiles the smaller programs that follow it (the chains' start and seeds, the draws'
    sites ``kept``) on the calling thread, idle until then, and waits for the transitions'.
    XLA's compilations share the CPU, so running them side by side gains less than their
    time; what it gains is the cores left idle while a model is traced (d=20, k=3, first
    fit on 2 cores, 21 runs alternating with the mode search's program compiled on the
    calling thread: median difference -0.16 s of ~5 s). None where the shapes are not known
    ahead (vectorized chains, a rotated factor possible).
    """
    size = sum(int(np.prod(shape)) for _, shape in static.layout)
    if run[3] == "vectorized" or _may_rotate(size, data["kwargs"].get("suff_stats")):
        return None
    settings = _settings(run)
    vector = jax.ShapeDtypeStruct((size,), jnp.float64)
    matrix = jax.ShapeDtypeStruct((size, size), jnp.float64)
    shapes = {"kwargs": data["kwargs"], "centre": vector, "factor": matrix}
    init = ParamInfo(vector, jax.ShapeDtypeStruct((), jnp.float64), vector)
    chain_key = jax.ShapeDtypeStruct(key.shape, key.dtype)
    executor = concurrent.futures.ThreadPoolExecutor(2)
    points = jax.ShapeDtypeStruct((_batch_rows(static), size), jnp.float64)
    search = _batch_values_and_gradients.lower(static, {"kwargs": data["kwargs"]}, points, np.int32(0))
    searching = executor.submit(search.compile)
    state = jax.eval_shape(functools.partial(_start, static, settings), shapes, init, chain_key)
    future = executor.submit(_advance_one.lower(static, settings, shapes, state).compile)
    executor.shutdown(wait=False)
    concurrent.futures.wait([searching])

    def finish():
        _start_one.lower(static, settings, shapes, init, chain_key).compile()
        _chain_seeds(key, run[2])
        draws = jax.ShapeDtypeStruct((run[1] * run[2], size), jnp.float64)
        _constrained_draws.lower(static, shapes, draws, kept).compile()
        concurrent.futures.wait([future])  # a failure there is met again, and raised, where it runs

    return finish


def sample_model(
    model: Callable,
    options: dict,
    kwargs: dict,
    start: dict,
    to_draws: Callable,
    *,
    log_lik: Callable | None = None,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    chain_method: str = "parallel",
    target_accept_prob: float = 0.9,
    random_state: Any = None,
    progress_bar: bool | None = None,
) -> Draws:
    """Draw from the posterior of ``model(**options, **kwargs)`` with the runner of :func:`fit_nuts`.

    For the models whose likelihood needs the rows (:func:`bayespca.models.robust_ppca`,
    :func:`~bayespca.models.mixture_ppca`): Newton from ``start`` to the
    mode, NUTS in the Laplace-whitened coordinates ``theta = theta_0 + S
    xi`` there (``S S^T`` the inverse Hessian of the potential, eigenvalues
    floored: :func:`~bayespca.inference.laplace.laplace_factor`), each chain started at a draw of that
    approximation. Compiled once per ``(model, options)`` and shapes: a fit
    of new rows of the same shape reuses the programs. Chains that fail the
    users' check (:func:`bayespca.posterior.diagnose`, on R-hat and ESS of
    the draws' invariants and ``log_lik``) by a shortfall within reach run
    on, as :func:`fit_nuts`'s do (:func:`_lengthened`).

    Parameters
    ----------
    model : callable
        A module-level NumPyro model function taking keyword arguments only.
    options : dict
        Its keyword arguments that fix code or shapes (hashable values:
        ``n_components``, ``identification``, ``has_missing``, ...).
    kwargs : dict
        Its other keyword arguments, pytrees of arrays (``X``, ``prior``, ...).
    start : dict
        Constrained values of every latent site (e.g. the ML point).
    to_draws : callable
        ``to_draws(sites, sample_stats)``: the model's draws from every sample
        and deterministic site (leading dims (chain, draw)) and the statistics
        of :func:`sample_statistics`, in the units of the check.
    log_lik : callable, optional
        ``log_lik(draws)``: the total log-likelihood of each draw (chain, draw), which the check
        takes in as :func:`bayespca.posterior.diagnose` does (None: the check without it).
    num_warmup, num_samples, num_chains, chain_method, target_accept_prob, random_state, progress_bar
        As in :func:`fit_nuts`.

    Returns
    -------
    Draws
        What ``to_draws`` made of the draws kept (``thinning`` where the chains ran on).
    """
    check_sampler_options(num_warmup, num_samples, num_chains, chain_method, target_accept_prob)
    release_compiled_programs()
    options = tuple(sorted(options.items()))
    data = {"kwargs": kwargs}
    theta = _unconstrained(_Static(model, options, ()), data, start)
    theta = {name: np.asarray(v, dtype=float) for name, v in sorted(theta.items())}
    static = _Static(model, options, tuple((name, v.shape) for name, v in theta.items()))
    run = (num_warmup, num_samples, num_chains, chain_method, target_accept_prob, False, progress_bar)
    key = as_key(random_state)
    finish_compiling = _compile_ahead(run, key, None, static, data)
    data["centre"], hessian = _best_mode(static, data, [_ravel(theta)])
    data["factor"] = laplace.laplace_factor(hessian)
    if finish_compiling is not None:
        finish_compiling()
    sites, stats, chains, _ = _sample(static, data, run, key, 1.0, None)
    shape = (int(num_chains), int(num_samples))
    draws = to_draws({name: v.reshape(*shape, *v.shape[1:]) for name, v in sites.items()}, stats)
    short = functools.partial(_shortfall, check=_Check(log_lik))
    draws, _ = _lengthened(draws, replace(chains, to_draws=to_draws), short, progress_bar)
    return draws


def _rough_scales(start: dict, n: int, variances: np.ndarray) -> np.ndarray:
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
        scales[name] = np.broadcast_to(np.asarray(s, dtype=float), value.shape)
    return _ravel(scales)


def _identify(w: np.ndarray, reference: np.ndarray, identification: str, psi: Any = None) -> np.ndarray:
    """Post-hoc alignment of draws ``w`` (m, d, k) to the reference loadings.

    With FA's ``psi`` (m, d) and ``"polar"``, each draw is first rotated to
    ``Psi^{1/2} U S`` from the SVD ``Psi^{-1/2} W = U S V^T`` (``factanal``'s
    orientation, that of :func:`bayespca.gaussian.canonical_loadings`).
    """
    if identification == "procrustes":
        from bayespca.rotations import procrustes

        return procrustes(w, reference)[0]
    if identification == "polar":
        if psi is not None:
            sd = np.sqrt(psi)[:, :, None]
            u, s, _ = np.linalg.svd(w / sd, full_matrices=False)
            w = sd * (u * s[:, None, :])
        return align_signs(w, reference)
    return w


def align_signs(w: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Flip each column of each draw ``w`` (..., d, k) to a positive inner product with ``reference``.

    The polar identification orders the columns of ``W`` by norm; only
    their signs are left free, and this fixes them.

    Examples
    --------
    >>> align_signs(np.array([[[-1.0], [-2.0]]]), np.array([[1.0], [1.0]]))[0].ravel().tolist()
    [1.0, 2.0]
    """
    signs = np.where(np.einsum("...dk,dk->...k", w, reference) < 0, -1.0, 1.0)
    return w * signs[..., None, :]


def sample_statistics(extra: dict) -> dict:
    """The sampler statistics that :class:`~bayespca.inference.contract.Draws` records, (chain, draw).

    From NumPyro's extra fields ``diverging``, ``num_steps``,
    ``potential_energy``, ``accept_prob``, ``energy`` and ``step_size``:
    ``diverging``, ``n_steps``, ``tree_depth`` (``ceil(log2(n_steps + 1))``),
    ``lp`` (minus the potential), ``acceptance_rate``, ``energy``, ``step_size``.
    """
    n_steps = np.asarray(extra["num_steps"]).astype(int)
    return {
        "diverging": np.asarray(extra["diverging"]).astype(bool),
        "n_steps": n_steps,
        "tree_depth": np.ceil(np.log2(n_steps + 1)).astype(int),
        "lp": -np.asarray(extra["potential_energy"]),
        "acceptance_rate": np.asarray(extra["accept_prob"]),
        "energy": np.asarray(extra["energy"]),
        "step_size": np.asarray(extra["step_size"]),
    }


def _sampler_statistics(prepared: Prepared) -> Any:
    """The statistics the potential reads: complete, rows (many patterns), or patterns stacked."""
    if prepared.missing is None:
        return prepared.stats
    patterns = prepared.patterns
    return patterns if patterns.X is not None else stack_patterns(patterns, PATTERN_MULTIPLE)


def _sampling_units(spec: ModelSpec, prepared: Prepared, stats: Any, fixed_units: np.ndarray | None = None):
    """Per-feature units FA samples in, and the statistics, data scales, priors and loadings prior there.

    FA with loadings priors stated per feature (the default, flat) is
    equivariant under rescaling each feature: its posterior in units of
    ``u_j`` (the power of two nearest the sd of feature ``j``) is the
    data's, mapped. The mode search and the Laplace factor are not (steps
    capped in length, eigenvalues floored at a fraction of the largest): on
    breast cancer, raw (feature variances from 7e-6 to 3e5), FA k=5 chains
    stayed apart (R-hat 1.5-1.7, bulk ESS 6-7) where the same data in
    feature units mix (R-hat 1.007, ESS 1138). pPCA (not equivariant) and
    the other loadings priors keep the working units: ``units`` None.
    ``fixed_units``: those of an earlier fit instead (:func:`continue_on`).

    The priors are ``spec.prior`` in the working units of ``prepared``, with the noise prior
    resolved once: FA's default takes an eigendecomposition (d x d) of the data that the model
    would otherwise repeat at every gradient. The loadings prior is returned resolved.

    Returns
    -------
    units, stats, priors, scales, loadings
    """
    noise, d = spec.noise, prepared.d
    priors = prior_classes.to_units(prior_classes.as_priors(spec.prior), noise, prepared.scale)
    if isinstance(priors.loadings, prior_classes.Horseshoe):
        priors.loadings.check(d)
    units = None
    scales, resolved = prior_classes.resolve_at_data(priors, noise, suff_stats=stats, n_features=d)
    per_feature = (type(None), prior_classes.Normal, prior_classes.Flat)
    if noise == "diagonal" and isinstance(priors.loadings, per_feature):
        units = np.exp2(np.round(np.log2(np.asarray(scales.sd, dtype=float))))
        units = units if fixed_units is None else fixed_units
        stats = columns_divided(stats, units)
        priors = prior_classes.to_units(priors, noise, units)
        scales, resolved = prior_classes.resolve_at_data(priors, noise, suff_stats=stats, n_features=d)
    loadings = jax.tree.map(np.asarray, resolved.loadings)
    return units, stats, priors._replace(noise=resolved.noise), scales, loadings


def _ml_start(prepared: Prepared, spec: ModelSpec, units: np.ndarray | None) -> LowRankGaussian:
    """The maximum-likelihood fit in sampling units (working or per feature): where chains start."""
    ml_spec = ModelSpec(spec.noise, spec.n_components)
    if spec.noise == "isotropic":
        closed_form.check_rows_leave_noise(prepared, spec.n_components)
    from bayespca.inference.em import fit_em

    complete = spec.noise == "isotropic" and prepared.missing is None
    fitter = closed_form.ppca_closed_form if complete else fit_em
    # What the ML fit says of itself (sigma^2 = 0 held at its floor at k = d, EM stopped early) is not
    # the posterior's to report; the sampler's diagnostics are.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fit = fitter(prepared, ml_spec)
    s = np.asarray(prepared.scale if units is None else prepared.scale * units)
    rows = s[:, None] if s.ndim else s
    g = fit.gaussian
    return LowRankGaussian(np.asarray(g.loadings) / rows, np.asarray(g.noise) / s**2, np.asarray(g.mean) / s)


def fit_nuts(
    prepared: Prepared,
    spec: ModelSpec,
    *,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    chain_method: str = "parallel",
    target_accept_prob: float = 0.9,
    dense_mass: bool = False,
    random_state: Any = None,
    progress_bar: bool | None = None,
    padded_components: int | None = None,
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
    chain_method : {"parallel", "sequential", "vectorized"}, default="parallel"
        ``"parallel"``: each chain runs the one-chain program, on threads,
        as many chains at once as the process has CPUs (XLA runs outside
        the GIL); ``"sequential"``: the same programs one after the other,
        the same draws; ``"vectorized"``: one program for all chains
        (``jax.vmap``), every transition waiting for the chains' longest
        trajectory (the choice on a GPU). The one-chain program compiles in
        half the time (d=20, k=3: 1.6 s against 3.1 s, tracing included).
        Measured on 2 cores, warm, 4 x (500 + 500), parallel / vectorized /
        sequential: pPCA n=1000, d=20, k=3 2.2 / 2.0 / 3.4 s; FA 2.5 / 2.5 /
        4.2 s; pPCA n=2000, d=50, k=5 27 / 34 / 45 s.
    target_accept_prob : float, default=0.9
    dense_mass : bool, default=False
        Adapt a dense mass matrix. The Laplace whitening already removes the
        posterior correlations, so a diagonal mass suffices (measured at
        n=1000, d=20, k=3: 15 leapfrog steps per draw either way, but a dense
        warm-up takes ~20x more leapfrog steps, its first windows estimating
        an 84 x 84 covariance from 25 draws).
    random_state : None, int, numpy Generator or RandomState
    progress_bar : bool or None, default=None
        A progress bar over the transitions; None shows it in a terminal or
        a notebook only. Chains that fail the check and run again show a
        second bar, "NUTS again, check failed: ..." with what changes, and
        chains that run on (:func:`_lengthened`) "NUTS on, check failed: t
        transitions a draw".
    padded_components : int or None, default=None
        Sample ``W`` with this many columns (at least ``n_components``), the
        last ones inactive (the model's ``active_components``): the same
        posterior, and one compiled sampler for every ``k`` up to it. Used
        with the polar identification and the default or flat loadings
        prior only (elsewhere each ``k`` compiles its own).

    Returns
    -------
    Fit
        In data units: ``draws`` (chain, draw, ...) with sampler statistics
        ``diverging``, ``n_steps``, ``tree_depth``, ``lp``,
        ``acceptance_rate``, ``energy``, ``step_size``; ``gaussian`` the
        posterior mean of ``(W, Psi, mu)``; ``log_likelihood`` there;
        ``converged`` False when a transition diverged. ``num_samples`` draws
        a chain, each the last of ``draws.thinning`` transitions (1, or 2-4
        where the chains ran on: :func:`_lengthened`).

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
    check_sampler_options(num_warmup, num_samples, num_chains, chain_method, target_accept_prob, dense_mass)
    release_compiled_programs()
    key = as_key(random_state)
    n, d, k, noise = prepared.n, prepared.d, spec.n_components, spec.noise
    check_number(padded_components, "padded_components", integer=True, low=k, high=d, allow_none=True)
    working_stats = _sampler_statistics(prepared)
    units, stats, priors, scales, loadings = _sampling_units(spec, prepared, working_stats)
    identification = identification_for(spec.identification, noise, loadings)

    ml = _ml_start(prepared, spec, units)
    reference_w, reparam, anchors = _reference(ml, (identification, spec.anchors), loadings, noise, n)
    start_point = LowRankGaussian(reference_w, np.asarray(ml.noise), np.asarray(ml.mean))
    # D of FA's polar map: the features' sds, as the model computes them from the same statistics.
    row_scale = np.asarray(scales.sd) if noise == "diagonal" else None
    data = {"kwargs": {"prior": priors, "suff_stats": stats, "reparam": reparam, "last_column_scale": None,
                       "gauge": None}}
    start = (start_point, ml, row_scale, n, prepared.variances / (1.0 if units is None else units**2))
    columns = _columns(padded_components, k, identification, loadings)
    run = (num_warmup, num_samples, num_chains, chain_method, target_accept_prob, dense_mass, progress_bar)
    ahead = functools.partial(_compile_ahead, run, key, _KEPT_SITES)
    search, static, init_scale = _preconditioned(
        noise, columns, identification, loadings, data, start, ahead, anchors
    )
    sampling = (run, (identification, reference_w, start_point, noise, k, anchors))
    check = _Check(functools.partial(_log_likelihood, stats=stats), units)
    draws, chains, xi = _run(static, data, sampling, key, init_scale, search)
    if spec.identification is None and noise == "diagonal" and _near_degenerate(static, data, loadings):
        if not _chains_agree(draws, check) or draws.sample_stats["diverging"].any():
            again = jax.random.fold_in(key, 1)
            in_w = _in_ws_coordinates(data, start, sampling, again, check, loadings, draws)
            draws, chains, xi = _better((draws, chains, xi), in_w, check)
    elif _last_scale_stuck(draws, identification, noise, k, loadings, reparam):
        # Unpadded (the chart needs the last column active): a padded fit compiles a sampler of its own.
        data["kwargs"]["last_column_scale"] = _last_scale(start_point)
        search, static, init_scale = _preconditioned(noise, (k, None), identification, loadings, data, start)
        again = jax.random.fold_in(key, 1)
        cartesian = _run(static, data, sampling, again, init_scale, search, _AGAIN + "Cartesian column")
        draws, chains, xi = _better((draws, chains, xi), cartesian, check)
    free = laplace.free_columns(ml, n)
    draws, chains = _run_again((draws, chains, xi), sampling, key, check, loadings, free)
    short = functools.partial(_shortfall, check=check)
    draws, chains = _run_on((draws, chains), sampling, key, (check, free, short), progress_bar)
    if units is not None:
        draws = draws.to_data_units(units)
    chains = replace(chains, units=units, stats=working_stats, prepared=prepared, spec=spec)
    fit = _posterior_fit(draws, working_stats, n, chains)
    return fit.to_data_units(prepared.scale, prepared.total_observed)


def continue_chains(chains: Chains, draws: Draws, num_samples: int, progress_bar: bool | None = None) -> Fit:
    """Run the chains of a :func:`fit_nuts` fit ``num_samples`` transitions further: the fit of all its draws.

    The chains go on from their last states with the step size and mass
    matrix their warm-up adapted (no new warm-up, and the compiled sampler is
    the fit's), so the draws continue the same Markov chains: a fit of
    ``num_samples=m`` continued by ``n`` gives the draws of one of ``m + n``
    where ``num_warmup + m`` is a multiple of the compiled chunk, 50
    transitions (otherwise the chains resume after that chunk's end), and
    neither fit kept a second run (:func:`_run_again`, or another chart)
    nor ran its chains longer. Where the fit kept every ``t``-th draw
    (``draws.thinning``, :func:`_lengthened`), so does the run on:
    ``t num_samples`` transitions a chain.

    Parameters
    ----------
    chains : Chains
        ``Fit.details`` of the fit (or of an earlier continuation).
    draws : Draws
        Its draws, in data units (``Fit.draws``).
    num_samples : int
        Transitions to add to each chain.
    progress_bar : bool or None, default=None
        As in :func:`fit_nuts`.

    Returns
    -------
    Fit
        As :func:`fit_nuts` returns it, from ``draws`` followed by the new draws
        (chain, draw, ...), and the chains where they now stop.

    Examples
    --------
    Factor analysis of noise, 2 chains of 50 warm-up draws and 50 + 50 kept, against 100 kept at once:

    >>> from bayespca.statistics import prepare
    >>> data, spec = prepare(np.random.default_rng(1).normal(size=(150, 4))), ModelSpec("diagonal", 1)
    >>> run = {"num_warmup": 50, "num_chains": 2, "random_state": 3}
    >>> part = fit_nuts(data, spec, num_samples=50, **run)
    >>> both = continue_chains(part.details, part.draws, 50)
    >>> once = fit_nuts(data, spec, num_samples=100, **run)
    >>> both.draws.noise.shape, bool(np.array_equal(both.draws.noise, once.draws.noise))
    ((2, 100, 4), True)
    """
    check_number(num_samples, "num_samples", integer=True, low=1)
    prepared = chains.prepared
    new, states = _transitions(chains, chains.data, (0, int(num_samples), draws.thinning), progress_bar)
    # Back to working units: exact, the scale being a power of two.
    joined = draws.to_data_units(1.0 / prepared.scale).extended(new)
    fit = _posterior_fit(joined, chains.stats, prepared.n, replace(chains, states=states))
    return fit.to_data_units(prepared.scale, prepared.total_observed)


# Transitions a chain makes on new rows before its draws are kept (:func:`continue_on`): its state,
# a draw of the posterior given the fit's rows, is near the new posterior's bulk, which the chains
# reach in a few transitions (bulk ESS 0.1-0.5 a draw at the defaults on the real datasets).
_BURN = 2 * _CHUNK


def continue_on(chains: Chains, rows: np.ndarray, num_samples: int, progress_bar: bool | None = None) -> Fit:
    """The posterior given other complete ``rows``, sampled by the chains of a :func:`fit_nuts` fit.

    The posterior a new fit to ``rows`` samples: the sufficient statistics
    ``(n, mean, scatter)`` are those of ``rows``, and the priors that read
    the data's scales are resolved from them (as a fit would, the rows
    checked as a fit checks them). What stays the fit's is how ``W`` is
    reported (the identification's reference and anchors) and sampled: the
    coordinates are whitened again (:func:`_whitened_again`), so each
    chain's state, a draw about standard normal in those coordinates, stays
    typical, and its adapted step size and mass matrix fit. Each chain then
    goes on in the fit's compiled sampler, with no warm-up: the first
    ``_BURN`` = 100 transitions are dropped, then ``num_samples`` kept. A
    new posterior close to the fit's, as for its rows less one or a few
    (exact leave-one-out, K-fold refits), costs a third to a half of a new
    fit (``benchmarks/bench_compare.py --refits``: standardised wine, pPCA
    k = 4, 0.38 s against 0.84 s; diabetes FA k = 5, 2.3 s against 7.4 s).

    Parameters
    ----------
    chains : Chains
        ``Fit.details`` of a fit of complete data (no missing values) whose
        sampler whitens by a dense factor (a ``ValueError`` otherwise: large
        pPCA's rotated factor and the diagonal ones have no rotation to align).
    rows : ndarray of shape (m, d)
        Complete rows in data units (m >= 2).
    num_samples : int
        Draws to keep per chain.
    progress_bar : bool or None, default=None
        As in :func:`fit_nuts`.

    Returns
    -------
    Fit
        As :func:`fit_nuts` returns it, for ``rows``; its ``details`` are the chains moved on.

    Examples
    --------
    pPCA of 200 rows, then its chains on the first 100:

    >>> from bayespca.statistics import prepare
    >>> X = np.random.default_rng(0).normal(size=(200, 1)) @ [[2.0, 1.0, -1.0]]
    >>> X += np.random.default_rng(1).normal(size=(200, 3))
    >>> spec = ModelSpec("isotropic", 1)
    >>> fit = fit_nuts(prepare(X), spec, num_warmup=100, num_samples=100, num_chains=2, random_state=0)
    >>> half = continue_on(fit.details, X[:100], 100)
    >>> half.draws.noise.shape, half.details.prepared.n
    ((2, 100, 3), 100)
    """
    check_number(num_samples, "num_samples", integer=True, low=1)
    if chains.prepared.missing is not None or not _is_dense(chains.data["factor"]):
        raise ValueError(
            "Continuing the chains on other rows needs a fit of complete data whose sampler whitens by a "
            "dense Laplace factor; this fit " + ("had missing values" if chains.prepared.missing is not None
                                                 else "whitens by a rotated or diagonal factor")
            + ". Fit the estimator to the new rows instead."
        )
    spec, prepared = chains.spec, Prepared(rows, None, chains.prepared.scale, chains.prepared.feature_names)
    check_representable(rows, None, prepared.scale)
    if spec.noise == "isotropic":  # as a fit refuses them: the posterior is improper
        closed_form.check_rows_leave_noise(prepared, spec.n_components)
    working = _sampler_statistics(prepared)
    _, stats, priors, _, _ = _sampling_units(spec, prepared, working, chains.units)
    data = {**chains.data, "kwargs": {**chains.data["kwargs"], "suff_stats": stats, "prior": priors}}
    data["centre"], data["factor"] = _whitened_again(chains, data["kwargs"], prepared.n)
    states = _with_potential(chains.static, data, chains.states)
    lengths = (_BURN, int(num_samples))
    draws, states = _transitions(replace(chains, states=states), data, lengths, progress_bar)
    moved = replace(chains, data=data, states=states, stats=working, prepared=prepared)
    fit = _posterior_fit(draws, working, prepared.n, moved)
    return fit.to_data_units(prepared.scale, prepared.total_observed)


def _with_potential(static: _Static, data: dict, states: Any) -> Any:
    """``states`` with the potential and gradient of ``data`` at their points.

    A state caches those of the data it was made with, from which NUTS
    measures the next trajectory's energy: kept for other data, a chain whose
    cached potential is far below the new one rejects every move and never
    recomputes it (wine, pPCA k = 3, refit on 120 of 178 rows: acceptance 0).
    """
    batched = not isinstance(states, list)
    info = _param_info(static, data, _positions(states))

    def moved(state, potential, gradient):
        energy = state.energy - state.potential_energy + potential
        return state._replace(potential_energy=potential, z_grad=gradient, energy=energy)

    if batched:
        return moved(states, info.potential_energy, info.z_grad)
    return [moved(s, info.potential_energy[c], info.z_grad[c]) for c, s in enumerate(states)]


def _positions(states: Any) -> np.ndarray:
    """The whitened points ``xi`` (chain, p) where the chains' ``states`` stand (a list of states, or one
    batched state)."""
    return np.asarray([s.z for s in states] if isinstance(states, list) else states.z)


def _whitened_again(chains: Chains, kwargs: dict, n: int) -> tuple:
    """The centre and dense factor of the sampled coordinates for the model arguments ``kwargs``.

    The chains' states live in the whitened coordinates ``xi``, where either
    posterior is about standard normal: re-whitened for the new rows, their
    states stay typical and their step sizes and mass matrices fit, provided
    each coordinate keeps its direction. The mode is searched from the
    fit's centre. A Laplace factor ``L`` (``L L^T`` the covariance) is one of
    ``L Q`` for any orthogonal ``Q``, and the eigenvectors that build it flip
    and swap between nearby Hessians (wine, pPCA k = 4, one row left out:
    acceptance 0.91 -> 0.00 unaligned), so ``Q`` is the orthogonal
    Procrustes solution nearest the fit's factor. A fit that kept the chains'
    own metric (it mixed better than the Laplace one) keeps it, moved with
    the mode.
    """
    static, old = chains.static, chains.data
    with serial_blas(0):  # as at the fit: the same draws on any number of cores
        mode, hessian = _best_mode(static, {"kwargs": kwargs}, [old["centre"]])
        if chains.own_metric:
            before, _ = _best_mode(static, {"kwargs": old["kwargs"]}, [old["centre"]])
            return old["centre"] + (mode - before), old["factor"]
        free = laplace.free_columns(chains.report[2], n)
        factor = _localized_factor(static, {"kwargs": kwargs}, hessian, free, mode)
        u, _, vt = np.linalg.svd(factor.T @ old["factor"])
        return mode, factor @ (u @ vt)


def _transitions(chains: Chains, data: dict, lengths: tuple, progress_bar: bool | None,
                 label: str = "NUTS") -> tuple:
    """``count`` draws (working units) after ``skip`` more transitions of ``chains`` on ``data``, each
    the last of ``thinning`` transitions, and the states the chains stop in; ``lengths`` is ``(skip,
    count)`` or ``(skip, count, thinning)`` (default 1). The draws are ``chains.to_draws``' of every
    site where it is set (:func:`sample_model`), else the Gaussian models' (:func:`_draws`)."""
    release_compiled_programs()
    skip, count, thinning = (*lengths, 1)[:3]
    chunks = -(-(skip + thinning * count) // _CHUNK)
    static = chains.static
    out, states = _advanced(static, chains.settings, data, chains.states, chunks, chains.chain_method,
                            progress_bar, label)
    xi, extra = _kept(out, skip, count, thinning)
    kept = _KEPT_SITES if chains.to_draws is None else None
    sites = jax.tree.map(np.asarray, _constrained_draws(static, data, xi.reshape(-1, xi.shape[-1]), kept))
    if chains.to_draws is None:
        draws = _draws(sites, sample_statistics(extra), chains.report, xi.shape[:2])
    else:
        by_chain = {name: v.reshape(*xi.shape[:2], *v.shape[1:]) for name, v in sites.items()}
        draws = chains.to_draws(by_chain, sample_statistics(extra))
    draws = replace(draws, thinning=thinning)
    return (draws if chains.units is None else draws.to_data_units(chains.units)), states


def _reference(ml: LowRankGaussian, chart: tuple, loadings: Any, noise: str, n: int) -> tuple:
    """``W`` of the ML fit in the orientation of the reported draws, and the horseshoe's reparam and
    anchors (or None), for ``chart``: the identification and the anchors asked for (None: pivoted).

    Under the horseshoe the start is triangular on the anchors, or with ``"none"`` near a sparse
    mode (varimax, the orthogonal rotation of simple structure), and each loading more than
    :data:`_CENTRED_AT` standard errors ``sqrt(psi_j / n)`` from 0 there is sampled centred.
    """
    identification, anchors = chart
    w = np.asarray(ml.loadings)
    if isinstance(loadings, prior_classes.Horseshoe):
        from bayespca.rotations import rotate

        triangle = identification == "lower_triangular"
        if triangle and anchors is None:
            anchors = pivot_anchors(w, ml.noise)
        w = np.asarray(lower_triangular(w, anchors) if triangle else rotate(w, "varimax").loadings)
        standard_error = np.sqrt(np.asarray(ml.noise) / n)[:, None]
        centred = np.abs(w) > _CENTRED_AT * standard_error
        return w, prior_classes.HorseshoeReparam(centred, standard_error), anchors
    # Anchors given here reach the model, which refuses them outside the horseshoe's triangle.
    if identification == "lower_triangular":
        return lower_triangular(w), None, anchors
    if identification == "polar" and noise == "diagonal":
        return np.asarray(canonical_loadings(ml).loadings), None, anchors
    return w, None, anchors


# Columns of the gauge's reference are independent where its condition number is below 1 / _INDEPENDENT:
# W^T B then has a polar factor near B's orientation (breast cancer, standardised, FA k = 19: 39).
_INDEPENDENT = 1e-6


def _gauge(reference: np.ndarray, polar: Draws) -> np.ndarray | None:
    """The model's ``gauge`` for sampling ``W`` free near ``reference``: the reference itself, or None
    where its columns are dependent (``W^T B`` would be singular, its polar factor undefined), it
    has one column (the orbit is ``W -> -W``: the gauge would only add a step at ``w^T b = 0``) or
    the ``polar`` draws reach the gauge's jump (:data:`_GAUGE_JUMP_REACHED`).

    The gauge depends on ``W``'s orientation alone, undefined at a zero column: it jumps by up to
    ``2 kappa`` where ``det(W^T B)`` changes sign, a wall through every ``W`` with a zero column.
    Where the weakest factor's scale reaches 0, chains run into that wall, crossing it or not, and
    their step size shrinks. The singular values of ``W^T B`` are invariant under ``W -> W R``, so
    the polar draws give the law of the smallest before ``W``'s coordinates are sampled.
    """
    singular = np.linalg.svd(reference, compute_uv=False)
    if len(singular) < 2 or singular[-1] <= _INDEPENDENT * singular[0]:
        return None
    smallest = np.linalg.svd(np.swapaxes(polar.loadings, -1, -2) @ reference, compute_uv=False)[..., -1]
    return None if np.quantile(smallest, 0.01) < _GAUGE_JUMP_REACHED * np.median(smallest) else reference


# The polar draws reach the gauge's jump where the smallest singular value of W^T B has its 1% quantile
# below this fraction of its median. Default settings, one BLAS thread: wine FA k = 7-8 and breast
# cancer FA k = 22 (at and next to their Ledermann bounds) 0.017-0.058, where gauged chains took 1023
# leapfrog steps a draw in 2-3 chains of 4 (wine standardised k = 8, seed 2: failing the check;
# without the gauge 63 steps and passing); diabetes FA k = 5, 0.093-0.20, gauged 31 steps a draw
# (127 without), and above 0.29 elsewhere. A miss costs time only: gauged chains that fail run again
# without the gauge (:func:`_in_ws_coordinates`).
_GAUGE_JUMP_REACHED = 0.075


def _in_ws_coordinates(data: dict, start: tuple, sampling: tuple, key, check: _Check, loadings: Any,
                       polar: Draws) -> tuple:
    """FA's run in ``W``'s own coordinates, which have no singularity: held near the reference's
    orientation by the model's gauge (:func:`_gauge`), and where those chains fail the users' check
    by more than running on can mend (:func:`_worth_running_on`), again without it; the better of
    the two (:func:`_better`), draws reported in the reference's orientation. ``data`` are the
    model's arguments (its ``gauge`` is set here), ``start`` as :func:`_preconditioned` takes it,
    ``sampling`` as in :func:`_run`, ``polar`` the polar chart's draws; ``(draws, chains, xi)``.

    The gauge turns the orbit's flat direction into a density: breast cancer, standardised, FA
    k = 19, seed 2: 127 leapfrog steps a draw instead of 511. But its polar factor jumps where
    ``det(W^T B)`` changes sign, a wall a weak column whose direction roams cannot cross: diabetes
    raw FA k = 5, seed 4 (one BLAS thread): R-hat 1.074 and ESS 39 on ``psi`` at 31 steps a draw,
    the smallest singular value of ``W^T B`` 0.02 at its 1% quantile against 0.12 at its median,
    where the run without it passed (R-hat 1.007, ESS 519, 127 steps a draw). The nearest rotation
    instead of the polar factor, continuous there, has a cone where ``det(W^T B) < 0`` and its two
    smallest singular values meet: wine raw FA k = 6, seed 0, reached it (255-511 steps a draw and
    divergent transitions in the chains that crossed).
    """
    reference = start[0].loadings
    gauge, run = _gauge(reference, polar), None
    for this_gauge in (gauge, None) if gauge is not None else (None,):
        data["kwargs"]["gauge"] = this_gauge
        columns = (reference.shape[1], None)
        search, static, init_scale = _preconditioned("diagonal", columns, "none", loadings, data, start)
        this = _run(static, data, sampling, key, init_scale, search, _AGAIN + "W's coordinates")
        run = this if run is None else _better(run, this, check)
        if _shortfall(run[0], check) <= _LONGEST:  # passes, or running on can mend it
            break
    return run


def _last_scale_stuck(draws: Draws, identification, noise, k, loadings, reparam) -> bool:
    """Whether pPCA's polar draws fail the users' check on the smallest eigenvalue of ``W W^T``.

    The polar chart samples ``log l_k``, whose posterior has a long tail
    towards 0 where the data leave the last component weak; its direction
    then turns freely as ``l_k`` shrinks, a funnel (wine, standardised,
    k = 12 = d - 1, seeds 0 and 4: R-hat 1.022 and ESS 370-390 on that
    eigenvalue, at 31 leapfrog steps a draw). Only fits of ``k >= 2``
    components with a rotation-invariant prior have the Cartesian
    alternative (:func:`bayespca.models.initial_values`).
    """
    if noise != "isotropic" or identification != "polar" or reparam is not None:
        return False
    if k < 2 or not loadings.rotation_invariant:
        return False
    w = draws.loadings
    smallest = np.linalg.eigvalsh(np.swapaxes(w, -1, -2) @ w)[..., :1]
    if np.quantile(smallest, 0.01) >= _REACHES_ZERO * np.median(smallest):
        return False
    return shortfall(worst_of({"smallest": smallest}, w.shape[0]), w.shape[0]) > 1.0


# The smallest eigenvalue of W W^T "reaches 0" where its 1% quantile is below this fraction of its
# median: only then is the polar chart's singularity in play, and a second run worth its time (short
# runs miss the ESS check for other reasons). Polar draws, default settings: wine standardised
# k = 12, seeds 0-4: 0.036-0.12 (4 of 5 failing the check); k = 10, 11: 0.16-0.22 (passing);
# diabetes standardised k = 9: 0.84; iris k = 3: 0.65; n = 1000, d = 20, rank 3, k = 4 and 5
# (whose Cartesian column NUTS crosses slowly): 0.56 and 0.51.
_REACHES_ZERO = 0.25


def _last_scale(g: LowRankGaussian) -> np.float64:
    """``tau`` of the Cartesian last column: ``W``'s smallest singular value, at least 1e-3 of its largest."""
    singular = np.linalg.svd(np.asarray(g.loadings), compute_uv=False)
    return np.float64(max(singular[-1], 1e-3 * singular[0]))


def _better(run: tuple, other: tuple, check: _Check) -> tuple:
    """``other`` where its draws mix better than ``run``'s (:func:`_mixes_better`), else ``run``; each is
    ``(draws, chains, xi)`` or ``(draws, chains)``. A second run's chart or coordinates can mix worse:
    breast cancer standardised FA k = 18, seed 0, polar R-hat 1.013 and ESS 440, in ``W``'s coordinates
    2.03 and 5 (measured before the gauge held them, :func:`_gauge`)."""
    return other if _mixes_better(other[0], run[0], check) else run


def _mixes_better(new: Draws, old: Draws, check: _Check) -> bool:
    """Whether ``new`` is the better run: of two runs of which one has divergent transitions, the
    other, where its shortfall is within running on's reach (:func:`_worth_running_on`); otherwise
    the run that passes the users' check, or the larger smallest ESS.

    Divergent draws miss part of the posterior whatever their ESS: diabetes raw FA k = 5, seed 4,
    with the gauge's first version (which walled a weak column off) kept the run with the draws'
    metric, 18 divergent transitions and ESS 72, over runs of none. Chains stuck apart (R-hat 2.03,
    ESS 5: :func:`_better`) are no better for having none.
    """
    new_diverges, old_diverges = (bool(np.any(d.sample_stats["diverging"])) for d in (new, old))
    if new_diverges != old_diverges:
        clean = old if new_diverges else new
        if _shortfall(clean, check) <= _LONGEST / clean.thinning:
            return clean is new
    if _chains_agree(new, check):
        return True
    return _smallest_ess(new, check) > _smallest_ess(old, check)


def _run(static: _Static, data: dict, sampling: tuple, key, init_scale: float, search: _Static | None,
         label: str = "NUTS"):
    """:func:`_sample`'s draws identified: ``(draws, chains, xi)``; ``sampling`` is ``(run, report)``
    (:func:`_draws`); ``label`` names the progress bar (a second run says why it runs)."""
    run, report = sampling
    sites, sample_stats, chains, xi = _sample(static, data, run, key, init_scale, _KEPT_SITES, search, label)
    return _draws(sites, sample_stats, report, (run[2], run[1])), chains, xi


def _run_again(run: tuple, sampling: tuple, key, check: _Check, loadings: Any, free: int) -> tuple:
    """Chains of ``_PILOT_MIN_DRAWS`` draws or more that fail the users' check run again: around a
    weightier mode one of them reached (:func:`_recentred`, Newton from each chain's densest draw),
    and where that does not make them pass, with a metric corrected by their own spread
    (:func:`_with_pilot_metric`).

    Shorter chains fail the check by their length, which another run of the same length does not
    change. ``run`` is ``(draws, chains, xi)``; ``sampling`` as in :func:`_run`; ``check`` the
    :class:`_Check`; ``loadings`` the resolved loadings prior; ``free`` the columns within the noise
    (:func:`~bayespca.inference.laplace.free_columns`). Returns ``(draws, chains)``.
    """
    draws, chains, xi = run
    if xi.shape[1] < _PILOT_MIN_DRAWS or _chains_agree(draws, check):
        return draws, chains
    lp = np.nan_to_num(draws.sample_stats["lp"], nan=-np.inf)
    densest = xi[np.arange(len(lp)), np.argmax(lp, axis=1)]
    fresh = _recentred(chains, sampling, jax.random.fold_in(key, 3), free, densest)
    again = run if fresh is None else _better(run, fresh, check)
    if again is not run and _chains_agree(again[0], check):
        return again[:2]
    return _with_pilot_metric(*again, sampling, jax.random.fold_in(key, 2), check, loadings)


# Chains run again around the mode that Newton reaches from one of their points where the mode's
# Laplace mass is this many nats or more above that of the mode Newton reaches from their centre
# (:func:`_recentred`).
_WEIGHTIER_BY = 1.0


def _recentred(chains: Chains, sampling: tuple, key, free: int, starts: np.ndarray) -> tuple | None:
    """Chains that failed the users' check run again around a weightier mode that one of them reached.

    The chains start around the mode that Newton reaches from the ML point
    (:func:`_best_mode`). The posterior can have another, weightier one,
    made by the prior and the volume where the likelihood has none, which
    chains started in the first reach rarely. Breast cancer, standardised,
    FA k = 18, seed 4 (one BLAS thread): two chains of four sat where the
    symmetry features keep their own noise (``psi[8]`` about 0.29 of its
    variance) for about 250 draws, then crossed to where a factor takes them
    up (``psi[8]`` about 0.11), the other two there throughout: R-hat 1.53.
    Newton from the chains' densest draws (each chain's: ``starts``) finds
    that mode, 4.4 nats higher at its peak and 29 nats weightier. Where the
    weightiest mode so found has a Laplace mass, ``-U - log det(H) / 2``
    (:func:`_log_mass`), ``_WEIGHTIER_BY`` nats or more above that of the
    mode Newton reaches from the chains' centre (the centre itself where a
    Laplace fit whitens the chains; the draws' mean of
    :func:`_with_pilot_metric` can be a saddle), the chains run again
    (warm-up and draws) around it with its Laplace factor
    (:func:`_laplace_at`); the callers keep that run where it mixes better
    (:func:`_better`); there it passed, and so at seed 3, where the
    densest draw of all led to a mode of 91 nats less mass than the
    centre's and another chain's to the weightiest. The new run samples around
    that mode: the mode the first chains left, of less mass, it seldom
    reaches, as chains started there seldom left it. Not for chains whose
    factor is a vector of scales (models too large for a Hessian, the
    horseshoe with ``W`` free). The mode search runs on the model's
    arguments alone, as :func:`_best_mode`'s does (one compiled program
    where the configurations agree); precision is refined around the new
    mode where it needs it (:func:`_refined_at_centre`). ``chains`` are
    the :class:`Chains` that failed; ``sampling`` as in :func:`_run`;
    ``free`` as in :func:`_localized_factor`; ``starts`` (chain, p) the
    whitened points Newton starts from. Returns the new run ``(draws,
    chains, xi)``, or None (a factor of scales, or no mode ``_WEIGHTIER_BY``
    nats weightier reached).
    """
    static, centre, factor = chains.static, chains.data["centre"], chains.data["factor"]
    if isinstance(factor, np.ndarray) and factor.ndim == 1:
        return None
    model = {"kwargs": chains.data["kwargs"]}
    with serial_blas(0):  # as the Laplace factor's: the same draws on any number of cores
        modes = [_mode(static, model, x) for x in centre + np.asarray(_times(static, factor, starts))]
        masses = [_log_mass(static, model, x, h) for x, h in modes]
        mode, hessian = modes[int(np.argmax(masses))]
        if not max(masses) >= _log_mass(static, model, *_mode(static, model, centre)) + _WEIGHTIER_BY:
            return None
        data = {**chains.data, "centre": mode}
        data["factor"] = _laplace_at(static, data, mode, hessian, free)
    if not dict(static.options)["refine_precision"]:
        static = _refined_at_centre(static, data)
    return _run(static, data, sampling, key, 1.0, None, _AGAIN + "a weightier mode")


def _log_mass(static: _Static, data: dict, mode: np.ndarray, hessian: np.ndarray) -> float:
    """The Laplace approximation's log mass of the posterior around ``mode``, ``-U - log det(H) / 2``
    (``H`` the potential's Hessian there); minus infinity where ``H`` is not positive definite (a
    saddle, not a mode)."""
    sign, log_det = np.linalg.slogdet(hessian)
    potential = _values_and_gradients(static, data, mode[None])[0][0]
    return -float(potential) - 0.5 * float(log_det) if sign > 0 else -np.inf


# The second run's metric is the Laplace one corrected along the eigen-directions of the first run's
# whitened draws' covariance whose variance differs from the Laplace fit's (1 there) by a factor
# _PILOT_RATIO or more, and more than chance makes it differ (:func:`_chance_band`); only for chains of
# _PILOT_MIN_DRAWS draws or more (shorter ones fail the users' check, ESS of 100 a chain, by their
# length, which another run of the same length does not change), and at least _PILOT_DRAWS_PER_PARAMETER
# draws a sampled parameter: fewer, and the draws' covariance has no rank to spare. Variances below
# _TURNED are directions the draws were turned out of (:func:`_off_the_orbit`; about 1e-15).
_PILOT_RATIO, _PILOT_MIN_DRAWS, _PILOT_DRAWS_PER_PARAMETER, _TURNED = 2.0, 400, 2, 1e-9


def _with_pilot_metric(draws: Draws, chains: Chains, xi: np.ndarray, sampling: tuple, key, check: _Check,
                       loadings: Any) -> tuple:
    """Draws that failed the users' check run again with a metric corrected by their own spread.

    The Laplace fit at the mode sees one mode; where a weak factor moves between two roles (breast
    cancer, FA k = 7: worst compactness or the smoothness features) the draws spread wider than it
    says along that move, and the chains crossed rarely at 15-31 leapfrog steps a draw (raw and
    standardised, seeds 0-4: every fit failed the check, smallest bulk ESS 101). The new run
    (warm-up and draws) is centred at the draws' mean and whitened by :func:`_draws_metric`, and is
    kept where it mixes better (:func:`_mixes_better`). Only for a dense
    factor (the rotated and diagonal ones are for models too large for a p x p covariance);
    ``check`` is the :class:`_Check`, ``loadings`` the resolved loadings prior; ``(draws, chains)``.
    """
    draws_a_parameter = xi.shape[0] * xi.shape[1] / xi.shape[2]
    if draws_a_parameter < _PILOT_DRAWS_PER_PARAMETER or not _is_dense(chains.data["factor"]):
        return draws, chains
    with serial_blas(0):  # as the Laplace factor's: the same draws on any number of cores
        centre, factor = _draws_metric(chains, xi, loadings)
    data = {**chains.data, "centre": centre, "factor": factor}
    other, other_chains, _ = _run(chains.static, data, sampling, key, 1.0, None, _AGAIN + "draws' metric")
    if _mixes_better(other, draws, check):
        return other, replace(other_chains, own_metric=True)
    return draws, chains


def _run_on(run: tuple, sampling: tuple, key, checks: tuple, progress_bar: bool | None) -> tuple:
    """Chains that fail the users' check run on (:func:`_lengthened`); where they still fail after
    running on, they run again around a weightier mode that one of them reached meanwhile, that run
    runs on in turn, and the fit keeps it where it then mixes better (:func:`_better`).

    Running on, a chain can cross to a mode that none of the first draws
    was in: breast cancer, raw, FA k = 18, seed 1 (one BLAS thread, on one
    machine) failed the check by its length alone after the first run (ESS
    379, shortfall 1.06, the four chains where ``psi[8]`` is about 0.29 of
    its variance), and while running on one chain moved to another mode of
    the symmetry features' noise (its mean of ``psi[8]`` 0.26): R-hat 1.21
    when it stopped. So chains that still fail after running on (out of
    reach, or at ``_LONGEST`` transitions a draw) run Newton from where each
    chain stopped, and where that reaches a mode weightier than the one
    they were centred at, they run again around it (:func:`_recentred`). ``run``
    is ``(draws, chains)``; ``sampling`` as in :func:`_run`; ``checks`` is
    ``(check, free, short)``: the :class:`_Check`, the columns of
    :func:`_localized_factor`, the draws' shortfall of :func:`_lengthened`.
    """
    check, free, short = checks

    def ran_on(draws, chains):
        return _lengthened(draws, replace(chains, report=sampling[1]), short, progress_bar)

    draws, chains = ran_on(*run)
    if draws.thinning == 1 or not short(draws) > 1:
        return draws, chains
    fresh = _recentred(chains, sampling, jax.random.fold_in(key, 4), free, _positions(chains.states))
    if fresh is None:
        return draws, chains
    # Compared once the new run has run on too, where it does: its first draws against the old ones,
    # thinned from up to _LONGEST times as many transitions, would favour the old run.
    return _better((draws, chains), ran_on(*fresh[:2]), check)


# At most this many transitions a draw kept (:func:`_lengthened`).
_LONGEST = 4


def _lengthened(draws: Draws, chains: Chains, short: Callable, progress_bar: bool | None) -> tuple:
    """Chains that still fail the users' check on R-hat or ESS alone run on, and keep every ``t``-th draw.

    Where no remedy of the start or the geometry made the chains pass
    (other charts, :func:`_run_again`), what is left is their length: R-hat
    below 1.01 on the 10-30 invariants at once takes a bulk ESS of about
    1,000 on each, and these chains mix at 370-520 in 2,000 draws
    (diabetes FA k = 5, R-hat 1.010-1.012). Each chain runs as many
    transitions again (no new warm-up), up to ``_LONGEST`` times its
    length, until the draws ``t - 1, 2 t - 1, ...`` of the joined
    chains pass the check; those are kept, as many as were asked
    (``Draws.thinning`` is ``t``; :func:`continue_chains` goes on
    keeping every ``t``-th). Not for chains with divergent transitions,
    which length does not mend, nor for chains shorter than
    ``_PILOT_MIN_DRAWS`` (asked for few draws, they are not run four
    times as long), nor where ``_LONGEST`` times the length would not
    reach the check (:func:`_worth_running_on`), and they stop where the
    joined chains fall out of that reach (breast cancer raw FA k = 18,
    seed 1: a chain found another mode of ``psi[8]`` while running on,
    R-hat 1.49; :func:`_run_on` then looks for a weightier mode).
    ``short`` gives the draws' :func:`bayespca.posterior.shortfall`
    (:func:`_shortfall` for the Gaussian models); ``(draws, chains)``.
    """
    diverging = draws.sample_stats["diverging"]
    count = diverging.shape[1]
    if count < _PILOT_MIN_DRAWS or diverging.any() or not _worth_running_on(short(draws)):
        return draws, chains
    joined = draws
    for thinning in range(2, _LONGEST + 1):
        label = f"NUTS on, check failed: {thinning} transitions a draw"
        more, states = _transitions(chains, chains.data, (0, count), progress_bar, label)
        joined, chains = joined.extended(more), replace(chains, states=states)
        kept = joined.thinned(thinning)
        if not _worth_running_on(short(kept), thinning):
            break
    return kept, chains


def _worth_running_on(short: float, thinning: int = 1) -> bool:
    """Whether chains kept every ``thinning``-th transition that fail the check by ``short``
    (:func:`bayespca.posterior.shortfall`) could pass it within ``_LONGEST`` transitions a draw.

    Running on from ``t`` to ``_LONGEST`` transitions a draw makes the chains ``_LONGEST / t`` times
    as long, which divides the shortfall by about that at most: what fails by more is out of reach,
    at the first look chains in different modes (R-hat above about 1.04, or not finite) or with
    fewer than 25 effective draws a chain.
    """
    return 1.0 < short <= _LONGEST / thinning


def _draws_metric(chains: Chains, xi: np.ndarray, loadings: Any) -> tuple[np.ndarray, np.ndarray]:
    """The draws' mean in ``theta`` and the chains' factor ``S`` corrected by the draws' spread.

    In the whitened coordinates ``xi`` the Laplace covariance is the identity. The draws' covariance
    there, ``V diag(lam) V^T``, replaces it along the eigen-directions where the two differ by a
    factor ``_PILOT_RATIO`` or more and by more than chance (outside :func:`_chance_band`; the
    columns ``V_s``): the new factor is ``S (I + V_s diag(sqrt(lam_s) - 1) V_s^T)``. Elsewhere the
    Laplace fit stays: with the draws' full covariance as metric, breast cancer FA k = 7 (p = 277,
    about 140 directions corrected) passed the check in 5 of 10 fits, with this 9 of 10.

    Where ``W`` is sampled free without a gauge the draws are turned back along the rotation first
    (:func:`_off_the_orbit`); along the rotation's tangents they then have no spread, and the
    metric keeps a share ``1 / m`` (``m`` draws) of the Laplace variance there, small enough that
    the chains do not wander along the orbit and positive, so that it stays a metric.
    """
    factor, centre = chains.data["factor"], chains.data["centre"]
    flat = xi.reshape(-1, xi.shape[-1])
    theta = _off_the_orbit(chains, centre + flat @ factor.T, loadings)
    z = np.linalg.solve(factor, (theta - centre).T).T
    lam, vectors = np.linalg.eigh(np.cov(z.T))
    turned = lam <= _TURNED
    low, high = _chance_band(z.reshape(xi.shape), int(np.sum(~turned)))
    lam = np.where(turned, 1.0 / len(z), lam)
    chosen = turned | (lam >= high) | (lam <= low)
    v = vectors[:, chosen]
    root = np.eye(len(lam)) + (v * (np.sqrt(lam[chosen]) - 1.0)) @ v.T
    return theta.mean(axis=0), factor @ root


def _chance_band(z: np.ndarray, directions: int) -> tuple[float, float]:
    """The whitened variances not corrected: ``(low, high)``, at least a factor ``_PILOT_RATIO`` from 1
    either way, and wide enough to hold those of ``directions`` of unit variance by chance.

    ``z`` (chain, draw, p) are the whitened draws. The sample covariance of ``n`` independent draws
    of ``p`` unit-variance coordinates has its eigenvalues in ``(1 -+ sqrt(p / n))^2`` (Marchenko and
    Pastur); correlated draws count as their effective number, the median over the coordinates of
    :func:`bayespca.convergence.ess_mean` (along the covariance's eigenvectors it is no measure:
    they pick the draws' slowest and fastest combinations). Without the band, draws of an exactly
    Laplace-shaped posterior at a typical ESS would have 103 of 277 directions "corrected" (4 x 500
    draws, lag-one autocorrelation 0.7).
    """
    effective = np.median(ess_mean(np.moveaxis(z, -1, 0)))
    spread = np.sqrt(directions / effective)
    return min(1.0 / _PILOT_RATIO, max(0.0, 1.0 - spread) ** 2), max(_PILOT_RATIO, (1.0 + spread) ** 2)


def _off_the_orbit(chains: Chains, theta: np.ndarray, loadings: Any) -> np.ndarray:
    """The draws ``theta`` (m, p), each one's ``W`` turned to the centre's where ``W`` is sampled free.

    With ``W`` free (``"none"``, ``"procrustes"``), a rotation-invariant prior and no gauge (the
    model's ``gauge``, which gives the orbit a density of its own), the posterior is
    constant along ``W -> W R`` (``R`` orthogonal) and the chains drift along that orbit, which no
    identified quantity sees. The draws' covariance takes the drift for spread and the metric built
    on it moves along the orbit instead of across it (diabetes, standardised, FA k = 5, sampled in
    ``W``'s coordinates after the polar chart failed, before the gauge held them there: smallest
    bulk ESS 348 -> 120 with that metric, seed 1). Each draw's ``W`` is turned to the centre's by
    orthogonal Procrustes first, so the draws differ only where the posterior does (the same fit:
    ESS 469, seed 0: 365 -> 468).
    Turned so, they have no spread along the rotation's tangents at the centre (:func:`_draws_metric`
    keeps a small metric there).
    """
    offset, shape = _site_offset(chains.static, "W"), dict(chains.static.layout).get("W")
    if offset is None or not loadings.rotation_invariant or chains.data["kwargs"].get("gauge") is not None:
        return theta
    from bayespca.rotations import procrustes

    size = int(np.prod(shape))
    w = theta[:, offset:offset + size].reshape(-1, *shape)
    centre = chains.data["centre"][offset:offset + size].reshape(shape)
    turned = theta.copy()
    turned[:, offset:offset + size] = procrustes(w, centre)[0].reshape(len(theta), size)
    return turned


def _is_dense(factor: Any) -> bool:
    """Whether the sampler's ``factor`` is a dense p x p matrix (not rotated, not a diagonal)."""
    return isinstance(factor, np.ndarray) and factor.ndim == 2


def _smallest_ess(draws: Draws, check: _Check) -> float:
    """The smallest bulk or tail ESS of :meth:`_Check.convergence`."""
    return check.convergence(draws)[1][1]


def _columns(padded_components: int | None, k: int, identification: str, loadings: Any) -> tuple:
    """Columns of ``W`` to sample and the model's ``active_components``: ``(padded_components, k)``
    where the model can be padded (polar, a rotation-invariant prior), else ``(k, None)``."""
    if padded_components is None or identification != "polar" or not loadings.rotation_invariant:
        return k, None
    return int(padded_components), k


def _padded(g: LowRankGaussian, width: int) -> LowRankGaussian:
    """``g`` with zero columns appended to its loadings, up to ``width``."""
    w = np.asarray(g.loadings)
    return g._replace(loadings=np.pad(w, ((0, 0), (0, width - w.shape[1]))))


def _preconditioned(noise, columns, identification, loadings, data, start, ahead=None, anchors=None) -> tuple:
    """The sampler's configuration for ``identification``: sets ``data``'s start and Laplace factor.

    ``data["kwargs"]["last_column_scale"]`` chooses the polar chart's last column (None: polar,
    else Cartesian of that scale: :func:`_last_scale`).

    ``columns`` is ``(width, active)``: the columns of ``W`` sampled and the model's
    ``active_components`` (None: all). ``start`` is
    ``(start_point, ml, row_scale, n, variances)``: the ML point in the reporting
    orientation, the ML fit, FA's polar ``D``, the number of rows and the features' variances.
    ``ahead(static, data)``, if given, starts compiling the sampler during the mode search
    (:func:`_compile_ahead`). ``anchors``: the horseshoe's triangle (the model's option).
    Returns the static configurations of the mode search and of
    the sampler (they differ only where the ML point needs the precision's refinement and the
    mode does not: FA's Heywood cases), and the scale of the chains' initial spread.
    """
    start_point, ml, row_scale, n, variances = start
    width, active = columns
    data["kwargs"]["active_components"] = None if active is None else np.int32(active)
    reparam = data["kwargs"]["reparam"]
    padded = _padded(start_point, width)
    last_scale = data["kwargs"]["last_column_scale"]
    values = initial_values(
        identification, loadings, padded, noise, n, row_scale, active, last_scale, reparam, anchors
    )
    options = (("identification", identification), ("n_components", width), _refinement(ml))
    if anchors is not None:
        options = (("anchors", anchors), *options)
    theta = _unconstrained(_Static(MODELS[noise], options, ()), data, values)
    theta = {name: np.asarray(v, dtype=float) for name, v in sorted(theta.items())}
    static = _Static(MODELS[noise], options, tuple((name, v.shape) for name, v in theta.items()))
    centre = _ravel(theta)
    init_scale = 1.0
    # The horseshoe with W free: unit-free coordinates, where a Laplace fit at one of the rotation's
    # peaks misleads. On its triangle the Laplace factor finds what a diagonal mass misses (breast
    # cancer, k = 2: the scale of W's first column across ~30 loadings; bulk ESS 162-309 -> 635-895).
    by_laplace = reparam is None or identification == "lower_triangular"
    if not by_laplace:
        factor = np.ones(centre.size)
        init_scale = 0.1 * min(1.0, 10.0 / np.sqrt(n))
    elif centre.size <= _MAX_LAPLACE_SIZE:
        starts = [centre]
        raised = _raised_noise(ml, data["kwargs"]["prior"].noise) if noise == "diagonal" else None
        if raised is not None:
            w = np.asarray(canonical_loadings(raised).loadings)
            raised = _padded(raised._replace(loadings=w), width)
            other = initial_values(
                identification, loadings, raised, noise, n, row_scale, active, None, reparam, anchors
            )
            other = _unconstrained(_Static(MODELS[noise], options, ()), data, other)
            starts.append(_ravel(jax.tree.map(np.asarray, other)))
        finish_compiling = ahead(static, data) if ahead is not None else None
        # One BLAS thread for the Hessians' eigendecompositions whatever their size: their rounding,
        # and the chains after it, then do not follow the machine's core count (a seed gives the same
        # draws), and no BLAS thread waits on XLA's. On 2 busy cores one thread was faster at every
        # size measured (p = 300: 0.07 s against 1.3 s; p = 2000: 3.6 s against 10.2 s).
        with serial_blas(0):
            centre, hessian = _best_mode(static, data, starts)
            factor = _laplace_at(static, data, centre, hessian, laplace.free_columns(ml, n))
        if finish_compiling is not None:
            finish_compiling()
    else:
        factor = _rough_scales(theta, n, variances)
    data["centre"], data["factor"] = centre, factor
    at_mode = by_laplace and centre.size <= _MAX_LAPLACE_SIZE
    sampler = _refined_at_centre(static, data) if at_mode and dict(options)["refine_precision"] else static
    return static, sampler, init_scale


def _laplace_at(static: _Static, data: dict, centre: np.ndarray, hessian: np.ndarray, free: int):
    """The chains' factor at the mode ``centre`` of Hessian ``hessian`` (:func:`_localized_factor`,
    ``free`` as there), rotated where that is cheaper (:func:`_cheapest_factor`)."""
    factor = _localized_factor(static, data, hessian, free, centre)
    return _cheapest_factor(static, factor, data["kwargs"]["suff_stats"])


def _refinement(g: LowRankGaussian) -> tuple[str, bool]:
    """The model option ``refine_precision`` for draws near ``g`` (see :data:`_UNREFINED_BELOW`)."""
    return "refine_precision", capacitance_norm(g) > _UNREFINED_BELOW


def _refined_at_centre(static: _Static, data: dict) -> _Static:
    """``static`` with ``refine_precision`` decided at ``data["centre"]`` (a mode) instead of the ML point."""
    sites = _constrained_draws(static, data, np.zeros((1, data["centre"].size)), ("W", "sigma", "psi"))
    w = np.asarray(sites["W"][0])
    psi = np.asarray(sites["psi"][0] if "psi" in sites else np.full(w.shape[0], sites["sigma"][0] ** 2))
    options = dict(static.options) | dict([_refinement(LowRankGaussian(w, psi, np.zeros(w.shape[0])))])
    return replace(static, options=tuple(sorted(options.items())))


def _may_rotate(size: int, stats: Any) -> bool:
    """Whether the Laplace factor of ``size`` parameters may be the rotated one (:func:`_cheapest_factor`)."""
    if not isinstance(stats, SufficientStatistics):
        return False
    return size > _ROTATED_ABOVE and np.shape(stats.mean)[-1] >= _ROTATED_FROM_FEATURES


def _cheapest_factor(static: _Static, factor: np.ndarray, stats: Any):
    """``factor`` (dense, p x p), or the rotated factor of the same covariance where it whitens it.

    The rotated factor costs O(d^2 k) per gradient instead of O(p^2)
    (:mod:`bayespca.inference.rotated_factor`); it needs the complete data's scatter, and pays
    only above :data:`_ROTATED_ABOVE` parameters and from :data:`_ROTATED_FROM_FEATURES` features.
    """
    if not _may_rotate(factor.shape[0], stats):
        return factor
    rotated = rotated_factor.rotated_factor(static.layout, factor @ factor.T, np.asarray(stats.scatter))
    return factor if rotated is None else rotated


def _near_degenerate(static: _Static, data: dict, loadings: Any) -> bool:
    """Whether the Laplace approximation in polar coordinates reaches a singularity of the chart.

    The polar map ``W = D U diag(l) V^T`` is singular where two scales ``l_i``
    meet (their directions turn into each other freely) and at ``l_k = 0``.
    Its gaps ``l_i - l_{i+1}`` (``l_k`` the last) are sampled on the log
    scale; a Laplace standard deviation of a log gap above
    :data:`_DEGENERATE_GAP` means the posterior reaches the singularity.
    """
    options = dict(static.options)
    factor = data["factor"]
    dense = isinstance(factor, np.ndarray) and factor.ndim == 2
    if options["identification"] != "polar" or not loadings.rotation_invariant or not dense:
        return False
    offset = _site_offset(static, "log_gaps")
    active = data["kwargs"]["active_components"]
    k = options["n_components"] if active is None else int(active)
    rows = factor[offset: offset + k]
    return bool(np.sqrt(np.max(np.sum(rows * rows, axis=1))) > _DEGENERATE_GAP)


class _Check(NamedTuple):
    """The users' check, in data units, of draws in the sampler's units: the one every remedy and
    running on apply.

    ``log_lik``: the total log-likelihood of each draw (chain, draw), given the draws in the sampler's
    units (the Gaussian models' sufficient statistics are in those), checked with the invariants
    (None: the invariants alone); ``units``: FA's per-feature sampling units (None: the draws' units
    are the users'), in which the eigenvalues of ``W W^T`` are not the users' (wine raw FA k = 8,
    seed 3: R-hat 1.012 in data units, at most 1.01 in them).
    """

    log_lik: Callable | None
    units: np.ndarray | None = None

    def convergence(self, draws: Draws) -> tuple:
        """:func:`bayespca.posterior.worst_convergence` of the draws as users see them."""
        seen = draws if self.units is None else draws.to_data_units(self.units)
        return worst_convergence(seen, None if self.log_lik is None else self.log_lik(draws))


def _chains_agree(draws: Draws, check: _Check) -> bool:
    """Whether the draws pass the users' check (:func:`bayespca.posterior.converged`)."""
    return _shortfall(draws, check) <= 1.0


def _shortfall(draws: Draws, check: _Check) -> float:
    """:func:`bayespca.posterior.shortfall` of the draws as users see them."""
    return shortfall(check.convergence(draws), draws.loadings.shape[0])


def _log_likelihood(draws: Draws, stats: Any) -> np.ndarray:
    """The total log-likelihood of each draw, (chain, draw)."""
    flat = tuple(a.reshape(-1, *a.shape[2:]) for a in (draws.loadings, draws.noise, draws.mean))
    return np.asarray(draws_marginal_log_likelihood(flat, stats)).reshape(draws.loadings.shape[:2])


def _draws(sites, sample_stats, report: tuple, shape) -> Draws:
    """Identified draws (chain, draw, ...) and sampler statistics, in sampling units.

    ``report`` is ``(identification, reference_w, start_point, noise, k)``: the draws of ``W``
    (their first ``k`` columns) are identified by ``identification`` against ``reference_w``.
    """
    identification, reference_w, start_point, noise, k, anchors = report
    w = sites["W"][..., :k]
    d = w.shape[-2]
    if noise == "isotropic":
        psi = np.broadcast_to(sites["sigma"][:, None] ** 2, (w.shape[0], d))
    else:
        psi = sites["psi"]
    prior_extra = {}
    if "kappa" in sites and identification == "lower_triangular":
        w = align_signs(w, reference_w)  # not by W_ll's sign: a factor's W_ll may be near 0
        prior_extra["kappa"] = sites["kappa"].reshape(*shape, d, k)
    elif "kappa" in sites:
        w, kappa = prior_classes.Horseshoe.align(w, sites["kappa"], reference_w)
        prior_extra["kappa"] = kappa.reshape(*shape, d, k)
        identification = "signed_permutation"
    else:
        w = _identify(w, reference_w, identification, None if noise == "isotropic" else psi)
    if "alpha" in sites:
        prior_extra["alpha"] = sites["alpha"].reshape(*shape, k)
    return Draws(
        w.reshape(*shape, d, k), np.array(psi).reshape(*shape, d), sites["mu"].reshape(*shape, d),
        identification, noise, sample_stats, start_point, prior_extra, anchors,
    )


def _posterior_fit(draws: Draws, stats: Any, n: int, chains: Chains) -> Fit:
    """The Fit of a posterior: its mean as the estimate, the log-likelihood there, ``chains`` as details."""
    g = LowRankGaussian(draws.loadings.mean((0, 1)), draws.noise.mean((0, 1)), draws.mean.mean((0, 1)))
    ll = float(marginal_log_likelihood(g, stats))
    n_draws = draws.loadings.shape[0] * draws.loadings.shape[1]
    converged = not draws.sample_stats["diverging"].any()
    at_floor = np.zeros(g.noise.shape, bool)
    return Fit(g, ll, "nuts", n_draws, converged, np.array([ll]), at_floor, draws, chains)
