"""The low-rank-plus-diagonal Gaussian behind PCA, probabilistic PCA and factor analysis.

All of these models share one marginal distribution::

    z ~ N(0, I_k),   x | z ~ N(W z + mu, Psi)   =>   x ~ N(mu, C),  C = W W^T + Psi,

with ``Psi = sigma^2 I`` for pPCA (and PCA, as ``sigma^2`` is the mean discarded
eigenvalue) and ``Psi = diag(psi)`` for factor analysis. Everything a fitted
model answers follows from ``(W, psi, mu)``; this module computes it once,
never forming or inverting a d x d matrix where a k x k one will do.

One implementation, two array libraries. Every function here runs on NumPy
input with NumPy/SciPy (no compiler, nothing cached per data shape: what a
fitted estimator's ``score``, ``transform`` or ``impute`` needs) and on JAX
input (arrays or tracers, inside ``jit`` and ``grad``: what the NumPyro
models, SVI and NUTS need) with JAX, by the same code.

Whitened coordinates. With ``A = Psi^{-1/2} W`` every quantity is one of
the k x k capacitance ``M = I + A^T A``:

* ``C = Psi^{1/2} (I + A A^T) Psi^{1/2}`` and
  ``(I + A A^T)^{-1} = I - A M^{-1} A^T`` (Woodbury);
* ``log|C| = sum_j log psi_j + log|M|`` (determinant lemma);
* ``(x - mu)^T C^{-1} (x - mu) = min_z |y - A z|^2 + |z|^2`` with
  ``y = Psi^{-1/2} (x - mu)``, attained at ``z* = M^{-1} A^T y`` (the
  posterior mean of ``z``).

Accuracy as a noise variance goes to 0 (a Heywood case, a floor): ``A`` then
has a huge row while ``C`` stays well conditioned. Three choices keep every
result accurate to rounding there (the textbook forms lose
``log10(1 / psi_min)`` digits):

1. ``W`` is first rotated (an exact symmetry, ``W -> W R``) so that ``A``
   has orthogonal columns: ``M`` is then diagonal up to rounding, and its
   Cholesky factor accurate however graded its diagonal. The rotation comes
   from the eigenvectors of ``A^T A``; under JAX it is held constant for
   differentiation, which is exact because the Gaussian does not depend on
   it.
2. Quadratic forms are ``|y - A z*|^2 + |z*|^2``, a sum of squares, not the
   difference ``|y|^2 - |L^{-1} A^T y|^2`` of two huge numbers. The forms
   over many posterior draws at once (:func:`draws_log_prob`) take that
   difference, as matrix products of all rows with a block of draws, only
   for draws whose ``lambda_max(M)`` keeps its error within the tolerance of
   3.; the other draws are scored by the sum of squares.
3. The precision ``C^{-1}``, whose Woodbury form ``P_0 = Psi^{-1} - ...``
   is a difference of entries of size ``1 / psi``, is refined by steps of
   iterative refinement ``P <- P + P_0 (I - C P)``, each O(d^2 k) through
   the Woodbury form. ``P_0``'s relative error is about
   ``e = eps * lambda_max(M)`` (``1 - s / (1 + s)`` standing for
   ``1 / (1 + s)``, ``s = |a_j|^2`` a signal-to-noise ratio). After ``t``
   steps ``I - C P = (I - C P_0)^(t + 1)``, an error of at most
   ``e^(t + 1)``, and a gradient, which reads ``C^{-1}`` twice, keeps
   ``lambda_max(M)`` times that, down to the ``eps * lambda_max(M)`` of
   rounding that no step removes (measured in rational arithmetic:
   ``|I - C P|`` 3e-4, 2e-8, 3e-13, 1e-15 after 0-3 steps at
   ``lambda_max(M)`` 9e11; the gradient: test_gaussian). So the first
   step is taken where ``e`` exceeds :data:`_PRECISION_TOLERANCE`
   (``lambda_max(M)`` above ~450), and step ``t + 1`` only where the error
   the first ``t`` leave, ``e^(t + 1)``, is above rounding, ``eps``: the
   thresholds :data:`_REFINE_ABOVE`, a second step from ~7e7, a third from
   ~3e10 (past ~5e11 three leave more than rounding: 4 times it at 9e11).
   At the ratios of most data none is needed, and under JAX a step costs
   a third to most of the rest of a gradient (d = 20, k = 6: 57 us with
   three steps, 28 us with none; breast cancer standardised, FA k = 21 at
   its mode, ``lambda_max(M)`` 1e4: 1,000 us with three, 420 us with one,
   230 us with none). The statistics form of the log-likelihood uses it:
   ``tr(C^{-1} S)``. Under JAX the choice is made per evaluation
   (``lax.cond``; under ``vmap``, as in vectorized chains, both branches
   run), so the compiled program holds both branches; callers that know
   their Gaussians stay far below that ratio (the NUTS runner, from
   :func:`capacitance_norm` at the posterior's mode) pass ``refine=False``
   for a program without them.

Rows with missing entries (``observed`` masks) are handled exactly: row ``i``
is the Gaussian of its observed block ``O_i``, with its own capacitance
``M_i = I + A_O^T A_O``, at O(d k^2) per row.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, NamedTuple

import numpy as np
import scipy.linalg
import scipy.linalg.blas
import scipy.linalg.lapack

from bayespca.linalg import flip_signs
from bayespca.statistics import SufficientStatistics

__all__ = [
    "LatentPosterior",
    "LowRankGaussian",
    "MissingConditional",
    "Whitened",
    "array_namespace",
    "canonical_loadings",
    "capacitance_cholesky",
    "capacitance_norm",
    "cholesky",
    "conditional_missing",
    "covariance",
    "draws_log_likelihood_from_stats",
    "draws_log_prob",
    "e_step",
    "expected_statistics",
    "latent_posterior",
    "log_likelihood_from_stats",
    "log_prob",
    "precision",
    "sample",
    "symmetric_packing",
    "tri_solve",
    "whiten",
]

_LOG_2PI = 1.8378770664093453
_ROWS = 1024  # rows per block of the missing-block covariance products
_SMALL_FACTOR = 32  # batched triangular factors up to this size are inverted by substitution
# In JAX, factors of at most this order are factorised and inverted by unrolled scalar formulas,
# not LAPACK's calls, whose fixed cost dominates at this size. The gradient of the sampled pPCA
# density (n = 1000, d = 20), k = 1: 6.4 -> 1.4 us, k = 2: 11.9 -> 8.1, k = 3: 14.1 -> 9.5, its
# compile at most 0.08 s longer; at k = 4 19.9 -> 17.3 us for 0.4 s more compiling, and at k = 6
# the unrolled program is the slower (26.4 -> 33.6 us; compile 0.8 -> 2.5 s).
_UNROLLED_ORDER = 3
# Relative error of the precision below which no refinement step is taken (module notes, 3.).
_PRECISION_TOLERANCE = 1e-13
_EPS = float(np.finfo(float).eps)
# lambda_max(M) above which the precision takes its first, second and third refinement step: the
# Woodbury form's error e = eps * lambda_max(M) above the tolerance, then e^2 and e^3 above rounding
# (module notes, 3.): ~450, ~6.7e7, ~2.7e10.
_REFINE_ABOVE = (_PRECISION_TOLERANCE / _EPS, _EPS ** (-1 / 2), _EPS ** (-2 / 3))


class LowRankGaussian(NamedTuple):
    """Parameters of ``N(mean, loadings @ loadings.T + diag(noise))``.

    Attributes
    ----------
    loadings : array of shape (d, k)
        ``W``; ``k`` may be 0.
    noise : array of shape (d,)
        Diagonal of ``Psi``, strictly positive.
    mean : array of shape (d,)
        ``mu``.

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[1.0], [1.0]]), np.array([0.5, 0.5]), np.zeros(2))
    >>> covariance(g)
    array([[1.5, 1. ],
           [1. , 1.5]])
    """

    loadings: Any
    noise: Any
    mean: Any


# ------------------------------------------------------------------ backends
class _NumPyOps:
    """NumPy/SciPy linear algebra; batched solves go through NumPy's gufuncs."""

    xp = np
    is_jax = False

    @property
    def special(self):
        import scipy.special

        return scipy.special

    @staticmethod
    def asarray(a):
        return np.asarray(a, dtype=float)

    @staticmethod
    def stop_gradient(a):
        return a

    @staticmethod
    def eigh(a):
        return np.linalg.eigh(a)

    @staticmethod
    def when(condition, fn, x):
        """``fn(x)`` if ``condition`` else ``x``."""
        return fn(x) if condition else x

    @staticmethod
    def cholesky(a):
        return np.linalg.cholesky(a)

    @staticmethod
    def tri_solve(chol, b, *, transpose=False):
        """``L^{-1} b`` (or ``L^{-T} b``) for lower ``L``; leading batch axes allowed."""
        if chol.shape[-1] == 0:
            return np.array(b, dtype=float)
        if chol.ndim == 2:
            # The k x k inverse, then one product: LAPACK's triangular solve with many
            # right-hand sides takes OpenBLAS's threaded path, which on a loaded machine
            # waits milliseconds for its second thread (measured 8 ms for k = 1, n = 150).
            inverse = _NumPyOps.tri_inverse(chol)
            return (inverse.T if transpose else inverse) @ b
        if chol.ndim == 3 and chol.shape[-1] <= _SMALL_FACTOR < b.shape[-1]:
            # Many right-hand sides per factor (stacked draws' rows): inverting each small factor by
            # substitution, then one batched product, is 5x NumPy's LU solve (k = 6, 1000 rows).
            inverse = _batched_tri_inverse(chol)
            return (np.swapaxes(inverse, -1, -2) if transpose else inverse) @ b
        # SciPy loops over batches in Python; NumPy's LU gufunc loops in C.
        return np.linalg.solve(np.swapaxes(chol, -1, -2) if transpose else chol, b)

    @staticmethod
    def gram_sum(blocks):
        """``sum_b b @ b.T`` over 2-D blocks ``b`` of equal rows (the first not empty).

        Each of BLAS's symmetric rank-k updates accumulates into one upper
        triangle (half the flops of a product), made symmetric once at the end.
        """
        upper = None
        for b in blocks:
            if b.shape[1] == 0:  # BLAS rejects an empty inner dimension (k = 0)
                continue
            # BLAS reads a Fortran-ordered array without a copy: b itself, or b.T of a C-ordered b.
            a, trans = (b, 0) if b.flags.f_contiguous else (b.T, 1)
            if upper is None:
                upper = scipy.linalg.blas.dsyrk(1.0, a, trans=trans)
            else:
                upper = scipy.linalg.blas.dsyrk(1.0, a, trans=trans, beta=1.0, c=upper, overwrite_c=True)
        return np.triu(upper) + np.triu(upper, 1).T

    @staticmethod
    def masked_capacitance(a, observed):
        """``(L_i^{-1}, log|M_i|)`` of ``M_i = I + A^T diag(o_i) A = L_i L_i^T``, one per row of ``observed``.

        Each entry of the ``M_i`` is kept as one contiguous vector over the
        rows, so that factorising and inverting them are ``O(k^3)`` vector
        operations of length ``n``: a third of the time of NumPy's batched
        Cholesky and of substitution on ``(n, k, k)`` arrays (20000 rows,
        k = 10: 18 against 55 ms).
        """
        k = a.shape[1]
        (rows, cols), unpack = symmetric_packing(k)
        m = ((a[:, rows] * a[:, cols]).T @ np.asarray(observed, dtype=a.dtype).T)[unpack]  # (k, k, n)
        diagonal = np.arange(k)
        m[diagonal, diagonal] += 1.0
        chol = np.zeros_like(m)
        for j in range(k):
            s = m[j:, j] - np.einsum("imn,mn->in", chol[j:, :j], chol[j, :j])
            chol[j, j] = np.sqrt(s[0])
            chol[j + 1 :, j] = s[1:] / chol[j, j]
        inverse = np.zeros_like(m)
        recip = 1.0 / chol[diagonal, diagonal]
        for r in range(k):
            inverse[r, r] = recip[r]
            for c in range(r):
                inverse[r, c] = np.einsum("mn,mn->n", chol[r, c:r], inverse[c:r, c]) * -recip[r]
        return np.ascontiguousarray(np.moveaxis(inverse, -1, 0)), -2.0 * np.sum(np.log(recip), axis=0)

    @staticmethod
    def tri_inverse(chol):
        """``L^{-1}`` of lower triangular ``L``; leading batch axes allowed."""
        if chol.ndim == 2 and chol.shape[0] > 0:
            inverse, info = scipy.linalg.lapack.dtrtri(chol, lower=1)
            if info != 0:
                raise np.linalg.LinAlgError("singular triangular factor")
            return np.tril(inverse)
        if chol.ndim == 3 and 0 < chol.shape[-1] <= _SMALL_FACTOR:
            return _batched_tri_inverse(chol)
        return np.linalg.inv(chol)


def _batched_tri_inverse(chol: np.ndarray) -> np.ndarray:
    """``L_i^{-1}`` of many small lower triangular ``L_i`` (n, k, k), by substitution over the rows.

    Row ``r`` of ``X = L^{-1}`` is ``(e_r - L[r, :r] X[:r]) / L[r, r]``: ``k``
    small batched products, each over all ``n`` factors at once, half the
    time of a batched LU inverse at k = 10 (which ignores the zeros).
    """
    inverse = np.zeros_like(chol)
    diagonal = np.diagonal(chol, axis1=1, axis2=2)
    for r in range(chol.shape[-1]):
        inverse[:, r, r] = 1.0 / diagonal[:, r]
        if r:
            row = np.einsum("nm,nmj->nj", chol[:, r, :r], inverse[:, :r, :r])
            inverse[:, r, :r] = -row / diagonal[:, r, None]
    return inverse


def _unrolled_cholesky(a, xp):
    """Lower Cholesky factor of ``a`` (..., k, k) entry by entry (its lower triangle is read)."""
    k = a.shape[-1]
    zero = xp.zeros_like(a[..., 0, 0])
    factor = {}
    for j in range(k):
        for i in range(j, k):
            t = a[..., i, j] - sum((factor[i, m] * factor[j, m] for m in range(j)), zero)
            factor[i, j] = xp.sqrt(t) if i == j else t / factor[j, j]
    return _from_entries(factor, k, zero, xp)


def _unrolled_tri_inverse(chol, xp):
    """``L^{-1}`` of lower triangular ``L`` (..., k, k) entry by entry, by forward substitution."""
    k = chol.shape[-1]
    zero = xp.zeros_like(chol[..., 0, 0])
    inverse = {}
    for r in range(k):
        inverse[r, r] = 1.0 / chol[..., r, r]
        for c in range(r):
            inverse[r, c] = -sum((chol[..., r, m] * inverse[m, c] for m in range(c, r)), zero) * inverse[r, r]
    return _from_entries(inverse, k, zero, xp)


def _from_entries(lower: dict, k: int, zero, xp):
    rows = [xp.stack([lower[i, j] if j <= i else zero for j in range(k)], axis=-1) for i in range(k)]
    return xp.stack(rows, axis=-2)


class _JaxOps:
    """The same operations in JAX (jit- and grad-friendly)."""

    is_jax = True

    def __init__(self):
        import jax
        import jax.numpy as jnp
        import jax.scipy.special
        from jax.scipy.linalg import solve_triangular

        self.xp = jnp
        self.special = jax.scipy.special
        self.asarray = jnp.asarray
        self.stop_gradient = jax.lax.stop_gradient
        self.eigh = jnp.linalg.eigh
        self._cholesky = jnp.linalg.cholesky
        self._solve_triangular = solve_triangular
        self._cond = jax.lax.cond

    def cholesky(self, a):
        if 0 < a.shape[-1] <= _UNROLLED_ORDER:
            return _unrolled_cholesky(a, self.xp)
        return self._cholesky(a)

    def tri_solve(self, chol, b, *, transpose=False):
        if 0 < chol.shape[-1] <= _UNROLLED_ORDER:
            inverse = _unrolled_tri_inverse(chol, self.xp)
            return (self.xp.swapaxes(inverse, -1, -2) if transpose else inverse) @ b
        return self._solve_triangular(chol, b, lower=True, trans=int(transpose))

    def when(self, condition, fn, x):
        """``fn(x)`` if ``condition`` else ``x``, deciding at run time (a traced ``condition``)."""
        return self._cond(condition, fn, lambda v: v, x)

    @staticmethod
    def gram_sum(blocks):
        return sum(b @ b.T for b in blocks)

    def masked_capacitance(self, a, observed):
        """As :meth:`_NumPyOps.masked_capacitance`, from batched factors (n, k, k)."""
        xp = self.xp
        k = a.shape[1]
        (rows, cols), unpack = symmetric_packing(k)
        # sum_j o_ij a_j a_j^T for every row at once is one matrix product
        # (n, d) x (d, k(k+1)/2), the fastest way to form n small matrices.
        packed = xp.asarray(observed, dtype=a.dtype) @ (a[:, rows] * a[:, cols])
        chol = self.cholesky(xp.eye(k, dtype=a.dtype) + packed[:, unpack])
        log_det = 2.0 * xp.sum(xp.log(xp.diagonal(chol, axis1=-2, axis2=-1)), axis=1)
        return self.tri_inverse(chol), log_det

    def tri_inverse(self, chol):
        if 0 < chol.shape[-1] <= _UNROLLED_ORDER:
            return _unrolled_tri_inverse(chol, self.xp)
        eye = self.xp.broadcast_to(self.xp.eye(chol.shape[-1], dtype=chol.dtype), chol.shape)
        return self._solve_triangular(chol, eye, lower=True)


_NUMPY = _NumPyOps()
_JAX: list = []  # built on first JAX input (importing JAX is slow)


def _ops(*args):
    """JAX operations if any argument holds a JAX array or tracer, else NumPy/SciPy."""
    jax = sys.modules.get("jax")
    if jax is not None and any(isinstance(a, jax.Array) for a in _leaves(args)):
        if not _JAX:
            _JAX.append(_JaxOps())
        return _JAX[0]
    return _NUMPY


def array_namespace(*args) -> tuple[Any, Any]:
    """``(xp, special)``: JAX's ``numpy`` and ``scipy.special`` if an argument holds a JAX array or tracer.

    Else NumPy and SciPy's: functions written against ``xp`` then run on
    NumPy input without compiling anything, and are traceable on JAX input.
    Tuples (a :class:`LowRankGaussian`) are searched; None is skipped.

    Examples
    --------
    >>> array_namespace(np.ones(2), None)[0] is np
    True
    """
    ops = _ops(*args)
    return ops.xp, ops.special


def cholesky(a):
    """Lower Cholesky factor ``L`` of a symmetric positive definite ``a`` (..., k, k): ``a = L L^T``.

    In NumPy or JAX, as ``a`` is. In JAX, orders up to 3 are computed by
    unrolled scalar formulas (from ``a``'s lower triangle), a few times
    faster inside a compiled sampler than LAPACK's call; a matrix that is
    not positive definite gives NaN, as JAX's own factorisation does.

    Examples
    --------
    >>> cholesky(np.array([[4.0, 2.0], [2.0, 5.0]]))
    array([[2., 0.],
           [1., 2.]])
    """
    return _ops(a).cholesky(a)


def tri_solve(chol, b, *, transpose: bool = False):
    """``L^{-1} b``, or ``L^{-T} b`` with ``transpose``, for lower triangular ``L`` (k, k) and ``b`` (k, m).

    In NumPy or JAX, as the arguments are (JAX orders up to 3: :func:`cholesky`).

    Examples
    --------
    >>> tri_solve(np.array([[2.0, 0.0], [1.0, 2.0]]), np.array([[2.0], [3.0]]))
    array([[1.],
           [1.]])
    """
    return _ops(chol, b).tri_solve(chol, b, transpose=transpose)


def _leaves(args):
    for a in args:
        if isinstance(a, tuple):
            yield from _leaves(a)
        elif a is not None:
            yield a


def _chol_solve(ops, chol, b):
    """``M^{-1} b`` from the lower Cholesky factor of ``M``."""
    return ops.tri_solve(chol, ops.tri_solve(chol, b), transpose=True)


def symmetric_packing(k: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Indices of the upper triangle of a k x k matrix, and the (k, k) map back to it.

    Sums of many small symmetric matrices are matrix products over their
    ``k (k + 1) / 2`` distinct entries, about half the work of all ``k^2``:
    ``(weights @ (A[:, rows] * A[:, cols]))[:, unpack]`` is
    ``sum_j weights[i, j] a_j a_j^T`` for every ``i`` at once.

    Returns
    -------
    (rows, cols) : tuple of ndarray of int
        ``np.triu_indices(k)``.
    unpack : ndarray of int, shape (k, k)
        Position of entry ``(r, c)`` in the packed vector.

    Examples
    --------
    >>> (rows, cols), unpack = symmetric_packing(2)
    >>> rows.tolist(), cols.tolist(), unpack.tolist()
    ([0, 0, 1], [0, 1, 1], [[0, 1], [1, 2]])
    """
    upper = np.triu_indices(k)
    unpack = np.zeros((k, k), dtype=int)
    unpack[upper] = np.arange(upper[0].size)
    unpack.T[upper] = np.arange(upper[0].size)
    return upper, unpack


# ------------------------------------------------------------ whitened frame
class Whitened(NamedTuple):
    """The Gaussian in whitened, rotated coordinates (see the module notes).

    Attributes
    ----------
    sd : array of shape (d,)
        ``sqrt(psi)``.
    loadings : array of shape (d, k)
        ``A = Psi^{-1/2} W R`` with orthogonal columns.
    rotation : array of shape (k, k)
        The orthogonal ``R``: ``z = R z'`` maps latent coordinates of this
        frame back to those of ``W``.
    chol : array of shape (k, k)
        Lower Cholesky factor of ``M = I + A^T A`` (diagonal up to rounding).
    """

    sd: Any
    loadings: Any
    rotation: Any
    chol: Any


def whiten(g: LowRankGaussian, *, rotate: bool = True) -> Whitened:
    """Whitened loadings ``Psi^{-1/2} W R`` with orthogonal columns, and the Cholesky factor of ``M``.

    ``R`` holds the eigenvectors of ``W^T Psi^{-1} W``; ``M`` is recomputed
    from the rotated loadings so that its small eigenvalues keep their
    accuracy when others are huge (a noise variance near 0). Cost
    O(d k^2 + k^3). Under JAX, ``R`` is constant for differentiation.
    ``rotate=False`` takes ``R = I`` (columns not orthogonal): ``M``'s
    entries then carry an absolute error of about ``eps * lambda_max(M)``,
    harmless to its eigenvalues (all >= 1) where ``lambda_max(M)`` is
    moderate, and a compiled gradient leaves out an eigendecomposition and
    two products (d = 20, k = 6: ~10 of ~140 operations).

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[1.0], [2.0]]), np.array([0.5, 1.0]), np.zeros(2))
    >>> wh = whiten(g)
    >>> round(float(wh.chol[0, 0] ** 2), 12)  # 1 + 1/0.5 + 4/1
    7.0
    """
    ops = _ops(g)
    xp = ops.xp
    w, noise = ops.asarray(g.loadings), ops.asarray(g.noise)
    sd = xp.sqrt(noise)
    a = w / sd[..., None]
    k = w.shape[-1]
    if k > 0 and rotate:
        _, rotation = ops.eigh(ops.stop_gradient(_transpose(xp, a) @ a))
        rotation = rotation[..., ::-1]  # leading direction first, as canonical_loadings
        a = a @ rotation
    else:
        rotation = xp.broadcast_to(xp.eye(k, dtype=w.dtype), w.shape[:-2] + (k, k))
    chol = ops.cholesky(xp.eye(k, dtype=w.dtype) + _transpose(xp, a) @ a)
    return Whitened(sd, a, rotation, chol)


def _transpose(xp, a):
    """The matrix transpose of ``a``'s last two axes (leading axes index stacked draws)."""
    return xp.swapaxes(a, -1, -2)


def capacitance_cholesky(g: LowRankGaussian):
    """Lower Cholesky factor of the capacitance ``M = I + W^T Psi^{-1} W``, and ``Psi^{-1} W``.

    In the orientation of ``W`` as given (:func:`whiten` gives the
    accurately factorised, rotated form used throughout this module).

    Returns
    -------
    chol : array of shape (k, k)
        Lower triangular, ``chol @ chol.T = M``.
    scaled : array of shape (d, k)
        ``Psi^{-1} W``.

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[1.0], [2.0]]), np.array([0.5, 1.0]), np.zeros(2))
    >>> chol, scaled = capacitance_cholesky(g)
    >>> round(float(chol[0, 0] ** 2), 12), scaled.ravel().tolist()  # 1 + 1/0.5 + 4/1
    (7.0, [2.0, 2.0])
    """
    ops = _ops(g)
    w = ops.asarray(g.loadings)
    scaled = w / ops.asarray(g.noise)[:, None]
    return ops.cholesky(ops.xp.eye(w.shape[1], dtype=w.dtype) + w.T @ scaled), scaled


def capacitance_norm(g: LowRankGaussian) -> float:
    """``lambda_max(M)``, ``M = I + W^T Psi^{-1} W``: one plus the largest signal-to-noise ratio.

    The Woodbury form of the precision loses ``log10(lambda_max(M))``
    digits (module notes, 3.); its gradient in ``Psi``, about twice as
    many. From the factor of :func:`whiten`, in NumPy.

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[1.0], [2.0]]), np.array([0.5, 1.0]), np.zeros(2))
    >>> round(capacitance_norm(g), 12)  # 1 + 1/0.5 + 4/1
    7.0
    """
    chol = whiten(LowRankGaussian(*(np.asarray(a, dtype=float) for a in g))).chol
    return float(np.max(np.diag(chol)) ** 2) if chol.size else 1.0


class _RowFactors(NamedTuple):
    """Per-row pieces shared by log-density, latent posterior and EM (whitened frame)."""

    z: Any  # (n, k) posterior means M_i^{-1} A^T y_i in the rotated frame
    chol: Any  # (k, k); None for rows with missing values (linv instead)
    linv: Any  # (n, k, k) inverses of the per-row factors (missing values), None for complete data
    quad: Any  # (n,) (x_i - mu)^T C^{-1} (x_i - mu) over the observed entries
    logdet: Any  # (n,) log|C| of the observed block
    n_obs: Any  # (n,) or scalar: observed entries per row


def _row_factors(ops, g, wh: Whitened, X, observed) -> _RowFactors:
    xp = ops.xp
    a = wh.loadings
    centred = ops.asarray(X) - ops.asarray(g.mean)[..., None, :]
    if observed is not None:  # a missing entry's placeholder minus the mean can overflow once divided
        obs = xp.asarray(observed, dtype=bool)
        centred = xp.where(obs, centred, 0.0)
    y = centred / wh.sd[..., None, :]
    log_sd = xp.log(wh.sd)
    if observed is None:
        chol = wh.chol
        z = _transpose(xp, _chol_solve(ops, chol, _transpose(xp, y @ a)))
        linv = None
        n_obs = y.shape[-1]
        log_diag = xp.log(xp.diagonal(chol, axis1=-2, axis2=-1))
        logdet = 2.0 * (xp.sum(log_sd, axis=-1) + xp.sum(log_diag, axis=-1))
        logdet = xp.broadcast_to(logdet[..., None], y.shape[:-1])
        resid = y - z @ _transpose(xp, a)
    else:
        # Batched solves with n small triangular factors cost as much as inverting them once,
        # and the inverses serve z, the missing-block covariances and the conditional variances.
        chol = None
        linv, log_det_m = ops.masked_capacitance(a, obs)
        u = (linv @ (y @ a)[..., None])[..., 0]  # L_i^{-1} A^T y_i
        z = (u[:, None, :] @ linv)[:, 0, :]  # (L_i^{-T} u_i)^T
        n_obs = xp.sum(obs, axis=1)
        # log|Psi_O| (the log sd over the observed entries, twice) + log|M_i|
        logdet = 2.0 * (xp.asarray(obs, dtype=log_sd.dtype) @ log_sd) + log_det_m
        resid = xp.where(obs, y - z @ a.T, 0.0)
    quad = xp.sum(resid**2, axis=-1) + xp.sum(z**2, axis=-1)
    return _RowFactors(z, chol, linv, quad, logdet, n_obs)


def _log_density(xp, f: _RowFactors):
    return -0.5 * (f.n_obs * _LOG_2PI + f.logdet + f.quad)


def _posterior_covariance(ops, wh: Whitened, f: _RowFactors):
    """``R M^{-1} R^T`` from the Cholesky factor(s) of ``M`` or their inverses (rotated frame)."""
    xp = ops.xp
    if f.linv is not None:
        inv = xp.swapaxes(f.linv, -1, -2) @ f.linv
    else:
        k = f.chol.shape[-1]
        inv = _chol_solve(ops, f.chol, xp.broadcast_to(xp.eye(k, dtype=f.chol.dtype), f.chol.shape))
    r = wh.rotation
    return r @ inv @ r.T


# ------------------------------------------------------------ log-densities
def log_prob(g: LowRankGaussian, X, observed=None):
    """Log-density of each row of ``X``: ``log N(x_i | mu, W W^T + Psi)``.

    ``(x - mu)^T C^{-1} (x - mu) = |y - A z*|^2 + |z*|^2`` in whitened
    coordinates (module notes) and ``log|C| = log|Psi| + log|M|``.

    With missing values, row ``i`` contributes the density of its observed
    block only, ``log N(x_{i,O} | mu_O, W_O W_O^T + Psi_O)``: the likelihood
    of data missing at random, at O(d k^2) per row.

    Parameters
    ----------
    g : LowRankGaussian
        Or, for complete rows (``observed=None``), ``m`` draws stacked on a
        leading axis: loadings (m, d, k), noise and mean (m, d).
    X : array of shape (n, d)
        Missing entries may hold any value (NaN included) when ``observed``
        is given.
    observed : array of bool, shape (n, d), optional
        True where an entry is observed; all observed when None.

    Returns
    -------
    array of shape (n,), or (m, n) for stacked draws
        NumPy for NumPy input, JAX for JAX input.

    Examples
    --------
    >>> from scipy.stats import multivariate_normal
    >>> g = LowRankGaussian(np.array([[1.0], [2.0]]), np.array([0.5, 0.3]), np.array([0.1, -0.2]))
    >>> x = np.array([[0.3, 0.4]])
    >>> ref = multivariate_normal(g.mean, covariance(g)).logpdf(x)
    >>> bool(np.isclose(log_prob(g, x)[0], ref))
    True
    >>> part = log_prob(g, np.array([[0.3, np.nan]]), np.array([[True, False]]))[0]
    >>> bool(np.isclose(part, multivariate_normal(0.1, 1.5).logpdf(0.3)))
    True
    """
    if observed is not None and np.ndim(g.loadings) > 2:
        raise ValueError(f"observed needs one draw (loadings of shape (d, k)); got loadings of shape "
                         f"{np.shape(g.loadings)}: stacked draws take complete rows (observed=None).")
    ops = _ops(g, X, observed)
    return _log_density(ops.xp, _row_factors(ops, g, whiten(g), X, observed))


def log_likelihood_from_stats(g: LowRankGaussian, n_samples, mean, scatter, *, refine: bool = True):
    """Total log-likelihood ``sum_i log N(x_i | mu, C)`` from sufficient statistics.

    With ``xbar`` the sample mean and ``scatter = sum_i (x_i - xbar)(x_i - xbar)^T``,

        sum_i log N(x_i) = n log N(xbar | mu, C) - tr(C^{-1} scatter) / 2,

    with ``tr(C^{-1} scatter) = sum_{jl} (C^{-1})_{jl} scatter_{jl}`` and
    ``C^{-1}`` from :func:`precision`: O(d^2 k), no d x d factorisation, and
    accurate as a noise variance goes to 0 (``C^{-1}`` stays bounded there).

    Parameters
    ----------
    g : LowRankGaussian
        Or ``m`` draws stacked on a leading axis (as :func:`log_prob`).
    n_samples : int
    mean : array of shape (d,)
        Sample mean.
    scatter : array of shape (d, d)
        Centred scatter matrix (a sum, not divided by ``n``), e.g.
        :func:`bayespca.linalg.centred_scatter`.
    refine : bool, default=True
        Refine ``C^{-1}`` where its error estimate asks (module notes, 3.).
        False leaves the steps out (under JAX, the ``lax.cond`` too: at
        d = 20, k = 3 a gradient's program half the size, its compile
        0.3 s shorter); the result's relative error is then about
        ``eps * lambda_max(M)`` (:func:`capacitance_norm`), that of a
        gradient in ``Psi`` about its square.

    Returns
    -------
    scalar, or (m,) for stacked draws

    Examples
    --------
    >>> X = np.array([[0.0, 1.0], [1.0, 3.0], [2.0, 2.0]])
    >>> g = LowRankGaussian(np.array([[0.8], [0.6]]), np.array([0.4, 0.7]), np.array([1.0, 2.0]))
    >>> xbar = X.mean(0)
    >>> total = log_likelihood_from_stats(g, 3, xbar, (X - xbar).T @ (X - xbar))
    >>> bool(np.isclose(total, log_prob(g, X).sum()))
    True
    """
    ops = _ops(g, mean, scatter)
    xp = ops.xp
    # Unrefined, the precision's own error (eps * lambda_max(M)) exceeds what the rotation saves.
    wh = whiten(g, rotate=refine)
    centre = _row_factors(ops, g, wh, ops.asarray(mean)[None, :], None)
    trace = xp.sum(_precision(ops, g, wh, refine) * ops.asarray(scatter), axis=(-2, -1))
    return n_samples * _log_density(xp, centre)[..., 0] - 0.5 * trace


# ------------------------------------------------------------ many draws at once
_DRAWS_BLOCK = 128  # draws per block at most (fastest measured at n = 1000, d = 20, k = 6)
# Values in one stacked call of log_prob on the draws the difference forms leave: (draws, n, d) arrays
# that stay in cache (n = 1000, d = 20, k = 6: 0.46 s for 2000 draws at 2^18, 0.83 s at 2^22).
_EXACT_VALUES = 1 << 18
_BLOCK_VALUES = 1 << 22  # and at most this many values in a block's (rows, draws x k) product


class _DrawFactors(NamedTuple):
    """Per-draw pieces of a block of ``b`` draws, for the difference forms of :func:`draws_log_prob`."""

    inv_noise: np.ndarray  # (b, d) 1 / psi
    offset: np.ndarray  # (b, d) mu - centre
    reduce: np.ndarray  # (b, d, k) Psi^{-1} W L^{-T}: |u|^2 with u = reduce^T (x - mu) is y^T A M^-1 A^T y
    logdet: np.ndarray  # (b,) log|C|
    benign: np.ndarray  # (b,) bool: lambda_max(M) small enough for the difference forms


def _draw_factors(g: LowRankGaussian, centre: np.ndarray) -> _DrawFactors:
    w, noise, mean = (np.asarray(a, dtype=float) for a in g)
    inv_noise = 1.0 / noise
    scaled = w * inv_noise[..., None]
    capacitance = np.eye(w.shape[-1]) + np.swapaxes(w, -1, -2) @ scaled
    largest = np.linalg.eigvalsh(capacitance)[:, -1] if w.shape[-1] else np.ones(w.shape[0])
    # The difference |y|^2 - |u|^2 loses log10(lambda_max(M)) digits (module notes, 2.): allowed
    # as far as the precision's Woodbury form is (notes, 3.); other draws go through log_prob.
    benign = _EPS * largest <= _PRECISION_TOLERANCE
    chol = np.linalg.cholesky(np.where(benign[:, None, None], capacitance, np.eye(w.shape[-1])))
    reduce = np.swapaxes(np.linalg.solve(chol, np.swapaxes(scaled, -1, -2)), -1, -2)
    logdet = np.sum(np.log(noise), axis=1) + 2.0 * np.sum(np.log(np.diagonal(chol, axis1=1, axis2=2)), axis=1)
    return _DrawFactors(inv_noise, mean - centre, reduce, logdet, benign)


def _quadratic_forms(f: _DrawFactors, rows: np.ndarray) -> np.ndarray:
    """``(x_i - mu_s)^T C_s^{-1} (x_i - mu_s)`` for centred rows (n, d) and each draw: (n, b)."""
    b, d, k = f.reduce.shape
    weighted = f.offset * f.inv_noise
    quad = (rows * rows) @ f.inv_noise.T - 2.0 * (rows @ weighted.T) + np.sum(f.offset * weighted, axis=1)
    u = rows @ np.moveaxis(f.reduce, 1, 0).reshape(d, b * k)
    u -= np.einsum("bd,bdk->bk", f.offset, f.reduce).reshape(1, b * k)
    u *= u
    return quad - u.reshape(-1, b, k).sum(axis=2)


def _by_blocks(g: LowRankGaussian, centre: np.ndarray, benign_part, exact_part, rows: int = 1) -> np.ndarray:
    """``benign_part(factors)`` (b, ...) per block of draws, ``exact_part(g_others)`` for the other draws.

    ``exact_part`` takes the other draws of a block stacked (as ``g``) and
    returns their values stacked.
    """
    m, _, k = np.shape(g.loadings)
    size = int(np.clip(_BLOCK_VALUES // max(rows * k, 1), 1, _DRAWS_BLOCK))
    blocks = []
    for start in range(0, m, size):
        block = LowRankGaussian(*(np.asarray(a, dtype=float)[start:start + size] for a in g))
        factors = _draw_factors(block, centre)
        others = np.flatnonzero(~factors.benign)
        exact = exact_part(LowRankGaussian(*(a[others] for a in block))) if others.size else None
        if others.size == factors.benign.size:  # raw data of large signal-to-noise ratios: every draw
            blocks.append(exact)
            continue
        out = benign_part(factors)
        if exact is not None:
            out[others] = exact
        blocks.append(out)
    return np.concatenate(blocks)


def _in_steps(g: LowRankGaussian, step: int, score) -> np.ndarray:
    """``score`` of ``step`` stacked draws of ``g`` at a time, concatenated."""
    m = np.shape(g.loadings)[0]
    return np.concatenate([score(LowRankGaussian(*(a[s:s + step] for a in g))) for s in range(0, m, step)])


def draws_log_prob(g: LowRankGaussian, X) -> np.ndarray:
    """``log N(x_i | mu_s, W_s W_s^T + Psi_s)`` for every draw ``s`` and row ``i``, shape (m, n).

    ``g`` holds ``m`` draws stacked on a leading axis: loadings (m, d, k),
    noise (m, d), mean (m, d); ``X`` (n, d) complete, NumPy. With ``x``
    centred at the column means of ``X`` (so that ``mu_s`` is near 0),
    ``B_s = Psi_s^{-1} W_s L_s^{-T}`` (``L_s L_s^T = M_s``) and
    ``r = x - mu_s``::

        (x - mu)^T C^{-1} (x - mu) = sum_j r_j^2 / psi_j - |B^T r|^2,

    both terms matrix products of all rows with a block of draws at once
    (``O(n d k)`` per draw in BLAS, against :func:`log_prob`'s ``O(n d k)``
    in a dozen array passes per draw). That difference loses
    ``log10(lambda_max(M_s))`` digits (module notes, 2.): draws with
    ``eps * lambda_max(M_s)`` above 1e-13 (``lambda_max`` ~450, as the
    precision's refinement, notes 3.) are scored by :func:`log_prob`
    instead, on those draws stacked. Measured, 2000 draws, n = 1000,
    d = 20, k = 6: 0.11 s by the difference forms against 0.78 s draw by
    draw, equal to 1e-13; where every draw needs :func:`log_prob`, 0.5 s
    stacked against 0.87 s draw by draw.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> w, noise, mu = rng.normal(size=(3, 4, 2)), rng.uniform(0.5, 1.0, (3, 4)), rng.normal(size=(3, 4))
    >>> g = LowRankGaussian(w, noise, mu)
    >>> X = rng.normal(size=(5, 4))
    >>> each = np.stack([log_prob(LowRankGaussian(*(a[s] for a in g)), X) for s in range(3)])
    >>> bool(np.allclose(draws_log_prob(g, X), each, rtol=1e-12, atol=0))
    True
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 2:
        raise ValueError(f"X must have shape (n, d); got shape {X.shape}.")
    if not np.all(np.isfinite(X)):
        bad = np.flatnonzero(~np.isfinite(X).all(axis=1))
        raise ValueError(f"X must be finite (rows with NaN: log_prob with observed=); got non-finite "
                         f"entries in rows {bad[:5].tolist()}{' ...' if bad.size > 5 else ''}.")
    centre = X.mean(axis=0)
    rows = X - centre

    def benign_part(f):
        return -0.5 * (X.shape[1] * _LOG_2PI + f.logdet[:, None] + _quadratic_forms(f, rows).T)

    def exact_part(others):
        return _in_steps(others, max(1, _EXACT_VALUES // X.size), lambda some: log_prob(some, X))

    return _by_blocks(g, centre, benign_part, exact_part, X.shape[0])


def draws_log_likelihood_from_stats(g: LowRankGaussian, n_samples, mean, scatter) -> np.ndarray:
    """:func:`log_likelihood_from_stats` of each of ``m`` stacked draws (as :func:`draws_log_prob`): (m,).

    ``tr(C_s^{-1} S) = sum_j S_jj / psi_j - tr(B_s^T S B_s)``, one product
    ``S B`` per block of draws; the difference forms are used where
    :func:`draws_log_prob` uses them, the other draws are scored by
    :func:`log_likelihood_from_stats` on those draws stacked (n = 1000,
    d = 20, k = 6, 1706 of 2000 such draws: 1.05 s one by one, 0.08 s
    stacked). NumPy: nothing is compiled.

    Examples
    --------
    One draw, against the sum over rows:

    >>> g = LowRankGaussian(np.array([[[1.0], [2.0]]]), np.array([[0.5, 1.0]]), np.zeros((1, 2)))
    >>> X = np.array([[0.0, 1.0], [1.0, 3.0], [2.0, 2.0]])
    >>> total = draws_log_likelihood_from_stats(g, 3, X.mean(0), 2 * np.cov(X.T))
    >>> bool(np.isclose(total[0], log_prob(LowRankGaussian(*(a[0] for a in g)), X).sum()))
    True
    """
    mean, scatter = np.asarray(mean, dtype=float), np.asarray(scatter, dtype=float)
    d = mean.shape[0]

    def benign_part(f):
        b, _, k = f.reduce.shape
        product = (scatter @ np.moveaxis(f.reduce, 1, 0).reshape(d, b * k)).reshape(d, b, k)
        trace = f.inv_noise @ np.diagonal(scatter) - np.einsum("dbk,bdk->b", product, f.reduce)
        centre = -0.5 * (d * _LOG_2PI + f.logdet + _quadratic_forms(f, np.zeros((1, d)))[0])
        return n_samples * centre - 0.5 * trace

    def exact_part(others):
        step = max(1, _EXACT_VALUES // scatter.size)  # stacked (draws, d, d) precisions
        return _in_steps(others, step, lambda some: log_likelihood_from_stats(some, n_samples, mean, scatter))

    return _by_blocks(g, mean, benign_part, exact_part)


# ------------------------------------------------------------ latent posterior
class LatentPosterior(NamedTuple):
    """Gaussian posterior of the latent ``z`` given rows of ``X``.

    Attributes
    ----------
    mean : array of shape (n, k)
        ``E[z_i | x_i] = M^{-1} W^T Psi^{-1} (x_i - mu)``.
    covariance : array of shape (k, k) or (n, k, k)
        ``Cov[z_i | x_i] = M^{-1}``: one matrix shared by all rows when every
        entry is observed, else one per row (it depends on which entries are
        observed).
    """

    mean: Any
    covariance: Any


def latent_posterior(g: LowRankGaussian, X, observed=None) -> LatentPosterior:
    """Posterior of ``z`` given each row: ``N(M^{-1} W^T Psi^{-1} (x - mu), M^{-1})``.

    With ``M = I + W^T Psi^{-1} W``. With missing values row ``i`` conditions on
    its observed entries only, ``M_i = I + W_O^T Psi_O^{-1} W_O`` (Tipping &
    Bishop 1999, appendix; Ilin & Raiko 2010); a row with nothing observed
    gets the prior ``N(0, I)``.

    Parameters
    ----------
    g : LowRankGaussian
    X : array of shape (n, d)
    observed : array of bool, shape (n, d), optional
        True where observed; all observed when None.

    Returns
    -------
    LatentPosterior
        ``covariance`` has shape (k, k) when ``observed`` is None, else (n, k, k).

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[1.0], [1.0]]), np.array([1.0, 1.0]), np.zeros(2))
    >>> post = latent_posterior(g, np.array([[3.0, 3.0]]))
    >>> post.mean.round(12), post.covariance.round(12)
    (array([[2.]]), array([[0.33333333]]))
    """
    return e_step(g, X, observed)[0]


def e_step(g: LowRankGaussian, X, observed=None) -> tuple[LatentPosterior, Any]:
    """Latent posterior and log-density of each row from one factorisation (EM's E-step).

    Returns
    -------
    posterior : LatentPosterior
        As :func:`latent_posterior`.
    log_density : array of shape (n,)
        As :func:`log_prob`.

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[1.0], [1.0]]), np.array([1.0, 1.0]), np.zeros(2))
    >>> post, logp = e_step(g, np.array([[3.0, 3.0]]))
    >>> bool(np.isclose(logp[0], log_prob(g, np.array([[3.0, 3.0]]))[0]))
    True
    """
    ops = _ops(g, X, observed)
    wh = whiten(g)
    f = _row_factors(ops, g, wh, X, observed)
    post = LatentPosterior(f.z @ wh.rotation.T, _posterior_covariance(ops, wh, f))
    return post, _log_density(ops.xp, f)


def expected_statistics(g: LowRankGaussian, X, observed) -> tuple[SufficientStatistics, Any]:
    """Expected complete-data statistics given the observed entries (the E-step of EM over missing x).

    With ``x^_i = E[x_i | x_{i,O}]`` (the observed entries, and
    ``mu + W E[z_i | x_{i,O}]`` at missing ones) and ``D_i`` the diagonal
    indicator of row ``i``'s missing entries::

        n_hat = n,   mean_hat = sum_i x^_i / n,
        scatter_hat = sum_i (x^_i - mean_hat)(x^_i - mean_hat)^T
                      + sum_i D_i (W Sigma_i W^T + Psi) D_i,

    ``Sigma_i = Cov[z_i | x_{i,O}]``: the conditional covariance of the
    missing block. The complete-data Gaussian likelihood is linear in these
    statistics, so maximising it at them is an exact M-step. Cost O(n d k^2)
    plus one O(n d^2 k) product for the missing-block covariances.

    Parameters
    ----------
    g : LowRankGaussian
    X : array of shape (n, d)
        Missing entries may hold anything (NaN included).
    observed : array of bool, shape (n, d)

    Returns
    -------
    stats : SufficientStatistics
        ``(n, mean_hat, scatter_hat)``.
    log_likelihood : scalar
        ``sum_i log N(x_{i,O} | mu_O, C_OO)`` at ``g`` (as :func:`log_prob`).

    Examples
    --------
    With nothing missing these are the sample statistics:

    >>> X = np.array([[0.0, 1.0], [1.0, 3.0], [2.0, 2.0]])
    >>> g = LowRankGaussian(np.array([[0.8], [0.6]]), np.array([0.4, 0.7]), np.array([1.0, 2.0]))
    >>> stats, ll = expected_statistics(g, X, np.ones(X.shape, dtype=bool))
    >>> stats.mean, stats.scatter
    (array([1., 2.]), array([[2., 1.],
           [1., 2.]]))
    """
    ops = _ops(g, X, observed)
    xp = ops.xp
    wh = whiten(g)
    obs = xp.asarray(observed, dtype=bool)
    f = _row_factors(ops, g, wh, X, obs)
    loadings = wh.sd[:, None] * wh.loadings  # W R
    X = ops.asarray(X)
    xhat = xp.where(obs, X, f.z @ loadings.T + ops.asarray(g.mean))
    n = X.shape[0]
    mean = xp.mean(xhat, axis=0)
    centred = xhat - mean
    # Sigma_i = L_i^{-T} L_i^{-1} (rotated frame), so D_i W R Sigma_i R^T W^T D_i = B_i B_i^T
    # with B_i = D_i W R L_i^{-T}. Column r of every B_i over a block of rows is one (d, c) matrix
    # product, masked where it stands, and their grams add up to the sum.
    # (d, n): the mask in the layout of those products (the transposed view of an (n, d) mask
    # made applying it a third of the E-step's time).
    missing = xp.asarray(~obs.T, dtype=loadings.dtype)
    blocks = (
        (loadings @ f.linv[start : start + _ROWS, r, :].T) * missing[:, start : start + _ROWS]
        for start in range(0, n, _ROWS)
        for r in range(loadings.shape[1])
    )
    scatter = ops.gram_sum(itertools.chain([centred.T], blocks))
    scatter = scatter + xp.diag(xp.sum(missing, axis=1) * wh.sd**2)
    return SufficientStatistics(n, mean, scatter), xp.sum(_log_density(xp, f))


class MissingConditional(NamedTuple):
    """Conditional distribution of the missing entries given the observed ones.

    Attributes
    ----------
    mean : array of shape (n, d)
        ``E[x_ij | x_{i,O}]`` at missing entries; the data themselves at
        observed entries.
    variance : array of shape (n, d)
        ``Var[x_ij | x_{i,O}]`` at missing entries; 0 at observed entries.
    """

    mean: Any
    variance: Any


def conditional_missing(g: LowRankGaussian, X, observed) -> MissingConditional:
    """Mean and variance of each missing entry given the observed entries of its row.

    Through the latent posterior ``z | x_O ~ N(m, Sigma)``: a missing entry is
    ``x_j = w_j^T z + mu_j + eps_j``, so

        E[x_j | x_O] = mu_j + w_j^T m,    Var[x_j | x_O] = w_j^T Sigma w_j + psi_j,

    which equals Gaussian conditioning on the d x d covariance at O(d k^2)
    per row.

    Parameters
    ----------
    g : LowRankGaussian
    X : array of shape (n, d)
        Missing entries may hold anything (NaN included).
    observed : array of bool, shape (n, d)

    Returns
    -------
    MissingConditional

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[1.0], [1.0]]), np.array([1.0, 1.0]), np.zeros(2))
    >>> cond = conditional_missing(g, np.array([[2.0, np.nan]]), np.array([[True, False]]))
    >>> cond.mean, cond.variance
    (array([[2., 1.]]), array([[0. , 1.5]]))
    """
    ops = _ops(g, X, observed)
    xp = ops.xp
    wh = whiten(g)
    obs = xp.asarray(observed, dtype=bool)
    f = _row_factors(ops, g, wh, X, obs)
    k = wh.loadings.shape[1]
    inv = xp.swapaxes(f.linv, -1, -2) @ f.linv  # M_i^{-1}
    (rows, cols), _ = symmetric_packing(k)
    # psi_j (a_j^T M_i^{-1} a_j + 1) for all (i, j): the packed entries of
    # M_i^{-1} (off-diagonal ones counted twice) against the packed a_j a_j^T.
    twice = np.where(rows == cols, 1.0, 2.0)
    a = wh.loadings
    spread = (inv[:, rows, cols] * twice) @ (a[:, rows] * a[:, cols]).T
    var = wh.sd**2 * (spread + 1.0)
    mean = (f.z @ a.T) * wh.sd + ops.asarray(g.mean)
    X = ops.asarray(X)
    return MissingConditional(xp.where(obs, X, mean), xp.where(obs, 0.0, var))


# ------------------------------------------------------------ moments, draws
def covariance(g: LowRankGaussian):
    """Model covariance ``W W^T + diag(psi)``, shape (d, d).

    Examples
    --------
    >>> covariance(LowRankGaussian(np.array([[1.0], [0.0]]), np.array([1.0, 2.0]), np.zeros(2)))
    array([[2., 0.],
           [0., 2.]])
    """
    ops = _ops(g)
    w = ops.asarray(g.loadings)
    return w @ w.T + ops.xp.diag(ops.asarray(g.noise))


def _precision(ops, g, wh: Whitened, refine: bool = True):
    xp = ops.xp
    a, sd = wh.loadings, wh.sd[..., :, None]
    b = ops.tri_solve(wh.chol, _transpose(xp, a))  # (k, d) L^{-1} A^T, so A M^{-1} A^T = B^T B

    def solve(x):  # C^{-1} x = Psi^{-1/2} (I - B^T B) Psi^{-1/2} x, O(d^2 k)
        y = x / sd
        return (y - _transpose(xp, b) @ (b @ y)) / sd

    eye = xp.eye(a.shape[-2], dtype=a.dtype)
    w, noise = ops.asarray(g.loadings), ops.asarray(g.noise)[..., :, None]

    def step(prec):
        return prec + solve(eye - (w @ (_transpose(xp, w) @ prec) + noise * prec))

    # lambda_max(M) read off the factor of M, diagonal in the rotated frame; stacked draws are refined
    # together where any needs it. The steps stay differentiated where taken: a gradient in psi reads
    # C^-1 twice, so the Woodbury form's own derivative loses twice the digits (psi = 1e-6 var: 3e-4
    # relative).
    prec = solve(eye)
    if refine and a.shape[-1]:
        largest = xp.max(xp.diagonal(ops.stop_gradient(wh.chol), axis1=-2, axis2=-1)) ** 2
        for above in _REFINE_ABOVE:
            prec = ops.when(largest > above, step, prec)
    return 0.5 * (prec + _transpose(xp, prec))


def precision(g: LowRankGaussian):
    """Inverse covariance ``C^{-1} = Psi^{-1/2} (I - A M^{-1} A^T) Psi^{-1/2}``, shape (d, d).

    Only the k x k capacitance ``M`` is factorised (Woodbury identity), cost
    O(d^2 k); iterative refinement (module notes, 3.) makes ``C C^{-1} = I`` to
    rounding for signal-to-noise ratios ``lambda_max(M)`` up to ~5e11.

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[1.0], [1.0]]), np.array([1.0, 1.0]), np.zeros(2))
    >>> (precision(g) @ covariance(g)).round(12) + 0.0
    array([[1., 0.],
           [0., 1.]])
    """
    return _precision(_ops(g), g, whiten(g))


def sample(g: LowRankGaussian, key, n_samples: int):
    """Draw ``n_samples`` rows ``x = W z + mu + eps``, ``z ~ N(0, I)``, ``eps ~ N(0, Psi)``.

    Parameters
    ----------
    g : LowRankGaussian
    key : jax.random key or numpy.random.Generator
        A JAX key draws with JAX (JAX array out); a NumPy ``Generator`` with
        NumPy (NumPy array out, nothing compiled).
    n_samples : int

    Returns
    -------
    array of shape (n_samples, d)

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[2.0], [0.0]]), np.array([1.0, 4.0]), np.zeros(2))
    >>> x = sample(g, np.random.default_rng(0), 100_000)
    >>> np.round(np.var(x, axis=0), 1)
    array([5., 4.])
    """
    if isinstance(key, np.random.Generator):
        w, noise, mean = (np.asarray(a, dtype=float) for a in g)
        d, k = w.shape
        z = key.standard_normal((n_samples, k))
        eps = key.standard_normal((n_samples, d))
        return z @ w.T + mean + eps * np.sqrt(noise)
    import jax
    import jax.numpy as jnp

    w = jnp.asarray(g.loadings)
    d, k = w.shape
    key_z, key_eps = jax.random.split(key)
    z = jax.random.normal(key_z, (n_samples, k), dtype=w.dtype)
    eps = jax.random.normal(key_eps, (n_samples, d), dtype=w.dtype)
    return z @ w.T + jnp.asarray(g.mean) + eps * jnp.sqrt(jnp.asarray(g.noise))


def canonical_loadings(g: LowRankGaussian) -> LowRankGaussian:
    """The same Gaussian with ``W`` in its canonical orientation (NumPy, not jit-able).

    ``W`` is identified only up to ``W R`` with ``R`` orthogonal. The
    canonical choice makes ``W^T Psi^{-1} W`` diagonal with decreasing
    entries (for pPCA: orthogonal columns of decreasing norm, the
    Tipping-Bishop closed form; for FA: the unrotated loadings of R's
    ``factanal`` and scikit-learn), each column signed as
    :func:`bayespca.linalg.flip_signs` (largest-magnitude entry positive).
    It is ``Psi^{1/2} U S`` from the SVD ``Psi^{-1/2} W = U S V^T``.

    Examples
    --------
    >>> g = LowRankGaussian(np.array([[0.0, -1.0], [2.0, 0.0]]), np.ones(2), np.zeros(2))
    >>> canonical_loadings(g).loadings + 0.0
    array([[0., 1.],
           [2., 0.]])
    """
    w = np.asarray(g.loadings, dtype=float)
    noise = np.asarray(g.noise, dtype=float)
    sd = np.sqrt(noise)
    u, s, _ = np.linalg.svd(w / sd[:, None], full_matrices=False)
    columns, _ = flip_signs((sd[:, None] * (u * s)).T)
    return LowRankGaussian(columns.T, noise, np.asarray(g.mean, dtype=float))
