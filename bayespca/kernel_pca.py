"""Kernel PCA: PCA of the centred Gram matrix, exact or in an approximate feature space.

With a kernel ``k`` and training points ``x_1..x_n``, let ``K_ij = k(x_i, x_j)``
and ``H = I - 11^T/n``. Kernel PCA (Schoelkopf, Smola & Mueller 1998) is PCA of
the features ``phi(x_i)`` centred in feature space, whose Gram matrix is

    K_c = H K H,   (K_c)_ij = K_ij - mean_i K_i. - mean_j K_.j + mean K.

With ``K_c = sum_j lambda_j a_j a_j^T`` (``a_j`` unit eigenvectors, ``lambda_j``
*not* divided by n), the j-th principal axis in feature space is
``v_j = sum_i a_ij phi_c(x_i) / sqrt(lambda_j)`` and the projections are

    training points:  z_ij = a_ij sqrt(lambda_j)
    a new point x:    z_j(x) = k_c(x)^T a_j / sqrt(lambda_j),
                      k_c(x)_i = k(x, x_i) - mean_l k(x, x_l) - mean_l K_li + mean K,

so projecting the training points again gives back ``a_j sqrt(lambda_j)``.
With the linear kernel ``K_c = X_c X_c^T`` and ``lambda_j = (n - 1) x`` the
PCA explained variance.

Non-PSD kernels (sigmoid, some precomputed or callable kernels) can give
negative eigenvalues. Among the eigenvalues computed (the ``n_components``
largest), one below ``-1e-5 lambda_max`` and ``-1e-10`` is an error (there is
no real projection on it); smaller negative ones are rounding and set to 0,
and so are positive ones below ``1e-12 lambda_max`` (scikit-learn's float64
thresholds) or below ``n (8 + 4 log2 n) eps max|K|``, the rounding that
centring leaves in ``K_c``. Zero-eigenvalue components project every point
to 0; their eigenvectors are a fixed orthonormal completion (orthogonal to
the constant vector and to the other eigenvectors), so they are the same on
every solver and every call. A centred matrix that is zero to rounding
(constant data in feature space: duplicate rows, or a ``gamma`` that makes
every kernel value equal) has every eigenvalue 0 and is not handed to an
eigensolver; ARPACK's failures on exhausted Krylov spaces fall back to
LAPACK. Fewer non-zero eigenvalues than ``n_components``, or none left,
warn.

``approximation="nystroem"`` or ``"rff"`` replaces ``phi`` by an explicit
``r``-dimensional map (:mod:`bayespca.kernels`) and does ordinary PCA of the
centred features ``Phi_c`` (n x r): the eigenvalues of the r x r scatter
``Phi_c^T Phi_c`` are those of the approximate ``K_c ~ Phi_c Phi_c^T``, on the
same scale as the exact ones, with ``O(n r)`` memory.

References
----------
B. Schoelkopf, A. Smola, K.-R. Mueller (1998). Nonlinear component analysis as
a kernel eigenvalue problem. Neural Computation 10(5), 1299-1319.
G. H. Bakir, J. Weston, B. Schoelkopf (2004). Learning to find pre-images. NIPS 16.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse.linalg
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError

from bayespca.data import check_is_fitted, validate_fit, validate_scores, validate_transform
from bayespca.kernels import FourierMap, Kernel, NystroemMap
from bayespca.linalg import complete_basis, decompose, eigh_top, flip_signs
from bayespca.messages import warn
from bayespca.params import as_generator, check_bool, check_choice, check_number, check_seed

__all__ = ["KernelPCA", "choose_kernel_solver"]

_SOLVERS = ("auto", "dense", "arpack", "randomized")
_APPROXIMATIONS = (None, "nystroem", "rff")
_DEFAULT_N_APPROX = {"nystroem": 300, "rff": 1000}

# Spectrum thresholds (float64, as scikit-learn's _check_psd_eigenvalues).
_NEG_RATIO = 1e-5  # a negative eigenvalue is significant below -_NEG_RATIO * lambda_max ...
_NEG_ABS = 1e-10  # ... and below -_NEG_ABS
_SMALL_RATIO = 1e-12  # positive eigenvalues below _SMALL_RATIO * lambda_max are rounding

# "auto" solver rule, from `benchmarks/bench_kernel_pca.py --solvers` (rbf, d=20,
# one BLAS thread, n = 200..2000, k = 2..n/5): LAPACK's dense eigh (~4/3 n^3
# flops whatever k) wins for n = 200 at every k and whenever k >= 0.1 n;
# ARPACK's Lanczos (~100 products of 2 n^2 flops for k = 10, more as k grows)
# wins for n >= 500 and k < 0.1 n, by 2.5x at n = 500 and 7x at n = 2000 for
# k = 10. The randomized solver is often faster still, but its eigenvalues were
# off by 1e-4 to 1e-2 (relative) on these flat rbf spectra, so auto never picks it.
_DENSE_MAX_N = 300
_DENSE_MIN_FRACTION = 0.1


def choose_kernel_solver(n: int, k: int) -> str:
    """The eigensolver ``solver="auto"`` uses for ``k`` components of an ``n x n`` kernel matrix.

    LAPACK's dense ``eigh`` up to ``n = 300`` rows or when ``k`` is at least
    a tenth of ``n``; ARPACK's Lanczos iteration otherwise.

    Examples
    --------
    >>> choose_kernel_solver(100, 2), choose_kernel_solver(5000, 2)
    ('dense', 'arpack')
    """
    if n <= _DENSE_MAX_N or k >= _DENSE_MIN_FRACTION * n:
        return "dense"
    return "arpack"


def _eigh_dense(K, k):
    """Largest ``k`` algebraic eigenpairs by LAPACK (descending; negative ones kept)."""
    return eigh_top(K, k, clip=False)


def _arpack_v0(n, random_state):
    # The start vector does not change the converged answer; seeding it (0
    # when random_state is None) makes repeated fits agree bit for bit.
    rng = as_generator(0 if random_state is None else random_state)
    return rng.uniform(-1.0, 1.0, n)


def _eigh_arpack(K, k, random_state):
    """Largest ``k`` algebraic eigenpairs by implicitly restarted Lanczos (ARPACK).

    ARPACK stops with an error when its Krylov space is exhausted (the
    centred matrix has rank below what it needs, as with duplicate rows);
    LAPACK's dense solver then gives the answer.
    """
    n = K.shape[0]
    if k >= n - 1:  # ARPACK needs k < n - 1
        return _eigh_dense(K, k)
    # A Krylov space of 2k + 20 vectors takes ~30% fewer products than ARPACK's
    # default max(2k + 1, 20) for k ~ 10 (fewer restarts).
    ncv = min(n, 2 * k + 20)
    try:
        return scipy.sparse.linalg.eigsh(K, k, which="LA", v0=_arpack_v0(n, random_state), ncv=ncv, tol=0.0)
    except scipy.sparse.linalg.ArpackError:
        return _eigh_dense(K, k)


def _eigh_randomized(K, k, random_state, kernel, n_oversamples=10):
    """Largest ``k`` eigenpairs of a PSD matrix by randomized subspace iteration.

    Halko, Martinsson & Tropp (2011), Alg. 4.4 + 5.3: an orthonormal basis Q
    of ``K^(q+1) Omega`` with ``k + n_oversamples`` random columns, then the
    Rayleigh-Ritz pairs of ``Q^T K Q``, selected by *algebraic* value. For a
    PSD matrix that equals scikit-learn's selection by modulus; if the sketch
    has significant negative Ritz values the matrix is indefinite and the
    dominant subspace need not hold the k largest eigenvalues, so it fails
    loudly instead of returning the wrong ones.
    """
    n = K.shape[0]
    width = min(n, k + n_oversamples)
    n_iter = 7 if k < 0.1 * n else 4
    rng = as_generator(random_state)
    q, _ = np.linalg.qr(K @ rng.standard_normal((n, width)))
    for _ in range(n_iter):
        q, _ = np.linalg.qr(K @ q)
    kq = K @ q
    small = q.T @ kq
    evals, small_vecs = scipy.linalg.eigh((small + small.T) / 2.0, check_finite=False)
    if evals[0] < -_NEG_RATIO * max(evals[-1], 0.0) and evals[0] < -_NEG_ABS:
        raise ValueError(
            f"solver='randomized' found a negative eigenvalue {evals[0]:.4g} of the centred "
            f"{kernel.label} kernel matrix (largest {evals[-1]:.4g}): the matrix is not "
            "positive semi-definite, and the randomized solver is only reliable for PSD "
            "kernels. Use solver='arpack' or solver='dense'."
        )
    return evals[-k:], q @ small_vecs[:, -k:]


def _clean_spectrum(evals, kernel, n_requested):
    """Apply the documented thresholds to eigenvalues sorted in descending order."""
    evals = np.array(evals, dtype=np.float64)
    top = evals[0] if evals.size else 0.0
    low = evals[-1] if evals.size else 0.0
    if low < -_NEG_RATIO * max(top, 0.0) and low < -_NEG_ABS:
        n_pos = int(np.sum(evals > _SMALL_RATIO * max(top, 0.0)))
        raise ValueError(
            f"The centred {kernel.label} kernel matrix has eigenvalue {low:.4g} among its "
            f"{n_requested} largest (largest {top:.4g}): the kernel is not positive "
            "semi-definite on these data and kernel PCA has no real projection on a "
            "negative eigenvalue. Negative eigenvalues above -1e-5 x largest (or -1e-10) "
            "are treated as rounding and set to 0; this one is not. Fixes: ask for "
            f"n_components <= {n_pos} (the positive eigenvalues found), use a PSD kernel "
            "(rbf, laplacian, cosine, poly with integer degree and coef0 >= 0), lower gamma "
            "or coef0 of the sigmoid kernel, or shift/clip the spectrum of a precomputed kernel."
        )
    evals[evals < _SMALL_RATIO * max(top, 0.0)] = 0.0
    return evals


def _centre_gram(K):
    """Centre a symmetric Gram matrix in place; return its column means and grand mean."""
    col_means = K.mean(axis=0)
    grand_mean = col_means.mean()
    K -= col_means[None, :]
    K -= col_means[:, None]
    K += grand_mean
    return col_means, grand_mean


def _centre_cross(K, col_means, grand_mean):
    """Centre, in place, the kernel between new points (rows) and training points."""
    row_means = K.mean(axis=1)
    K -= col_means[None, :]
    K -= row_means[:, None]
    K += grand_mean
    return K


class KernelPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Kernel principal component analysis: exact, out-of-sample, invertible, scalable.

    PCA of the data mapped by a kernel into feature space (see the module
    docstring for the formulas). Compatible with scikit-learn's
    ``KernelPCA``: same eigenvalues (of the centred Gram matrix, not divided
    by n), same projections and sign convention (each eigenvector's
    largest-magnitude entry is positive), same pre-image.

    Parameters
    ----------
    n_components : int or None, default=None
        Number of components ``k >= 1`` (capped at n_samples, or at the
        dimension of the approximate feature space). None keeps every
        component with a non-zero eigenvalue.
    kernel : {"rbf", "linear", "poly", "laplacian", "sigmoid", "cosine", "precomputed"} \
or callable, default="rbf"
        See :class:`bayespca.kernels.Kernel` for the formulas. A callable
        ``f(x, y, **kernel_params) -> float`` on two rows may be written in
        ``jax.numpy`` (vectorised) or NumPy (called per pair). With
        "precomputed", ``fit`` takes the n x n Gram matrix and ``transform``
        the (n_new, n) kernel between new and training points.
    gamma : float or None, default=None
        Scale of rbf, laplacian, poly and sigmoid; None means ``1/n_features``.
    degree : float, default=3
        Degree of the poly kernel.
    coef0 : float, default=1
        Offset of the poly and sigmoid kernels.
    kernel_params : dict or None, default=None
        Keyword arguments of a callable kernel.
    solver : {"auto", "dense", "arpack", "randomized"}, default="auto"
        Eigensolver for the exact n x n problem. "dense": LAPACK ``eigh``
        (``O(n^3)``, only the k wanted pairs are extracted). "arpack":
        implicitly restarted Lanczos (``scipy.sparse.linalg.eigsh``, largest
        algebraic, fixed start vector), ``O(n^2)`` per iteration, best for
        ``k << n``. "randomized": Halko et al. subspace iteration, PSD kernels
        only, approximate when the spectrum decays slowly. "auto": "dense" when
        ``n <= 300`` or ``k >= 0.1 n``, else "arpack" (chosen by benchmark,
        see ``benchmarks/bench_kernel_pca.py --solvers``). Unused with an
        approximation (its r x r problem is always solved densely).
    approximation : {None, "nystroem", "rff"}, default=None
        None: exact kernel PCA (``O(n^2)`` memory). "nystroem": PCA in the
        Nystroem feature space of ``n_approx`` landmarks drawn uniformly from
        the training points (any PSD kernel; exact when ``n_approx = n``).
        "rff": PCA in the space of ``n_approx`` random Fourier features (rbf
        only). Both use ``O(n * n_approx)`` memory.
    n_approx : int or None, default=None
        Landmarks (Nystroem, capped at n_samples with a warning) or random
        features (rff). None means 300 landmarks or 1000 features.
    fit_inverse_transform : bool, default=False
        Learn the pre-image map used by :meth:`inverse_transform`: kernel
        ridge regression from the projections back to X, with the same kernel
        (and ``gamma_``) on the projections. With an approximation the ridge
        regression is done in the same kind of approximate feature space
        (``O(n * n_approx)`` memory).
    alpha : float, default=1.0
        Ridge penalty ``>= 0`` of the pre-image regression.
    remove_zero_eig : bool, default=False
        Drop components with a zero eigenvalue (always done when
        ``n_components`` is None).
    random_state : None, int >= 0, numpy Generator or RandomState, default=None
        Seeds the landmarks, random features, randomized sketch and ARPACK
        start vector (ARPACK uses seed 0 when None; its result does not
        depend on it beyond rounding). Checked whatever the solver
        (:mod:`bayespca.params`).

    Attributes
    ----------
    eigenvalues_ : ndarray of shape (n_components_,)
        Eigenvalues of the (approximate) centred Gram matrix, descending.
    eigenvectors_ : ndarray of shape (n_samples, n_components_)
        Unit eigenvectors ``a_j``; columns of zero eigenvalues in an
        approximation are 0.
    n_components_ : int
    gamma_ : float
        The kernel scale used (``1/n_features`` when ``gamma`` is None).
    kernel_ : bayespca.kernels.Kernel
        The kernel with ``gamma_`` filled in.
    solver_ : str
        Eigensolver or approximation actually used.
    X_fit_ : ndarray of shape (n_samples, n_features)
        Training data (exact kernel PCA with a non-precomputed kernel).
    kernel_col_means_ : ndarray of shape (n_samples,)
        Column means of the training Gram matrix (exact kernel PCA).
    kernel_mean_ : float
        Grand mean of the training Gram matrix (exact kernel PCA).
    feature_map_ : NystroemMap or FourierMap
        The approximate feature map (approximations only).
    feature_mean_ : ndarray of shape (r,)
        Mean of the training features (approximations only).
    feature_components_ : ndarray of shape (n_components_, r)
        Principal axes in the approximate feature space (approximations only).
    dual_coef_ : ndarray of shape (n_samples, n_features)
        Pre-image ridge coefficients (exact, ``fit_inverse_transform=True``).
    X_transformed_fit_ : ndarray of shape (n_samples, n_components_)
        Projections of the training points (exact, ``fit_inverse_transform=True``).
    inverse_map_ : NystroemMap or FourierMap
        Feature map of the projections (approximate, ``fit_inverse_transform=True``).
    inverse_coef_ : ndarray of shape (r', n_features)
        Pre-image ridge weights (approximate, ``fit_inverse_transform=True``).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Only when X has string column names.

    See Also
    --------
    bayespca.kernels.Kernel : the kernel formulas.
    sklearn.decomposition.KernelPCA : the reference implementation.

    Examples
    --------
    >>> import numpy as np
    >>> from bayespca.kernel_pca import KernelPCA
    >>> X = np.random.default_rng(0).standard_normal((100, 3))
    >>> kpca = KernelPCA(2, kernel="rbf", gamma=0.5, fit_inverse_transform=True)
    >>> Z = kpca.fit_transform(X)
    >>> bool(np.allclose(kpca.transform(X), Z))
    True
    >>> kpca.inverse_transform(Z).shape
    (100, 3)
    """

    def __init__(
        self,
        n_components=None,
        *,
        kernel="rbf",
        gamma=None,
        degree=3,
        coef0=1,
        kernel_params=None,
        solver="auto",
        approximation=None,
        n_approx=None,
        fit_inverse_transform=False,
        alpha=1.0,
        remove_zero_eig=False,
        random_state=None,
    ):
        self.n_components = n_components
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.kernel_params = kernel_params
        self.solver = solver
        self.approximation = approximation
        self.n_approx = n_approx
        self.fit_inverse_transform = fit_inverse_transform
        self.alpha = alpha
        self.remove_zero_eig = remove_zero_eig
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.pairwise = isinstance(self.kernel, str) and self.kernel == "precomputed"
        tags.input_tags.sparse = (
            self.kernel == "linear" and self.approximation is None and not self.fit_inverse_transform
        )
        return tags

    @property
    def _n_features_out(self):
        return self.eigenvalues_.shape[0]

    # ------------------------------------------------------------------ fit

    def _takes_sparse(self, kernel) -> bool:
        """Scipy sparse rows are taken by the exact linear kernel: its Gram matrix is a sparse product."""
        return kernel.name == "linear" and self.approximation is None and not self.fit_inverse_transform

    def _check_params(self):
        check_number(self.n_components, "n_components", integer=True, low=1, allow_none=True)
        check_choice(self.solver, "solver", _SOLVERS)
        check_choice(self.approximation, "approximation", _APPROXIMATIONS)
        check_number(self.n_approx, "n_approx", integer=True, low=1, allow_none=True)
        check_number(self.alpha, "alpha", low=0.0)
        check_bool(self.fit_inverse_transform, "fit_inverse_transform")
        check_bool(self.remove_zero_eig, "remove_zero_eig")
        check_seed(self.random_state)
        precomputed = isinstance(self.kernel, str) and self.kernel == "precomputed"
        if precomputed and self.fit_inverse_transform:
            raise ValueError(
                "Cannot fit_inverse_transform with kernel='precomputed': the pre-image "
                "regression needs the kernel function on the projections."
            )
        if precomputed and self.approximation is not None:
            raise ValueError(
                f"approximation={self.approximation!r} needs the data, not kernel='precomputed'."
            )
        # Kernel() validates the kernel name, gamma, degree, coef0 and kernel_params.
        return Kernel(self.kernel, self.gamma, self.degree, self.coef0, self.kernel_params)

    def fit(self, X, y=None):
        """Fit kernel PCA on X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data, or the (n_samples, n_samples) Gram matrix when
            ``kernel="precomputed"``.
        y : ignored

        Returns
        -------
        self
        """
        self._fit(X)
        return self

    def fit_transform(self, X, y=None):
        """Fit and return the projections ``eigenvectors_ * sqrt(eigenvalues_)``.

        Returns
        -------
        ndarray of shape (n_samples, n_components_)
        """
        self._fit(X)
        return self.eigenvectors_ * np.sqrt(self.eigenvalues_)

    def _fit(self, X):
        kernel = self._check_params()
        for name in (
            "X_fit_", "kernel_col_means_", "kernel_mean_", "feature_map_", "feature_mean_",
            "feature_components_", "dual_coef_", "X_transformed_fit_", "inverse_map_",
            "inverse_coef_",
        ):
            self.__dict__.pop(name, None)
        X = validate_fit(self, X, accept_sparse=self._takes_sparse(kernel)).X
        self.gamma_ = 1.0 / X.shape[1] if self.gamma is None else float(self.gamma)
        kernel = Kernel(kernel.name, self.gamma_, kernel.degree, kernel.coef0, kernel.params)
        self.kernel_ = kernel
        if self.approximation is None:
            self._fit_exact(X, kernel)
        else:
            self._fit_approximate(X, kernel)
        self.n_components_ = self.eigenvalues_.shape[0]
        if self.fit_inverse_transform:
            self._fit_pre_image(X, kernel)

    def _fit_exact(self, X, kernel):
        n = X.shape[0]
        if kernel.name == "precomputed":
            K = _check_precomputed_fit(X)
        else:
            K = kernel(X)
            self.X_fit_ = X.copy()
        top = _check_kernel_range(K, kernel)
        self.kernel_col_means_, self.kernel_mean_ = _centre_gram(K)
        k = n if self.n_components is None else min(n, self.n_components)
        solver = choose_kernel_solver(n, k) if self.solver == "auto" else self.solver
        # Centring leaves rounding errors of about (8 + 4 log2 n) eps max|K| in each entry (the
        # column means are pairwise sums); a centred matrix no larger than that is zero (constant
        # data in feature space), and eigenvalues below n times it, the largest norm of such an
        # error matrix, are zero too.
        rounding = (8 + 4 * np.log2(n)) * np.finfo(float).eps * top
        if max(float(K.max()), -float(K.min())) <= rounding:
            evals, evecs = np.zeros(k), np.zeros((n, k))
        elif solver == "dense":
            evals, evecs = _eigh_dense(K, k)
        elif solver == "arpack":
            evals, evecs = _eigh_arpack(K, k, self.random_state)
        else:
            evals, evecs = _eigh_randomized(K, k, self.random_state, kernel)
        if not np.all(np.isfinite(evals)):
            raise ValueError(
                f"The eigenvalues of the centred {kernel.label} kernel matrix overflow float64 "
                f"(largest kernel value {top:.3g}, n_samples = {n}); rescale X or the kernel."
            )
        order = np.argsort(evals)[::-1]
        evals = _clean_spectrum(evals[order], kernel, k)
        evals[evals <= n * rounding] = 0.0
        evecs = _complete_null_vectors(evecs[:, order], evals)
        evecs, _ = flip_signs(evecs.T)
        self.solver_ = solver
        self._set_components(evals, evecs.T)

    def _fit_approximate(self, X, kernel):
        n = X.shape[0]
        m = _DEFAULT_N_APPROX[self.approximation] if self.n_approx is None else self.n_approx
        if self.approximation == "nystroem":
            if m > n:
                if self.n_approx is not None:
                    warn(
                        f"n_approx={m} exceeds n_samples={n}; using all {n} training points "
                        "as Nystroem landmarks (exact kernel PCA).",
                        UserWarning,
                    )
                m = n
            feature_map = NystroemMap.fit(X, kernel, m, random_state=self.random_state)
        else:
            feature_map = FourierMap.sample(kernel, X.shape[1], m, centre=X.mean(axis=0),
                                            random_state=self.random_state)
        features = feature_map(X)
        r = features.shape[1]
        k = min(n, r) if self.n_components is None else min(n, r, self.n_components)
        mean = features.mean(axis=0)
        # r x r scatter when r <= n, else the n x n Gram matrix: O(min(n, r)^3).
        svd = decompose(features, mean, k, "covariance" if r <= n else "gram").svd
        evals = _clean_spectrum(svd.singular_values**2, kernel, k)
        axes = svd.components
        scores = features @ axes.T - mean @ axes.T
        positive = evals > 0
        evecs = np.zeros_like(scores)
        evecs[:, positive] = scores[:, positive] / np.sqrt(evals[positive])
        axes[~positive] = 0.0  # zero-eigenvalue components project every point to 0
        # Signs by the kernel-PCA rule on the n-vectors, axes flipped alike.
        evecs_t, axes_t = flip_signs(evecs.T, axes.T)
        self.feature_map_ = feature_map
        self.feature_mean_ = mean
        self.solver_ = self.approximation
        keep = self._set_components(evals, evecs_t.T)
        self.feature_components_ = axes_t.T[keep]

    def _set_components(self, evals, evecs):
        """Store eigenpairs, dropping zero eigenvalues when asked; return the kept mask."""
        keep = np.ones(evals.shape[0], dtype=bool)
        if self.remove_zero_eig or self.n_components is None:
            keep = evals > 0
        zero = int(np.sum(evals[keep] == 0))  # kept ones only: those dropped go without a word
        if not keep.any():
            warn(
                f"KernelPCA found no component with a non-zero eigenvalue: the centred "
                f"{self.kernel_.label} kernel matrix is zero to rounding (the data are constant in "
                "the kernel's feature space: duplicate rows, or a gamma that makes every kernel "
                "value equal). n_components_ = 0 and transform returns no columns.",
                UserWarning,
            )
        elif zero:
            warn(
                f"The centred {self.kernel_.label} kernel matrix has {int(np.sum(evals != 0))} non-zero "
                f"eigenvalues, fewer than n_components = {self.n_components}: the last {zero} "
                "components have eigenvalue 0 and project every point to 0 (use "
                "remove_zero_eig=True to drop them).",
                UserWarning,
            )
        self.eigenvalues_ = evals[keep]
        self.eigenvectors_ = np.ascontiguousarray(evecs[:, keep])
        return keep

    def _fit_pre_image(self, X, kernel):
        Z = self.eigenvectors_ * np.sqrt(self.eigenvalues_)
        if self.approximation is None:
            self.dual_coef_ = _ridge_solve(kernel(Z), X, self.alpha)
            self.X_transformed_fit_ = Z
            return
        if self.approximation == "nystroem":
            inverse_map = NystroemMap.from_landmarks(Z, kernel, self.feature_map_.landmark_indices)
        else:
            inverse_map = FourierMap.sample(
                kernel, Z.shape[1], self.feature_map_.n_features_out,
                random_state=self.random_state,
            )
        psi = inverse_map(Z)
        self.inverse_map_ = inverse_map
        # Kernel ridge regression with the approximate kernel psi(z)^T psi(z'):
        # primal (Psi^T Psi + alpha I) W = Psi^T X when r' <= n, else the dual
        # W = Psi^T (Psi Psi^T + alpha I)^{-1} X; the same predictor either way.
        if psi.shape[1] <= psi.shape[0]:
            self.inverse_coef_ = _ridge_solve(psi.T @ psi, psi.T @ X, self.alpha)
        else:
            self.inverse_coef_ = psi.T @ _ridge_solve(psi @ psi.T, X, self.alpha)

    # ------------------------------------------------------------ transform

    def transform(self, X):
        """Project X on the principal components.

        Parameters
        ----------
        X : array-like of shape (n_new, n_features)
            New points, or the (n_new, n_samples) kernel between new and
            training points when ``kernel="precomputed"``.

        Returns
        -------
        ndarray of shape (n_new, n_components_)
        """
        check_is_fitted(self)  # before kernel_, a fitted attribute, is read
        X = validate_transform(self, X, accept_sparse=self._takes_sparse(self.kernel_)).X
        with np.errstate(over="ignore", invalid="ignore"):
            if hasattr(self, "feature_map_"):
                axes = self.feature_components_
                Z = self.feature_map_(X) @ axes.T - self.feature_mean_ @ axes.T
            else:
                K = self.kernel_(X, self.X_fit_) if hasattr(self, "X_fit_") else X.copy()
                _centre_cross(K, self.kernel_col_means_, self.kernel_mean_)
                positive = self.eigenvalues_ > 0
                scaled = np.zeros_like(self.eigenvectors_)
                scaled[:, positive] = self.eigenvectors_[:, positive] / np.sqrt(self.eigenvalues_[positive])
                Z = K @ scaled
        if not np.all(np.isfinite(Z)):
            raise ValueError(
                "KernelPCA.transform overflowed float64 on this X (its kernel values are far outside "
                "those of the training data); rescale X."
            )
        return Z

    def inverse_transform(self, X):
        """Map projections back to input space with the learned pre-image.

        ``x(z) = k(z, Z) (k(Z, Z) + alpha I)^{-1} X``: kernel ridge regression
        from the training projections Z to the training data (Bakir et al.
        2004), evaluated at ``z`` (or its primal form in the approximate
        feature space). Like scikit-learn's, it is a regression, not an exact
        inverse: use it for denoising.

        Parameters
        ----------
        X : array-like of shape (n_new, n_components_)
            Projections.

        Returns
        -------
        ndarray of shape (n_new, n_features_in_)

        Raises
        ------
        sklearn.exceptions.NotFittedError
            If the estimator was not fitted with ``fit_inverse_transform=True``.
        """
        check_is_fitted(self)
        if not (hasattr(self, "dual_coef_") or hasattr(self, "inverse_coef_")):
            raise NotFittedError(
                "This KernelPCA was fitted with fit_inverse_transform=False, so it has no "
                "pre-image map; refit with fit_inverse_transform=True to use inverse_transform."
            )
        Z = validate_scores(self, X)
        if hasattr(self, "inverse_coef_"):
            return self.inverse_map_(Z) @ self.inverse_coef_
        return self.kernel_(Z, self.X_transformed_fit_) @ self.dual_coef_


def _check_kernel_range(K, kernel) -> float:
    """The largest ``|K|``; a ValueError when every kernel value is below float64's normal range."""
    top = max(float(K.max()), -float(K.min()))
    if 0.0 < top < np.finfo(float).tiny:
        raise ValueError(
            f"Every value of the {kernel.label} kernel matrix is below {np.finfo(float).tiny:.3g} in "
            f"magnitude (largest {top:.3g}): they are subnormal in float64 and have lost their digits. "
            "Rescale X (or raise gamma or coef0)."
        )
    return top


def _complete_null_vectors(evecs, evals):
    """Eigenvectors of zero eigenvalues replaced by a fixed orthonormal completion.

    They are orthogonal to the constant vector (the centred matrix has it in
    its null space) and to the other eigenvectors; their own directions are
    arbitrary, and on a matrix that is zero to rounding an iterative solver
    returns different ones from call to call.
    """
    zero = evals == 0
    if not zero.any():
        return evecs
    n = evecs.shape[0]
    kept = np.vstack([np.full((1, n), 1.0 / np.sqrt(n)), evecs[:, ~zero].T])
    evecs = evecs.copy()
    evecs[:, zero] = complete_basis(kept, int(zero.sum())).T
    return evecs


def _check_precomputed_fit(K):
    n, m = K.shape
    if n != m:
        raise ValueError(
            f"With kernel='precomputed', X must be the square Gram matrix of the training "
            f"points; got shape {K.shape}."
        )
    scale = np.abs(K).max()
    asym = np.abs(K - K.T).max()
    if asym > 1e-8 * scale:
        raise ValueError(
            f"With kernel='precomputed', X must be a symmetric Gram matrix; max |K - K^T| = "
            f"{asym:.3g} (max |K| = {scale:.3g}). Symmetrise it with (K + K.T) / 2 if the "
            "asymmetry is rounding."
        )
    return (K + K.T) / 2.0  # a copy: K is centred in place later


def _ridge_solve(gram, rhs, alpha):
    """``(gram + alpha I)^{-1} rhs`` for a symmetric ``gram``, on its eigendecomposition.

    ``U diag(1 / (e + alpha)) U^T rhs`` is backward stable however small
    ``alpha`` is against ``gram`` (a Cholesky solve of the shifted matrix is
    not), and it works for kernels that are not PSD (sigmoid) as long as no
    ``e + alpha`` vanishes.
    """
    e, U = scipy.linalg.eigh(gram, check_finite=False, driver="evd")
    rounding = gram.shape[0] * np.finfo(float).eps * np.abs(e).max(initial=0.0)
    e[np.abs(e) <= rounding] = 0.0  # eigenvalues at the rounding level of the kernel are 0
    shifted = e + alpha
    if np.any(np.abs(shifted) <= max(rounding, np.finfo(float).tiny)):
        raise ValueError(
            f"The pre-image regression is singular with alpha={alpha} (the kernel matrix of the "
            f"projections has eigenvalue {-alpha:.3g} or is singular); use another alpha > 0 "
            "(e.g. the default 1.0)."
        )
    return U @ ((U.T @ rhs) / shifted[:, None])
