"""NUTS on a row-level model of :mod:`bayespca.models`, started at its ML point, and its DataTree.

The runner of :mod:`bayespca.inference.nuts` is specialised to the Gaussian
models and their sufficient statistics. The models whose likelihood needs
the rows themselves (the Student-t pPCA, the mixture of pPCA) are sampled
here by NumPyro's own ``MCMC(NUTS(model))``, with two of its ideas:

1. *Start at the fit.* The chains start near the maximum-likelihood point
   (from EM), given as values of the model's latent sites: each at a draw of
   the Laplace approximation there.
2. *Laplace preconditioning.* The inverse mass matrix is the inverse
   Hessian of the model's potential energy (its negative log joint, from
   ``numpyro.infer.util.potential_energy``) at that point, eigenvalues
   floored: the sampler sees near-unit-scale geometry whatever the data's
   units or ``n``. It is kept through warm-up (only the step size adapts),
   since windowed estimates of a dense matrix from a few dozen draws are
   worse than the Laplace one. An affine change of the momentum metric: the
   posterior is unchanged.

The same model under ``MCMC(NUTS(model))`` with NumPyro's defaults samples
the same posterior, only more slowly. :func:`posterior_tree` turns the draws
of such a model, with its own pointwise log-likelihood, into the ArviZ
DataTree that :func:`bayespca.compare` reads.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import constrain_fn, potential_energy, unconstrain_fn

from bayespca.inference.nuts import laplace_factor, sample_statistics
from bayespca.params import as_key, check_number

__all__ = ["check_prior", "laplace_inverse_mass", "posterior_tree", "sample_model"]

_EXTRA_FIELDS = ("diverging", "num_steps", "potential_energy", "accept_prob", "energy",
                 "adapt_state.step_size")


def check_prior(prior: Any, method: str, estimator: str, bayesian: str) -> None:
    """A named error for a ``prior`` a row-level model cannot use with ``method``.

    Maximum likelihood (``"em"``) has no prior; the horseshoe samples ``W``
    in its own coordinates with a reparameterisation that only the Gaussian
    models' runner (:mod:`bayespca.inference.nuts`) sets up.

    Examples
    --------
    >>> check_prior("ard", "nuts", "RobustPPCA", "'svi' or 'nuts'") is None
    True
    """
    if prior is None:
        return
    from bayespca.priors import as_priors, is_named

    as_priors(prior)
    if method == "em":
        raise ValueError(f"prior={prior!r} needs method={bayesian}; method='em' maximises the likelihood, "
                         "which has no prior.")
    if is_named(prior, "horseshoe"):
        raise ValueError(f"prior='horseshoe' is not available for {estimator}: use None, 'flat', 'ard', a "
                         "bayespca.priors prior or a distribution of W.")


def laplace_inverse_mass(potential: Any, theta: dict) -> np.ndarray:
    """Inverse Hessian of ``potential`` at ``theta`` (a dict of unconstrained sites, raveled by name).

    Eigenvalues floored as by :func:`bayespca.inference.nuts.laplace_factor`.

    Examples
    --------
    >>> theta = {"a": np.zeros(2)}
    >>> np.round(laplace_inverse_mass(lambda t: 2.0 * (t["a"] ** 2).sum(), theta), 3).tolist()
    [[0.25, 0.0], [0.0, 0.25]]
    """
    flat, unravel = ravel_pytree(theta)
    hessian = np.asarray(jax.jit(jax.hessian(lambda v: potential(unravel(v))))(flat))
    factor = laplace_factor(0.5 * (hessian + hessian.T))
    return factor @ factor.T


def sample_model(
    model: Any,
    kwargs: dict,
    start: dict,
    *,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    target_accept_prob: float = 0.9,
    random_state: Any = None,
) -> tuple[dict, dict]:
    """Draw from the posterior of ``model(**kwargs)`` by NUTS, preconditioned at ``start``.

    Every model evaluation runs compiled (the potential, its Hessian, the
    maps between constrained and unconstrained sites): traced eagerly, a
    model costs one compilation per operation. Each chain starts at a draw
    of the Laplace approximation at ``start``.

    Parameters
    ----------
    model : callable
        A NumPyro model taking only keyword arguments.
    kwargs : dict
        Its arguments (data included).
    start : dict
        Constrained values of every latent site (e.g. the ML point).
    num_warmup, num_samples, num_chains : int
    target_accept_prob : float
    random_state : None, int, Generator or RandomState

    Returns
    -------
    sites : dict of ndarray
        Every sample and deterministic site, leading dims (chain, draw).
    sample_stats : dict of ndarray (chain, draw)
        ``diverging``, ``n_steps``, ``tree_depth``, ``lp``,
        ``acceptance_rate``, ``energy``, ``step_size``, as
        :class:`bayespca.inference.contract.Draws` records them.
    """
    for value, name in ((num_warmup, "num_warmup"), (num_samples, "num_samples"), (num_chains, "num_chains")):
        check_number(value, name, integer=True, low=1)
    check_number(target_accept_prob, "target_accept_prob", low=0, high=1, low_open=True, high_open=True)

    def potential(theta):
        return potential_energy(model, (), kwargs, theta)

    theta = jax.jit(lambda values: unconstrain_fn(model, (), kwargs, values))(start)
    inverse_mass = laplace_inverse_mass(potential, theta)
    key_init, key_run = jax.random.split(as_key(random_state))
    flat, unravel = ravel_pytree(theta)
    spread = jax.random.normal(key_init, (num_chains, flat.size)) @ np.linalg.cholesky(inverse_mass).T
    init = jax.vmap(unravel)(flat + spread)
    kernel = NUTS(potential_fn=jax.jit(potential), dense_mass=True, inverse_mass_matrix=inverse_mass,
                  adapt_mass_matrix=False, target_accept_prob=target_accept_prob)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="sequential", progress_bar=False)
    mcmc.run(key_run, init_params=init if num_chains > 1 else jax.tree.map(lambda a: a[0], init),
             extra_fields=_EXTRA_FIELDS)
    draws = mcmc.get_samples()  # unconstrained, chains concatenated
    constrain = jax.jit(jax.vmap(lambda t: constrain_fn(model, (), kwargs, t, return_deterministic=True)))
    sites = {name: np.asarray(v).reshape(num_chains, num_samples, *np.shape(v)[1:])
             for name, v in constrain(draws).items()}
    extra = {name: np.asarray(v) for name, v in mcmc.get_extra_fields(group_by_chain=True).items()}
    extra["step_size"] = extra.pop("adapt_state.step_size")
    return sites, sample_statistics(extra)


def posterior_tree(draws: Any, X: np.ndarray, pointwise: np.ndarray, *, feature_names: Any = None,
                   extra: dict | None = None, clusters: int | None = None):
    """The posterior of a row-level model as an ArviZ DataTree, and its sampling diagnostics.

    Groups: ``posterior`` (:func:`bayespca.posterior.posterior_variables`
    of ``draws``, the ``extra`` variables and ``log_lik``, the total
    log-likelihood per draw), ``sample_stats``, ``log_likelihood`` (``X``:
    ``pointwise``, dims (chain, draw, obs)) and ``observed_data``.
    :func:`bayespca.posterior.diagnose` warns as for the Gaussian models.

    Parameters
    ----------
    draws : bayespca.inference.contract.Draws
        With a cluster axis after (chain, draw) when ``clusters`` is given.
    X : ndarray of shape (n, d)
        The data, in data units.
    pointwise : ndarray of shape (chain, draw, n)
        The model's log-likelihood of each row.
    feature_names : sequence of str, optional
    extra : dict of ndarray, optional
        Further posterior variables (chain, draw) or (chain, draw, cluster).
    clusters : int, optional
        Number of clusters of a mixture (dim ``cluster`` on every
        parameter).

    Returns
    -------
    xarray.DataTree
    """
    from arviz_base import from_dict

    from bayespca.posterior import diagnose, posterior_variables

    variables = {**posterior_variables(draws), **(extra or {}), "log_lik": pointwise.sum(-1)}
    d = X.shape[1]
    feature = list(feature_names) if feature_names is not None else list(range(d))
    # "obs" gets ArviZ's default 0 .. n-1 (as in bayespca.posterior.to_datatree)
    coords = {"feature": feature, "component": list(range(draws.loadings.shape[-1]))}
    dims = {"W": ["feature", "component"], "mu": ["feature"], "eigenvalues": ["component"]}
    if clusters is not None:
        coords["cluster"] = list(range(clusters))
        dims = {name: ["cluster", *names] for name, names in dims.items()}
        dims.update({"sigma2": ["cluster"], "weights": ["cluster"]})
    dims["X"] = ["obs", "feature"]
    tree = from_dict(
        {"posterior": variables, "sample_stats": dict(draws.sample_stats),
         "log_likelihood": {"X": pointwise}, "observed_data": {"X": X}},
        coords=coords, dims=dims,
    )
    diagnose(draws, variables["log_lik"])
    return tree
