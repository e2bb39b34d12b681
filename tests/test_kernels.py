"""Kernel functions and feature maps against scikit-learn and closed forms."""

import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import pairwise

import bayespca  # noqa: F401  (float64 JAX)
from bayespca.kernels import FourierMap, Kernel, NystroemMap

RNG = np.random.default_rng(42)
X = RNG.standard_normal((40, 5))
Y = RNG.standard_normal((7, 5))


@pytest.mark.parametrize(
    ("kernel", "reference"),
    [
        (Kernel("linear"), lambda a, b: pairwise.linear_kernel(a, b)),
        (Kernel("poly", gamma=0.3, degree=3, coef0=0.5),
         lambda a, b: pairwise.polynomial_kernel(a, b, degree=3, gamma=0.3, coef0=0.5)),
        (Kernel("poly"), lambda a, b: pairwise.polynomial_kernel(a, b)),  # gamma = 1/d
        (Kernel("rbf", gamma=0.7), lambda a, b: pairwise.rbf_kernel(a, b, gamma=0.7)),
        (Kernel("rbf"), lambda a, b: pairwise.rbf_kernel(a, b)),
        (Kernel("laplacian", gamma=0.4), lambda a, b: pairwise.laplacian_kernel(a, b, gamma=0.4)),
        (Kernel("laplacian"), lambda a, b: pairwise.laplacian_kernel(a, b)),
        (Kernel("sigmoid", gamma=0.1, coef0=-0.5),
         lambda a, b: pairwise.sigmoid_kernel(a, b, gamma=0.1, coef0=-0.5)),
        (Kernel("cosine"), lambda a, b: pairwise.cosine_similarity(a, b)),
    ],
    ids=lambda v: getattr(v, "name", None) if isinstance(v, Kernel) else "",
)
def test_kernels_match_sklearn(kernel, reference):
    np.testing.assert_allclose(kernel(X), reference(X, X), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(kernel(X, Y), reference(X, Y), rtol=1e-12, atol=1e-13)


def test_rbf_is_exactly_one_on_diagonal_and_never_above_one():
    # Near-duplicate points with a large norm: the ||x||^2 + ||y||^2 - 2 x.y
    # expansion cancels, and the clipping must keep the kernel <= 1.
    Z = 1e4 + np.array([[0.0, 0.0], [1e-9, 0.0], [0.0, 2e-9]])
    K = Kernel("rbf", gamma=1.0)(Z)
    assert np.all(np.diag(K) == 1.0)
    assert K.max() <= 1.0
    np.testing.assert_allclose(K, 1.0, atol=1e-6)


def test_cosine_of_zero_row_is_zero():
    Z = np.array([[0.0, 0.0], [1.0, 2.0]])
    np.testing.assert_allclose(Kernel("cosine")(Z), [[0.0, 0.0], [0.0, 1.0]], atol=1e-15)


def test_precomputed_returns_input():
    K = X @ X.T
    assert Kernel("precomputed")(K) is K


def test_jax_callable_is_vectorised_and_matches_sklearn():
    def laplace(x, y, scale):
        return jnp.exp(-scale * jnp.sum(jnp.abs(x - y)))

    K = Kernel(laplace, params={"scale": 0.3})(X, Y)
    np.testing.assert_allclose(K, pairwise.laplacian_kernel(X, Y, gamma=0.3), rtol=1e-13)


def test_numpy_callable_falls_back_to_pairwise_loop():
    calls = []

    def poly(x, y):
        calls.append(1)
        return float(np.dot(x, y) + 1.0) ** 2  # float() cannot be traced by JAX

    K = Kernel(poly)(X[:6])
    np.testing.assert_allclose(
        K, pairwise.polynomial_kernel(X[:6], degree=2, gamma=1.0, coef0=1.0), rtol=1e-13
    )
    # The symmetric Gram matrix is filled from its upper triangle: 21 pairs,
    # plus the one failed JAX trace.
    assert len(calls) == 6 * 7 // 2 + 1


def test_callable_returning_vector_or_nan_is_rejected():
    with pytest.raises(ValueError, match="one number per pair"):
        Kernel(lambda x, y: x * y)(X, Y)
    with pytest.raises(ValueError, match="NaN or infinite"):
        Kernel(lambda x, y: jnp.log(jnp.dot(x, y)))(X, Y)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": "gaussian"}, ValueError, "kernel='gaussian' is not a known kernel"),
        ({"name": 3}, TypeError, "kernel must be a string or a callable"),
        ({"gamma": -1.0}, ValueError, "gamma must be a finite number >= 0 or None; got -1.0"),
        ({"gamma": np.nan}, ValueError, "gamma must be .*; got nan"),
        ({"degree": -2}, ValueError, "degree must be a finite number >= 0; got -2"),
        ({"coef0": "a"}, TypeError, "coef0 must be a finite number; got 'a'"),
        ({"params": {"a": 1}}, ValueError, "kernel_params"),
        ({"name": len, "params": [1]}, TypeError, "kernel_params must be a dict"),
    ],
)
def test_bad_kernel_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        Kernel(**kwargs)


def test_poly_with_fractional_degree_and_negative_base_is_an_error():
    with pytest.raises(ValueError, match="non-integer degree=2.5"):
        Kernel("poly", degree=2.5, coef0=0.0)(X)
    # with a non-negative base it is well defined
    Z = np.abs(X)
    np.testing.assert_allclose(
        Kernel("poly", degree=2.5, gamma=1.0, coef0=0.0)(Z), (Z @ Z.T) ** 2.5, rtol=1e-13
    )


def test_nystroem_with_all_points_reproduces_the_gram_matrix():
    kernel = Kernel("rbf", gamma=0.2)
    phi = NystroemMap.fit(X, kernel, X.shape[0], random_state=0)
    np.testing.assert_allclose(phi(X) @ phi(X).T, kernel(X), atol=1e-10)


def test_nystroem_out_of_sample_is_the_landmark_projection_formula():
    kernel = Kernel("rbf", gamma=0.2)
    phi = NystroemMap.fit(X, kernel, 10, random_state=3)
    L = X[phi.landmark_indices]
    expected = kernel(Y, L) @ np.linalg.solve(kernel(L), kernel(L, Y))
    np.testing.assert_allclose(phi(Y) @ phi(Y).T, expected, atol=1e-9)


def test_nystroem_error_decreases_with_landmarks():
    # Same seed => nested landmark sets => K - K_m decreases in the PSD order.
    kernel = Kernel("rbf", gamma=0.2)
    K = kernel(X)
    errors = []
    for m in (3, 6, 12, 24, 40):
        phi = NystroemMap.fit(X, kernel, m, random_state=7)
        errors.append(np.linalg.norm(K - phi(X) @ phi(X).T))
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False))
    assert errors[-1] < 1e-9


def test_nystroem_rejects_indefinite_landmark_matrix():
    with pytest.raises(ValueError, match="sigmoid kernel matrix of the 40 Nystroem landmarks"):
        NystroemMap.fit(X, Kernel("sigmoid", gamma=1.0, coef0=-1.0), 40, random_state=0)


def test_nystroem_landmark_count_is_checked():
    with pytest.raises(ValueError, match="n_landmarks=41 must be between 1 and n_samples=40"):
        NystroemMap.fit(X, Kernel("rbf"), 41)


def test_fourier_features_converge_to_rbf():
    kernel = Kernel("rbf", gamma=0.3)
    K = kernel(X[:10])
    errors = []
    for D in (100, 1000, 10000):
        # average over seeds so that the decrease is not a coin flip
        errs = [
            np.abs(f(X[:10]) @ f(X[:10]).T - K).max()
            for f in (FourierMap.sample(kernel, 5, D, random_state=s) for s in range(4))
        ]
        errors.append(np.mean(errs))
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False))
    # Monte Carlo rate: error ~ D^{-1/2}, a factor 10 over a factor 100 in D
    assert errors[0] / errors[-1] > 5


def test_fourier_frequencies_have_the_rbf_spectral_density():
    # Bochner: exp(-gamma ||d||^2) is the characteristic function of N(0, 2 gamma I).
    f = FourierMap.sample(Kernel("rbf", gamma=0.25), 3, 200000, random_state=0)
    np.testing.assert_allclose(f.frequencies.var(axis=1), 0.5, rtol=0.02)
    np.testing.assert_allclose(f.offsets.mean(), np.pi, rtol=0.01)


def test_fourier_default_gamma_is_one_over_n_features():
    f = FourierMap.sample(Kernel("rbf"), 4, 200000, random_state=0)
    np.testing.assert_allclose(f.frequencies.var(axis=1), 2.0 / 4, rtol=0.02)


def test_fourier_needs_rbf():
    with pytest.raises(ValueError, match="rbf kernel only; got kernel='laplacian'"):
        FourierMap.sample(Kernel("laplacian"), 3, 10)


# ------------------------------------------------------------------ extreme data
def _dyadic(shape, seed=0):
    """Standard-normal-like values on a grid of 2^-10: exactly representable at offsets up to 1e12."""
    return np.round(np.random.default_rng(seed).standard_normal(shape) * 1024) / 1024


@pytest.mark.parametrize("name", ["rbf", "laplacian"])
@pytest.mark.parametrize("offset", [1e6, 1e7, 1e9, 1e12])
def test_translation_invariant_kernels_do_not_depend_on_where_the_data_sit(name, offset):
    A, B = _dyadic((30, 3), 0), _dyadic((7, 3), 1)
    reference = {"rbf": pairwise.rbf_kernel, "laplacian": pairwise.laplacian_kernel}[name]
    kernel = Kernel(name, gamma=0.3)
    assert np.array_equal((A + offset) - offset, A)  # the shifted data are exact
    np.testing.assert_allclose(kernel(A + offset), reference(A, gamma=0.3), rtol=1e-10, atol=0)
    np.testing.assert_allclose(kernel(A + offset, B + offset), reference(A, B, gamma=0.3), rtol=1e-10, atol=0)


@pytest.mark.parametrize("c", [1e-300, 1e-150, 1e150, 1e300])
def test_rbf_at_extreme_scales_has_its_limits(c):
    A = _dyadic((12, 3))
    A[5] = A[2]  # a duplicate row
    # gamma scaled with the data: the same kernel (reference: scikit-learn on the unscaled data).
    if 1e-150 <= c <= 1e150:
        np.testing.assert_allclose(Kernel("rbf", gamma=0.3 / c**2)(A * c), pairwise.rbf_kernel(A, gamma=0.3),
                                   rtol=1e-12, atol=1e-15)
    # gamma fixed: far apart points (closed form: 1 on duplicates, 0 elsewhere) or all at one point.
    K = Kernel("rbf", gamma=0.3)(A * c)
    expected = (pairwise.euclidean_distances(A) == 0).astype(float) if c > 1 else np.ones((12, 12))
    np.testing.assert_array_equal(K, expected)


@pytest.mark.parametrize("c", [1e-200, 1e200])
def test_cosine_is_scale_free_at_any_magnitude(c):
    np.testing.assert_allclose(Kernel("cosine")(X * c, Y * c), pairwise.cosine_similarity(X, Y), rtol=1e-13)


@pytest.mark.parametrize("name", ["linear", "poly", "sigmoid"])
def test_inner_product_overflow_is_a_named_error(name):
    with pytest.raises(ValueError, match=f"The {name} kernel needs the inner products x.y"):
        Kernel(name, gamma=1.0)(X * 1e200)


def test_laplacian_with_zero_gamma_is_one_even_when_distances_overflow():
    np.testing.assert_array_equal(Kernel("laplacian", gamma=0.0)(np.array([[-1e308], [1e308]])), 1.0)


def test_fourier_features_far_from_the_origin_equal_those_at_the_origin():
    A = _dyadic((20, 3))
    near = FourierMap.sample(Kernel("rbf", gamma=0.5), 3, 50, centre=np.zeros(3), random_state=0)
    far = FourierMap.sample(Kernel("rbf", gamma=0.5), 3, 50, centre=np.full(3, 1e9), random_state=0)
    np.testing.assert_array_equal(far(A + 1e9), near(A))  # (A + 1e9) - 1e9 == A exactly
    # Without a centre, the phases of points at 1e9 keep about 7 digits.
    plain = FourierMap.sample(Kernel("rbf", gamma=0.5), 3, 50, random_state=0)
    assert np.abs(plain(A + 1e9) @ plain(A + 1e9).T - near(A) @ near(A).T).max() > 1e-9
    with pytest.raises(ValueError, match="phases x W of the random Fourier features overflow"):
        near(np.full((1, 3), 1e308))


def test_random_state_rule_for_feature_maps():
    for fit in (lambda rs: NystroemMap.fit(X, Kernel("rbf"), 5, random_state=rs),
                lambda rs: FourierMap.sample(Kernel("rbf"), 5, 10, random_state=rs)):
        with pytest.raises(TypeError, match="random_state must be None, an int >= 0"):
            fit("seed")
        a, b = fit(np.random.default_rng(3)), fit(np.random.default_rng(3))
        np.testing.assert_array_equal(a(X), b(X))
