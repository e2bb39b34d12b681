"""Kernel functions and the two explicit feature maps that approximate them.

A kernel ``k(x, y)`` is an inner product in some feature space,
``k(x, y) = <phi(x), phi(y)>``; kernel PCA is PCA in that space. This module
evaluates Gram matrices ``K[i, j] = k(x_i, y_j)`` for the usual kernels
(:class:`Kernel`) and builds finite-dimensional feature maps ``phi`` whose
inner products approximate ``k``, so that PCA in feature space costs
``O(n m)`` memory instead of the ``O(n^2)`` of the Gram matrix:

* :class:`NystroemMap` (Williams & Seeger 2001): ``m`` landmark points
  ``L`` give ``phi(x) = k(x, L) U_r S_r^{-1/2}`` with ``k(L, L) = U S U^T``,
  hence ``phi(x)^T phi(y) = k(x, L) k(L, L)^+ k(L, y)``. It is exact on the
  span of the landmarks: with every training point as a landmark, the
  approximate Gram matrix of the training points is the exact one.
* :class:`FourierMap` (Rahimi & Recht 2007), for the rbf kernel only:
  ``phi(x) = sqrt(2/D) cos(x W + b)`` with ``W_ij ~ N(0, 2 gamma)`` and
  ``b_j ~ U(0, 2 pi)``, an unbiased Monte Carlo estimate of
  ``exp(-gamma ||x - y||^2)`` with error ``O(1/sqrt(D))``.

References
----------
C. K. I. Williams, M. Seeger (2001). Using the Nystroem method to speed up
kernel machines. NIPS 13.
A. Rahimi, B. Recht (2007). Random features for large-scale kernel machines.
NIPS 20.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.spatial.distance

from bayespca.params import as_generator, check_number
from bayespca.statistics import power_of_two_above

__all__ = ["KERNELS", "FourierMap", "Kernel", "NystroemMap"]

#: Kernel names accepted by :class:`Kernel`, with the parameters each one uses.
KERNELS: dict[str, tuple[str, ...]] = {
    "linear": (),
    "poly": ("gamma", "degree", "coef0"),
    "rbf": ("gamma",),
    "laplacian": ("gamma",),
    "sigmoid": ("gamma", "coef0"),
    "cosine": (),
    "precomputed": (),
}

# Rows of X per block when a kernel or feature map is evaluated block by block:
# keeps the temporaries small (block x m) when n is large.
_BLOCK_ROWS = 4096
# Elements (rows x columns x features) per batch when a JAX callable is mapped
# over pairs: bounds the memory of the vmapped intermediate arrays.
_JAX_BATCH_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Kernel:
    r"""A kernel function ``k(x, y)``, evaluated on all pairs of rows.

    =================  =======================================================
    name               ``k(x, y)``
    =================  =======================================================
    ``"linear"``       :math:`x^\top y`
    ``"poly"``         :math:`(\gamma\, x^\top y + c_0)^{p}`
    ``"rbf"``          :math:`\exp(-\gamma \lVert x - y\rVert_2^2)`
    ``"laplacian"``    :math:`\exp(-\gamma \lVert x - y\rVert_1)` (L1 norm, as
                       scikit-learn; kernlab's ``laplacedot`` uses the L2 norm)
    ``"sigmoid"``      :math:`\tanh(\gamma\, x^\top y + c_0)` (not positive
                       semi-definite in general)
    ``"cosine"``       :math:`x^\top y / (\lVert x\rVert \lVert y\rVert)`, 0 when
                       either vector is 0
    ``"precomputed"``  ``X`` already is the Gram matrix and is returned as is
    callable           ``f(x, y, **params)`` on two 1-D rows, returning a scalar
    =================  =======================================================

    A callable written with ``jax.numpy`` is vectorised with ``jax.vmap`` over
    all pairs (fast); any other callable is called once per pair, as in
    scikit-learn (slow: use it for small data).

    Parameters
    ----------
    name : str or callable, default="rbf"
        One of :data:`KERNELS` or a callable.
    gamma : float or None, default=None
        Scale :math:`\gamma \ge 0` of rbf, laplacian, poly and sigmoid. None means
        ``1 / n_features`` of the arrays the kernel is called on, scikit-learn's
        default (so a standardised feature contributes ``1/n_features`` to the
        exponent on average).
    degree : float, default=3
        Power :math:`p \ge 0` of the polynomial kernel.
    coef0 : float, default=1
        Offset :math:`c_0` of poly and sigmoid.
    params : mapping or None, default=None
        Keyword arguments passed to a callable kernel.

    Examples
    --------
    >>> k = Kernel("rbf", gamma=0.5)
    >>> k(np.array([[0.0, 0.0], [1.0, 1.0]]))
    array([[1.        , 0.36787944],
           [0.36787944, 1.        ]])
    """

    name: str | Callable[..., Any] = "rbf"
    gamma: float | None = None
    degree: float = 3
    coef0: float = 1
    params: Mapping[str, Any] | None = None

    def __post_init__(self):
        if isinstance(self.name, str):
            if self.name not in KERNELS:
                raise ValueError(
                    f"kernel={self.name!r} is not a known kernel; accepted: "
                    f"{sorted(KERNELS)} or a callable f(x, y) -> float."
                )
        elif not callable(self.name):
            raise TypeError(
                f"kernel must be a string or a callable; got {type(self.name).__name__} "
                f"({self.name!r}). Accepted: {sorted(KERNELS)} or a callable f(x, y) -> float."
            )
        check_number(self.gamma, "gamma", low=0.0, allow_none=True)
        check_number(self.degree, "degree", low=0.0)
        check_number(self.coef0, "coef0")
        if self.params is not None and not isinstance(self.params, Mapping):
            raise TypeError(
                f"kernel_params must be a dict of keyword arguments for a callable kernel or "
                f"None; got {type(self.params).__name__}."
            )
        if self.params and not callable(self.name):
            raise ValueError(
                f"kernel_params={dict(self.params)!r} is only used by a callable kernel; "
                f"kernel={self.name!r} takes gamma, degree and coef0 instead."
            )

    @property
    def label(self) -> str:
        """Readable name for messages."""
        return self.name if isinstance(self.name, str) else getattr(
            self.name, "__name__", repr(self.name)
        )

    def __call__(self, X: np.ndarray, Y: np.ndarray | None = None) -> np.ndarray:
        """Gram matrix ``K[i, j] = k(X[i], Y[j])`` (``Y = X`` when None).

        Parameters
        ----------
        X : ndarray of shape (n, d)
        Y : ndarray of shape (m, d), optional

        Returns
        -------
        ndarray of shape (n, m), float64 (a new array, except for "precomputed")
        """
        if self.name == "precomputed":
            return X
        symmetric = Y is None
        Y = X if symmetric else Y
        if X.shape[1] != Y.shape[1]:
            raise ValueError(
                f"The two arrays of a kernel evaluation need the same number of features; "
                f"got {X.shape[1]} and {Y.shape[1]}."
            )
        if callable(self.name):
            return _callable_gram(self.name, dict(self.params or {}), X, Y, symmetric)
        gamma = 1.0 / X.shape[1] if self.gamma is None else float(self.gamma)
        if self.name == "rbf":
            return _rbf(X, Y, gamma, symmetric)
        if self.name == "laplacian":
            if gamma == 0.0:  # exp(-0 |x - y|_1) = 1, also where the distance overflows
                return np.ones((X.shape[0], Y.shape[0]))
            # Differences taken pair by pair: exact for nearby points wherever they sit.
            K = scipy.spatial.distance.cdist(X, Y, "cityblock")
            K *= -gamma
            return np.exp(K, out=K)
        if self.name == "cosine":
            X, Y = _unit_rows(X), (None if symmetric else _unit_rows(Y))
            return X @ (X if Y is None else Y).T
        with np.errstate(over="ignore", invalid="ignore"):
            K = X @ Y.T
        K = K.toarray(order="C") if scipy.sparse.issparse(K) else K  # scipy sparse rows: linear KernelPCA
        if not np.all(np.isfinite(K)):
            raise ValueError(
                f"The {self.name} kernel needs the inner products x.y of the rows, which overflow "
                f"float64 here (largest |x| {np.abs(X).max():.3g}); rescale X (e.g. standardize it)."
            )
        if self.name == "poly":
            K *= gamma
            K += self.coef0
            if not float(self.degree).is_integer() and K.min() < 0:
                raise ValueError(
                    f"The poly kernel with non-integer degree={self.degree} needs "
                    f"gamma * x.y + coef0 >= 0 for every pair; got {K.min():.3g}. Use an "
                    "integer degree or a larger coef0."
                )
            with np.errstate(over="ignore"):
                np.power(K, self.degree, out=K)
            if not np.all(np.isfinite(K)):
                raise ValueError(
                    f"The poly kernel overflows float64 (degree={self.degree}, gamma={gamma}, "
                    f"coef0={self.coef0}); lower the degree or gamma, or scale X."
                )
            return K
        if self.name == "sigmoid":
            K *= gamma
            K += self.coef0
            return np.tanh(K, out=K)
        return K  # linear


def _rbf(X, Y, gamma, symmetric):
    """``exp(-gamma ||x - y||^2)`` through one matrix product, wherever the data sit.

    The rows are first moved to a common centre ``c`` (the midpoint of their
    range) and divided by a power of two ``u`` that brings them into
    ``[-1, 1]``: distances do not depend on a translation, so this changes
    nothing but rounding, and it keeps ``|x - c|^2`` of the order of the
    spread rather than of the offset (at an offset of 1e9 the plain
    expansion loses every digit). Then
    ``-gamma ||x - y||^2 = -gamma u^2 (||x'||^2 + ||y'||^2 - 2 x'.y')``: the
    cross term is one BLAS call, the rest in-place passes. Rounding can make
    the bracket slightly negative for near-duplicate points; it is clipped at
    0 (and the diagonal of a symmetric Gram matrix is exactly 1). When
    ``gamma u^2`` itself overflows, every pair of distinct points is
    infinitely far on the kernel's scale: the kernel is 1 on exact
    duplicates and 0 elsewhere.
    """
    both = X if symmetric else np.vstack([X, Y])
    lo, hi = both.min(axis=0), both.max(axis=0)
    centre = lo / 2 + hi / 2  # no overflow, unlike (lo + hi) / 2
    half = float(np.max(hi / 2 - lo / 2, initial=0.0))
    unit = power_of_two_above(half)
    Xu = (X - centre) / unit
    Yu = Xu if symmetric else (Y - centre) / unit
    factor = gamma * unit * unit
    if not math.isfinite(factor):
        d2 = scipy.spatial.distance.cdist(Xu, Yu, "sqeuclidean")
        return (d2 == 0.0).astype(float)
    K = Xu @ Yu.T
    K *= 2.0
    x_sq = np.einsum("ij,ij->i", Xu, Xu)
    y_sq = x_sq if symmetric else np.einsum("ij,ij->i", Yu, Yu)
    K -= x_sq[:, None]
    K -= y_sq[None, :]
    np.minimum(K, 0.0, out=K)
    if symmetric:
        np.fill_diagonal(K, 0.0)
    with np.errstate(over="ignore"):
        K *= factor
    return np.exp(K, out=K)


def _unit_rows(X):
    """Rows divided by their norms; each row is first divided by its largest entry (no overflow)."""
    top = np.abs(X).max(axis=1, initial=0.0)
    top[top == 0.0] = 1.0  # a zero row stays zero: its cosine with anything is 0
    X = X / top[:, None]
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))
    norms[norms == 0.0] = 1.0
    return X / norms[:, None]


def _callable_gram(func, params, X, Y, symmetric):
    """Gram matrix of a user function of two rows; vmapped when it is JAX-traceable."""
    pair = functools.partial(func, **params)
    try:
        K = _jax_gram(pair, X, Y)
    except TypeError:
        # Not traceable by JAX (e.g. it calls NumPy on its arguments): evaluate
        # pair by pair, as scikit-learn does.
        K = _loop_gram(pair, X, Y, symmetric)
    if K.shape != (X.shape[0], Y.shape[0]):
        raise ValueError(
            f"The kernel callable {getattr(func, '__name__', func)!r} must return one number "
            f"per pair of rows; got an array of shape {K.shape[2:]} per pair."
        )
    if not np.all(np.isfinite(K)):
        raise ValueError(
            f"The kernel callable {getattr(func, '__name__', func)!r} returned NaN or infinite "
            "values; check it on the rows of X."
        )
    return K


def _jax_gram(pair, X, Y):
    row = jax.vmap(pair, in_axes=(None, 0))
    ys = jnp.asarray(Y)
    batch = max(1, _JAX_BATCH_ELEMENTS // max(1, Y.shape[0] * Y.shape[1]))
    out = jax.lax.map(lambda x: row(x, ys), jnp.asarray(X), batch_size=min(batch, X.shape[0]))
    return np.array(out, dtype=np.float64)


def _loop_gram(pair, X, Y, symmetric):
    n, m = X.shape[0], Y.shape[0]
    K = np.empty((n, m))
    for i in range(n):
        for j in range(i if symmetric else 0, m):
            value = np.asarray(pair(X[i], Y[j]), dtype=np.float64)
            if value.size != 1:
                raise ValueError(
                    "A kernel callable must return one number per pair of rows; got an "
                    f"array of shape {value.shape}."
                )
            K[i, j] = value.item()
            if symmetric:
                K[j, i] = K[i, j]
    return K


def _in_blocks(func, X, width):
    """``func(X)`` evaluated block by block into one preallocated (n, width) array."""
    out = np.empty((X.shape[0], width))
    for start in range(0, X.shape[0], _BLOCK_ROWS):
        out[start : start + _BLOCK_ROWS] = func(X[start : start + _BLOCK_ROWS])
    return out


@dataclass(frozen=True)
class NystroemMap:
    r"""Nystroem feature map: ``phi(x) = k(x, L) U_r S_r^{-1/2}``.

    With the eigendecomposition ``k(L, L) = U S U^T`` of the landmarks' Gram
    matrix, ``phi(x)^T phi(y) = k(x, L) k(L, L)^+ k(L, y)``, the kernel
    projected on the span of the landmarks' features. Eigenvalues below
    ``m * eps * s_max`` (rounding level) are dropped, so ``r <= m``.

    Build one with :meth:`fit`. Memory: ``O(m d + m r)``; ``phi(X)`` costs
    ``O(n m (d + r))`` time and ``O(n r)`` memory (evaluated in blocks of rows).

    Attributes
    ----------
    kernel : Kernel
    landmarks : ndarray of shape (m, d)
    landmark_indices : ndarray of shape (m,)
        Rows of the fitting data used as landmarks.
    normalization : ndarray of shape (m, r)
        ``U_r S_r^{-1/2}``.

    Examples
    --------
    >>> X = np.random.default_rng(0).standard_normal((6, 2))
    >>> phi = NystroemMap.fit(X, Kernel("rbf", gamma=0.5), 6, random_state=0)
    >>> bool(np.allclose(phi(X) @ phi(X).T, Kernel("rbf", gamma=0.5)(X)))
    True
    """

    kernel: Kernel
    landmarks: np.ndarray
    landmark_indices: np.ndarray
    normalization: np.ndarray

    @classmethod
    def fit(
        cls,
        X: np.ndarray,
        kernel: Kernel,
        n_landmarks: int,
        *,
        random_state=None,
    ) -> NystroemMap:
        """Draw ``n_landmarks`` rows of ``X`` uniformly without replacement.

        The landmarks are the first ``n_landmarks`` entries of one random
        permutation, so for a fixed seed a larger ``n_landmarks`` gives a
        superset of landmarks (and an approximation that can only improve).

        Raises
        ------
        ValueError
            If the landmarks' Gram matrix has significant negative eigenvalues
            (the kernel is not positive semi-definite, so it has no feature map).
        """
        n = X.shape[0]
        if not 1 <= n_landmarks <= n:
            raise ValueError(
                f"n_landmarks={n_landmarks} must be between 1 and n_samples={n}."
            )
        rng = as_generator(random_state)
        return cls.from_landmarks(X, kernel, rng.permutation(n)[:n_landmarks])

    @classmethod
    def from_landmarks(cls, X: np.ndarray, kernel: Kernel, indices: np.ndarray) -> NystroemMap:
        """The map whose landmarks are the rows ``X[indices]``."""
        if kernel.name == "precomputed":
            raise ValueError("The Nystroem map needs the data, not kernel='precomputed'.")
        landmarks = X[indices].copy()
        s, u = scipy.linalg.eigh(kernel(landmarks), check_finite=False, driver="evd")
        s_max = max(s[-1], 0.0)
        if s[0] < -1e-5 * s_max and s[0] < -1e-10:
            raise ValueError(
                f"The {kernel.label} kernel matrix of the {len(indices)} Nystroem landmarks has "
                f"eigenvalue {s[0]:.3g} (largest {s_max:.3g}): the kernel is not positive "
                "semi-definite, so it has no Nystroem feature map. Use a PSD kernel "
                "(rbf, laplacian, poly with integer degree) or approximation=None."
            )
        keep = s > len(indices) * np.finfo(float).eps * s_max
        normalization = u[:, keep] / np.sqrt(s[keep])
        return cls(kernel, landmarks, np.asarray(indices), normalization)

    @property
    def n_features_out(self) -> int:
        """Dimension ``r`` of the feature space."""
        return self.normalization.shape[1]

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """Features ``phi(X)`` of shape (n, r)."""
        return _in_blocks(
            lambda block: self.kernel(block, self.landmarks) @ self.normalization,
            X,
            self.n_features_out,
        )


@dataclass(frozen=True)
class FourierMap:
    r"""Random Fourier features for the rbf kernel (Rahimi & Recht 2007).

    ``phi(x) = sqrt(2/D) cos(x W + b)`` with ``W_ij ~ N(0, 2 gamma)`` and
    ``b_j ~ U(0, 2 pi)``. By Bochner's theorem
    ``E[phi(x)^T phi(y)] = exp(-gamma ||x - y||^2)``; the error of the
    estimate is ``O(1/sqrt(D))``. Build one with :meth:`sample`.

    The inputs are first moved by ``centre`` (``phi(x - c)``): the kernel is
    translation-invariant, so the estimate keeps its distribution, and the
    phases ``(x - c) W`` keep their digits for data far from the origin.

    Attributes
    ----------
    frequencies : ndarray of shape (d, D)
    offsets : ndarray of shape (D,)
    centre : ndarray of shape (d,) or None
        Subtracted from every input (None: nothing).

    Examples
    --------
    >>> X = np.random.default_rng(0).standard_normal((3, 2))
    >>> phi = FourierMap.sample(Kernel("rbf", gamma=0.5), 2, 20000, random_state=0)
    >>> bool(np.allclose(phi(X) @ phi(X).T, Kernel("rbf", gamma=0.5)(X), atol=0.03))
    True
    """

    frequencies: np.ndarray
    offsets: np.ndarray
    centre: np.ndarray | None = None

    @classmethod
    def sample(
        cls,
        kernel: Kernel,
        n_features_in: int,
        n_features_out: int,
        *,
        centre: np.ndarray | None = None,
        random_state=None,
    ) -> FourierMap:
        """Draw ``n_features_out`` random features for inputs of ``n_features_in`` columns.

        ``centre`` (e.g. the mean of the training data) is subtracted from
        every input; ``random_state`` follows :mod:`bayespca.params`.
        """
        if kernel.name != "rbf":
            raise ValueError(
                f"Random Fourier features approximate the rbf kernel only; got "
                f"kernel={kernel.label!r}. Use approximation='nystroem' for other kernels."
            )
        if n_features_out < 1:
            raise ValueError(f"n_features_out={n_features_out} must be >= 1.")
        gamma = 1.0 / n_features_in if kernel.gamma is None else float(kernel.gamma)
        rng = as_generator(random_state)
        frequencies = rng.normal(0.0, np.sqrt(2.0 * gamma), size=(n_features_in, n_features_out))
        offsets = rng.uniform(0.0, 2.0 * np.pi, size=n_features_out)
        return cls(frequencies, offsets, None if centre is None else np.array(centre, dtype=float))

    @property
    def n_features_out(self) -> int:
        """Number ``D`` of random features."""
        return self.offsets.shape[0]

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """Features ``phi(X)`` of shape (n, D)."""
        scale = np.sqrt(2.0 / self.n_features_out)

        def block(rows):
            if self.centre is not None:
                rows = rows - self.centre
            with np.errstate(over="ignore", invalid="ignore"):
                z = rows @ self.frequencies
            z += self.offsets
            if not np.all(np.isfinite(z)):
                raise ValueError(
                    "The phases x W of the random Fourier features overflow float64 for these data "
                    f"(largest |x| {np.abs(rows).max():.3g}); rescale X or lower gamma."
                )
            np.cos(z, out=z)
            z *= scale
            return z

        return _in_blocks(block, X, self.n_features_out)
