"""Deterministic principal component analysis."""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin

from bayespca import gaussian
from bayespca.chunked import is_chunked, rowwise
from bayespca.data import check_is_fitted, finite_result, validate_fit, validate_scores, validate_transform
from bayespca.linalg import SOLVERS, decompose, exact_means
from bayespca.messages import warn
from bayespca.params import check_bool, check_choice, check_number, check_seed
from bayespca.selection import METHODS, OPTIONS, select_from_singular_values
from bayespca.sparse_input import is_sparse, map_row_blocks, sparse_means, sparse_working_units
from bayespca.statistics import check_representable, log_scale_correction, power_of_two_scale

__all__ = ["PCA"]

# Data whose largest magnitude lies in [2^-256, 2^256] are decomposed as they
# are: their squares and sums of squares are normal, finite float64 numbers, and
# dividing by a power of two would change no result (it is exact). Outside that
# band they are centred and brought to power-of-two working units first.
_SAFE_LOG2 = 256
_SCALES_APART = (
    "(with standardize=True, columns on scales too far apart have a covariance that float64 cannot hold)"
)


def _working_units(
    X: np.ndarray, mean: np.ndarray, top: float
) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """``(Xw, centre, unit, mean)``: the data in units of a power of two, the centre to subtract
    from them, and the column means in data units; ``top = max|X|``.

    Data in the safe band come back as they are (``unit = 1``). Others are
    centred (twice: what the first pass leaves of the mean, its rounding, is
    removed by the second, so constant data become exactly constant) and
    divided by :func:`bayespca.statistics.power_of_two_scale` of the centred
    data, after :func:`bayespca.statistics.check_representable` has refused
    spreads whose variances float64 cannot hold.
    """
    if top == 0.0 or 2.0**-_SAFE_LOG2 <= top <= 2.0**_SAFE_LOG2:
        return X, mean, 1.0, mean
    centred = X - mean
    residual = centred.mean(axis=0)
    centred -= residual
    unit = power_of_two_scale(centred)
    check_representable(centred, None, unit)
    return centred / unit, np.zeros_like(mean), unit, mean + residual


class PCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Principal component analysis, with the numbers of scikit-learn and R's ``prcomp``.

    The data are centred (and, with ``standardize=True``, scaled to unit
    variance) and decomposed as ``Xc = U S V^T``. The rows of ``V^T`` are the
    principal axes (``components_``), ``S^2 / (n - 1)`` the variances along
    them (``explained_variance_``), and ``Xc V = U S`` the scores.

    The fitted model is also the probabilistic PCA Gaussian
    ``x ~ N(mean, V_k^T diag(lambda_k - sigma^2) V_k + sigma^2 I)`` with
    ``sigma^2`` the mean discarded eigenvalue (``noise_variance_``), which
    ``score``, ``score_samples``, ``get_covariance`` and ``get_precision`` use
    (Tipping & Bishop 1999, with scikit-learn's ``n - 1`` eigenvalues, so the
    numbers equal scikit-learn's; :class:`bayespca.PPCA` gives the exact ML
    fit). Whitening only rescales the scores and never changes that model.

    Extreme and degenerate data (see the user guide's "Extreme data" page):
    data are decomposed in power-of-two units, so a fit of ``c X`` is the
    fit of ``X`` with every result scaled by ``c`` (exactly for powers of
    two); data whose spread lies outside about 1e-152..1e152 are refused
    with a ``ValueError``. Singular values at the rounding level of the data
    or of the solver are set to 0 and their axes completed by a fixed
    orthonormal basis, so constant data, duplicate rows and rank below
    ``n_components`` give the same answer on every solver; asking for more
    components than the rank warns.

    Parameters
    ----------
    n_components : int, float, str or None, default=None
        * ``None``: all ``min(n_samples, n_features)`` components.
        * int in ``[0, min(n_samples, n_features)]``.
        * float in (0, 1): the smallest number of components whose cumulative
          explained-variance ratio is *strictly greater* than it (as
          scikit-learn).
        * str: a rule of :mod:`bayespca.selection` (``"mle"``,
          ``"gavish-donoho"``, ``"bic"``, ``"aic"``, ``"gaic"``, ``"elbow"``,
          ``"rank"``, ``"profile-likelihood"``, ``"variance"``); its
          outcome is kept in ``selection_``.
    solver : {"auto", "full", "covariance", "gram", "randomized"}, default="auto"
        On scipy sparse input the data are never densified: the mean is
        subtracted inside the products (``X^T X - n m m^T``, the Gram matrix
        likewise, ``Xc B = X B - 1 (m^T B)``), ``"full"`` is refused and
        ``"auto"`` is :func:`bayespca.sparse_input.choose_sparse_solver`.
        ``"full"``: thin SVD of the centred data (most accurate);
        ``"covariance"``: eigh of the d x d scatter matrix (n >> d);
        ``"gram"``: eigh of the n x n Gram matrix (d >> n);
        ``"randomized"``: randomized block Krylov (integer ``n_components``
        only; exact to rounding when the spectrum decays past ``k + 10``, see
        :func:`bayespca.linalg.svd_randomized`);
        ``"auto"``: see :func:`choose_solver`.
    whiten : bool, default=False
        Divide the scores by ``sqrt(explained_variance_)`` so they have unit
        sample variance. ``inverse_transform`` undoes it exactly.
    standardize : bool, default=False
        Scale each feature to unit sample variance (``ddof=1``) before the
        decomposition, like R's ``prcomp(scale. = TRUE)``. Constant features
        keep scale 1 (R refuses them). ``score`` and the covariance are then
        given in the original units.
    n_oversamples : int, default=10
        Randomized solver: extra sketch columns.
    n_power_iter : int or None, default=None
        Randomized solver: block Krylov depth (None: 3 if
        ``n_components < 0.1 min(n, d)`` else 2).
    selection_options : dict or None, default=None
        Options for a string ``n_components`` rule (``threshold``,
        ``noise_std``, ``tau``; see
        :func:`bayespca.selection.select_from_singular_values`). Refused with
        any other ``n_components``, which would ignore them.
    random_state : None, int >= 0, numpy Generator or RandomState, default=None
        Seed of the randomized solver (checked whatever the solver; see
        :mod:`bayespca.params`).

    Attributes
    ----------
    components_ : ndarray of shape (n_components_, n_features)
        Principal axes; each row's largest-magnitude entry is positive.
    explained_variance_ : ndarray of shape (n_components_,)
        ``S^2 / (n - 1)``.
    explained_variance_ratio_ : ndarray of shape (n_components_,)
    singular_values_ : ndarray of shape (n_components_,)
    mean_ : ndarray of shape (n_features,)
    scale_ : ndarray of shape (n_features,)
        Feature scales divided out (ones unless ``standardize``).
    n_components_ : int
    n_samples_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a DataFrame with string column names.
    noise_variance_ : float
        Mean of the ``min(n, d) - k`` discarded eigenvalues (0 when none).
    solver_ : str
        The solver that ran.
    selection_ : Selection or None
        The outcome of a string ``n_components`` rule.

    See Also
    --------
    bayespca.select_n_components : every rule for choosing ``n_components``.
    bayespca.PPCA : maximum-likelihood and Bayesian probabilistic PCA.

    References
    ----------
    M. E. Tipping, C. M. Bishop (1999). Probabilistic principal component
    analysis. J. R. Stat. Soc. B 61(3), 611-622.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> X = load_iris().data
    >>> pca = PCA(n_components=2).fit(X)
    >>> pca.explained_variance_.round(4)
    array([4.2282, 0.2427])
    >>> round(pca.score(X), 6)
    -2.699797
    >>> PCA(n_components="mle").fit(X).n_components_
    3
    """

    def __init__(
        self,
        n_components=None,
        *,
        solver="auto",
        whiten=False,
        standardize=False,
        n_oversamples=10,
        n_power_iter=None,
        selection_options=None,
        random_state=None,
    ):
        self.n_components = n_components
        self.solver = solver
        self.whiten = whiten
        self.standardize = standardize
        self.n_oversamples = n_oversamples
        self.n_power_iter = n_power_iter
        self.selection_options = selection_options
        self.random_state = random_state

    # ------------------------------------------------------------------ fit
    def _check_params(self, n: int, d: int) -> int | None:
        """Validate hyper-parameters; return the integer k requested, or None for the whole spectrum."""
        m = min(n, d)
        check_choice(self.solver, "solver", SOLVERS)
        check_bool(self.whiten, "whiten")
        check_bool(self.standardize, "standardize")
        check_number(self.n_oversamples, "n_oversamples", integer=True, low=0)
        check_number(self.n_power_iter, "n_power_iter", integer=True, low=0, allow_none=True)
        check_seed(self.random_state)
        k = self.n_components
        accepted = (
            f"None, an int in [0, min(n_samples, n_features)] = [0, {m}], a float in (0, 1), "
            f"or one of {list(METHODS)}"
        )
        self._check_selection_options(isinstance(k, str))
        if k is None:
            return None
        if isinstance(k, bool | np.bool_):
            raise TypeError(f"n_components must be {accepted}; got {k!r}.")
        if isinstance(k, numbers.Integral):
            if not 0 <= k <= m:
                raise ValueError(f"n_components must be {accepted}; got {k}.")
            return int(k)
        if isinstance(k, numbers.Real):
            if not 0.0 < k < 1.0:
                raise ValueError(f"n_components must be {accepted}; got {k}.")
            return None
        if isinstance(k, str):
            if k not in METHODS:  # the whole rule, not only the strings
                raise ValueError(f"n_components must be {accepted}; got {k!r}.")
            return None
        raise TypeError(f"n_components must be {accepted}; got {type(k).__name__} {k!r}.")

    def _check_selection_options(self, rule: bool) -> None:
        options = self.selection_options
        if options is None:
            return
        if not isinstance(options, dict):
            raise TypeError(f"selection_options must be None or a dict; got {options!r}.")
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ValueError(
                f"selection_options has unknown keys {unknown}; accepted keys: {list(OPTIONS)}."
            )
        if options and not rule:
            raise ValueError(
                f"selection_options={options!r} is only used when n_components is a rule name "
                f"(one of {list(METHODS)}); got n_components={self.n_components!r}."
            )

    def _fit(self, X):
        if is_chunked(X):  # rows held by Dask: bayespca.chunked.pca_spectrum
            return self._fit_chunked(X)
        data = validate_fit(self, X, accept_sparse=True)
        n, d = data.X.shape
        k = self._check_params(n, d)
        if is_sparse(data.X):  # kept sparse: centred inside the solvers' products
            mean, top, varying_top = sparse_means(data.X)
            Xw, unit, centre = sparse_working_units(data.X, mean, top, _SAFE_LOG2)
        else:
            mean, top, varying_top = exact_means(data.X, data.column_sums / n)
            Xw, centre, unit, mean = _working_units(data.X, mean, top)
        dec = decompose(Xw, centre, k, self.solver, standardize=self.standardize,
                        magnitudes=(top / unit, varying_top / unit), n_oversamples=self.n_oversamples,
                        n_power_iter=self.n_power_iter, random_state=self.random_state)
        # The power of two of the data, for the Gaussian's working units (see _gaussian).
        self._unit = unit
        if self.standardize:  # standardized data have no units: results need none put back
            scale, unit = dec.scale * unit, 1.0
        else:
            scale = np.ones(d)
        self.selection_ = None
        svd = dec.svd
        k = self._resolve_n_components(svd.singular_values, n, d, unit) if k is None else k
        self._store(svd, k, n, d, unit)
        self.mean_ = mean
        self.scale_ = scale
        self.solver_ = dec.solver
        return svd.scores

    def _fit_chunked(self, X) -> None:
        """Fit on rows held by Dask (:func:`bayespca.chunked.pca_spectrum`); no training scores."""
        from bayespca.chunked import pca_spectrum

        spectrum = pca_spectrum(self, X, self._check_params)
        n, d = spectrum.shape
        self.selection_ = None
        svd, k = spectrum.svd, spectrum.k
        k = self._resolve_n_components(svd.singular_values, n, d, 1.0) if k is None else k
        self._unit = 1.0
        self._store(svd, k, n, d, 1.0)
        self.mean_, self.scale_, self.solver_ = spectrum.mean, spectrum.scale, spectrum.solver

    def _store(self, svd, k: int, n: int, d: int, unit: float) -> None:
        """Fitted attributes in data units from the working-unit decomposition."""
        m = min(n, d)
        s = svd.singular_values[:k]
        ev = s**2 / (n - 1)
        total = svd.total_ss / (n - 1)
        rank = int(np.count_nonzero(s))
        if isinstance(self.n_components, numbers.Integral) and rank < k:
            warn(
                f"The centred data have rank {rank} < n_components = {k}: components {rank}..{k - 1} "
                "have zero variance (explained_variance_ = 0) and a fixed but arbitrary orthonormal "
                f"direction. Use n_components <= {rank}.",
                UserWarning,
            )
        with np.errstate(over="ignore"):
            self.explained_variance_ = ev * unit**2
            self.noise_variance_ = float(max(total - ev.sum(), 0.0) / (m - k)) * unit**2 if k < m else 0.0
        if not (np.all(np.isfinite(self.explained_variance_)) and np.isfinite(total * unit**2)):
            raise ValueError(
                f"The variances of X (total {total:.3g} x {unit:.3g}^2) overflow float64; rescale X "
                "(the principal axes of X / c are those of X, with variances divided by c^2)."
            )
        self.components_ = svd.components[:k]
        self.singular_values_ = s * unit
        self.explained_variance_ratio_ = ev / total if total > 0 else np.zeros(k)
        self.n_components_ = int(k)
        self.n_samples_ = n

    def _resolve_n_components(self, s: np.ndarray, n: int, d: int, unit: float) -> int:
        k = self.n_components
        if k is None:
            return min(n, d)
        if isinstance(k, str):
            options = dict(self.selection_options or {})
            self.selection_ = select_from_singular_values(s * unit, n, d, k, **options)
        else:  # fraction of variance
            self.selection_ = select_from_singular_values(s * unit, n, d, "variance", threshold=float(k))
        return self.selection_.n_components

    def fit(self, X, y=None):
        """Fit the principal axes.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self
        """
        self._fit(X)
        return self

    def fit_transform(self, X, y=None):
        """Fit and return the scores of the training data, shape (n_samples, n_components_)."""
        scores = self._fit(X)
        if scores is None:
            return self.transform(X)
        unit = 1.0 if self.standardize else self._unit  # standardized scores have no units
        return self._whiten(scores[:, : self.n_components_] * unit)

    # ------------------------------------------------------------ transforms
    def _whiten(self, scores):
        if not self.whiten:
            return scores
        return scores / self._whiten_scale()

    def _whiten_scale(self):
        # A zero-variance component scores every point 0; dividing by 1 keeps it 0.
        ev = self.explained_variance_
        return np.sqrt(np.where(ev > 0, ev, 1.0))

    @rowwise(width="out")
    def transform(self, X):
        """Project ``X`` on the principal axes: ``((X - mean_) / scale_) @ components_.T``.

        Parameters
        ----------
        X : array-like or scipy sparse matrix of shape (n_samples, n_features)
            A sparse ``X`` is projected as ``X @ V^T - mean_ @ V^T`` (not densified).

        Returns
        -------
        ndarray of shape (n_samples, n_components_)
            Divided by ``sqrt(explained_variance_)`` when ``whiten``.
        """
        X = validate_transform(self, X, accept_sparse=True).X
        axes = self.components_ / self.scale_ if self.standardize else self.components_
        with np.errstate(over="ignore", invalid="ignore"):
            scores = self._whiten(X @ axes.T - self.mean_ @ axes.T)
        return finite_result(scores, "PCA.transform")

    @rowwise(width="in", named=False)
    def inverse_transform(self, X):
        """Map scores back to feature space: ``(Z [sqrt(lambda)] V) * scale_ + mean_``.

        The exact inverse of :meth:`transform` on the span of the components
        (whitening and standardizing included).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components_)
            Scores.

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        Z = validate_scores(self, X)
        with np.errstate(over="ignore", invalid="ignore"):
            if self.whiten:
                Z = Z * self._whiten_scale()
            back = (Z @ self.components_) * self.scale_ + self.mean_
        return finite_result(back, "PCA.inverse_transform")

    # ------------------------------------------------ probabilistic view
    def _gaussian(self, *, singular_ok: bool = False) -> gaussian.LowRankGaussian:
        """The pPCA Gaussian in working units (data units / ``_unit``), as a (W, psi, mu) triple.

        Its covariance is ``V^T diag(max(lambda_j, sigma^2)) V + sigma^2 (I - V^T V)``.
        When every direction is a component (k = d) there is no discarded
        eigenvalue; the smallest component's variance then plays the role of
        the isotropic part, which leaves the covariance unchanged. Working
        units keep every intermediate of the density normal at any accepted
        scale; the power of two is exact to divide out and put back.
        """
        check_is_fitted(self)
        d, k, u = self.n_features_in_, self.n_components_, self._unit
        # Standardized variances are unitless: the units are in scale_.
        v = 1.0 if self.standardize else u
        lam = np.maximum(self.explained_variance_, self.noise_variance_) / v**2
        axes, sigma2 = self.components_, self.noise_variance_ / v**2
        if k == d:
            axes, lam, sigma2 = axes[:-1], lam[:-1], lam[-1]
        if sigma2 <= 0 and not singular_ok:
            raise ValueError(
                f"The fitted covariance is singular (noise_variance_ = 0 with n_components_ = {k} "
                f"< n_features = {d}: the data have rank <= n_components_), so its density and "
                "precision are undefined. Fit fewer components than the rank of the centred data, "
                "or use bayespca.PPCA."
            )
        w = axes.T * np.sqrt(lam - sigma2)
        scale = self.scale_ / u if self.standardize else np.ones(d)
        return gaussian.LowRankGaussian(scale[:, None] * w, scale**2 * sigma2, self.mean_ / u)

    def get_covariance(self):
        """Model covariance ``V^T diag(lambda) V + sigma^2 (I - V^T V)`` in the original units, (d, d)."""
        with np.errstate(over="ignore", invalid="ignore"):
            cov = np.asarray(gaussian.covariance(self._gaussian(singular_ok=True))) * self._unit**2
        return finite_result(cov, "PCA.get_covariance", _SCALES_APART)

    def get_precision(self):
        """Inverse of :meth:`get_covariance` by the Woodbury identity (no d x d inverse), shape (d, d)."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            precision = np.asarray(gaussian.precision(self._gaussian())) / self._unit**2
        return finite_result(precision, "PCA.get_precision", _SCALES_APART)

    @rowwise(width=None)
    def score_samples(self, X):
        """Log-likelihood of each sample under the pPCA Gaussian, shape (n_samples,)."""
        g = self._gaussian()
        X = validate_transform(self, X, accept_sparse=True).X
        with np.errstate(over="ignore", invalid="ignore"):
            log_p = _rows(lambda rows: np.asarray(gaussian.log_prob(g, rows / self._unit)), X)
            log_p = log_p + log_scale_correction(self.n_features_in_, self._unit)
        return finite_result(log_p, "PCA.score_samples")

    def score(self, X, y=None):
        """Average log-likelihood of the samples under the pPCA Gaussian."""
        return float(np.mean(self.score_samples(X)))

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64"]
        tags.input_tags.sparse = self.solver != "full"  # centred implicitly (bayespca.sparse_input)
        return tags


def _rows(fn, X):
    """``fn(X)``; on sparse ``X``, on its dense rows one block at a time."""
    return map_row_blocks(fn, X) if is_sparse(X) else fn(X)

