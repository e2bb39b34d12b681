"""The low-rank Gaussian core against dense NumPy/SciPy Gaussian algebra."""

from fractions import Fraction

import jax
import numpy as np
import pytest
from scipy.stats import multivariate_normal

from bayespca import gaussian
from bayespca.gaussian import LowRankGaussian


def _model(d=7, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return LowRankGaussian(
        rng.standard_normal((d, k)), rng.uniform(0.2, 1.5, d), rng.standard_normal(d)
    )


def _dense_cov(g):
    w = np.asarray(g.loadings)
    return w @ w.T + np.diag(np.asarray(g.noise))


def _data(g, n=40, seed=1):
    rng = np.random.default_rng(seed)
    return rng.multivariate_normal(np.asarray(g.mean) + 0.3, _dense_cov(g), size=n)


def test_log_likelihood_from_stats_equals_rows_and_scipy():
    g = _model()
    X = _data(g)
    xbar = X.mean(axis=0)
    scatter = (X - xbar).T @ (X - xbar)
    from_stats = float(gaussian.log_likelihood_from_stats(g, X.shape[0], xbar, scatter))
    per_row = float(np.sum(gaussian.log_prob(g, X)))
    ref = multivariate_normal(np.asarray(g.mean), _dense_cov(g)).logpdf(X).sum()
    assert from_stats == pytest.approx(ref, rel=1e-10)
    assert per_row == pytest.approx(ref, rel=1e-10)


def test_masked_log_prob_all_observed_equals_complete():
    g = _model()
    X = _data(g)
    full = np.asarray(gaussian.log_prob(g, X))
    masked = np.asarray(gaussian.log_prob(g, X, np.ones(X.shape, dtype=bool)))
    np.testing.assert_allclose(masked, full, rtol=1e-12)


def test_latent_posterior_complete_matches_dense_conditioning():
    # Joint of (z, x): Cov(z, x) = W^T, so E[z|x] = W^T C^{-1}(x - mu),
    # Cov[z|x] = I - W^T C^{-1} W (standard Gaussian conditioning).
    g = _model()
    X = _data(g, n=5)
    w, c = np.asarray(g.loadings), _dense_cov(g)
    post = gaussian.latent_posterior(g, X)
    ref_mean = np.linalg.solve(c, (X - np.asarray(g.mean)).T).T @ w
    ref_cov = np.eye(w.shape[1]) - w.T @ np.linalg.solve(c, w)
    np.testing.assert_allclose(post.mean, ref_mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(post.covariance, ref_cov, rtol=1e-10, atol=1e-12)


def test_latent_posterior_masked_matches_dense_conditioning_on_observed_block():
    g = _model()
    X = _data(g, n=6)
    rng = np.random.default_rng(3)
    obs = rng.random(X.shape) > 0.35
    obs[0] = True
    obs[1] = False  # nothing observed: the prior
    w, c, mu = np.asarray(g.loadings), _dense_cov(g), np.asarray(g.mean)
    post = gaussian.latent_posterior(g, np.where(obs, X, np.nan), obs)
    assert post.covariance.shape == (6, 3, 3)
    for i in range(X.shape[0]):
        o = obs[i]
        wo = w[o]
        gain = np.linalg.solve(c[np.ix_(o, o)], wo).T if o.any() else np.zeros((3, 0))
        np.testing.assert_allclose(post.mean[i], gain @ (X[i, o] - mu[o]), atol=1e-10)
        np.testing.assert_allclose(post.covariance[i], np.eye(3) - gain @ wo, atol=1e-10)


def test_conditional_missing_matches_dense_conditioning():
    g = _model()
    X = _data(g, n=6)
    rng = np.random.default_rng(4)
    obs = rng.random(X.shape) > 0.4
    obs[:, 0] = True
    c, mu = _dense_cov(g), np.asarray(g.mean)
    cond = gaussian.conditional_missing(g, np.where(obs, X, np.nan), obs)
    for i in range(X.shape[0]):
        o, m = obs[i], ~obs[i]
        k_mo = c[np.ix_(m, o)]
        ref_mean = mu[m] + k_mo @ np.linalg.solve(c[np.ix_(o, o)], X[i, o] - mu[o])
        ref_var = np.diag(c[np.ix_(m, m)] - k_mo @ np.linalg.solve(c[np.ix_(o, o)], k_mo.T))
        np.testing.assert_allclose(cond.mean[i, m], ref_mean, rtol=1e-10)
        np.testing.assert_allclose(cond.variance[i, m], ref_var, rtol=1e-10)
        np.testing.assert_array_equal(cond.mean[i, o], X[i, o])
        np.testing.assert_array_equal(cond.variance[i, o], 0.0)


def _masked_data(g, n, seed):
    X = _data(g, n=n, seed=seed)
    obs = np.random.default_rng(seed + 10).random(X.shape) > 0.3
    obs[0] = True  # a complete row
    obs[1] = False  # a row with nothing observed
    return X, obs


@pytest.mark.parametrize("backend", ["numpy", "jax"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_masked_log_prob_is_the_density_of_each_observed_block(backend, k):
    g = _model(d=9, k=k, seed=k)
    X, obs = _masked_data(g, 12, seed=k)
    c, mu = _dense_cov(g), np.asarray(g.mean)
    args = (g, np.where(obs, X, np.nan), obs)
    if backend == "jax":
        import jax.numpy as jnp

        args = (LowRankGaussian(*(jnp.asarray(a) for a in g)), jnp.asarray(np.where(obs, X, 0.0)), obs)
    got = np.asarray(gaussian.log_prob(*args))
    for i, o in enumerate(obs):
        ref = multivariate_normal(mu[o], c[np.ix_(o, o)]).logpdf(X[i, o]) if o.any() else 0.0
        assert got[i] == pytest.approx(ref, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("k", [1, 3])
def test_expected_statistics_are_the_dense_conditional_moments(k, monkeypatch):
    # E[x_i | x_iO] and Cov[x_iM | x_iO] by dense Gaussian conditioning; blocks of 4 rows, the last
    # one partial, so that every row's missing-block covariance passes through the blocked products.
    monkeypatch.setattr(gaussian, "_ROWS", 4)
    g = _model(d=8, k=k, seed=5)
    X, obs = _masked_data(g, 13, seed=6)
    c, mu = _dense_cov(g), np.asarray(g.mean)
    xhat, extra, ll_ref = X.copy(), np.zeros_like(c), 0.0
    for i, o in enumerate(obs):
        m = ~o
        if o.any():
            ll_ref += multivariate_normal(mu[o], c[np.ix_(o, o)]).logpdf(X[i, o])
        gain = np.linalg.solve(c[np.ix_(o, o)], c[np.ix_(o, m)]).T if o.any() else np.zeros((m.sum(), 0))
        xhat[i, m] = mu[m] + gain @ (X[i, o] - mu[o])
        extra[np.ix_(m, m)] += c[np.ix_(m, m)] - gain @ c[np.ix_(o, m)]
    mean = xhat.mean(axis=0)
    stats, ll = gaussian.expected_statistics(g, np.where(obs, X, np.nan), obs)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-10)
    np.testing.assert_allclose(stats.scatter, (xhat - mean).T @ (xhat - mean) + extra, rtol=1e-10, atol=1e-10)
    assert float(ll) == pytest.approx(ll_ref, rel=1e-10)


def test_sample_moments_match_model():
    g = _model(d=4, k=2)
    x = np.asarray(gaussian.sample(g, jax.random.key(0), 200_000))
    # Standard errors of the sample mean and covariance at n = 2e5 are ~0.3%.
    np.testing.assert_allclose(x.mean(axis=0), g.mean, atol=0.02)
    np.testing.assert_allclose(np.cov(x.T), _dense_cov(g), atol=0.05 * _dense_cov(g).max())
    first = np.asarray(gaussian.sample(g, jax.random.key(7), 10))
    np.testing.assert_array_equal(first, np.asarray(gaussian.sample(g, jax.random.key(7), 10)))
    assert not np.allclose(first, np.asarray(gaussian.sample(g, jax.random.key(8), 10)))


def test_precision_times_covariance_is_identity():
    g = _model()
    np.testing.assert_allclose(
        np.asarray(gaussian.precision(g)) @ _dense_cov(g), np.eye(7), atol=1e-10
    )


def test_canonical_loadings_removes_rotation():
    g = _model()
    q, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((3, 3)))
    rotated = LowRankGaussian(np.asarray(g.loadings) @ q, g.noise, g.mean)
    a = gaussian.canonical_loadings(g)
    b = gaussian.canonical_loadings(rotated)
    np.testing.assert_allclose(a.loadings, b.loadings, atol=1e-10)
    np.testing.assert_allclose(_dense_cov(a), _dense_cov(g), atol=1e-10)
    # W^T Psi^{-1} W is diagonal with decreasing entries; largest |entry| positive.
    gram = a.loadings.T @ (a.loadings / np.asarray(a.noise)[:, None])
    np.testing.assert_allclose(gram, np.diag(np.diag(gram)), atol=1e-10)
    assert np.all(np.diff(np.diag(gram)) <= 0)
    idx = np.argmax(np.abs(a.loadings), axis=0)
    assert np.all(a.loadings[idx, np.arange(3)] > 0)


def _graded(noise_scale, d=8, k=3, n=60, seed=3):
    """A model whose first feature's noise is ``noise_scale`` times its variance (a near-Heywood case at
    small scales), and rows drawn from it."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((d, k))
    noise = rng.uniform(0.3, 1.2, d)
    noise[0] = noise_scale * (w[0] @ w[0] + noise[0])
    g = LowRankGaussian(w, noise, rng.standard_normal(d))
    return g, rng.multivariate_normal(g.mean, _dense_cov(g), size=n)


@pytest.mark.parametrize("noise_scale", [1.0, 1e-3, 1e-6, 1e-9, 1e-12])
@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_statistics_log_likelihood_is_accurate_at_every_signal_to_noise_ratio(noise_scale, backend):
    # The reference is the row form, a sum of squares with no cancellation (module notes, 2.); the
    # statistics form goes through the precision, refined only where its error estimate asks.
    g, X = _graded(noise_scale)
    xbar = X.mean(axis=0)
    scatter = (X - xbar).T @ (X - xbar)
    ref = float(np.sum(gaussian.log_prob(g, X)))
    if backend == "jax":
        g = LowRankGaussian(*(jax.numpy.asarray(a) for a in g))
        stats = jax.jit(gaussian.log_likelihood_from_stats, static_argnums=1)(g, X.shape[0], xbar, scatter)
    else:
        stats = gaussian.log_likelihood_from_stats(g, X.shape[0], xbar, scatter)
    assert float(stats) == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize(("noise_scale", "refine"), [(1.0, True), (1e-3, True), (1e-6, True), (1.0, False),
                                                     (1e-3, False)])
def test_statistics_log_likelihood_gradient_equals_dense_formula(noise_scale, refine):
    # d/dC of sum_i log N(x_i | mu, C) is (C^-1 T C^-1 - n C^-1) / 2, T = sum_i (x_i - mu)(x_i - mu)^T:
    # dW = (C^-1 T C^-1 - n C^-1) W, dpsi = its diagonal / 2, dmu = n C^-1 (xbar - mu). Unrefined
    # (the NUTS runner's program below lambda_max(M) = 1e4; here 27 and 916), M is also
    # factorised without the rotation that keeps its small eigenvalues accurate at extreme ratios.
    g, X = _graded(noise_scale)
    n = X.shape[0]
    xbar = X.mean(axis=0)
    scatter = (X - xbar).T @ (X - xbar)

    def total(*p):
        return gaussian.log_likelihood_from_stats(LowRankGaussian(*p), n, xbar, scatter, refine=refine)

    grads = jax.grad(total, argnums=(0, 1, 2))(*(jax.numpy.asarray(a) for a in g))
    cov = _dense_cov(g)
    total = scatter + n * np.outer(xbar - g.mean, xbar - g.mean)
    inner = np.linalg.solve(cov, np.linalg.solve(cov, total).T) - n * np.linalg.inv(cov)
    expected = (inner @ g.loadings, 0.5 * np.diag(inner), n * np.linalg.solve(cov, xbar - g.mean))
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-7, atol=1e-9 * np.abs(want).max())


def _exact(a):
    """``a`` (floats) as exact rationals, an object array."""
    return np.vectorize(Fraction, otypes=[object])(np.asarray(a, dtype=float))


def _exact_inverse(a):
    """The inverse of a square object array of rationals, by Gauss-Jordan elimination (no rounding)."""
    n = a.shape[0]
    m = np.hstack([a, _exact(np.eye(n))])
    for c in range(n):
        pivot = c + int(np.argmax([abs(x) for x in m[c:, c]]))
        m[[c, pivot]] = m[[pivot, c]]
        m[c] = m[c] / m[c, c]
        for r in range(n):
            if r != c:
                m[r] = m[r] - m[r, c] * m[c]
    return m[:, n:]


# The gradient in (W, psi, mu) of the statistics form, compiled once for every ratio below.
_statistics_gradient = jax.jit(jax.grad(
    lambda w, psi, mu, n, xbar, scatter: gaussian.log_likelihood_from_stats(
        LowRankGaussian(w, psi, mu), n, xbar, scatter
    ),
    argnums=(0, 1, 2),
))


@pytest.mark.parametrize("noise_scale", [1e-6, 1e-8, 1e-10, 1e-11])
def test_refined_statistics_gradient_is_exact_up_to_rounding_at_extreme_ratios(noise_scale):
    # The precision is refined a step at a time as its error estimate asks (module notes, 3.): here
    # lambda_max(M) 9e5, 9e7, 9e9, 9e10 take one, two, two and three steps, and the gradient keeps only
    # the eps * lambda_max(M) of rounding. The reference is the dense formula of
    # test_statistics_log_likelihood_gradient_equals_dense_formula in rational arithmetic: exact for the
    # same statistics. One step fewer leaves 1.2e4 and 13 times the bound at the last two ratios.
    g, X = _graded(noise_scale)
    n = X.shape[0]
    xbar = X.mean(axis=0)
    scatter = (X - xbar).T @ (X - xbar)
    grads = _statistics_gradient(*(jax.numpy.asarray(a) for a in (*g, n, xbar, scatter)))
    w, centred = _exact(g.loadings), _exact(xbar) - _exact(g.mean)
    inverse = _exact_inverse(w @ w.T + np.diag(_exact(g.noise)))
    inner = inverse @ (_exact(scatter) + n * np.outer(centred, centred)) @ inverse - n * inverse
    expected = (inner @ w, np.diag(inner) / 2, n * inverse @ centred)
    bound = np.finfo(float).eps * gaussian.capacitance_norm(g)
    for got, want in zip(grads, expected, strict=True):
        want = want.astype(float)
        assert np.max(np.abs(np.asarray(got) - want)) <= bound * np.max(np.abs(want))


def test_capacitance_norm_is_the_largest_eigenvalue_of_the_capacitance():
    for noise_scale in (1.0, 1e-6):
        g, _ = _graded(noise_scale)
        w, noise = np.asarray(g.loadings), np.asarray(g.noise)
        dense = np.linalg.eigvalsh(np.eye(w.shape[1]) + w.T @ (w / noise[:, None])).max()
        assert gaussian.capacitance_norm(g) == pytest.approx(dense, rel=1e-9)


@pytest.mark.parametrize("noise_scale", [1.0, 1e-3, 1e-6, 1e-9, 1e-12])
@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_unrefined_statistics_log_likelihood_error_is_eps_n_times_the_capacitance(noise_scale, backend):
    # The NUTS runner leaves the refinement out below a capacitance norm, on the strength of this bound:
    # without it the error is about eps * n * lambda_max(M) (module notes, 3.), against the row form
    # (a sum of squares, no precision: notes, 2.). From 1e-6 on the error is of that order (not far
    # below it: the bound is what the refinement removes).
    g, X = _graded(noise_scale)
    n = X.shape[0]
    xbar = X.mean(axis=0)
    scatter = (X - xbar).T @ (X - xbar)
    ref = float(np.sum(gaussian.log_prob(g, X)))
    scale = np.finfo(float).eps * n * gaussian.capacitance_norm(g)
    if backend == "jax":
        g = LowRankGaussian(*(jax.numpy.asarray(a) for a in g))
        fn = jax.jit(gaussian.log_likelihood_from_stats, static_argnums=1, static_argnames="refine")
        got = float(fn(g, n, xbar, scatter, refine=False))
    else:
        got = float(gaussian.log_likelihood_from_stats(g, n, xbar, scatter, refine=False))
    error = abs(got - ref)
    assert error <= 2 * scale + 1e-13 * abs(ref)
    if noise_scale <= 1e-6:
        assert error > 1e-2 * scale


def _stacked_draws(m=300, d=6, k=2, seed=4, graded=()):
    """``m`` draws around one model (a posterior's spread), those in ``graded`` with the first feature's
    noise 1e-9 of its variance (``lambda_max(M)`` ~ 1e9: the difference forms would lose 9 digits)."""
    rng = np.random.default_rng(seed)
    centre = _model(d, k, seed)
    w = centre.loadings + 0.1 * rng.standard_normal((m, d, k))
    noise = centre.noise * rng.uniform(0.8, 1.25, (m, d))
    mean = centre.mean + 0.1 * rng.standard_normal((m, d))
    for s in graded:
        noise[s, 0] = 1e-9 * (w[s, 0] @ w[s, 0] + noise[s, 0])
    return LowRankGaussian(w, noise, mean)


def _one(g, s):
    return LowRankGaussian(*(a[s] for a in g))


# Draws 0, 200 and 299 sit in the first and last blocks of 128, with other draws beside them.
@pytest.mark.parametrize("graded", [(), (0, 200, 299)])
def test_draws_log_prob_equals_scipy_for_every_draw_and_row(graded):
    g = _stacked_draws(graded=graded)
    g = g._replace(mean=g.mean + 100.0)  # far from 0: the rows are centred first
    X = _data(_one(g, 0), n=50)
    got = gaussian.draws_log_prob(g, X)
    ref = np.stack([multivariate_normal(g.mean[s], _dense_cov(_one(g, s))).logpdf(X) for s in range(300)])
    np.testing.assert_allclose(got, ref, rtol=1e-10)


def test_log_prob_of_stacked_draws_equals_scipy_for_each_draw():
    g = _stacked_draws(m=7, graded=(2, 5))
    X = _data(_one(g, 0), n=30)
    ref = np.stack([multivariate_normal(g.mean[s], _dense_cov(_one(g, s))).logpdf(X) for s in range(7)])
    np.testing.assert_allclose(gaussian.log_prob(g, X), ref, rtol=1e-10)


def test_log_prob_refuses_stacked_draws_with_missing_values():
    g = _stacked_draws(m=3)
    X = _data(_one(g, 0), n=5)
    with pytest.raises(ValueError, match=r"observed needs one draw .* got loadings of shape \(3, 6, 2\)"):
        gaussian.log_prob(g, X, np.ones_like(X, dtype=bool))


def test_draws_log_prob_in_blocks_bounded_by_rows_equals_log_prob(monkeypatch):
    # Blocks of draws shrink with the rows so that their products stay small: here blocks of 3 draws,
    # the second all of large signal-to-noise ratio, the third partly; those are scored two at a time.
    monkeypatch.setattr(gaussian, "_BLOCK_VALUES", 300)
    monkeypatch.setattr(gaussian, "_EXACT_VALUES", 200)
    g = _stacked_draws(m=10, graded=(3, 4, 5, 7))
    X = _data(_one(g, 0), n=50)
    each = np.stack([gaussian.log_prob(_one(g, s), X) for s in range(10)])
    np.testing.assert_allclose(gaussian.draws_log_prob(g, X), each, rtol=1e-10)


def test_draws_log_prob_scores_large_signal_to_noise_draws_exactly():
    # At lambda_max(M) ~ 1e9 the difference |y|^2 - |u|^2 keeps ~7 digits; such draws must be scored by
    # log_prob (the sum-of-squares form), whose result the batched one then equals to rounding.
    g = _stacked_draws(graded=(5,))
    X = _data(_one(g, 5), n=50)
    each = np.asarray(gaussian.log_prob(_one(g, 5), X))
    np.testing.assert_allclose(gaussian.draws_log_prob(g, X)[5], each, rtol=1e-12)
    w, noise = g.loadings[5], g.noise[5]
    assert np.linalg.eigvalsh(np.eye(2) + w.T @ (w / noise[:, None])).max() > 1e8


def test_draws_log_prob_refuses_rows_with_nan():
    g = _stacked_draws(m=3)
    X = _data(_one(g, 0), n=10)
    X[[2, 7], 1] = np.nan
    with pytest.raises(ValueError, match=r"non-finite entries in rows \[2, 7\]"):
        gaussian.draws_log_prob(g, X)
    with pytest.raises(ValueError, match=r"shape \(n, d\); got shape \(10,\)"):
        gaussian.draws_log_prob(g, X[:, 0])


def test_log_likelihood_from_stats_of_stacked_draws_equals_scipy_for_each_draw():
    # Draw 1 needs the precision's refinement (lambda_max(M) ~ 1e9): stacked, all five are refined.
    g = _stacked_draws(m=5, graded=(1,))
    X = _data(_one(g, 0), n=50)
    xbar = X.mean(axis=0)
    got = gaussian.log_likelihood_from_stats(g, 50, xbar, (X - xbar).T @ (X - xbar))
    ref = [multivariate_normal(g.mean[s], _dense_cov(_one(g, s))).logpdf(X).sum() for s in range(5)]
    np.testing.assert_allclose(got, ref, rtol=1e-10)


@pytest.mark.parametrize("graded", [(), (3, 130), (3, 4, 5, 130)])
def test_draws_log_likelihood_from_stats_equals_the_sum_over_rows(graded, monkeypatch):
    monkeypatch.setattr(gaussian, "_EXACT_VALUES", 2 * 6 * 6)  # stacked precisions two draws at a time
    g = _stacked_draws(m=140, graded=graded)
    X = _data(_one(g, 0), n=50)
    xbar = X.mean(axis=0)
    got = gaussian.draws_log_likelihood_from_stats(g, 50, xbar, (X - xbar).T @ (X - xbar))
    ref = [multivariate_normal(g.mean[s], _dense_cov(_one(g, s))).logpdf(X).sum() for s in range(140)]
    np.testing.assert_allclose(got, ref, rtol=1e-10)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_jax_cholesky_and_triangular_solves_match_lapack_with_their_gradients(k):
    # Orders up to 3 are unrolled in JAX, 4 is LAPACK's: both must give NumPy's factor, SciPy's
    # triangular solves and, through autodiff, the closed-form gradient d log det(A) / dA = A^{-1}.
    import jax.numpy as jnp
    from scipy.linalg import solve_triangular

    rng = np.random.default_rng(k)
    z = rng.standard_normal((3, 7, k))
    a = np.einsum("bij,bik->bjk", z, z) + 0.1 * np.eye(k)  # a batch of 3 positive definite matrices
    b = rng.standard_normal((k, 5))
    chol = np.asarray(gaussian.cholesky(jnp.asarray(a)))
    np.testing.assert_allclose(chol, np.linalg.cholesky(a), rtol=1e-12, atol=1e-13)
    for transpose in (False, True):
        got = np.asarray(gaussian.tri_solve(jnp.asarray(chol[0]), jnp.asarray(b), transpose=transpose))
        want = solve_triangular(chol[0], b, lower=True, trans=int(transpose))
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)

    def log_det(m):
        return 2.0 * jnp.sum(jnp.log(jnp.diagonal(gaussian.cholesky(m))))

    gradient = np.asarray(jax.grad(log_det)(jnp.asarray(a[0])))
    # Along a symmetric direction E (an unrolled factor reads one triangle, LAPACK's both halves):
    # d log det(A + t E) / dt = tr(A^{-1} E).
    e = rng.standard_normal((k, k))
    e = e + e.T
    assert np.sum(gradient * e) == pytest.approx(np.trace(np.linalg.solve(a[0], e)), rel=1e-10, abs=1e-12)
