"""Input validation shared by every bayespca estimator.

Every estimator turns its input into a dense float64 ``(n_samples, n_features)``
NumPy array through :func:`validate_fit` (at ``fit``) and
:func:`validate_transform` (at ``transform``, ``score``, ...). Keeping the
rules in one place means that every estimator accepts the same inputs
(NumPy arrays, nested lists, JAX arrays, pandas DataFrames) and rejects bad
input with the same messages.

Missing values are encoded as NaN. Estimators that can handle them pass
``allow_nan=True`` and receive the boolean mask of missing entries; all other
estimators reject NaN with a ``ValueError``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.exceptions import NotFittedError

from bayespca.messages import warn
from bayespca.sparse_input import SPARSE_ESTIMATORS, as_sparse_matrix, is_sparse

__all__ = [
    "ValidatedData",
    "as_float_matrix",
    "check_is_fitted",
    "finite_result",
    "validate_fit",
    "validate_scores",
    "validate_transform",
]

_ACCEPTED = "a 2-D array-like of real numbers (NumPy array, nested list, JAX array or pandas DataFrame)"


@dataclass(frozen=True)
class ValidatedData:
    """A validated data matrix; unpacks as ``X, missing = data``.

    Attributes
    ----------
    X : ndarray of shape (n_samples, n_features)
        C-contiguous float64 copy or view of the input. Missing entries stay NaN.
    missing : ndarray of bool, shape (n_samples, n_features), or None
        True where an entry is missing; ``None`` when nothing is missing (the
        common case, so callers can take the fast complete-data path).
    column_sums : ndarray of shape (n_features,)
        Column sums, a by-product of the finiteness check that saves fitting
        code a pass over X for the mean (NaN in columns with missing values).
    """

    X: np.ndarray
    missing: np.ndarray | None
    column_sums: np.ndarray

    def __iter__(self):
        return iter((self.X, self.missing))


def _feature_names(X: Any, name: str) -> np.ndarray | None:
    """Column names of a DataFrame when all of them are strings, else None."""
    columns = getattr(X, "columns", None)
    if columns is None or not hasattr(X, "iloc"):
        return None
    names = np.asarray(columns, dtype=object)
    kinds = {isinstance(c, str) for c in names}
    if kinds == {True}:
        return names
    if kinds == {True, False}:
        raise TypeError(
            f"{name} has column names of mixed types "
            f"({sorted({type(c).__name__ for c in names})}); feature names are only "
            "used when all column names are strings. Convert them with "
            f"{name}.columns = {name}.columns.astype(str)."
        )
    return None


def _from_dataframe(X: Any, name: str) -> np.ndarray:
    from pandas.api.types import is_complex_dtype, is_numeric_dtype  # only reached with a DataFrame

    complex_columns = [str(c) for c, t in zip(X.columns, X.dtypes, strict=True) if is_complex_dtype(t)]
    if complex_columns:
        raise ValueError(
            f"Complex data not supported: {name} has complex columns {complex_columns[:5]}; "
            f"accepted: {_ACCEPTED}."
        )
    bad = [str(col) for col, dtype in zip(X.columns, X.dtypes, strict=True) if not is_numeric_dtype(dtype)]
    if bad:
        raise TypeError(
            f"{name} has non-numeric columns {bad[:5]}{'...' if len(bad) > 5 else ''}; "
            f"accepted: {_ACCEPTED}. Encode or drop those columns first."
        )
    # Nullable pandas dtypes hold pd.NA, which becomes NaN here (a missing value).
    return X.to_numpy(dtype=np.float64, na_value=np.nan)


def _from_objects(arr: np.ndarray, name: str) -> np.ndarray:
    """An object array of real numbers as float64; strings, None and complex numbers refused."""
    for value in arr.flat:
        if isinstance(value, str | bytes) or value is None:
            raise TypeError(
                f"{name} contains non-numeric values (e.g. {value!r}); accepted: {_ACCEPTED}. Convert "
                "strings first; use NaN for missing values."
            )
        if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
            raise ValueError(f"Complex data not supported: {name} contains {value!r}; accepted: {_ACCEPTED}.")
    try:
        return arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} contains non-numeric values ({exc}); accepted: {_ACCEPTED}.") from None


def as_float_matrix(X: Any, *, name: str = "X", allow_nan: bool = False) -> np.ndarray:
    """Convert ``X`` to a finite, 2-D, C-contiguous float64 array.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        NumPy array, nested list, JAX array or pandas DataFrame of real numbers
        (bool and integer dtypes are converted).
    name : str, default="X"
        Argument name used in error messages.
    allow_nan : bool, default=False
        Whether NaN (a missing value) is allowed. ``inf`` never is.

    Returns
    -------
    ndarray of shape (n_samples, n_features), float64

    Raises
    ------
    TypeError
        Sparse or non-numeric input (strings, even numeric-looking ones,
        None, datetimes, other objects).
    ValueError
        Complex numbers, not 2-D, empty, infinite values, or NaN when
        ``allow_nan`` is False.

    Examples
    --------
    >>> as_float_matrix([[1, 2], [3, 4]]).dtype
    dtype('float64')
    """
    return _convert(X, name, allow_nan)[0]


def _convert(X: Any, name: str, allow_nan: bool, min_columns: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """:func:`as_float_matrix`, also returning the column sums."""
    arr = _numeric_array(X, name)
    if arr.ndim != 2:
        hint = (
            f" Reshape your data with {name}.reshape(-1, 1) for one feature or "
            f"{name}.reshape(1, -1) for one sample."
            if arr.ndim == 1
            else ""
        )
        raise ValueError(
            f"{name} must be 2-D (n_samples, n_features); got a {arr.ndim}-D array with shape "
            f"{arr.shape}.{hint}"
        )
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    # A data matrix has samples and features; other matrices (loadings, scores) rows and columns.
    for axis, what in enumerate(("sample", "feature") if name == "X" else ("row", "column")):
        if arr.shape[axis] < (1 if axis == 0 else min_columns):
            raise ValueError(
                f"{name} has 0 {what}(s) (shape={arr.shape}) while a minimum of 1 is required."
            )
    return arr, _checked_sums(arr, name, allow_nan)


def _numeric_array(X: Any, name: str) -> np.ndarray:
    """``X`` as a NumPy array of a real numeric dtype (any shape); a TypeError or ValueError otherwise."""
    if hasattr(X, "toarray") or type(X).__module__.startswith("scipy.sparse"):
        raise TypeError(
            f"{name} is a scipy sparse matrix ({type(X).__name__}); this function needs dense "
            f"input: pass {name}.toarray(). Sparse input is accepted by {SPARSE_ESTIMATORS}."
        )
    if hasattr(X, "iloc") and hasattr(X, "dtypes") and getattr(X, "ndim", 2) == 2:
        return _from_dataframe(X, name)
    try:
        arr = np.asarray(X)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} could not be read as an array ({exc}); accepted: {_ACCEPTED}.") from None
    if np.iscomplexobj(arr):
        raise ValueError(f"Complex data not supported: {name} has dtype {arr.dtype}; accepted: {_ACCEPTED}.")
    if arr.dtype.kind == "O":
        return _from_objects(arr, name)
    if arr.dtype.kind in "US":
        raise TypeError(
            f"{name} contains non-numeric values: strings (dtype {arr.dtype}), even if they look "
            f"like numbers; accepted: {_ACCEPTED}. Convert them first, e.g. {name}.astype(float)."
        )
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} has dtype {arr.dtype}, which is not numeric; accepted: {_ACCEPTED}.")
    return arr


def _checked_sums(arr: np.ndarray, name: str, allow_nan: bool) -> np.ndarray:
    """The column sums of ``arr`` (float64, 2-D); a ValueError for infinity, refused NaN or overflow.

    Column sums are a cheap test for the common all-finite case (and give
    the mean for free); only on failure is the element-wise scan done to say
    what is wrong.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        sums = np.ones(arr.shape[0]) @ arr  # BLAS gemv: one streaming pass, faster than sum(axis=0)
    if not np.isfinite(sums).all():
        if np.isinf(arr).any():
            raise ValueError(f"{name} contains infinity (inf); accepted: finite values"
                             f"{' or NaN for missing entries' if allow_nan else ''}.")
        if not allow_nan and np.isnan(arr).any():
            raise ValueError(
                f"{name} contains NaN; this estimator does not accept missing values. "
                "Use bayespca.PPCA or bayespca.FactorAnalysis, which model them, or impute first."
            )
        if np.isnan(arr).sum() == 0:
            raise ValueError(
                f"{name} holds values so large that their sum overflows float64; rescale {name}."
            )
    return sums


def _missing_mask(arr: np.ndarray, allow_nan: bool, sums: np.ndarray) -> np.ndarray | None:
    """Boolean mask of NaN entries, or None when NaN is not allowed or absent."""
    if not allow_nan or np.isfinite(sums).all():  # finite column sums: no NaN anywhere
        return None
    nan = np.isnan(arr)
    return nan if nan.any() else None


def _refuse_sparse(estimator: Any, X: Any) -> None:
    """A TypeError naming the estimator, for sparse input where it is not supported."""
    kernel = getattr(estimator, "kernel", None)
    which = type(estimator).__name__ + ("" if kernel is None else f" with kernel={kernel!r}")
    raise TypeError(
        f"X is a scipy sparse matrix ({type(X).__name__}) and {which} does not accept sparse input; "
        f"pass X.toarray() if it fits in memory. Sparse input is accepted by {SPARSE_ESTIMATORS}."
    )


def _validate_sparse(X: Any) -> ValidatedData:
    arr = as_sparse_matrix(X)
    return ValidatedData(arr, None, np.asarray(arr.sum(axis=0)).ravel())


def validate_fit(
    estimator: Any, X: Any, *, allow_nan: bool = False, min_samples: int = 2, accept_sparse: bool = False
) -> ValidatedData:
    """Validate training data and record its shape and feature names on ``estimator``.

    Sets ``estimator.n_features_in_`` and, for a DataFrame with string column
    names, ``estimator.feature_names_in_`` (deleted otherwise, as scikit-learn
    does).

    Parameters
    ----------
    estimator : object
        The estimator being fitted.
    X : array-like of shape (n_samples, n_features)
        Training data; see :func:`as_float_matrix` for what is accepted.
    allow_nan : bool, default=False
        Whether NaN marks a missing value. Features with no observed value are
        rejected, since nothing can be estimated for them.
    min_samples : int, default=2
        Minimum number of samples.
    accept_sparse : bool, default=False
        Whether the estimator takes scipy sparse input (returned as a CSR
        float64 copy, :func:`bayespca.sparse_input.as_sparse_matrix`);
        otherwise sparse input is a ``TypeError`` naming the estimator.

    Returns
    -------
    ValidatedData
        ``(X, missing)``; ``missing`` is None when nothing is missing.

    Examples
    --------
    >>> from bayespca import PCA
    >>> data = validate_fit(PCA(), [[1.0, 2.0], [3.0, float("nan")], [0.5, 1.0]], allow_nan=True)
    >>> data.missing.sum()
    np.int64(1)
    """
    if is_sparse(X) and not accept_sparse:
        _refuse_sparse(estimator, X)
    names = _feature_names(X, "X")
    arr, sums = _validate_sparse(X) if is_sparse(X) else _convert(X, "X", allow_nan)
    n, d = arr.shape
    if n < min_samples:
        raise ValueError(
            f"X has {n} sample{'s' if n != 1 else ''} (n_samples = {n}); "
            f"{type(estimator).__name__} needs at least {min_samples} samples."
        )
    missing = _missing_mask(arr, allow_nan, sums)
    if missing is not None:
        empty = np.flatnonzero(missing.all(axis=0))
        if empty.size:
            raise ValueError(
                f"X has features with no observed value (column indices {empty[:10].tolist()}); "
                "drop them: nothing can be estimated for a feature that is never observed."
            )
        blank = np.flatnonzero(missing.all(axis=1))
        if blank.size:
            warn(
                f"X has {blank.size} row{'s' * (blank.size != 1)} with no observed value (indices "
                f"{blank[:10].tolist()}): such a row adds nothing to the fit (its log-likelihood is 0, "
                "under every posterior draw too, which arviz.loo cannot score); drop it."
            )
    estimator.n_features_in_ = d
    if names is not None:
        estimator.feature_names_in_ = names
    elif hasattr(estimator, "feature_names_in_"):
        del estimator.feature_names_in_
    return ValidatedData(arr, missing, sums)


def check_is_fitted(estimator: Any, attribute: str = "n_features_in_") -> None:
    """Raise ``sklearn.exceptions.NotFittedError`` unless ``estimator`` was fitted."""
    if not hasattr(estimator, attribute):
        raise NotFittedError(
            f"This {type(estimator).__name__} instance is not fitted yet. Call 'fit' with "
            "appropriate arguments before using this estimator."
        )


def validate_transform(
    estimator: Any, X: Any, *, allow_nan: bool = False, accept_sparse: bool = False
) -> ValidatedData:
    """Validate new data against what ``estimator`` saw at fit time.

    Checks that the estimator is fitted, that ``X`` has ``n_features_in_``
    columns and, when the estimator was fitted on named columns, that the
    names match in the same order.

    Parameters
    ----------
    estimator : fitted estimator
    X : array-like of shape (n_samples, n_features)
    allow_nan : bool, default=False
        Whether NaN marks a missing value.
    accept_sparse : bool, default=False
        Whether scipy sparse input is taken (as :func:`validate_fit`).

    Returns
    -------
    ValidatedData

    Examples
    --------
    >>> from bayespca import PCA
    >>> pca = PCA(1).fit([[1.0, 2.0], [2.0, 4.1], [3.0, 5.9]])
    >>> validate_transform(pca, [[1.0, 2.0, 3.0]])
    Traceback (most recent call last):
    ...
    ValueError: X has 3 features, but PCA is expecting 2 features as input.
    """
    check_is_fitted(estimator)
    if is_sparse(X) and not accept_sparse:
        _refuse_sparse(estimator, X)

    fitted_names = getattr(estimator, "feature_names_in_", None)
    names = _feature_names(X, "X")
    cls = type(estimator).__name__
    if fitted_names is not None and names is None:
        warn(
            f"X does not have valid feature names, but {cls} was fitted with feature names",
            UserWarning,
        )
    elif fitted_names is None and names is not None:
        warn(
            f"X has feature names, but {cls} was fitted without feature names",
            UserWarning,
        )
    elif fitted_names is not None and (
        len(names) != len(fitted_names) or np.any(names != fitted_names)
    ):
        unexpected = sorted(set(names) - set(fitted_names))
        absent = sorted(set(fitted_names) - set(names))
        detail = []
        if unexpected:
            detail.append(f"unseen at fit time: {unexpected[:5]}")
        if absent:
            detail.append(f"seen at fit time but missing now: {absent[:5]}")
        if not detail:
            detail.append("same names in a different order")
        raise ValueError(
            "The feature names should match those that were passed during fit; "
            + "; ".join(detail)
            + "."
        )
    arr, sums = _validate_sparse(X) if is_sparse(X) else _convert(X, "X", allow_nan)
    if arr.shape[1] != estimator.n_features_in_:
        raise ValueError(
            f"X has {arr.shape[1]} features, but {cls} is expecting "
            f"{estimator.n_features_in_} features as input."
        )
    return ValidatedData(arr, _missing_mask(arr, allow_nan, sums), sums)


def validate_scores(estimator: Any, Z: Any) -> np.ndarray:
    """Validate scores given to ``inverse_transform``: ``n_components_`` finite columns.

    An estimator fitted with no components takes (and gives) scores with no
    columns; ``inverse_transform`` then returns the mean.

    Examples
    --------
    >>> from bayespca import PCA
    >>> pca = PCA(1).fit([[1.0, 2.0], [2.0, 4.1], [3.0, 5.9]])
    >>> validate_scores(pca, [[1.0, 2.0]])
    Traceback (most recent call last):
    ...
    ValueError: X has 2 columns, but PCA.inverse_transform expects n_components_ = 1 score columns.
    """
    check_is_fitted(estimator)
    k = estimator.n_components_
    arr, _ = _convert(Z, "X", allow_nan=False, min_columns=min(k, 1))
    if arr.shape[1] != k:
        raise ValueError(
            f"X has {arr.shape[1]} columns, but {type(estimator).__name__}.inverse_transform expects "
            f"n_components_ = {k} score columns."
        )
    return arr


def finite_result(values: np.ndarray, where: str, cause: str = "on this X (its values are far outside "
                  "the range of the training data)") -> np.ndarray:
    """``values``, or a ValueError saying that ``where`` (e.g. ``"PCA.transform"``) overflowed float64.

    Examples
    --------
    >>> finite_result(np.array([1.0]), "PCA.transform").tolist()
    [1.0]
    """
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{where} overflowed float64 {cause}; rescale X.")
    return values
