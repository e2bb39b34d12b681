"""Model comparison by PSIS-LOO on the marginal likelihood: how many components, pPCA or FA.

Leave-one-out cross-validation here predicts a *new row*: the pointwise
log-likelihood is the marginal ``log p(x_i | W, Psi, mu) = log N(x_i | mu,
W W^T + Psi)`` with the latent ``z_i`` integrated out (observed entries
only for rows with NaN), one value per row, shape (chain, draw, n). The
conditional ``p(x_i | z_i, W, Psi, mu)`` would answer another question
(predicting a row already seen through its own ``z_i``) and its importance
weights are heavy-tailed by construction (Merkle, Furr & Rabe-Hesketh 2019).

PSIS needs the relative efficiency ``reff`` of the draws. ArviZ's default is
the mean relative ESS of *every* posterior variable, which non-identified
(rotating, sign-flipping) loadings deflate although the likelihood does not
depend on them. :func:`bayespca.psis.relative_efficiency` computes it instead as the mean
over rows of ``ESS(p(x_i | theta^s)) / S`` (the quantity whose expectation
PSIS estimates, as R's ``loo::relative_eff``), which is rotation invariant.

Only posteriors sampled by NUTS are compared. SVI guides (``"normal"``,
``"lowrank"``) are Gaussian in the unconstrained loadings, while the
posterior of ``W`` is spread along the curved orbit ``W R`` (``R``
orthogonal): the approximate-posterior correction of Magnusson et al.
(2019), importance ratios ``p(theta, X) / q(theta)``, gave Pareto k-hat of
1.1-1.6 for every ``k >= 2`` on a 300 x 8 data set with 3 true components
(k = 1, whose only symmetry is a sign flip, gave 0.57 with the low-rank
guide), so such estimates would be unreliable; :func:`loo` refuses them.

References
----------
A. Vehtari, A. Gelman, J. Gabry (2017). Practical Bayesian model evaluation
using leave-one-out cross-validation and WAIC. Stat. Comput. 27, 1413-1432.
E. C. Merkle, D. Furr, S. Rabe-Hesketh (2019). Bayesian comparison of latent
variable models: conditional versus marginal likelihoods. Psychometrika 84,
802-829.
M. Magnusson, M. R. Andersen, J. Jonasson, A. Vehtari (2019). Bayesian
leave-one-out cross-validation for large data. ICML, PMLR 97, 4244-4253.
T. Sivula, M. Magnusson, A. A. Matamoros, A. Vehtari (2025). Uncertainty in
Bayesian leave-one-out cross-validation based model comparison. arXiv:2008.10296.
"""

from __future__ import annotations

import copy
import numbers
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from arviz_stats.loo.wrapper import SamplingWrapper
from xarray import DataArray

from bayespca.data import as_float_matrix
from bayespca.messages import MORE_DRAWS, progress, shown_above, warn
from bayespca.params import as_generator, check_bool, check_choice, check_number
from bayespca.psis import psis_loo

__all__ = [
    "KHAT_THRESHOLD",
    "ComparisonResult",
    "ParetoKWarning",
    "compare",
    "compare_n_components",
    "loo",
    "noiseless_candidates",
]

# Pareto k-hat above which PSIS-LOO is unreliable however many the draws; with S draws the threshold
# is min(1 - 1 / log10(S), KHAT_THRESHOLD) (Vehtari et al. 2024; ArviZ's ELPDData.good_k).
KHAT_THRESHOLD = 0.7
# Sivula et al.: |elpd_diff| < 4 means the models predict alike and dse is unreliable.
SMALL_ELPD_DIFF = 4.0
_MODELS = ("ppca", "fa")
# Folds of the ML fit's cross-validation unless the caller says; fewer rows give one fold a row.
DEFAULT_FOLDS = 5
_WEIGHT_METHODS = ("stacking", "BB-pseudo-BMA", "pseudo-BMA")
_SVI_REFUSAL = (
    "{what}: PSIS-LOO needs posterior draws, and the Gaussian guide of method='svi' cannot "
    "follow the rotation orbit W R of the loadings (the importance ratios p(theta, X) / q(theta) "
    "of Magnusson et al. 2019 have Pareto k-hat > 1 for k >= 2, so the estimate would be "
    "unreliable). Fit with method='nuts' to compare models."
)


class ParetoKWarning(UserWarning):
    """Some Pareto k-hat exceed the threshold for the number of draws: PSIS-LOO is unreliable there."""


def _datatree(model: Any, name: str):
    """The DataTree with a ``log_likelihood`` group behind a fitted estimator or a DataTree."""
    from xarray import DataTree

    if isinstance(model, DataTree):
        if "log_likelihood" not in model.children:
            raise ValueError(f"{name} is a DataTree without a log_likelihood group.")
        return model
    if not hasattr(model, "gaussian_"):
        raise TypeError(
            f"{name} must be a fitted PPCA or FactorAnalysis (method='nuts'), an ArviZ "
            f"DataTree with a log_likelihood group, or an ELPDData; got {type(model).__name__}."
        )
    if getattr(model, "method_", None) == "svi":
        raise ValueError(_SVI_REFUSAL.format(what=f"{name} was fitted with method='svi'"))
    if getattr(model, "nuts_", None) is None:
        raise ValueError(
            f"{name} has no posterior (method_={model.method_!r}); fit it with "
            "method='nuts' for PSIS-LOO."
        )
    tree = model.posterior_
    if "log_likelihood" not in tree.children:  # left out of posterior_ for its size
        rows, sizes = tree["observed_data"]["X"].shape[0], tree["posterior"].sizes
        values = rows * sizes["chain"] * sizes["draw"]
        warn(
            f"{name}: PSIS-LOO over all {rows} rows needs their {values:.3g} draws x rows "
            f"log-likelihood values ({values * 8 / 1e9:.1f} GB in memory); "
            "bayespca.subsampled_loo.loo_subsample(model, X) estimates the elpd from a subsample of "
            "the rows, as compare_n_components does at this size."
        )
        tree = model.to_arviz(log_likelihood=True)
    return tree


def loo(model: Any, *, var_name: str | None = None, name: str = "model", max_refits: int = 10):
    """PSIS-LOO of one NUTS fit on its marginal pointwise log-likelihood, exact where PSIS fails.

    ``elpd = sum_i log p(x_i | x_{-i})``, each term estimated by Pareto-smoothed
    importance sampling with ``reff`` from :func:`bayespca.psis.relative_efficiency`
    (:func:`bayespca.psis.psis_loo`: ArviZ's estimate, all rows at once). For a
    fitted estimator, the rows whose Pareto ``k-hat`` exceeds the threshold
    for ``S`` draws, ``min(1 - 1 / log10(S), 0.7)`` (Vehtari et al. 2024;
    ArviZ's ``good_k``, on which its ``warning`` flag and :func:`arviz.compare`
    read; 0.67 at 1000 draws, 0.70 at 2000), at most ``max_refits`` of
    them, are scored exactly instead: the model is refitted
    without the row and ``log p(x_i | x_{-i})`` is the log
    mean of ``p(x_i | theta)`` over the refit's draws
    (:func:`arviz_stats.reloo`); their ``k-hat`` is then 0. A fit of
    complete data is refitted by its own chains moved to the other rows
    (``fit_warm``: the posterior a new fit samples, in the compiled sampler
    with no new warm-up; standardised wine, pPCA k = 4: 0.38 s a refit
    against 0.84 s for a new fit); one with missing values, whose sampler
    ``fit_warm`` cannot continue, or whose moved chains diverge, by a new fit
    (same options and seed, the compiled sampler reused).

    Parameters
    ----------
    model : PPCA, FactorAnalysis or xarray.DataTree
        A fit with ``method="nuts"``, or a DataTree with a ``log_likelihood``
        group of dims (chain, draw, obs) (no refits possible then).
    var_name : str, optional
        Variable of the ``log_likelihood`` group (needed only when it has several).
    name : str, default="model"
        Name used in warnings and errors.
    max_refits : int, default=10
        Most rows refitted exactly; 0 turns refits off. With more bad rows
        than this, none is refitted and the warning says so.

    Returns
    -------
    arviz_stats.ELPDData
        Pointwise (``elpd_i``, ``pareto_k``), ready for :func:`arviz.compare`.

    Warns
    -----
    ParetoKWarning
        When some ``k-hat`` above that threshold remain, naming the remedies.
    UserWarning
        Before forming the draws x rows values of a fit whose ``posterior_``
        left them out for their size (above 2e7 of them, 160 MB), with their
        size and :func:`bayespca.subsampled_loo.loo_subsample`, which needs
        only a subsample of the rows.

    Examples
    --------
    Rows ``x_i ~ N(mu, I_2)`` with a flat prior, so ``mu | X ~ N(xbar, I / n)``
    and the exact ``p(x_i | x_{-i}) = N(x_i | xbar_{-i}, (1 + 1 / (n - 1)) I)``:

    >>> from arviz_base import from_dict
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(50, 2))
    >>> mu = X.mean(0) + rng.normal(size=(4, 1000, 2)) / np.sqrt(50)
    >>> ll = -0.5 * ((X - mu[:, :, None, :]) ** 2).sum(-1) - np.log(2 * np.pi)
    >>> tree = from_dict({"posterior": {"mu": mu}, "log_likelihood": {"x": ll}})
    >>> var = 1 + 1 / 49
    >>> rest = (X.sum(0) - X) / 49
    >>> exact = np.sum(-0.5 * ((X - rest) ** 2).sum(1) / var - np.log(2 * np.pi * var))
    >>> bool(abs(loo(tree).elpd - exact) < 0.05)
    True
    """
    check_number(max_refits, "max_refits", integer=True, low=0)
    tree = _datatree(model, name)
    group = tree["log_likelihood"].to_dataset()
    if var_name is None:
        if len(group.data_vars) != 1:
            raise ValueError(
                f"{name}: the log_likelihood group has variables {list(group.data_vars)}; pass var_name."
            )
        var_name = next(iter(group.data_vars))
    elif var_name not in group.data_vars:
        raise ValueError(f"var_name must be one of {list(group.data_vars)}; got {var_name!r}.")
    ll = group[var_name].transpose("chain", "draw", ...)
    result = psis_loo(ll)
    threshold = float(result.good_k)  # the sample-size threshold, at most KHAT_THRESHOLD
    bad = int(np.sum(np.asarray(result.pareto_k) > threshold))
    if 0 < bad <= max_refits and hasattr(model, "gaussian_"):
        from arviz_stats import reloo

        with warnings.catch_warnings():
            # ArviZ's generic message is replaced by ours, which names the fixes.
            warnings.filterwarnings("ignore", message="Estimated shape parameter of Pareto")
            result = reloo(_Refit(model, tree), loo_orig=result, var_name=var_name,
                           k_threshold=threshold, pointwise=True)
    khat = np.asarray(result.pareto_k)
    bad_left = int(np.sum(khat > threshold))
    if bad_left:
        refits = (
            f"more than max_refits={max_refits} rows, so none was refitted exactly"
            if hasattr(model, "gaussian_") and bad_left > max_refits
            else "no refit possible from a DataTree"
        )
        warn(
            f"{name}: Pareto k-hat > {threshold:.2f} (the threshold for {ll.shape[0] * ll.shape[1]} "
            f"draws) for {bad_left} of {khat.size} rows "
            f"(max {shown_above(float(np.nanmax(khat)), threshold)}; {refits}); PSIS-LOO is "
            "unreliable there. Fixes: more draws (num_samples) if k-hat is barely above; a larger "
            "max_refits (exact refits of those rows); exact K-fold cross-validation (the "
            "cv_log_likelihood column of compare_n_components). High k-hat on the marginal "
            "likelihood usually marks outlying rows (see the pareto_k of this result)."
            f"{MORE_DRAWS if hasattr(model, 'sample_more') else ''}",
            ParetoKWarning,
        )
    return result


class _Refit(SamplingWrapper):
    """Refits a bayespca estimator without some rows, for :func:`arviz_stats.reloo`."""

    def __init__(self, estimator, tree):
        super().__init__(model=estimator, idata_orig=tree)
        self.X = np.asarray(tree["observed_data"]["X"].values, dtype=float)

    def sel_observations(self, idx):
        keep = np.ones(len(self.X), bool)
        keep[idx] = False
        return self.X[keep], self.X[~keep]

    def sample(self, modified_observed_data):
        from sklearn.base import clone

        rows = modified_observed_data
        with warnings.catch_warnings():
            # The refit's own diagnostics concern one leave-one-out fit, not the user's.
            warnings.simplefilter("ignore")
            warm = hasattr(self.model, "fit_warm") and getattr(self.model, "nuts_", None) is not None
            if warm and not np.isnan(rows).any():
                try:  # the fit's chains moved to the other rows: the same posterior, at half a fit's cost
                    moved = copy.copy(self.model).fit_warm(rows)
                except ValueError:  # a sampler they cannot go on in (missing values, a rotated factor)
                    moved = None
                # Divergent transitions (where the chains' adaptation no longer fits): a new fit instead.
                if moved is not None and not moved.sample_stats_["diverging"].any():
                    return moved
            refit = clone(self.model)
            if getattr(self.model, "anchors_", None) is not None:
                # The same model: anchors pivoted again from fewer rows could be others.
                refit.set_params(anchors=self.model.anchors_)
            return refit.fit(rows)

    def get_inference_data(self, fitted_model):
        return fitted_model.nuts_

    def log_likelihood__i(self, excluded_obs, idata__i):
        from bayespca.posterior import pointwise_log_likelihood

        return DataArray(pointwise_log_likelihood(idata__i, excluded_obs), dims=("chain", "draw", "obs"))


def _check_weight_method(method: Any) -> str:
    lowered = {m.lower(): m for m in _WEIGHT_METHODS}
    if not isinstance(method, str) or method.lower() not in lowered:
        raise ValueError(f"method must be one of {list(_WEIGHT_METHODS)}; got {method!r}.")
    return lowered[method.lower()]


def compare(models: Mapping, *, method: str = "stacking", max_refits: int = 10) -> pd.DataFrame:
    """Compare fitted models by PSIS-LOO: ArviZ's comparison table plus the worst Pareto k-hat.

    Parameters
    ----------
    models : mapping of name -> model
        At least two of: fitted :class:`~bayespca.PPCA` /
        :class:`~bayespca.FactorAnalysis` with ``method="nuts"`` (any prior,
        e.g. ``"ard"``), ArviZ DataTrees with a ``log_likelihood`` group
        (e.g. ``posterior_``), or ``ELPDData`` from :func:`loo`. All must be
        fitted to the same rows.
    method : {"stacking", "BB-pseudo-BMA", "pseudo-BMA"}, default="stacking"
        How :func:`arviz.compare` weighs the models.
    max_refits : int, default=10
        Passed to :func:`loo` for each fitted model: the most rows with a
        high k-hat it refits exactly.

    Returns
    -------
    pandas.DataFrame
        Indexed by model name, best first: ``rank``, ``elpd``, ``p``,
        ``elpd_diff`` (to the best), ``weight``, ``se``, ``dse`` (standard
        error of the paired difference to the best), ArviZ's ``p_worse``,
        ``diag_diff``, ``diag_elpd``, then ``warning`` (some k-hat above
        ArviZ's sample-size threshold ``min(1 - 1/log10(S), 0.7)``) and
        ``pareto_k_max``.

    Raises
    ------
    ValueError
        Fewer than two models, models fitted to different numbers of rows,
        or SVI fits (see the module docstring).

    Examples
    --------
    Two models of rows ``x_i ~ N(mu, s^2 I_2)`` with draws of ``mu`` from its
    posterior: the right scale ``s = 1`` against ``s = 2``:

    >>> from arviz_base import from_dict
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(50, 2))
    >>> mu = X.mean(0) + rng.normal(size=(4, 500, 2)) / np.sqrt(50)
    >>> sq = ((X - mu[:, :, None, :]) ** 2).sum(-1)
    >>> trees = {f"s={s}": from_dict({"posterior": {"mu": mu},
    ...          "log_likelihood": {"x": -0.5 * sq / s**2 - np.log(2 * np.pi * s**2)}})
    ...          for s in (1, 2)}
    >>> table = compare(trees)
    >>> list(table.index), bool(table["elpd_diff"].iloc[1] < -2 * table["dse"].iloc[1])
    (['s=1', 's=2'], True)
    """
    import arviz_stats
    from arviz_stats.utils import ELPDData

    if not isinstance(models, Mapping) or len(models) < 2:
        raise ValueError(
            "models must be a mapping of at least two names to fitted models; got "
            f"{type(models).__name__} of length {len(models) if hasattr(models, '__len__') else '?'}."
        )
    method = _check_weight_method(method)
    check_number(max_refits, "max_refits", integer=True, low=0)
    elpds = {}
    for name, model in models.items():
        elpds[name] = (model if isinstance(model, ELPDData)
                       else loo(model, name=f"models[{name!r}]", max_refits=max_refits))
        if elpds[name].elpd_i is None:
            raise ValueError(f"models[{name!r}] is an ELPDData without pointwise values; use pointwise=True.")
    sizes = {name: int(e.n_data_points) for name, e in elpds.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"models must be fitted to the same rows; numbers of rows: {sizes}.")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Estimated shape parameter of Pareto")
        table = arviz_stats.compare(elpds, method=method, round_to="none")
    table["warning"] = [bool(elpds[name].warning) for name in table.index]
    table["pareto_k_max"] = [float(np.nanmax(np.asarray(elpds[name].pareto_k))) for name in table.index]
    return table


@dataclass
class ComparisonResult:
    """What :func:`compare_n_components` found.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per k (index ``n_components``, increasing): the LOO columns
        ``elpd``, ``se``, ``elpd_diff``, ``dse``, ``p``, ``weight``, ``rank``,
        ``warning``, ``pareto_k_max`` (see :func:`compare`); the
        maximum-likelihood criteria ``minka`` (Minka's log-evidence of pPCA,
        larger is better), ``bic`` and ``aic`` (``-2 L + penalty``, smaller
        is better), ``cv_log_likelihood`` and ``cv_se`` (K-fold held-out
        log-likelihood of the ML fit, mean per row and its standard error);
        ``gavish_donoho``, True at the Gavish-Donoho rank; and
        ``parallel_analysis``, True at the rank parallel analysis keeps
        (:func:`bayespca.selection.parallel_analysis`; False everywhere with
        missing values or a constant column).

        ``p`` is LOO's effective number of parameters, ``sum_i (lpd_i -
        elpd_i)``. On data the model describes it is near the model's count of
        free parameters, ``d k - k (k - 1) / 2 + d + 1`` for pPCA, and grows
        with k; well above that count it marks misspecification, rows the fit
        leans on (the R loo package's glossary). Standardised wine (k = 1..5): 29, 41,
        55, 89-95, 89 against counts of 27, 39, 50, 60, 69: above at every k
        (three cultivars are not one Gaussian), and furthest at k = 4, whose
        fourth component must choose between two directions of nearly equal
        variance (correlation eigenvalues 0.92 and 0.85) and so follows
        single rows; at k = 5 both are in the model and ``p`` falls.
    n_components : int
        The recommended k (see ``rule``).
    rule : str
        How ``n_components`` was chosen.
    comparison : pandas.DataFrame
        The table of :func:`compare` (ArviZ's, best first), indexed by k, or
        of :func:`bayespca.subsampled_loo.compare_subsampled`.
    models : dict of int -> estimator
        The NUTS fits.
    loo : dict of int -> arviz_stats.ELPDData or SubsampledLOO
        Pointwise PSIS-LOO of each fit (subsampled on Dask input and for
        large n; see :func:`compare_n_components`).
    """

    table: pd.DataFrame
    n_components: int
    rule: str
    comparison: pd.DataFrame
    models: dict = field(repr=False)
    loo: dict = field(repr=False)

    def _repr_html_(self) -> str:
        return f"<p>n_components = {self.n_components}: {self.rule}</p>" + self.table._repr_html_()


def _check_candidates(n_components: Any, upper: int, model: str) -> list[int]:
    accepted = (
        f"an iterable of distinct ints in [1, {upper}] (bayespca.probabilistic.max_components) "
        "with at least two values"
    )
    if isinstance(n_components, numbers.Integral) or not isinstance(n_components, Iterable):
        raise TypeError(f"n_components must be {accepted}; got {n_components!r}.")
    ks = list(n_components)
    bad = [k for k in ks if isinstance(k, bool | np.bool_) or not isinstance(k, numbers.Integral)]
    if bad or len(set(ks)) != len(ks) or len(ks) < 2:
        raise ValueError(f"n_components must be {accepted}; got {ks!r}.")
    out = sorted(int(k) for k in ks)
    if out[0] < 1 or out[-1] > upper:
        raise ValueError(f"n_components must be {accepted} for model={model!r}; got {ks!r}.")
    return out


def noiseless_candidates(ks: list[int], model: str, n: int, d: int) -> list[int]:
    """The pPCA candidates ``n - 2 <= k < d`` whose exact LOO refits would leave the data no noise.

    A refit fits ``n - 1`` rows, whose centred data have rank at most
    ``n - 2``; pPCA's posterior with ``k`` at or above that rank and below
    ``d`` is improper
    (:func:`bayespca.inference.closed_form.check_rows_leave_noise`). Factor
    analysis, whose noise prior vanishes at 0, has none.

    Examples
    --------
    >>> noiseless_candidates([1, 2, 3, 4], "ppca", n=5, d=10), noiseless_candidates([1, 2], "fa", n=3, d=10)
    ([3, 4], [])
    """
    return [k for k in ks if n - 2 <= k < d] if model == "ppca" else []


def _n_parameters(k: int, d: int, model: str) -> int:
    """Free parameters of pPCA / FA with k components: mean, W modulo rotation, noise."""
    return d + d * k - k * (k - 1) // 2 + (1 if model == "ppca" else d)


def _spectral_criteria(X: np.ndarray, ks: list[int]) -> tuple[np.ndarray, int | None]:
    """Minka's log-evidence at each k and the Gavish-Donoho rank (NaN, None with missing values)."""
    from bayespca.selection import select_from_singular_values

    n, d = X.shape
    s = _singular_values(X)
    if s is None:
        return np.full(len(ks), np.nan), None
    minka = np.full(len(ks), np.nan)
    if n >= d:
        sel = select_from_singular_values(s, n, d, "mle")
        lookup = dict(zip(sel.candidates.tolist(), sel.criterion, strict=True))
        minka = np.array([lookup.get(k, np.nan) for k in ks])
    gd = select_from_singular_values(s, n, d, "gavish-donoho").n_components
    return minka, gd


def _singular_values(X) -> np.ndarray | None:
    """Singular values of the centred data, None with missing values (Dask input: from the scatter)."""
    from bayespca.chunked import is_chunked
    from bayespca.linalg import svd_full

    if not is_chunked(X):
        return None if np.isnan(X).any() else svd_full(X, X.mean(axis=0)).singular_values
    from bayespca.statistics import prepare

    prepared = prepare(X)
    if prepared.missing is not None:
        return None
    eigenvalues = np.linalg.eigvalsh(prepared.stats.scatter)[::-1]
    return np.sqrt(np.clip(eigenvalues, 0.0, None)) * prepared.scale


def _cross_validated(X, ks, estimator, cv, seed):
    """Held-out marginal log-likelihood of the ML fit, mean per row and its se, per k."""
    from sklearn.model_selection import KFold

    n = X.shape[0]
    held_out = np.empty((len(ks), n))
    with warnings.catch_warnings():
        # A fold's own Heywood case is not the data's: the full fit of each k reports those.
        warnings.simplefilter("ignore", UserWarning)
        for train, test in KFold(cv, shuffle=True, random_state=seed).split(X):
            for j, k in enumerate(ks):
                held_out[j, test] = estimator(n_components=k).fit(X[train]).score_samples(X[test])
    return held_out.mean(axis=1), held_out.std(axis=1, ddof=1) / np.sqrt(n)


def _ml_fit(estimator: type, k: int, X):
    """The maximum-likelihood fit of ``k`` components, its warnings (a Heywood case) naming that ``k``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = estimator(n_components=k).fit(X)
    _reraise(caught, k)
    return fit


def _with_progress(ks: list[int], seeds, progress_bar: bool | None):
    """``(k, seed)`` pairs, shown as a progress bar (None: in a terminal or a notebook only)."""
    show = None if progress_bar is None else check_bool(progress_bar, "progress_bar")
    pairs = list(zip(ks, seeds, strict=True))
    bar = progress(show, iterable=pairs, desc="n_components", unit="k")
    return pairs if bar is None else bar


def _reraise(caught: list, k: int) -> None:
    """The warnings of the fit of one k, raised again with the k they are about."""
    prefix = f"n_components={k}: "
    for record in caught:
        if issubclass(record.category, UserWarning):
            # The fits are the comparison's: the user holds none to continue.
            text = str(record.message).removesuffix(MORE_DRAWS)
            # loo's own warning already starts with the k (its name)
            warn(text if text.startswith(prefix) else prefix + text, record.category)


# Features x largest k up to which compare_n_components pads every k to the largest. k = 1..6, 2 cores:
# n = 1000 synthetic, d = 20 67 -> 44 s, d = 40 122 -> 90 s, d = 100 222 -> 235 s; breast cancer
# standardised (d = 30, more leapfrog steps a draw) 102 -> 110 s.
_PADDED_SIZE = 150


def compare_n_components(
    X: Any,
    n_components: Iterable[int] | None = None,
    *,
    model: str = "ppca",
    method: str = "nuts",
    cv: int | None = None,
    observations: int = 400,
    max_refits: int = 10,
    random_state: Any = None,
    progress_bar: bool | None = None,
    **fit_kwargs,
) -> ComparisonResult:
    """Fit each number of components by NUTS, compare by PSIS-LOO, and recommend one.

    Every k is fitted with the same priors and options (``fit_kwargs``), its
    marginal pointwise log-likelihood scored by :func:`loo`, and the fits
    compared by :func:`compare`. Where ``d * max(k) <= 150``, the fits
    sample ``W`` with as many columns as the largest k, those past k held
    at 0 (``padded_components``, the same posterior): one compiled sampler
    serves every k, where each would compile its own (n = 1000, d = 20,
    k = 1..6 on 2 cores: 67 -> 44 s). Padding makes each transition dearer,
    which outweighs the compiling saved on larger models (breast cancer,
    standardised, d = 30: 102 -> 110 s). ``padded_components`` overrides
    the rule (None: never). Next to LOO the table carries the cheap
    criteria of the maximum-likelihood fit: Minka's evidence
    (:func:`bayespca.selection.select_from_singular_values`, ``"mle"``), the
    Gavish-Donoho rank, ``AIC = -2 L + 2 P`` and ``BIC = -2 L + P log n``
    with ``L`` the maximised log-likelihood and
    ``P = d + d k - k (k - 1) / 2 + (1 | d)`` free parameters (mean,
    loadings modulo rotation, noise), and K-fold cross-validation of the ML
    fit (held-out ``log p(x_i | theta_ML(X_{-fold}))``).

    Rows whose PSIS ``k-hat`` exceeds the threshold for the number of
    draws are scored by exact refits (:func:`loo`), so the elpd of every k is reliable; a warning says when
    the recommended k is the largest (or the smallest, above 1) offered,
    since the best k may then lie outside the range. Warnings of the fit of
    one k are raised again prefixed ``n_components=k:``.

    On Dask input, or when rows x draws exceed
    :data:`bayespca.subsampled_loo.SUBSAMPLE_ABOVE` (n > 10,000 at 4 x 500
    draws), PSIS-LOO is subsampled (:func:`bayespca.subsampled_loo.loo_subsample`,
    Magnusson et al. 2019): every k is scored on the same ``observations``
    rows, so the differences between k are paired, with the approximations
    of every row reduced chunk by chunk; the table gains
    ``subsampling_dse`` and its ``weight`` is NaN. On Dask input the NUTS
    and ML fits come from the reduced statistics, Minka and Gavish-Donoho
    from the reduced scatter; the cross-validation columns are NaN and
    parallel analysis is not run (both need the rows in memory).

    The recommendation is the smallest k whose elpd is below the best by at
    most ``max(dse, 4)``: within one standard error of its paired difference
    to the best k, or closer than 4, below which Sivula et al. (2025) find
    differences small and their ``dse`` unreliable (ArviZ flags them
    ``|elpd_diff| < 4``). Among models that predict new rows about equally
    well, the simplest. Without the floor, Monte Carlo noise of a few tenths
    against a ``dse`` of similar size can make an extra, useless component
    look better.

    Parameters
    ----------
    X : array-like, dask.array.Array or dask.dataframe.DataFrame of shape (n_samples, n_features)
        NaN marks a missing entry: each row then counts with its observed
        entries (likelihood, LOO and cross-validation); Minka and
        Gavish-Donoho, which need the complete spectrum, are NaN / False.
    n_components : iterable of int or None, default=None
        Candidate k, distinct, in ``[1, max_components(model, d)]``, at least
        two. None: :func:`bayespca.probabilistic.default_candidates`
        (``1 .. 6``, clipped to ``d`` for pPCA and to the Ledermann bound for
        FA), less the :func:`noiseless_candidates` of ``n`` rows.
    model : {"ppca", "fa"}, default="ppca"
        :class:`~bayespca.PPCA` or :class:`~bayespca.FactorAnalysis`.
    method : {"nuts", "svi"}, default="nuts"
        Only ``"nuts"`` gives posteriors PSIS-LOO can use; ``"svi"`` raises
        (see the module docstring).
    cv : int or None, default=None
        Folds of the cross-validation of the ML fit, 2 to ``n``. None: 5, or
        one fold a row (leave-one-out) where there are fewer than 5 rows.
    observations : int, default=400
        Rows of the subsample when PSIS-LOO is subsampled (see above; all
        rows when there are fewer).
    max_refits : int, default=10
        Most rows of each k refitted exactly (:func:`loo`); with more rows
        above the k-hat threshold, none is, and that k's warning says so. 0
        turns refits off. Not used when PSIS-LOO is subsampled.
    random_state : int, numpy Generator or None
        Seeds the NUTS fits (one derived seed per k) and the folds.
    progress_bar : bool or None, default=None
        A progress bar over the candidate k; None shows it in a terminal or
        a notebook only.
    **fit_kwargs
        Estimator options shared by every k (``prior``, ``num_warmup``,
        ``num_samples``, ``num_chains``, ``identification``,
        ``padded_components`` (default: see above), ...).

    Returns
    -------
    ComparisonResult

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> X = rng.normal(size=(100, 1)) @ [[2.0, 1.0, -1.0, 1.5]] + rng.normal(size=(100, 4))
    >>> res = compare_n_components(X, [1, 2], num_warmup=100, num_samples=100,
    ...                            num_chains=1, random_state=0)
    >>> res.n_components, list(res.table.index), bool(res.table.loc[1, "gavish_donoho"])
    (1, [1, 2], True)
    """
    from bayespca.chunked import as_dask_matrix, is_chunked
    from bayespca.probabilistic import PPCA, FactorAnalysis, max_components
    from bayespca.subsampled_loo import SUBSAMPLE_ABOVE, compare_subsampled

    check_choice(model, "model", _MODELS)
    _check_method(method)
    chunked = is_chunked(X)
    arr = as_dask_matrix(X)[0] if chunked else as_float_matrix(X, name="X", allow_nan=True)
    n, d = arr.shape
    observations = min(check_number(observations, "observations", integer=True, low=2), n)
    max_refits = check_number(max_refits, "max_refits", integer=True, low=0)
    ks = _candidates(n_components, model, n, d)
    cv = check_number(min(DEFAULT_FOLDS, n) if cv is None else cv, "cv", integer=True, low=2, high=n)
    estimator = PPCA if model == "ppca" else FactorAnalysis
    options = _fit_options(estimator, fit_kwargs, ks, d)
    seeds = as_generator(random_state).integers(2**31, size=len(ks) + 1)

    probe = estimator(**fit_kwargs)
    subsampled = chunked or n * probe.num_chains * probe.num_samples > SUBSAMPLE_ABOVE
    fits, elpds = _fit_each(X, ks, seeds, estimator, options, progress_bar, subsampled=subsampled,
                            observations=observations, max_refits=max_refits)
    comparison = compare_subsampled(elpds) if subsampled else compare(elpds)
    loo_columns = ["elpd", "se", "elpd_diff", "dse", "p", "weight", "rank", "warning", "pareto_k_max"]
    table = comparison.loc[ks, loo_columns + (["subsampling_dse"] if subsampled else [])].copy()
    table.index = pd.Index(ks, name="n_components")
    table["rank"] = table["rank"].astype(int)
    _add_classical_criteria(table, arr, model, estimator, cv, int(seeds[-1]), chunked)
    chosen, rule = _recommendation(table, int(comparison.index[0]))
    _warn_at_edge(chosen, ks, max_components(model, d))
    return ComparisonResult(table, chosen, rule, comparison, fits, elpds)


def _check_method(method: Any) -> None:
    """Refuse any method but NUTS, naming why SVI is refused."""
    if method == "svi":
        raise ValueError(_SVI_REFUSAL.format(what="method='svi' is not supported"))
    if method != "nuts":
        raise ValueError(f"method must be 'nuts' (or 'svi', which is refused); got {method!r}.")


def _candidates(n_components: Any, model: str, n: int, d: int) -> list[int]:
    """The checked, sorted ``n_components`` (None: the defaults that ``n`` rows allow)."""
    from bayespca.probabilistic import default_candidates, max_components

    if d < 2:
        raise ValueError(f"X must have at least 2 features to compare numbers of components; got {d}.")
    if n < 2:
        raise ValueError(f"X must have at least 2 samples to compare numbers of components; got {n}.")
    refits = (f"an exact LOO refit fits {n - 1} rows, whose centred data have rank at most {n - 2}, and "
              f"pPCA with n - 2 <= k < d = {d} components then leaves them no noise (an improper posterior; "
              "see bayespca.inference.closed_form.check_rows_leave_noise)")
    if n_components is None:
        defaults = default_candidates(model, d)
        n_components = [k for k in defaults if k not in noiseless_candidates(defaults, model, n, d)]
        if len(n_components) < 2:
            raise ValueError(f"X has {n} samples: the default candidates leave k = {n_components} to "
                             f"compare, at least two needed: {refits}.")
    ks = _check_candidates(n_components, max_components(model, d), model)
    noiseless = noiseless_candidates(ks, model, n, d)
    if noiseless:
        raise ValueError(f"n_components {noiseless}: {refits}. Offer k <= {n - 3}.")
    return ks


def _fit_options(estimator: type, fit_kwargs: dict, ks: list[int], d: int) -> dict:
    """The options of every k's fit; refuses those the estimator does not take, or that compare sets."""
    reserved = {"n_components", "method", "random_state", "progress_bar"}
    allowed = set(estimator().get_params()) - reserved
    unknown = sorted(set(fit_kwargs) - allowed)
    if unknown:
        raise TypeError(
            f"Unknown fit option(s) {unknown} for {estimator.__name__}; accepted: {sorted(allowed)}."
        )
    check_number(fit_kwargs.get("padded_components"), "padded_components", integer=True, low=max(ks), high=d,
                 allow_none=True)
    if fit_kwargs.get("anchors") is not None and len(ks) > 1:
        raise ValueError(
            f"anchors name one feature per component, so no one list serves n_components {ks}; got "
            f"anchors={fit_kwargs['anchors']!r}. Leave it None: each k's fit chooses its own (anchors_)."
        )
    # One compiled sampler for every k (ignored where the model cannot be padded), while the
    # padded model stays small enough that compiling dominates what padding adds to sampling.
    return {"padded_components": max(ks) if d * max(ks) <= _PADDED_SIZE else None, **fit_kwargs}


def _fit_each(X, ks, seeds, estimator, options, progress_bar, *, subsampled, observations, max_refits):
    """The NUTS fit of each k and its elpd: PSIS-LOO with at most ``max_refits`` exact refits, or
    subsampled LOO on one subsample of ``observations`` rows for every k."""
    from bayespca.subsampled_loo import loo_subsample

    fits, elpds = {}, {}
    for k, seed in _with_progress(ks, seeds[:-1], progress_bar):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fits[k] = estimator(n_components=k, method="nuts", random_state=int(seed), **options).fit(X)
            # One subsample for every k (same seed): their elpd differences are then paired.
            elpds[k] = (loo_subsample(fits[k], X, observations=observations, seed=int(seeds[-1]))
                        if subsampled else loo(fits[k], name=f"n_components={k}", max_refits=max_refits))
        _reraise(caught, k)
    return fits, elpds


def _add_classical_criteria(table: pd.DataFrame, arr, model: str, estimator: type, cv: int, seed: int,
                            chunked: bool) -> None:
    """Minka, BIC, AIC, cross-validated likelihood, Gavish-Donoho and parallel analysis, by k in ``table``."""
    ks = list(table.index)
    n, d = arr.shape
    ml_loglik = np.array([_ml_fit(estimator, k, arr).log_likelihood_ for k in ks])
    params = np.array([_n_parameters(k, d, model) for k in ks])
    minka, gd_rank = _spectral_criteria(arr, ks)
    if chunked:  # held-out folds need the rows in memory; the subsampled LOO is the check here
        cv_mean = cv_se = np.full(len(ks), np.nan)
    else:
        cv_mean, cv_se = _cross_validated(arr, ks, estimator, cv, seed)
    table["minka"] = minka
    table["bic"] = -2 * ml_loglik + params * np.log(n)
    table["aic"] = -2 * ml_loglik + 2 * params
    table["cv_log_likelihood"] = cv_mean
    table["cv_se"] = cv_se
    table["gavish_donoho"] = [k == gd_rank for k in ks]
    # Parallel analysis (Horn; psych::fa.parallel): of the correlation matrix for pPCA, its SMC-reduced
    # form for FA; it needs the complete data, without a constant column (no correlation).
    pa_rank = None
    if not chunked and not np.isnan(arr).any() and np.all(np.ptp(arr, axis=0) > 0):
        from bayespca.selection import parallel_analysis

        kind = "pca" if model == "ppca" else "fa"
        pa_rank = parallel_analysis(arr, kind=kind, random_state=seed).n_components
    table["parallel_analysis"] = [k == pa_rank for k in ks]


def _recommendation(table: pd.DataFrame, best: int) -> tuple[int, str]:
    """The smallest k within max(dse, SMALL_ELPD_DIFF) of the best elpd, and the rule in words."""
    gap = -table["elpd_diff"]
    chosen = int(table.index[gap <= np.maximum(table["dse"], SMALL_ELPD_DIFF)].min())
    rule = (
        f"smallest k whose elpd is below the best (k = {best}) by at most max(dse, "
        f"{SMALL_ELPD_DIFF:g}): one standard error of the paired elpd difference, or a "
        "difference too small for its dse to be trusted"
    )
    return chosen, rule


def _warn_at_edge(chosen: int, ks: list[int], upper: int) -> None:
    """Warn when the recommendation is an end of the range offered (the best may lie beyond)."""
    if chosen == ks[-1] and chosen < upper:
        warn(
            f"The recommended n_components={chosen} is the largest offered: a larger k may predict "
            f"better still. Offer larger values (up to {upper})."
        )
    elif chosen == ks[0] and chosen > 1:
        warn(
            f"The recommended n_components={chosen} is the smallest offered: a smaller k may do as "
            "well. Offer smaller values (down to 1)."
        )
