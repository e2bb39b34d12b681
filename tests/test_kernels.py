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
