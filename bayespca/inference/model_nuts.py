"""Prior checks and the ArviZ DataTree of the row-level models of :mod:`bayespca.models`.

The Student-t pPCA and the mixture of pPCA have no sufficient statistics:
their likelihood reads the rows. They are sampled by the runner of the
Gaussian models (:func:`bayespca.inference.nuts.sample_model`: Newton to
the mode from the ML fit, Laplace-whitened coordinates, compiled once per
configuration). :func:`check_prior` names the priors they cannot take, and
:func:`posterior_tree` turns their draws, with their own pointwise
log-likelihood, into the ArviZ DataTree that :func:`bayespca.compare` reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_prior", "posterior_tree"]


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


def posterior_tree(draws: Any, X: np.ndarray, pointwise: np.ndarray, *, feature_names: Any = None,
                   extra: dict | None = None, clusters: int | None = None):
    """The posterior of a row-level model as an ArviZ DataTree, and its sampling diagnostics.

    Groups: ``posterior`` (:func:`bayespca.posterior.posterior_variables`
    of ``draws``, the ``extra`` variables and ``log_lik``, the total
    log-likelihood per draw), ``sample_stats`` (``attrs["thinning"]`` as in
    :func:`bayespca.posterior.to_datatree`), ``log_likelihood`` (``X``:
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
        coords=coords, dims=dims, attrs={"sample_stats": {"thinning": draws.thinning}},
    )
    diagnose(draws, variables["log_lik"])
    return tree
