"""Probabilistic PCA and factor analysis estimators (maximum likelihood).

Both fit the low-rank-plus-diagonal Gaussian ``x ~ N(mu, W W^T + Psi)``
(:mod:`bayespca.gaussian`) and answer every question from it: posterior of
the latent factors, marginal log-likelihood, covariance and precision,
sampling, and imputation of missing entries (NaN). They differ in ``Psi``:
``sigma^2 I`` for :class:`PPCA`, ``diag(psi)`` for :class:`FactorAnalysis`.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin

from bayespca import gaussian
from bayespca.chunked import is_chunked, rowwise
from bayespca.data import as_float_matrix, check_is_fitted, finite_result, validate_transform
from bayespca.gaussian import LatentPosterior, LowRankGaussian
from bayespca.inference.closed_form import ppca_closed_form
from bayespca.inference.contract import IDENTIFICATIONS, Draws, Fit, ModelSpec
from bayespca.inference.em import fit_em
from bayespca.messages import warn
from bayespca.params import (
    as_generator,
    as_key,
    check_anchors,
    check_bool,
    check_choice,
    check_number,
    check_sampler_options,
    check_seed,
    check_svi_options,
)
from bayespca.sparse_input import is_sparse, map_row_blocks
from bayespca.statistics import Prepared, prepare

__all__ = ["FactorAnalysis", "PPCA", "default_candidates", "ledermann_bound", "max_components"]

MODELS = ("ppca", "fa")

ROTATIONS = ("varimax", "quartimax", "promax", "oblimin")
# Above this many (draw x row) values the pointwise log-likelihood is left out
# of posterior_ (to_arviz(log_likelihood=True) still computes it).
_MAX_POINTWISE = 20_000_000
_DEFAULT_TARGET = 0.9  # NUTS target acceptance rate but under the horseshoe


def _fitter(method: str):
    """The fitter of a method (SVI and NUTS imported on first use: they need NumPyro).

    The maximum-likelihood fitters are imported with this module, as
    scikit-learn's estimators are: imported at the first fit, they cost
    2-3 ms, as much as a small fit itself.
    """
    if method == "closed_form":
        return ppca_closed_form
    if method == "em":
        return fit_em
    if method == "svi":
        from bayespca.inference.svi import fit_svi

        return fit_svi
    from bayespca.inference.nuts import fit_nuts

    return fit_nuts


# Why a covariance or precision matrix can leave float64's range: noise variances at their floor
# on data whose own variances are near its edges.
_OUT_OF_RANGE = "(noise variances at their floor on data of extreme scale)"


def ledermann_bound(n_features: int) -> int:
    """Largest number of factors ``k`` with ``(d - k)^2 >= d + k`` (Ledermann, 1937).

    Above it the factor model ``W W^T + diag(psi)`` has more free parameters
    (``d k - k (k - 1) / 2 + d``) than the covariance has entries
    (``d (d + 1) / 2``): the loadings are then not identified even up to
    rotation. R's ``factanal`` refuses such ``k``.

    Examples
    --------
    >>> [ledermann_bound(d) for d in (3, 4, 6, 13, 30)]
    [1, 1, 3, 8, 22]
    """
    d = int(n_features)
    return max(k for k in range(d) if (d - k) ** 2 >= d + k)


def max_components(model: str, n_features: int) -> int:
    """The largest ``n_components`` a model accepts on ``n_features`` features (one rule everywhere).

    pPCA: ``d`` (at ``k = d`` it is the saturated Gaussian ``N(mu, C)``, its
    ML noise variance held at the floor). Factor analysis: ``d - 1``; above
    :func:`ledermann_bound` the fit warns that the loadings are not
    identified. :class:`PPCA`, :class:`FactorAnalysis`,
    :func:`bayespca.compare_n_components` and the command line use this.

    Examples
    --------
    >>> max_components("ppca", 4), max_components("fa", 4)
    (4, 3)
    """
    from bayespca.params import check_choice

    check_choice(model, "model", MODELS)
    if model == "fa" and n_features < 2:
        raise ValueError(
            "FactorAnalysis needs at least 2 features (n_features = 1): one feature is "
            "explained entirely by its own noise variance."
        )
    return int(n_features) if model == "ppca" else int(n_features) - 1


def default_candidates(model: str, n_features: int, largest: int = 6) -> list[int]:
    """Numbers of components compared by default: ``1 .. min(largest, limit)``.

    The limit is :func:`max_components` for pPCA and :func:`ledermann_bound`
    for factor analysis (at least 1), so the default never asks for a model
    the data cannot identify.

    Examples
    --------
    >>> default_candidates("ppca", 4), default_candidates("fa", 4), default_candidates("fa", 30)
    ([1, 2, 3, 4], [1], [1, 2, 3, 4, 5, 6])
    """
    limit = max_components(model, n_features)
    if model == "fa":
        limit = max(1, min(limit, ledermann_bound(n_features)))
    return list(range(1, min(largest, limit) + 1))


class _LowRankGaussianModel(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """What PPCA and FactorAnalysis share: everything that follows from ``gaussian_``."""

    _noise = "isotropic"
    _methods: tuple[str, ...] = ()

    # -------------------------------------------------------------- fitting
    _model = "ppca"

    def _plan(self, prepared: Prepared) -> tuple[str, ModelSpec, dict]:
        """Check every parameter against the data (named errors, before any work); the method,
        the model and the fitter's options."""
        method = check_choice(self.method, "method", self._methods)
        if method == "auto":
            method = self._auto_method(prepared.missing)
        if method == "closed_form" and prepared.missing is not None:
            raise ValueError(
                "method='closed_form' needs complete data, but X has "
                f"{int(prepared.missing.sum())} missing (NaN) entries; use method='em' or 'svi'."
            )
        k = self._check_n_components(prepared.n, prepared.d)
        check_number(self.padded_components, "padded_components", integer=True, low=k, high=prepared.d,
                     allow_none=True)
        self._check_prior(method)
        check_choice(self.identification, "identification", IDENTIFICATIONS, allow_none=True)
        anchors = self._check_anchors(prepared, k)
        check_seed(self.random_state)
        progress = None if self.progress_bar is None else check_bool(self.progress_bar, "progress_bar")
        floor = check_number(self.noise_floor, "noise_floor", low=0, high=1, low_open=True, high_open=True)
        tol = check_number(self.tol, "tol", low=0, allow_none=True)
        max_iter = check_number(self.max_iter, "max_iter", integer=True, low=1, allow_none=True)
        learning_rate = check_number(
            self.learning_rate, "learning_rate", low=0, low_open=True, allow_none=True
        )
        # The other methods' options too, as scikit-learn checks every parameter at fit.
        batch_size = check_svi_options(self.guide, self.batch_size, prepared.n)
        # None stands for a valid default (_target_accept_prob, whose prior lookup would import JAX here)
        target = _DEFAULT_TARGET if self.target_accept_prob is None else self.target_accept_prob
        check_sampler_options(self.num_warmup, self.num_samples, self.num_chains, self.chain_method, target)
        options = {}
        if method in ("closed_form", "em"):
            options["floor"] = floor
        if method in ("em", "svi") and tol is not None:
            options["tol"] = tol
        if method in ("em", "svi") and max_iter is not None:
            options["max_iter" if method == "em" else "num_steps"] = max_iter
        if method == "svi":
            if learning_rate is not None:
                options["learning_rate"] = learning_rate
            options.update(guide=self.guide, batch_size=batch_size)
        if method == "nuts":
            options.update(
                num_warmup=self.num_warmup, num_samples=self.num_samples, num_chains=self.num_chains,
                chain_method=self.chain_method, target_accept_prob=self._target_accept_prob(),
                padded_components=self.padded_components,
            )
        if method in ("svi", "nuts"):
            options.update(random_state=self.random_state, progress_bar=progress)
        return method, ModelSpec(self._noise, k, self.prior, self.identification, anchors), options

    def _check_n_components(self, n: int, d: int) -> int:
        """``n_components`` within :func:`max_components` (None: ``min(n - 1, d) - 1``, at least 1)."""
        upper = max_components(self._model, d)
        k = self.n_components
        if k is None:
            k = max(1, min(min(n - 1, d) - 1, upper))
        accepted = f"None or an int in [1, {upper}] (n_features = {d})"
        if isinstance(k, bool | np.bool_) or not isinstance(k, numbers.Integral):
            raise TypeError(f"{type(self).__name__}: n_components must be {accepted}; got {k!r}.")
        if not 1 <= k <= upper:
            raise ValueError(f"{type(self).__name__}: n_components must be {accepted}; got {k!r}.")
        if self._model == "fa" and k > ledermann_bound(d):
            bound = ledermann_bound(d)
            warn(
                f"n_components={k} exceeds the Ledermann bound (k <= {bound} for {d} features): the "
                "factor model has more free parameters than the covariance matrix has entries, so its "
                f"loadings are not identified (R's factanal refuses this k). Use n_components <= {bound}."
            )
        return int(k)

    def _check_prior(self, method: str) -> None:
        """A named error for a bad prior, or one a method cannot use."""
        if self.prior is None:
            return
        from bayespca.priors import as_priors, is_named  # lazily: numpyro is slow to import

        as_priors(self.prior)
        if method in ("closed_form", "em"):
            raise ValueError(
                f"prior={self.prior!r} needs method='nuts' or 'svi' (a posterior or a MAP); "
                f"method={method!r} maximises the likelihood, which has no prior."
            )
        if is_named(self.prior, "horseshoe") and method == "svi" and self.guide == "delta":
            raise ValueError(
                "guide must be 'normal' or 'lowrank' with the horseshoe prior (its MAP is not a "
                "sparse estimate); got guide='delta'."
            )

    def _check_anchors(self, prepared: Prepared, k: int) -> tuple | None:
        """``anchors`` checked, as a tuple of indices: only the horseshoe's triangle has anchors."""
        anchors = check_anchors(self.anchors, prepared.d, k, prepared.feature_names)
        if anchors is None:
            return None
        from bayespca.priors import is_named

        if not is_named(self.prior, "horseshoe") or self.identification not in (None, "lower_triangular"):
            raise ValueError(
                "anchors needs prior='horseshoe' with identification None or 'lower_triangular'; got "
                f"prior={self.prior!r}, identification={self.identification!r}."
            )
        return anchors

    def _fit_gaussian(self, X) -> Fit:
        """Validate -> reduce -> dispatch -> store: the one path of every method."""
        for name in [a for a in vars(self) if a.endswith("_") and not a.startswith("_")]:
            delattr(self, name)  # a refit leaves nothing of the previous method behind
        self._posterior_source = None
        prepared = prepare(X, estimator=self, accept_sparse=True)
        method, spec, options = self._plan(prepared)
        if is_sparse(X) and method not in ("closed_form", "em"):
            raise TypeError(
                f"X is a scipy sparse matrix and {type(self).__name__}(method={method!r}) does not accept "
                "sparse input: its posterior keeps the rows (observed data, pointwise log-likelihood) "
                "densely. Accepted on sparse input: method='closed_form' or 'em'; or pass X.toarray()."
            )
        fit = _fitter(method)(prepared, spec, **options)
        self._store_fit(fit, prepared)
        return fit

    def _store_fit(self, fit: Fit, prepared: Prepared) -> None:
        """The fitted attributes that follow from ``fit`` (and the data, for posterior draws)."""
        method = fit.method
        self.__dict__.pop("posterior_", None)  # built from the draws when first read
        self.gaussian_ = LowRankGaussian(*(np.asarray(a, dtype=float) for a in fit.gaussian))
        self.mean_ = self.gaussian_.mean
        self.n_components_ = self.gaussian_.loadings.shape[1]
        self.method_ = method
        self.log_likelihood_ = float(fit.log_likelihood)
        self.n_iter_ = int(fit.n_iter)
        self.converged_ = bool(fit.converged)
        if method == "svi":
            self.svi_losses_ = np.asarray(fit.trace)
            self.loglike_trace_ = np.array([fit.log_likelihood])
        else:
            self.loglike_trace_ = np.asarray(fit.trace)
        self.nuts_ = fit.draws if method == "nuts" else None
        self._chains = fit.details if method == "nuts" else None
        if fit.draws is not None:
            self._store_draws(fit.draws, prepared)
        self._finish(fit)

    def _finish(self, fit: Fit) -> None:
        """What each model derives from ``gaussian_`` (loadings, rotations, noise)."""

    def sample_more(self, num_samples=None, *, progress_bar=None):
        """Draw more from the posterior: the NUTS chains continue where they stopped.

        Each of the ``num_chains`` chains runs ``num_samples`` more transitions
        (``t`` times as many where the fit kept every ``t``-th draw)
        with the step size and mass matrix its warm-up adapted, in the
        program compiled for the fit: no new warm-up, mode search or
        compilation. Its draws join the fit's (along ``draw``), and every
        posterior attribute (``nuts_``, ``posterior_``, the samples, the
        posterior mean ``gaussian_`` and what follows from it) and the
        convergence check are brought up to date, as though the fit had drawn
        them all: the same Markov chains, so a fit of ``num_samples=m`` continued
        by ``n`` has the draws of a fit of ``m + n`` (bit for bit where
        ``num_warmup + m`` is a multiple of 50, the sampler's chunk, and
        neither fit ran its chains a second time or longer because the first
        failed the check: then each kept the run it judged better). A fit whose
        chains ran longer keeps every ``t``-th draw, and so do the draws added
        here (``t`` times ``num_samples`` transitions). The remedy
        for the warnings of too few effective draws (100 a chain) or a small
        R-hat excess, at the cost of the new draws only; chains in different
        modes stay there.

        Parameters
        ----------
        num_samples : int or None, default=None
            Draws to add per chain; None: ``num_samples`` of the fit again.
        progress_bar : bool or None, default=None
            None: the estimator's ``progress_bar``.

        Returns
        -------
        self

        Examples
        --------
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(200, 1)) @ [[2.0, 1.0, -1.0]] + rng.normal(size=(200, 3))
        >>> m = PPCA(1, method="nuts", num_warmup=100, num_samples=100, num_chains=2,
        ...          random_state=0, progress_bar=False).fit(X)
        >>> m.sample_more(150).loadings_samples_.shape
        (2, 250, 3, 1)
        """
        self._check_nuts("sample_more")
        num_samples, progress = self._more_options(num_samples, progress_bar)
        from bayespca.inference.nuts import continue_chains  # it checks num_samples, before any work

        fit = continue_chains(self._chains, self.nuts_, num_samples, progress)
        self._store_fit(fit, self._chains.prepared)
        return self

    def fit_warm(self, X, *, num_samples=None, progress_bar=None):
        """Fit to other rows ``X`` by NUTS, warm-started from this fit's chains.

        The posterior ``p(W, Psi, mu | X)`` that ``fit(X)`` samples (the
        priors that read the data's scales resolved from ``X``, the rows
        checked as ``fit`` checks them), with the draws of ``W`` reported as
        this fit's (its identification's reference and anchors). The sampled
        coordinates are whitened again at the new mode (found from the fit's,
        the Laplace factor turned to the nearest of the fit's), so each
        chain's last state stays a typical point and its adapted step size and
        mass matrix fit; the chains go on in the compiled sampler with no
        warm-up, the first 100 transitions dropped, then ``num_samples`` kept,
        one transition each (where the fit's chains ran on and kept every
        ``t``-th draw, these do not: ``attrs["thinning"]`` is 1). Made for
        refits on nearly the same rows: exact leave-one-out (which
        :func:`bayespca.loo` runs this way) or K-fold cross-validation. Every
        posterior attribute follows ``X``, and the fit's warnings are those of
        the new draws. Fits of data with missing values, or whose sampler
        whitens by a rotated or diagonal factor (pPCA with more than 160
        sampled parameters on 30 or more features; the horseshoe with
        ``identification="none"``), are refused: fit the estimator to ``X``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Complete rows (no NaN), ``n_samples >= 2``, with the fit's features.
        num_samples : int or None, default=None
            Draws per chain; None: ``num_samples``.
        progress_bar : bool or None, default=None
            None: the estimator's ``progress_bar``.

        Returns
        -------
        self

        Examples
        --------
        Leave-one-out: the posterior without the first row.

        >>> X = np.random.default_rng(1).normal(size=(150, 4))
        >>> fa = FactorAnalysis(1, method="nuts", num_warmup=100, num_samples=100, num_chains=2,
        ...                     random_state=0, progress_bar=False).fit(X)
        >>> fa.fit_warm(X[1:]).noise_variance_samples_.shape
        (2, 100, 4)
        """
        self._check_nuts("fit_warm")
        rows, missing = validate_transform(self, X, allow_nan=True)
        if missing is not None or rows.shape[0] < 2:
            given = f"{int(missing.sum())} missing entries" if missing is not None else f"{rows.shape[0]} row"
            raise ValueError(f"fit_warm needs X of 2 or more complete rows; got {given}. Accepted: "
                             "complete rows (fit the estimator itself to data with missing values).")
        num_samples, progress = self._more_options(num_samples, progress_bar)
        from bayespca.inference.nuts import continue_on  # it checks num_samples, before any work

        fit = continue_on(self._chains, rows, num_samples, progress)
        self._store_fit(fit, fit.details.prepared)
        return self

    def _more_options(self, num_samples, progress_bar) -> tuple:
        """``(num_samples, progress_bar)`` of a run of the fit's chains: None takes the estimator's."""
        num_samples = self.num_samples if num_samples is None else num_samples
        progress = self.progress_bar if progress_bar is None else progress_bar
        return num_samples, (None if progress is None else check_bool(progress, "progress_bar"))

    def _store_draws(self, draws: Draws, prepared: Prepared) -> None:
        """Posterior (NUTS) or guide (SVI) draws: samples, DataTree, diagnostics, prior summaries."""
        from bayespca.priors import as_priors

        n = prepared.n
        loadings = as_priors(self.prior).loadings
        if loadings is not None:
            for name, value in loadings.summaries(draws.loadings, draws.extra, draws.noise, n).items():
                setattr(self, name, value)
        if draws.anchors is not None:
            self.anchors_ = draws.anchors
        self.identification_ = draws.identification
        if self.method_ != "nuts":
            return
        from bayespca.chunked import draws_log_likelihood
        from bayespca.posterior import diagnose

        self.loadings_samples_ = draws.loadings
        self.noise_variance_samples_ = draws.noise if self._noise == "diagonal" else draws.noise[..., 0]
        self.mean_samples_ = draws.mean
        self.sample_stats_ = draws.sample_stats
        self.target_accept_prob_ = float(self._chains.target_accept_prob)  # the sampler's, not the option's
        stored = draws.loadings.shape[0] * draws.loadings.shape[1] * n
        # The log-likelihood of each draw from the statistics (O(d^2 k) a draw), not from the draws x rows
        # pointwise values: posterior_ computes those when it is first read (0.2-0.4 s at 4000 x 1000).
        total = draws_log_likelihood(draws, prepared)
        self._posterior_source = (prepared.data, prepared.feature_names, stored <= _MAX_POINTWISE, total)
        diagnose(draws, total, continuable=True, target_accept_prob=self.target_accept_prob_,
                 feature_names=prepared.feature_names)

    @functools.cached_property
    def posterior_(self):
        """The ArviZ DataTree of the NUTS draws, built when first read (see the class's Attributes)."""
        source = getattr(self, "_posterior_source", None)
        if source is None or getattr(self, "nuts_", None) is None:
            raise AttributeError(f"{type(self).__name__} has a posterior_ once fitted with method='nuts'.")
        from bayespca.posterior import to_datatree

        X, feature_names, pointwise, total = source
        return to_datatree(self.nuts_, X, feature_names=feature_names, log_likelihood=pointwise,
                           log_lik=total)

    def _target_accept_prob(self) -> float:
        """The NUTS target: the user's, else 0.99 under the horseshoe (funnels diverge at 0.9), else 0.9."""
        if self.target_accept_prob is not None:
            return self.target_accept_prob
        from bayespca.priors import is_named

        return 0.99 if is_named(self.prior, "horseshoe") else _DEFAULT_TARGET

    def _draws(self, num_samples=None, random_state=None) -> LowRankGaussian:
        """Posterior draws of ``(W, Psi, mu)`` (all, or ``num_samples`` picked at random)."""
        g = self.nuts_.gaussians()
        if num_samples is None:
            return g
        total = g.loadings.shape[0]
        rng = np.random.default_rng(random_state)
        idx = rng.choice(total, size=num_samples, replace=num_samples > total)
        return LowRankGaussian(*(np.asarray(a)[idx] for a in g))

    def to_arviz(self, *, log_likelihood=True, posterior_predictive=False, random_state=None):
        """The posterior as an ArviZ DataTree (see :func:`bayespca.posterior.to_datatree`).

        Groups ``posterior`` (dims chain, draw, feature, component; feature
        coordinates from ``feature_names_in_``), ``sample_stats``,
        ``log_likelihood`` (marginal ``log p(x_i | W, Psi, mu)``, dims
        (chain, draw, obs)), ``observed_data`` and, when
        ``posterior_predictive``, replicated data sets. Needs ``method="nuts"``.
        """
        self._check_nuts("to_arviz")
        from bayespca.posterior import to_datatree

        X = self.posterior_["observed_data"]["X"].values
        return to_datatree(
            self.nuts_,
            X,
            feature_names=getattr(self, "feature_names_in_", None),
            log_likelihood=log_likelihood,
            posterior_predictive=posterior_predictive,
            random_state=random_state,
        )

    def summary(self, ci_prob=0.89):
        """Posterior summary: invariant quantities, then identified loadings (a DataFrame).

        Rows: the noise variances (``sigma2`` or ``psi``), ``eigenvalues`` of
        ``W W^T``, ``log_lik`` (total log-likelihood) -- meaningful under any
        identification -- then ``W`` (meaningful when identified, see
        ``identification_``), ``alpha`` with ``prior="ard"`` and
        ``inclusion`` (``1 - kappa`` per loading) with ``prior="horseshoe"``;
        the lower-triangular identification's structural zeros left out.
        Columns from
        ``arviz.summary``: mean, sd, equal-tailed interval, ess_bulk,
        ess_tail, r_hat, mcse.
        """
        self._check_nuts("summary")
        import arviz_stats

        noise = "sigma2" if self._noise == "isotropic" else "psi"
        names = [noise, "eigenvalues", "log_lik", "W"]
        for name in ("alpha", "inclusion"):
            if name in self.posterior_["posterior"]:
                names.append(name)
        # One variable at a time: ArviZ 1.3's summary of several variables flattens W in
        # (component, feature) order but labels it (feature, component) once a variable
        # with only the component dim precedes it.
        with np.errstate(divide="ignore", invalid="ignore"):  # constant draws: the structural zeros
            summaries = [arviz_stats.summary(self.posterior_, var_names=[v], ci_kind="eti", ci_prob=ci_prob)
                         for v in names]
        table = pd.concat(summaries)
        if self.identification_ != "lower_triangular":
            return table
        w = self.posterior_["posterior"]["W"]
        features, components = (w.coords[dim].values for dim in w.dims[2:])
        rows, cols = np.nonzero(np.all(w.values == 0.0, axis=(0, 1)))
        # Labelled as ArviZ labels the rows: by the features' names where the data had them.
        zeros = [f"{v}[{features[j]}, {components[c]}]" for j, c in zip(rows, cols, strict=True)
                 for v in ("W", "inclusion")]
        return table.drop(index=zeros, errors="ignore")

    def _check_nuts(self, what):
        check_is_fitted(self, "gaussian_")
        if getattr(self, "nuts_", None) is None:
            raise ValueError(f"{what} needs a posterior: fit with method='nuts' (got {self.method_!r}).")

    # ------------------------------------------------- rotation of the factors
    def _rotation(self) -> np.ndarray | None:
        """``R`` with ``loadings_ = W R`` (None when the factors are not rotated)."""
        return None

    def _rotate_posterior(self, post: LatentPosterior) -> LatentPosterior:
        r = self._rotation()
        mean, cov = np.asarray(post.mean), np.asarray(post.covariance)
        if r is None:
            return LatentPosterior(mean, cov)
        # z_rot = R^{-1} z, so E[z_rot] = R^{-1} E[z] and Cov[z_rot] = R^{-1} Cov[z] R^{-T}.
        r_inv = np.linalg.inv(r)
        return LatentPosterior(mean @ r_inv.T, r_inv @ cov @ r_inv.T)

    # ---------------------------------------------------------- inference
    def latent_posterior(self, X) -> LatentPosterior:
        """Posterior ``N(mean_i, cov_i)`` of the latent factors of each row of ``X``.

        ``mean_i = M^{-1} W^T Psi^{-1} (x_i - mu)`` and ``cov = M^{-1}``, with
        ``M = I + W^T Psi^{-1} W``. A row with missing entries (NaN) conditions
        on its observed entries only (``W_O``, ``Psi_O``), so its covariance is
        its own. For rotated factors these are the moments of ``R^{-1} z``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            NaN marks a missing entry.

        Returns
        -------
        LatentPosterior
            ``mean`` of shape (n_samples, n_components); ``covariance`` of
            shape (n_components, n_components) when nothing is missing,
            else (n_samples, n_components, n_components).
        """
        check_is_fitted(self, "gaussian_")
        X, missing = validate_transform(self, X, allow_nan=True)
        observed = None if missing is None else ~missing
        if getattr(self, "nuts_", None) is not None:
            from bayespca.posterior import latent_moments  # JAX: loaded with the first Bayesian fit

            post = latent_moments(self._draws(), np.nan_to_num(X), observed)
        elif missing is None:
            post = gaussian.latent_posterior(self.gaussian_, X)
        else:
            post = gaussian.latent_posterior(self.gaussian_, np.nan_to_num(X), ~missing)
        return self._rotate_posterior(post)

    @rowwise(width="out", draws=True)
    def sample_latent(self, X, num_samples=100, random_state=None):
        """Draws of the latent factors ``z_i`` from their posterior, shape (num_samples, n, k).

        Each draw picks a posterior draw ``(W, Psi, mu)`` of the parameters at
        random and then ``z_i ~ p(z | x_i, W, Psi, mu)`` (Gaussian, see
        :meth:`latent_posterior`), so the spread includes the uncertainty of
        the parameters. Rows with missing entries (NaN) condition on their
        observed entries. Needs ``method="nuts"``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        num_samples : int, default=100
        random_state : int, numpy Generator or None
        """
        self._check_nuts("sample_latent")
        if (
            isinstance(num_samples, bool)
            or not isinstance(num_samples, numbers.Integral)
            or (num_samples < 1)
        ):
            raise ValueError(f"num_samples must be an int >= 1; got {num_samples!r}.")
        X, missing = validate_transform(self, X, allow_nan=True)
        observed = None if missing is None else ~missing
        rng = np.random.default_rng(random_state)
        draws = self._draws(int(num_samples), rng)
        key = as_key(rng)
        from bayespca.posterior import sample_latent

        z = sample_latent(draws, np.nan_to_num(X), observed, key)
        r = self._rotation()
        return z if r is None else z @ np.linalg.inv(r).T

    @rowwise(width="out")
    def transform(self, X):
        """Posterior mean of the latent factors, ``E[z | x]``, shape (n_samples, n_components).

        Rows with missing entries (NaN) use their observed entries only. A
        scipy sparse ``X`` is taken one block of dense rows at a time.
        """
        if is_sparse(X):
            return map_row_blocks(self.transform, validate_transform(self, X, accept_sparse=True).X)
        return self.latent_posterior(X).mean

    @rowwise(width="in", named=False)
    def inverse_transform(self, X):
        """Mean of ``x`` given factor values, ``W z + mu``, shape (n_samples, n_features)."""
        check_is_fitted(self, "gaussian_")
        Z = as_float_matrix(X, name="X")
        if Z.shape[1] != self.n_components_:
            raise ValueError(
                f"X has {Z.shape[1]} columns, but inverse_transform expects n_components_ = "
                f"{self.n_components_} factor columns."
            )
        return Z @ self.components_ + self.mean_

    def sample(self, n_samples=1, random_state=None):
        """Draw new data from the fitted model, shape (n_samples, n_features).

        Parameters
        ----------
        n_samples : int, default=1
        random_state : int, numpy Generator, RandomState or None
            Drawn with NumPy (:func:`bayespca.params.as_generator`; None:
            fresh entropy); nothing is compiled.
        """
        check_is_fitted(self, "gaussian_")
        if isinstance(n_samples, bool) or not isinstance(n_samples, numbers.Integral) or n_samples < 1:
            raise ValueError(f"n_samples must be an int >= 1; got {n_samples!r}.")
        rng = as_generator(random_state)
        return np.asarray(gaussian.sample(self.gaussian_, rng, int(n_samples)))

    @rowwise(width=None)
    def score_samples(self, X):
        """Marginal log-likelihood ``log N(x_i | mu, W W^T + Psi)`` per row, shape (n_samples,).

        A row with missing entries gets the density of its observed entries.
        A scipy sparse ``X`` is taken one block of dense rows at a time.
        """
        check_is_fitted(self, "gaussian_")
        if is_sparse(X):
            return map_row_blocks(self.score_samples, validate_transform(self, X, accept_sparse=True).X)
        X, missing = validate_transform(self, X, allow_nan=True)
        if missing is None:
            return np.asarray(gaussian.log_prob(self.gaussian_, X))
        return np.asarray(gaussian.log_prob(self.gaussian_, np.nan_to_num(X), ~missing))

    def score(self, X, y=None):
        """Mean marginal log-likelihood of the rows of ``X``."""
        return float(np.mean(self.score_samples(X)))

    def get_covariance(self):
        """Model covariance ``W W^T + Psi``, shape (n_features, n_features).

        Rotations leave it unchanged (``L_rot Phi L_rot^T = W W^T``).
        """
        check_is_fitted(self, "gaussian_")
        with np.errstate(over="ignore", invalid="ignore"):
            cov = np.asarray(gaussian.covariance(self.gaussian_))
        return finite_result(cov, f"{type(self).__name__}.get_covariance", _OUT_OF_RANGE)

    def get_precision(self):
        """Inverse model covariance by the Woodbury identity, shape (n_features, n_features)."""
        check_is_fitted(self, "gaussian_")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            precision = np.asarray(gaussian.precision(self.gaussian_))
        return finite_result(precision, f"{type(self).__name__}.get_precision", _OUT_OF_RANGE)

    def impute(self, X, return_variance=False, *, n_imputations=None, random_state=None):
        """Replace missing entries (NaN) by their conditional mean given the observed ones.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        return_variance : bool, default=False
            Also return the conditional variance of each entry (0 where observed).
        n_imputations : int, optional
            Multiple imputation (needs ``method="nuts"``): return that many
            completed data sets drawn from the posterior predictive of the
            missing entries, one posterior draw of the parameters each, with
            the predictive moments and intervals of every missing entry
            (:func:`bayespca.imputation.multiple_imputation`).
        random_state : None, int, Generator or RandomState
            Seeds the multiple imputations.

        Returns
        -------
        X_imputed : ndarray of shape (n_samples, n_features)
        variance : ndarray of shape (n_samples, n_features)
            Only when ``return_variance`` is True.
        imputations : bayespca.imputation.Imputations
            Instead, with ``n_imputations``: ``.datasets`` (n_imputations,
            n_samples, n_features), ``.mean``, ``.within_variance``,
            ``.between_variance`` and ``.interval(prob)``.
        """
        check_is_fitted(self, "gaussian_")
        if n_imputations is None:
            return self._conditional_mean(X, return_variance=return_variance)
        if is_chunked(X):
            raise ValueError(
                "impute(n_imputations=...) needs X in memory (each completed data set is returned "
                "whole); got a Dask array. Use impute(X) for the lazy conditional mean, or X.compute()."
            )
        self._check_nuts("impute(n_imputations=...)")
        check_bool(return_variance, "return_variance")
        if return_variance:
            raise ValueError("return_variance must be False with n_imputations: the Imputations it "
                             "returns carry the variances (within_variance, between_variance).")
        from bayespca.imputation import multiple_imputation

        X, missing = validate_transform(self, X, allow_nan=True)
        return multiple_imputation(self._draws(), X, missing, n_imputations, random_state)

    @rowwise(width="in", pair="return_variance")
    def _conditional_mean(self, X, return_variance=False):
        """:meth:`impute` without ``n_imputations`` (lazily, chunk by chunk, on Dask input)."""
        X, missing = validate_transform(self, X, allow_nan=True)
        if missing is None:
            filled, var = X.copy(), np.zeros_like(X)
        else:
            cond = gaussian.conditional_missing(self.gaussian_, np.nan_to_num(X), ~missing)
            filled, var = np.asarray(cond.mean), np.asarray(cond.variance)
        return (filled, var) if return_variance else filled

    @property
    def _n_features_out(self):
        return self.n_components_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        tags.transformer_tags.preserves_dtype = ["float64"]
        # Sparse complete data: the maximum-likelihood methods, which read only the statistics.
        tags.input_tags.sparse = self.method in ("auto", "closed_form", "em")
        return tags


class PPCA(_LowRankGaussianModel):
    """Probabilistic PCA by maximum likelihood, with missing values.

    The model (Tipping & Bishop 1999) is

        z ~ N(0, I_k),   x | z ~ N(W z + mu, sigma^2 I),   so  x ~ N(mu, W W^T + sigma^2 I).

    Parameters
    ----------
    n_components : int or None, default=None
        ``k`` in ``[1, n_features]``. None: ``min(n_samples - 1, n_features) - 1``
        (at least 1), the largest ``k`` that leaves a positive noise variance
        for data in general position.
    method : {"auto", "closed_form", "em", "svi", "nuts"}, default="auto"
        ``"closed_form"``: eigendecomposition, exact ML with the true
        denominator ``n`` (:func:`bayespca.inference.closed_form.ppca_closed_form`);
        ``"em"``: EM, exact with missing values
        (:func:`bayespca.inference.em.fit_em`); ``"svi"``: NumPyro SVI on the
        marginal model (:func:`bayespca.inference.svi.fit_svi`; MAP with
        ``guide="delta"``, so its priors shift the answer slightly);
        ``"auto"``: closed form for complete data, EM when X has NaN;
        ``"nuts"``: the full posterior by NUTS on the marginal model
        (:func:`bayespca.inference.nuts.fit_nuts`).
    tol : float or None, default=None
        Convergence tolerance of EM (estimated distance of the parameters to
        the EM fixed point; default 1e-9) or SVI; None: the method's default.
    max_iter : int or None, default=None
        Maximum EM updates or SVI steps; None: the method's default.
    noise_floor : float, default=1e-10
        Lower bound on ``sigma^2`` as a fraction of the mean feature variance,
        in ``(0, 1)``: with ``k >= rank`` (or ``n <= k + 1``) the ML ``sigma^2`` is 0.
    guide : {"delta", "normal", "lowrank"}, default="delta"
        SVI guide.
    learning_rate : float or None, default=None
        SVI step size; None: SVI's default.
    batch_size : int or None, default=None
        SVI minibatch size (None: full batch).
    random_state : int, numpy Generator or None, default=None
        SVI seed.
    progress_bar : bool or None, default=None
        SVI / NUTS progress bar; None shows it in a terminal or a notebook
        only.
    prior : None, "flat", "ard", "horseshoe", a bayespca.priors prior, Priors or dict, default=None
        Priors of the ``"svi"`` and ``"nuts"`` methods (the maximum-likelihood
        methods refuse one): None for the scale-aware defaults of
        :mod:`bayespca.priors`; ``"flat"`` for improper flat priors (SVI's
        delta guide then returns the maximum-likelihood point); ``"ard"`` for
        Bishop's Bayesian PCA (a Gamma-distributed precision per column of
        ``W``, :class:`bayespca.priors.ARD`);
        ``"horseshoe"`` (or ``bayespca.priors.Horseshoe(p0=..., ...)``) for
        sparse loadings under the regularised horseshoe on the entries of
        ``W`` (:class:`bayespca.priors.Horseshoe`; method ``"nuts"``, where
        ``target_accept_prob`` defaults to 0.99, or ``"svi"`` with
        ``guide="normal"`` or ``"lowrank"``). ``W`` is then not rotated to a
        canonical basis: by default it has the horseshoe's triangular
        structure (``identification_`` ``"lower_triangular"``: anchor features
        ``p_1..p_k`` chosen from the maximum-likelihood loadings, with
        ``W_{p_i l} = 0`` for ``l > i``, exact zeros of ``loadings_``; see
        :class:`bayespca.priors.Horseshoe`); with ``identification="none"``
        the prior alone picks the rotation, and the columns are ordered by
        decreasing norm, each with its largest entry positive.
    identification : {None, "polar", "lower_triangular", "procrustes", "none"}, default=None
        How NUTS identifies ``W`` (None: ``"polar"``, or ``"lower_triangular"``
        with the horseshoe, which takes that or ``"none"`` only; for FactorAnalysis in
        the features' standard-deviation units, with draws reported in
        factanal's orientation, ``W^T Psi^-1 W`` diagonal and decreasing);
        see :mod:`bayespca.models`. With None, FactorAnalysis chains move in
        ``W``'s own coordinates where the polar ones are near their
        singularity (weak factors whose scales may meet, typically near the
        Ledermann bound; :func:`bayespca.inference.nuts.fit_nuts`), with the
        draws reported in the same orientation.
    num_warmup, num_samples, num_chains : int, default=500, 500, 4
        NUTS warm-up and kept draws per chain, and number of chains. Chains of
        400 draws or more that fail the convergence check without a divergent
        transition, after the sampler's other remedies, run on (no new warm-up)
        up to 4 times as long and keep every 2nd, 3rd or 4th draw, the first
        that passes (``posterior_["sample_stats"].attrs["thinning"]``), where
        4 times the length could pass (:func:`bayespca.posterior.shortfall`).
    chain_method : {"parallel", "sequential", "vectorized"}, default="parallel"
        NUTS chains on threads, one chain per CPU at a time; one after the
        other (the same draws); or as one vectorized program, the choice on
        a GPU (see :func:`bayespca.inference.nuts.fit_nuts`).
    target_accept_prob : float or None, default=None
        NUTS target acceptance rate; None: 0.99 with the horseshoe prior (whose
        funnels make smaller steps necessary; measured 6-12 divergences at
        0.95, none at 0.99), else 0.9.
    padded_components : int or None, default=None
        NUTS: sample ``W`` with this many columns (``n_components`` to
        ``n_features``), those past ``n_components`` held at 0: the same
        posterior, and one compiled sampler serves every ``n_components`` up
        to it, where each would compile its own (~5 s per k at d = 20 on 2
        cores); each transition costs more (about ``(padded / k)^2`` at
        most). With the polar identification and the default or flat loadings
        prior; ignored otherwise, though checked at fit whatever the method.
        :func:`bayespca.comparison.compare_n_components` sets it.
    anchors : sequence of int (or of column names) or None, default=None
        With ``prior="horseshoe"`` and its triangle (identification None or
        ``"lower_triangular"``): the ``n_components`` distinct anchor features
        ``p_1..p_k``, ``W_{p_i l} = 0`` for ``l > i`` (feature ``p_i`` loads on
        the first ``i`` factors only), e.g. a marker feature of each factor;
        a DataFrame's column names may stand for their indices.
        None: chosen from the maximum-likelihood loadings
        (:func:`bayespca.models.pivot_anchors`), reported as ``anchors_``.

    Attributes
    ----------
    components_ : ndarray of shape (n_components_, n_features)
        ``W^T``. By maximum likelihood: orthogonal rows of decreasing norm
        (the principal axes scaled by ``sqrt(lambda_j - sigma^2)``), each
        with its largest-magnitude entry positive; closed form, EM and SVI
        give the same rows, not only the same ``W W^T``. By NUTS the
        posterior mean of ``W`` in its identification's orientation, and
        under ``prior="horseshoe"`` (NUTS or SVI) the triangle's sparse
        loadings: neither is rotated to orthogonal rows.
    loadings_ : ndarray of shape (n_features, n_components_)
        ``W``.
    noise_variance_ : float
        ``sigma^2``.
    mean_ : ndarray of shape (n_features,)
    n_components_ : int
    gaussian_ : LowRankGaussian
        ``(W, sigma^2 1, mu)``, the fitted distribution.
    log_likelihood_ : float
        Total log-likelihood of the training data (observed entries).
    loglike_trace_ : ndarray
        Log-likelihood after each EM cycle (non-decreasing); one entry for
        the closed form and SVI.
    n_iter_ : int
        EM updates or SVI steps (1 for the closed form; NUTS: draws kept).
    converged_ : bool
    method_ : str
        The method that ran.
    svi_losses_ : ndarray
        Only for ``method="svi"``: the SVI loss (negative ELBO) per step.
    nuts_ : NUTSFit or None
        Only for ``method="nuts"``: the posterior draws and sampler
        statistics (:class:`bayespca.inference.contract.Draws`). The point
        estimate ``gaussian_`` (hence ``components_``, ``noise_variance_``,
        ``score``, ``impute``, ``sample``, covariance) is then the posterior
        mean of ``(W, Psi, mu)`` with identified ``W``; ``transform`` and
        ``latent_posterior`` average over all draws instead (posterior mean
        and covariance of ``z``), and ``sample_latent`` draws ``z``.
    loadings_samples_, noise_variance_samples_, mean_samples_ : ndarray
        NUTS draws with leading dims (chain, draw).
    sample_stats_ : dict of ndarray (chain, draw)
        ``diverging``, ``n_steps`` (leapfrog steps), ``tree_depth``, ``lp``,
        ``acceptance_rate``.
    identification_ : str
        Where there are draws (NUTS; SVI with the horseshoe): how the draws
        of ``W`` are told apart from their rotations, ``"polar"``,
        ``"lower_triangular"`` (the anchors' triangle), ``"procrustes"``,
        ``"signed_permutation"`` (the horseshoe with ``identification="none"``:
        columns aligned by sign and order) or ``"none"``; see
        :mod:`bayespca.inference.nuts`.
    target_accept_prob_ : float
        Only for ``method="nuts"``: the acceptance rate the step size was
        adapted to (``target_accept_prob``, or its default: 0.99 with
        ``prior="horseshoe"``, else 0.9).
    n_effective_components_ : int
        Only with ``prior="ard"``: components that ARD left active
        (:meth:`bayespca.priors.ARD.summaries`).
    inclusion_ : ndarray of shape (n_features, n_components_)
        Only with ``prior="horseshoe"``: posterior mean of ``1 - kappa_jl``,
        the inclusion-like weight of each loading (``kappa_jl`` its
        shrinkage factor, see :class:`bayespca.priors.Horseshoe`): near 1
        for a loading the data keep, lower for one shrunk to 0 (the data
        cannot tell an exact zero from a loading below its standard error,
        so zeros sit around 0.3 to 0.6 rather than at 0).
    loadings_interval_ : ndarray of shape (n_features, n_components_, 2)
        Only with ``prior="horseshoe"``: the 90% equal-tailed posterior
        interval of each loading (NUTS draws or SVI guide draws).
    support_ : ndarray of bool, shape (n_features, n_components_)
        Only with ``prior="horseshoe"``: loadings whose 90% interval
        excludes 0, the estimated support.
    anchors_ : tuple of int
        Only with ``prior="horseshoe"`` and its triangle: the anchor
        features (``anchors``, or those chosen), whose loadings on the later
        factors are the structural zeros of ``loadings_``.
    posterior_ : xarray.DataTree
        The ArviZ DataTree of :meth:`to_arviz` (without posterior predictive;
        without ``log_likelihood`` above 2e7 draw x row values), built when
        first read. Fitting warns (``SamplingWarning``) on divergences,
        R-hat > 1.01 or low ESS of the invariant quantities.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a DataFrame with string column names.

    Notes
    -----
    scikit-learn's ``PCA.score`` uses the same Gaussian with ``n - 1``
    eigenvalues; this class maximises the likelihood (denominator ``n``), so
    its ``log_likelihood_`` is the larger. Scores of rows with missing
    entries are the densities of their observed entries (data missing at
    random).

    References
    ----------
    M. E. Tipping, C. M. Bishop (1999). Probabilistic principal component
    analysis. J. R. Stat. Soc. B 61(3), 611-622.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> X = load_iris().data
    >>> ppca = PPCA(n_components=2).fit(X)
    >>> round(ppca.noise_variance_, 6), round(ppca.score(X), 6)
    (0.050682, -2.699752)
    >>> X[0, 1] = np.nan
    >>> PPCA(2).fit(X).impute(X[:1]).round(2)
    array([[5.1 , 3.44, 1.4 , 0.2 ]])
    """

    _noise = "isotropic"
    _methods = ("auto", "closed_form", "em", "svi", "nuts")

    def __init__(
        self,
        n_components=None,
        *,
        method="auto",
        tol=None,
        max_iter=None,
        noise_floor=1e-10,
        guide="delta",
        learning_rate=None,
        batch_size=None,
        random_state=None,
        progress_bar=None,
        prior=None,
        identification=None,
        num_warmup=500,
        num_samples=500,
        num_chains=4,
        chain_method="parallel",
        target_accept_prob=None,
        padded_components=None,
        anchors=None,
    ):
        self.n_components = n_components
        self.method = method
        self.tol = tol
        self.max_iter = max_iter
        self.noise_floor = noise_floor
        self.guide = guide
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.random_state = random_state
        self.progress_bar = progress_bar
        self.prior = prior
        self.identification = identification
        self.num_warmup = num_warmup
        self.num_samples = num_samples
        self.num_chains = num_chains
        self.chain_method = chain_method
        self.target_accept_prob = target_accept_prob
        self.padded_components = padded_components
        self.anchors = anchors

    def _auto_method(self, missing) -> str:
        return "closed_form" if missing is None else "em"

    def fit(self, X, y=None):
        """Fit the model by maximum likelihood.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            NaN marks a missing entry.
        y : ignored

        Returns
        -------
        self
        """
        self._fit_gaussian(X)
        return self

    def _finish(self, fit: Fit) -> None:
        self.loadings_ = self.gaussian_.loadings
        self.components_ = self.loadings_.T
        self.noise_variance_ = float(np.mean(self.gaussian_.noise))


class FactorAnalysis(_LowRankGaussianModel):
    """Factor analysis by maximum likelihood, with missing values and rotations.

    The model is

        z ~ N(0, I_k),   x | z ~ N(W z + mu, diag(psi)),   so  x ~ N(mu, W W^T + diag(psi)).

    Parameters
    ----------
    n_components : int or None, default=None
        Number of factors ``k`` in ``[1, n_features - 1]``. None:
        ``min(n_samples - 1, n_features) - 1`` (at least 1). The model is
        identified only when ``(d - k)^2 >= d + k``.
    method : {"auto", "em", "svi", "nuts"}, default="auto"
        ``"em"``: maximum likelihood (:func:`bayespca.inference.em.fit_em`):
        Newton's method on the profiled likelihood from several starts for
        complete data (:func:`bayespca.inference.factor_ml.fit_factor_analysis`),
        exact EM over the missing entries with NaN; ``"svi"``:
        NumPyro SVI (:func:`bayespca.inference.svi.fit_svi`); ``"nuts"``: full
        posterior (:func:`bayespca.inference.nuts.fit_nuts`); ``"auto"``: EM.
    rotation : {None, "varimax", "quartimax", "promax", "oblimin"}, default=None
        Rotation of the loadings (:func:`bayespca.rotations.rotate`, Kaiser
        normalised). It changes ``loadings_``, ``components_`` and the factor
        scores of ``transform``, never the likelihood or the covariance.
    tol : float or None, default=None
        Convergence tolerance; None: the method's default. Complete data:
        every free ``|d f / d log psi_j|`` below ``tol (1 + S_jj / psi_j)``
        (``f`` = -2/n log-likelihood; default 1e-11); with missing values:
        EM's estimated distance to its fixed point (default 1e-9).
    max_iter : int or None, default=None
        Maximum EM updates or SVI steps; None: the method's default.
    noise_floor : float, default=1e-9
        Heywood guard: ``psi_j >= noise_floor * var_j``, ``noise_floor`` in
        ``(0, 1)``. Features that end at the bound are listed in
        ``heywood_features_`` and warned about. (The likelihood of a Heywood
        case rises by O(n * noise_floor) as the bound goes to 0; the fit
        stays accurate down to 1e-12.)
    guide, learning_rate, batch_size, random_state, progress_bar
        SVI options, as in :class:`PPCA`.
    prior, identification, num_warmup, num_samples, num_chains, chain_method, target_accept_prob
    padded_components
        NUTS options, as in :class:`PPCA`.

    Attributes
    ----------
    components_ : ndarray of shape (n_components_, n_features)
        ``loadings_.T``.
    loadings_ : ndarray of shape (n_features, n_components_)
        Loadings, rotated when ``rotation`` is set. Unrotated, ``W^T Psi^{-1} W``
        is diagonal and decreasing and each column's largest-magnitude entry
        is positive (the orientation of R's ``factanal``).
    noise_variance_ : ndarray of shape (n_features,)
        Uniquenesses ``psi``.
    mean_ : ndarray of shape (n_features,)
    n_components_ : int
    rotation_matrix_ : ndarray of shape (n_components_, n_components_)
        ``R`` with ``loadings_ = W R`` (identity without rotation).
    factor_correlation_ : ndarray of shape (n_components_, n_components_)
        ``Phi = R^{-1} R^{-T}``, the correlation of the rotated factors
        (identity for orthogonal rotations). Also available as ``Phi_``.
    heywood_features_ : ndarray of int
        Features whose ``psi_j`` ended at the floor.
    gaussian_ : LowRankGaussian
        The fitted distribution, with the unrotated ``W``.
    log_likelihood_, loglike_trace_, n_iter_, converged_, method_,
    n_features_in_, feature_names_in_, nuts_, loadings_samples_,
    noise_variance_samples_, mean_samples_, sample_stats_, identification_,
    target_accept_prob_
        As in :class:`PPCA`.

    References
    ----------
    D. B. Rubin, D. T. Thayer (1982). EM algorithms for ML factor analysis.
    Psychometrika 47(1), 69-76.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((1000, 2)) @ rng.standard_normal((2, 6))
    >>> X += rng.standard_normal((1000, 6)) * np.sqrt([0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    >>> fa = FactorAnalysis(n_components=2).fit(X)
    >>> fa.noise_variance_.round(2)
    array([0.14, 0.31, 0.46, 0.4 , 0.74, 0.68])
    >>> bool(np.allclose(np.diag(fa.get_covariance()), X.var(axis=0), rtol=1e-4))
    True
    """

    _noise = "diagonal"
    _methods = ("auto", "em", "svi", "nuts")

    def __init__(
        self,
        n_components=None,
        *,
        method="auto",
        rotation=None,
        tol=None,
        max_iter=None,
        noise_floor=1e-9,
        guide="delta",
        learning_rate=None,
        batch_size=None,
        random_state=None,
        progress_bar=None,
        prior=None,
        identification=None,
        num_warmup=500,
        num_samples=500,
        num_chains=4,
        chain_method="parallel",
        target_accept_prob=None,
        padded_components=None,
        anchors=None,
    ):
        self.n_components = n_components
        self.method = method
        self.rotation = rotation
        self.tol = tol
        self.max_iter = max_iter
        self.noise_floor = noise_floor
        self.guide = guide
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.random_state = random_state
        self.progress_bar = progress_bar
        self.prior = prior
        self.identification = identification
        self.num_warmup = num_warmup
        self.num_samples = num_samples
        self.num_chains = num_chains
        self.chain_method = chain_method
        self.target_accept_prob = target_accept_prob
        self.padded_components = padded_components
        self.anchors = anchors

    _model = "fa"

    def _auto_method(self, missing) -> str:
        return "em"

    def fit(self, X, y=None):
        """Fit the model by maximum likelihood, then rotate the loadings if asked.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            NaN marks a missing entry.
        y : ignored

        Returns
        -------
        self
        """
        check_choice(self.rotation, "rotation", ROTATIONS, allow_none=True)
        if self.rotation is not None and self.prior is not None:
            from bayespca.priors import is_named

            if is_named(self.prior, "horseshoe"):
                raise ValueError(
                    f"rotation must be None with prior='horseshoe' (the prior already picks the sparse "
                    f"basis, which a rotation would undo); got rotation={self.rotation!r}."
                )
        self._fit_gaussian(X)
        return self

    def _finish(self, fit: Fit) -> None:
        w = self.gaussian_.loadings
        k = w.shape[1]
        if self.rotation is None:
            loadings, r, phi = w, np.eye(k), np.eye(k)
        else:
            from bayespca.rotations import rotate

            rot = rotate(w, self.rotation)
            loadings, r, phi = (np.asarray(a) for a in (rot.loadings, rot.matrix, rot.factor_correlation))
        self.loadings_ = loadings
        self.components_ = loadings.T
        self.rotation_matrix_ = r
        self.factor_correlation_ = phi
        self.noise_variance_ = np.asarray(self.gaussian_.noise)
        at_floor = np.zeros(len(w), bool) if fit.at_floor is None else fit.at_floor
        self.heywood_features_ = np.flatnonzero(at_floor)

    @property
    def Phi_(self):  # noqa: N802 - the name statisticians use
        """Correlation matrix of the rotated factors (alias of ``factor_correlation_``)."""
        check_is_fitted(self, "factor_correlation_")
        return self.factor_correlation_

    def _rotation(self):
        return self.rotation_matrix_
