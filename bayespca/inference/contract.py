"""The one fit contract: a model specification and prepared data in, one :class:`Fit` out.

Every fitter of the low-rank Gaussian models (closed form, EM, SVI, NUTS)
has the signature ``fit_<method>(prepared, spec, **options) -> Fit``:
``prepared`` is a :class:`bayespca.statistics.Prepared` (data validated
once, in power-of-two working units, with its statistics), ``spec`` a
:class:`ModelSpec`. Fitters compute in working units and return the
:class:`Fit` in data units (:meth:`Fit.to_data_units`), so an estimator's
``fit`` is validate -> prepare -> dispatch -> store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bayespca.gaussian import LowRankGaussian

__all__ = ["IDENTIFICATIONS", "NOISE_KINDS", "Draws", "Fit", "ModelSpec"]

NOISE_KINDS = ("isotropic", "diagonal")
#: How the Bayesian methods identify ``W`` (see :mod:`bayespca.models`).
IDENTIFICATIONS = ("polar", "lower_triangular", "procrustes", "none")


@dataclass(frozen=True)
class ModelSpec:
    """Which model to fit.

    Attributes
    ----------
    noise : {"isotropic", "diagonal"}
        pPCA (``Psi = sigma^2 I``) or factor analysis (``Psi = diag(psi)``).
    n_components : int
        ``k``.
    prior : Any, default=None
        The loadings/noise/mean priors of the Bayesian methods (ignored by
        maximum likelihood); see :mod:`bayespca.models`.
    identification : str or None, default=None
        How NUTS identifies ``W`` (see :mod:`bayespca.inference.nuts`).
    anchors : tuple of int or None, default=None
        The horseshoe triangle's anchor features (see :mod:`bayespca.models`);
        None: pivoted from the maximum-likelihood loadings.
    """

    noise: str
    n_components: int
    prior: Any = None
    identification: str | None = None
    anchors: tuple | None = None


@dataclass(frozen=True)
class Draws:
    """Posterior (or variational) draws of ``(W, Psi, mu)``, leading dims ``(chain, draw)``.

    Attributes
    ----------
    loadings : ndarray (chain, draw, d, k)
        Identified ``W`` (see ``identification``).
    noise : ndarray (chain, draw, d)
        Noise variances (pPCA: ``sigma^2`` repeated).
    mean : ndarray (chain, draw, d)
    identification : str
        How the draws of ``W`` were identified.
    noise_kind : {"isotropic", "diagonal"}
    sample_stats : dict of ndarray (chain, draw)
        Sampler statistics (NUTS: ``diverging``, ``n_steps``, ``tree_depth``,
        ``lp``, ``acceptance_rate``, ``energy``, ``step_size``); empty for
        variational draws.
    reference : LowRankGaussian or None
        The point the chains started from and were aligned to.
    extra : dict of ndarray
        Prior-specific draws with leading dims (chain, draw): ``alpha``
        (ARD precisions, (k,)), ``kappa`` (horseshoe shrinkage, (d, k)).
    anchors : tuple of int or None
        With ``identification="lower_triangular"`` under the horseshoe: its anchor features.
    thinning : int
        Each draw is the last of this many transitions of its chain (NUTS chains that ran on
        after failing the convergence check; a few more where a run's length is not a multiple of
        the sampler's 50-transition chunk); ``sample_stats`` are those of each draw's own (last)
        transition, but ``diverging`` says whether any of them diverged.
    """

    loadings: np.ndarray
    noise: np.ndarray
    mean: np.ndarray
    identification: str
    noise_kind: str
    sample_stats: dict = field(default_factory=dict)
    reference: LowRankGaussian | None = None
    extra: dict = field(default_factory=dict)
    anchors: tuple | None = None
    thinning: int = 1

    def gaussians(self) -> LowRankGaussian:
        """All draws as one LowRankGaussian with a flattened leading dim (chain * draw)."""
        d, k = self.loadings.shape[-2:]
        return LowRankGaussian(
            self.loadings.reshape(-1, d, k), self.noise.reshape(-1, d), self.mean.reshape(-1, d)
        )

    def extended(self, more: Draws) -> Draws:
        """These draws followed, chain by chain, by ``more`` (the same chains run on).

        Raises
        ------
        ValueError
            If ``more`` keeps every ``t``-th transition for another ``t`` (``thinning``).
        """
        if more.thinning != self.thinning:
            raise ValueError(f"more: draws of {more.thinning} transitions each cannot follow draws of "
                             f"{self.thinning}; run them on with thinning {self.thinning}")
        return self._each_array(lambda a, b: np.concatenate([a, b], axis=1), more)

    def thinned(self, step: int) -> Draws:
        """Every ``step``-th draw of each chain: draws ``step - 1, 2 step - 1, ...`` (the last one where
        the chains' length is a multiple of ``step``); ``diverging`` whether any of the ``step`` draws
        each one ends diverged."""
        def every(a):
            return np.ascontiguousarray(np.asarray(a)[:, step - 1::step])  # not a view of the long chains

        thinned = replace(self._each_array(every), thinning=self.thinning * step)
        if "diverging" not in self.sample_stats:
            return thinned
        groups = np.asarray(self.sample_stats["diverging"])[:, :step * thinned.loadings.shape[1]]
        diverged = groups.reshape(groups.shape[0], -1, step).any(axis=-1)  # no divergence thinned away
        return replace(thinned, sample_stats={**thinned.sample_stats, "diverging": diverged})

    def _each_array(self, f, *others: Draws) -> Draws:
        """These draws with every array of leading dims (chain, draw) ``a`` replaced by ``f(a, *b)``,
        ``b`` the same array of each of ``others``."""
        def by_name(group: str) -> dict:
            return {name: f(v, *(getattr(o, group)[name] for o in others))
                    for name, v in getattr(self, group).items()}

        plain = {name: f(getattr(self, name), *(getattr(o, name) for o in others))
                 for name in ("loadings", "noise", "mean")}
        return replace(self, **plain, sample_stats=by_name("sample_stats"), extra=by_name("extra"))

    def to_data_units(self, scale: float | np.ndarray) -> Draws:
        """The same draws with ``W`` and ``mu`` times ``scale`` and the noise times ``scale^2``.

        ``scale`` a number, or one per feature (d,) for draws of a model
        equivariant under rescaling each feature (FA; row ``j`` of ``W``
        times ``scale[j]``), whose ``extra`` has no per-column precisions.
        """
        if np.all(np.asarray(scale) == 1.0):
            return self
        ref = self.reference
        if ref is not None:
            ref = LowRankGaussian(*_scaled(ref.loadings, ref.noise, ref.mean, scale))
        loadings, noise, mean = _scaled(self.loadings, self.noise, self.mean, scale)
        extra = dict(self.extra)
        if "alpha" in extra:  # a precision of the loadings: units of 1 / W^2
            extra["alpha"] = np.asarray(extra["alpha"]) / scale**2
        return replace(self, loadings=loadings, noise=noise, mean=mean, reference=ref, extra=extra)


def _scaled(loadings, noise, mean, scale):
    scale = np.asarray(scale, dtype=float)
    rows = scale[:, None] if scale.ndim else scale
    return np.asarray(loadings) * rows, np.asarray(noise) * scale**2, np.asarray(mean) * scale


@dataclass(frozen=True)
class Fit:
    """What every fitter returns.

    Attributes
    ----------
    gaussian : LowRankGaussian
        The point estimate ``(W, Psi, mu)`` (NumPy): the maximum-likelihood
        point (closed form, EM), the guide's point (SVI) or the posterior
        mean (NUTS).
    log_likelihood : float
        Total log-likelihood of the training data (observed entries) at
        ``gaussian``.
    method : str
        ``"closed_form"``, ``"em"``, ``"svi"`` or ``"nuts"``.
    n_iter : int
        EM updates, SVI steps, kept NUTS draws (1 for the closed form).
    converged : bool
        The stopping rule was met (NUTS: no divergent transition).
    trace : ndarray
        The objective along the way: the log-likelihood after each EM cycle
        (non-decreasing); the SVI loss (negative ELBO) per step; the
        log-likelihood alone for the closed form and NUTS.
    at_floor : ndarray of bool, shape (d,)
        Noise variances held at their lower bound (Heywood cases).
    draws : Draws or None
        Posterior draws (NUTS) or guide draws (SVI with the horseshoe).
    details : Any
        Method-specific extras (SVI: the fitted guide and its parameters).
    """

    gaussian: LowRankGaussian
    log_likelihood: float
    method: str
    n_iter: int = 1
    converged: bool = True
    trace: np.ndarray = field(default_factory=lambda: np.zeros(0))
    at_floor: np.ndarray | None = None
    draws: Draws | None = None
    details: Any = None

    def to_data_units(self, scale: float, n_observed: int) -> Fit:
        """The fit of the data ``scale * X`` from that of working-unit ``X``.

        Parameters scale as in :meth:`Draws.to_data_units`; log-likelihoods
        gain ``-n_observed log(scale)`` (the Jacobian of ``x -> scale x`` over
        the ``n_observed`` observed entries); an SVI loss (a negative log
        density) loses it.
        """
        if scale == 1.0:
            return self
        shift = -n_observed * math.log(scale)
        trace = np.asarray(self.trace, dtype=float)
        trace = trace - shift if self.method == "svi" else trace + shift
        return replace(
            self,
            gaussian=LowRankGaussian(*_scaled(*self.gaussian, scale)),
            log_likelihood=float(self.log_likelihood + shift),
            trace=trace,
            draws=None if self.draws is None else self.draws.to_data_units(scale),
        )
