"""Deterministic principal component analysis."""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin

from bayespca import gaussian
from bayespca.chunked import is_chunked, rowwise
from bayespca.data import as_float_matrix, check_is_fitted, validate_fit, validate_transform
from bayespca.linalg import svd_covariance, svd_full, svd_gram, svd_randomized
from bayespca.selection import METHODS, select_from_singular_values

__all__ = ["PCA", "choose_solver"]

SOLVERS = ("auto", "full", "covariance", "gram", "randomized")

# Relative speeds of the kernels behind each solver, in flops per second
# relative to a matrix product (measured with benchmarks/bench_pca.py on the
# 2-core reference machine; only their ratios matter).
_EIGH_COST = 6.0  # full symmetric eigendecomposition, per size^3
_SVD_COST = 6.0  # thin SVD (gesdd), per n d min(n, d)
_RANDOMIZED_MIN_SIZE = 500


def choose_solver(n_samples: int, n_features: int, n_components: int | None) -> str:
    """The solver ``PCA(solver="auto")`` uses.

    With ``m = min(n, d)`` and ``k`` the requested number of components
    (``None`` when the whole spectrum is needed: ``n_components`` None, a
    fraction or a selection rule), the estimated costs in flops are

    * covariance: ``n d^2 + 6 d^3``  (scatter matrix, then eigh)
    * gram: ``n^2 d + 6 n^3``        (Gram matrix, then eigh)
    * randomized: ``2 (3q + 2) n d (k + 10)``, block Krylov depth ``q = 3``
      (2 when ``k >= 0.1 m``)
    * full: ``6 n d m``              (thin SVD)

    The rule takes the cheapest of covariance and Gram; it takes randomized
    instead only for an integer ``k`` with ``k + 10 <= m / 4``, ``m >= 500``
    and a cost at most half the exact solver's (randomized is approximate, so
    it must win clearly); and it takes full when the problem is tiny
    (``n d <= 10^4``), where everything takes microseconds and the thin SVD
    is the most accurate.

    Examples
    --------
    >>> choose_solver(20000, 100, 10), choose_solver(500, 20000, 10), choose_solver(2000, 2000, 10)
    ('covariance', 'gram', 'randomized')
    """
    n, d = n_samples, n_features
    m = min(n, d)
    if n * d <= 10_000:
        return "full"
    cov = n * d * d + _EIGH_COST * d**3
    gram = n * n * d + _EIGH_COST * n**3
    exact, name = (cov, "covariance") if cov <= gram else (gram, "gram")
    if n_components is not None and m >= _RANDOMIZED_MIN_SIZE and n_components + 10 <= m / 4:
        q = 3 if n_components < 0.1 * m else 2
        randomized = 2 * (3 * q + 2) * n * d * (n_components + 10)
        if 2 * randomized <= exact:
            return "randomized"
    return name


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
        :func:`bayespca.selection.select_from_singular_values`).
    random_state : int, numpy Generator or None, default=None
        Seed of the randomized solver.

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
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {list(SOLVERS)}; got {self.solver!r}.")
        for name in ("whiten", "standardize"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise TypeError(f"{name} must be a bool; got {getattr(self, name)!r}.")
        if not (isinstance(self.n_oversamples, numbers.Integral) and self.n_oversamples >= 0):
            raise ValueError(f"n_oversamples must be an int >= 0; got {self.n_oversamples!r}.")
        if self.n_power_iter is not None and not (
            isinstance(self.n_power_iter, numbers.Integral) and self.n_power_iter >= 0
        ):
            raise ValueError(f"n_power_iter must be None or an int >= 0; got {self.n_power_iter!r}.")
        if self.selection_options is not None and not isinstance(self.selection_options, dict):
            raise TypeError(f"selection_options must be None or a dict; got {self.selection_options!r}.")
        k = self.n_components
        accepted = (
            f"None, an int in [0, min(n_samples, n_features)] = [0, {m}], a float in (0, 1), "
            f"or one of {list(METHODS)}"
        )
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
            if k not in METHODS:
                raise ValueError(f"n_components must be {accepted}; got {k!r}.")
            return None
        raise TypeError(f"n_components must be {accepted}; got {type(k).__name__} {k!r}.")

    def _fit(self, X):
        if is_chunked(X):  # rows held by Dask: bayespca.chunked.pca_spectrum
            return self._fit_chunked(X)
        data = validate_fit(self, X)
        X = data.X
        n, d = X.shape
        k = self._check_params(n, d)
        solver = choose_solver(n, d, k) if self.solver == "auto" else self.solver
        if solver == "randomized" and k is None:
            raise ValueError(
                f"solver='randomized' needs an integer n_components; got {self.n_components!r}, "
                "which needs the whole spectrum. Use solver='auto', 'full', 'covariance' or 'gram'."
            )
        mean = data.column_sums / n
        scale = np.ones(d)
        if self.standardize:
            std = X.std(axis=0, ddof=1)
            scale = np.where(std > 0, std, 1.0)
            X = (X - mean) / scale
            centre = np.zeros(d)
        else:
            centre = mean
        if solver == "full":
            svd = svd_full(X, centre)
        elif solver == "covariance":
            svd = svd_covariance(X, centre, k)
        elif solver == "gram":
            svd = svd_gram(X, centre, k)
        elif k == 0:
            svd = svd_covariance(X, centre, 0) if d <= n else svd_gram(X, centre, 0)
        else:
            svd = svd_randomized(X, centre, k, n_oversamples=self.n_oversamples,
                                 n_power_iter=self.n_power_iter, random_state=self.random_state)
        return X, self._store(svd, mean, scale, n, d, k, solver)

    def _fit_chunked(self, X):
        from bayespca.chunked import pca_spectrum

        spectrum = pca_spectrum(self, X, self._check_params)
        n, d = spectrum.shape
        return spectrum.rows, self._store(spectrum.svd, spectrum.mean, spectrum.scale, n, d, spectrum.k,
                                          spectrum.solver)

    def _store(self, svd, mean, scale, n, d, k, solver):
        """Set the fitted attributes from the decomposition; the training scores (or None)."""
        self.selection_ = None
        if k is None:
            k = self._resolve_n_components(svd.singular_values, n, d)
        s = svd.singular_values[:k]
        total_var = svd.total_ss / (n - 1)
        ev = s**2 / (n - 1)
        m = min(n, d)
        self.mean_ = mean
        self.scale_ = scale
        self.components_ = svd.components[:k]
        self.singular_values_ = s
        self.explained_variance_ = ev
        self.explained_variance_ratio_ = ev / total_var if total_var > 0 else np.zeros(k)
        self.noise_variance_ = float(max(total_var - ev.sum(), 0.0) / (m - k)) if k < m else 0.0
        self.n_components_ = int(k)
        self.n_samples_ = n
        self.solver_ = solver
        if not (np.all(np.isfinite(self.components_)) and np.isfinite(total_var)):
            raise ValueError("X has values so large that PCA overflowed float64; rescale X.")
        return None if svd.scores is None else svd.scores[:, :k]

    def _resolve_n_components(self, s: np.ndarray, n: int, d: int) -> int:
        k = self.n_components
        if k is None:
            return min(n, d)
        options = dict(self.selection_options or {})
        if isinstance(k, str):
            self.selection_ = select_from_singular_values(s, n, d, k, **options)
        else:  # fraction of variance
            self.selection_ = select_from_singular_values(s, n, d, "variance", threshold=float(k))
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
        Xw, scores = self._fit(X)
        if scores is None:
            centre = self.mean_ if not self.standardize else np.zeros(self.n_features_in_)
            scores = Xw @ self.components_.T - centre @ self.components_.T
        return self._whiten(scores)

    # ------------------------------------------------------------ transforms
    def _whiten(self, scores):
        if not self.whiten:
            return scores
        return scores / self._whiten_scale()

    def _whiten_scale(self):
        scale = np.sqrt(self.explained_variance_)
        return np.maximum(scale, np.finfo(float).eps)

    @rowwise(width="out")
    def transform(self, X):
        """Project ``X`` on the principal axes: ``((X - mean_) / scale_) @ components_.T``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_components_)
            Divided by ``sqrt(explained_variance_)`` when ``whiten``.
        """
        X = validate_transform(self, X).X
        axes = self.components_ / self.scale_ if self.standardize else self.components_
        return self._whiten(X @ axes.T - self.mean_ @ axes.T)

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
        check_is_fitted(self)
        Z = as_float_matrix(X, name="X")
        if Z.shape[1] != self.n_components_:
            raise ValueError(
                f"X has {Z.shape[1]} columns, but inverse_transform expects n_components_ = "
                f"{self.n_components_} score columns."
            )
        if self.whiten:
            Z = Z * self._whiten_scale()
        return (Z @ self.components_) * self.scale_ + self.mean_

    # ------------------------------------------------ probabilistic view
    def _gaussian(self, *, singular_ok: bool = False) -> gaussian.LowRankGaussian:
        """The pPCA Gaussian in the original units, as a (W, psi, mu) triple.

        Its covariance is ``V^T diag(max(lambda_j, sigma^2)) V + sigma^2 (I - V^T V)``.
        When every direction is a component (k = d) there is no discarded
        eigenvalue; the smallest component's variance then plays the role of
        the isotropic part, which leaves the covariance unchanged.
        """
        check_is_fitted(self)
        d, k = self.n_features_in_, self.n_components_
        lam = np.maximum(self.explained_variance_, self.noise_variance_)
        axes, sigma2 = self.components_, self.noise_variance_
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
        return gaussian.LowRankGaussian(
            self.scale_[:, None] * w, self.scale_**2 * sigma2, self.mean_
        )

    def get_covariance(self):
        """Model covariance ``V^T diag(lambda) V + sigma^2 (I - V^T V)`` in the original units, (d, d)."""
        return np.asarray(gaussian.covariance(self._gaussian(singular_ok=True)))

    def get_precision(self):
        """Inverse of :meth:`get_covariance` by the Woodbury identity (no d x d inverse), shape (d, d)."""
        return np.asarray(gaussian.precision(self._gaussian()))

    @rowwise(width=None)
    def score_samples(self, X):
        """Log-likelihood of each sample under the pPCA Gaussian, shape (n_samples,)."""
        g = self._gaussian()
        X = validate_transform(self, X).X
        return np.asarray(gaussian.log_prob(g, X))

    def score(self, X, y=None):
        """Average log-likelihood of the samples under the pPCA Gaussian."""
        return float(np.mean(self.score_samples(X)))

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64"]
        return tags

