"""The shared data interface: what is accepted, what is refused, and how."""

import warnings

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import scipy.sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.datasets import load_iris

from bayespca import PCA, PPCA
from bayespca.data import validate_fit, validate_transform


class _Estimator:
    """A bare object to receive the fitted attributes."""


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a,
        lambda a: a.tolist(),
        lambda a: jnp.asarray(a),
        lambda a: pd.DataFrame(a, columns=["a", "b", "c"]),
        lambda a: a.astype(np.float32),
        lambda a: np.asfortranarray(a),
    ],
)
def test_accepted_containers_give_the_same_float64_matrix(make):
    a = np.arange(12.0).reshape(4, 3) / 3
    out = validate_fit(_Estimator(), make(a)).X
    assert out.dtype == np.float64 and out.flags.c_contiguous
    np.testing.assert_allclose(out, a, rtol=1e-6 if make(a) is not a else 0)


def test_integer_bool_and_nullable_columns_are_converted():
    df = pd.DataFrame({"i": [1, 2, 3], "b": [True, False, True], "n": pd.array([1, None, 3], dtype="Int64")})
    data = validate_fit(_Estimator(), df, allow_nan=True)
    np.testing.assert_array_equal(data.X[:, :2], [[1, 1], [2, 0], [3, 1]])
    np.testing.assert_array_equal(data.missing, [[False] * 3, [False, False, True], [False] * 3])


def test_feature_names_are_kept_and_checked():
    df = pd.DataFrame(np.random.default_rng(0).standard_normal((10, 3)), columns=["x", "y", "z"])
    pca = PCA(2).fit(df)
    assert list(pca.feature_names_in_) == ["x", "y", "z"]
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        plain_out = pca.transform(df.to_numpy())
    np.testing.assert_allclose(pca.transform(df), plain_out, rtol=1e-15)
    with pytest.raises(ValueError, match="feature names should match.*seen at fit time but missing now"):
        pca.transform(df.rename(columns={"z": "w"}))
    with pytest.raises(ValueError, match="different order"):
        pca.transform(df[["y", "x", "z"]])
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        pca.transform(df.to_numpy())
    plain = PCA(2).fit(df.to_numpy())
    assert not hasattr(plain, "feature_names_in_")
    with pytest.warns(UserWarning, match="has feature names"):
        plain.transform(df)


@pytest.mark.parametrize(
    "X, error, match",
    [
        (np.zeros(5), ValueError, "2-D.*1-D.*Reshape"),
        (np.zeros((2, 2, 2)), ValueError, "2-D.*3-D"),
        (np.zeros((0, 3)), ValueError, "0 sample"),
        (np.zeros((3, 0)), ValueError, "0 feature"),
        (np.ones((3, 2)) * (1 + 1j), ValueError, "Complex data not supported"),
        (np.array([["a", "b"], ["c", "d"]]), TypeError, "non-numeric"),
        (np.array([[1, {}], [2, 3]], dtype=object), TypeError, "argument must be a string.* number"),
        (np.array([["1.5", "2"], ["3", "4"]]), TypeError, "strings .* even if they look like numbers"),
        (np.array([[1.0, None], [2.0, 3.0]], dtype=object), TypeError, "use NaN for missing values"),
        (np.array([[1.0, 1j], [2.0, 3.0]], dtype=object), ValueError, "Complex data not supported"),
        (pd.DataFrame({"a": [1.0, 2.0], "z": [1 + 1j, 2.0]}), ValueError, r"complex columns \['z'\]"),
        (np.array(["2020-01-01", "2020-01-02"], dtype="datetime64[D]")[:, None], TypeError, "not numeric"),
        (scipy.sparse.random(5, 3, density=0.5, format="csr"), TypeError, "sparse"),
        (np.array([[1.0, np.inf], [2.0, 3.0]]), ValueError, "infinity"),
        (np.array([[1.0, np.nan], [2.0, 3.0]]), ValueError, "NaN"),
        (np.array([[1e308, 1e308], [1e308, 1e308]]), ValueError, "overflow"),
        (pd.DataFrame({"a": [1.0, 2.0], "s": ["x", "y"]}), TypeError, r"non-numeric columns \['s'\]"),
        (pd.DataFrame({"a": [1.0, 2.0], 3: [1.0, 2.0]}), TypeError, "mixed types"),
    ],
)
def test_rejections_name_the_problem(X, error, match):
    with pytest.raises(error, match=match):
        validate_fit(_Estimator(), X)


def test_sample_count_and_missing_rules():
    with pytest.raises(ValueError, match="1 sample"):
        validate_fit(_Estimator(), [[1.0, 2.0]])
    X = np.array([[1.0, np.nan], [2.0, np.nan], [3.0, np.nan]])
    with pytest.raises(ValueError, match="no observed value.*\\[1\\]"):
        validate_fit(_Estimator(), X, allow_nan=True)
    X[0, 1] = 5.0
    data = validate_fit(_Estimator(), X, allow_nan=True)
    np.testing.assert_array_equal(data.missing, np.isnan(X))
    assert validate_fit(_Estimator(), X[:, :1], allow_nan=True).missing is None
    with pytest.raises(ValueError, match="infinity"):
        validate_fit(_Estimator(), np.array([[np.inf, 1.0], [1.0, np.nan]]), allow_nan=True)


def test_transform_checks_width():
    pca = PCA(1).fit(np.random.default_rng(0).standard_normal((5, 3)))
    with pytest.raises(ValueError, match="X has 2 features, but PCA is expecting 3 features"):
        validate_transform(pca, np.zeros((4, 2)))


# --------------------------------------------------------------- properties
_dtypes = st.sampled_from([np.float64, np.float32, np.int64, np.int32, np.bool_])


@st.composite
def _matrices(draw):
    n = draw(st.integers(0, 7))
    d = draw(st.integers(0, 5))
    dtype = draw(_dtypes)
    elements = (
        st.floats(-1e6, 1e6, allow_nan=False, width=32 if dtype == np.float32 else 64)
        if np.issubdtype(dtype, np.floating)
        else None
    )
    X = draw(hnp.arrays(dtype, (n, d), elements=elements))
    if np.issubdtype(dtype, np.floating) and X.size:
        # Plant NaN/inf at random places.
        n_bad = draw(st.integers(0, 2))
        for _ in range(n_bad):
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, d - 1))
            X[i, j] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    as_frame = draw(st.booleans())
    if as_frame and X.ndim == 2:
        return pd.DataFrame(X, columns=[f"c{j}" for j in range(d)])
    return X


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_matrices())
def test_pca_gives_a_correct_result_or_a_documented_error(X):
    raw = X.to_numpy() if isinstance(X, pd.DataFrame) else X
    try:
        pca = PCA().fit(X)
    except (ValueError, TypeError) as exc:
        # Documented refusals only: shape, size, non-finite values, and a spread whose variances
        # float64 cannot hold (the extreme-data policy: about 1e-152 .. 1e152).
        n, d = raw.shape
        with np.errstate(invalid="ignore", over="ignore"):
            values = raw.astype(np.float64)
            bad = n < 2 or d < 1 or not np.all(np.isfinite(values))
            if not bad and "spread" in str(exc):
                spread = np.sqrt(np.mean((values - values.mean(0)) ** 2))
                bad = not 1e-153 <= spread <= 1e153
        assert bad, f"unexpected refusal: {exc}"
        return
    Xf = raw.astype(np.float64)
    ref = np.linalg.svd(Xf - Xf.mean(0), compute_uv=False)
    np.testing.assert_allclose(pca.singular_values_, ref, rtol=1e-7, atol=1e-7 * max(ref.max(), 1))
    Z = pca.transform(X)
    assert np.all(np.isfinite(Z))
    assert np.all(np.isfinite(pca.explained_variance_ratio_))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = pca.inverse_transform(Z)
    np.testing.assert_allclose(back, Xf, rtol=1e-6, atol=1e-6 * max(np.abs(Xf).max(), 1))
    try:
        scores = pca.score_samples(X)
    except ValueError as exc:  # documented: singular fitted covariance
        assert "singular" in str(exc)
    else:
        assert np.all(np.isfinite(scores))


def test_a_row_with_no_observed_value_is_fitted_as_absent_with_a_warning():
    # Missing at random: a row observed nowhere adds 0 to the log-likelihood, so the fit is that
    # of the other rows (EM to its tolerance), and the user is told to drop it.
    X = load_iris().data.copy()
    X[::7, 2] = np.nan
    blank = np.vstack([X, np.full((1, 4), np.nan)])
    with pytest.warns(UserWarning, match=r"1 row with no observed value \(indices \[150\]\).*drop it"):
        with_blank = PPCA(2, method="em", tol=1e-12, max_iter=10000).fit(blank)
    without = PPCA(2, method="em", tol=1e-12, max_iter=10000).fit(X)
    assert with_blank.log_likelihood_ == pytest.approx(without.log_likelihood_, rel=1e-9)
    np.testing.assert_allclose(with_blank.get_covariance(), without.get_covariance(), rtol=1e-5, atol=1e-8)
