"""Tests of the NumPyro pPCA / FA models against scipy densities and closed forms."""

import functools

import jax
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro import handlers
from numpyro.infer import MCMC, NUTS, Predictive, log_likelihood
from numpyro.infer.util import log_density
from scipy import stats
from test_priors import pairwise_residual_variances  # the reference, defined once
from threadpoolctl import threadpool_limits

import bayespca  # noqa: F401  (sets float64)
from bayespca.gaussian import LowRankGaussian, log_prob
from bayespca.models import draws_marginal_log_likelihood, factor_analysis, marginal_log_likelihood, ppca
from bayespca.priors import Priors, as_priors, data_scales, resolve
from bayespca.statistics import missing_patterns, stack_patterns, sufficient_statistics

N, D, K = 40, 5, 2


@pytest.fixture(autouse=True)
def _one_blas_thread():
    # Every LAPACK call here is small; on a machine with more busy threads
    # than cores, threaded OpenBLAS waits for scheduling on each call (up to
    # 100x slower, measured). Results do not depend on the thread count.
    with threadpool_limits(limits=1, user_api="blas"):
        yield


# W as a sample site in its own coordinates: densities evaluated at given (W, noise, mu).
MODELS = {
    "ppca": functools.partial(ppca, identification="none"),
    "fa": functools.partial(factor_analysis, identification="none"),
}


def default_priors(X, noise):
    return resolve(as_priors(None), noise, data_scales(X))


def _params(kind, rng):
    W = rng.normal(size=(D, K))
    mu = rng.normal(size=D)
    if kind == "ppca":
        sigma = 0.7
        return {"W": W, "sigma": sigma, "mu": mu}, np.full(D, sigma**2)
    psi = rng.uniform(0.2, 1.0, size=D)
    return {"W": W, "psi": psi, "mu": mu}, psi


def _data(params, psi, rng, n=N):
    z = rng.normal(size=(n, K))
    return z @ params["W"].T + params["mu"] + rng.normal(size=(n, D)) * np.sqrt(psi)


def _trace(model, *args):
    return handlers.trace(handlers.seed(model, rng_seed=0)).get_trace(*args)


def _batched(params):
    return {name: np.asarray(value)[None] for name, value in params.items()}


def _blockwise_logpdf(X, mean, cov):
    """Per-row scipy log-density of the observed entries (0 for an empty row)."""
    out = np.zeros(len(X))
    for i, row in enumerate(X):
        o = ~np.isnan(row)
        if o.any():
            out[i] = stats.multivariate_normal(mean[o], cov[np.ix_(o, o)]).logpdf(row[o])
    return out


@pytest.mark.parametrize("kind", ["ppca", "fa"])
def test_marginal_pointwise_log_likelihood_is_scipy_mvn(kind):
    rng = np.random.default_rng(0)
    params, psi = _params(kind, rng)
    X = _data(params, psi, rng)
    model = functools.partial(MODELS[kind], n_components=K)
    ll = np.asarray(log_likelihood(model, _batched(params), X)["X"])
    cov = params["W"] @ params["W"].T + np.diag(psi)
    ref = stats.multivariate_normal(params["mu"], cov).logpdf(X)
    assert ll.shape == (1, N)
    np.testing.assert_allclose(ll[0], ref, rtol=1e-10)


@pytest.mark.parametrize("kind", ["ppca", "fa"])
def test_missing_entries_give_observed_block_density(kind):
    rng = np.random.default_rng(1)
    params, psi = _params(kind, rng)
    X = _data(params, psi, rng)
    X[rng.random(X.shape) < 0.25] = np.nan
    X[3] = np.nan  # a row with nothing observed contributes log 1 = 0
    model = functools.partial(MODELS[kind], n_components=K)
    ll = np.asarray(log_likelihood(model, _batched(params), X)["X"])[0]
    cov = params["W"] @ params["W"].T + np.diag(psi)
    np.testing.assert_allclose(ll, _blockwise_logpdf(X, params["mu"], cov), rtol=1e-10, atol=1e-12)
    assert ll[3] == 0.0


@pytest.mark.parametrize("missing", [False, True])
def test_explicit_model_conditional_is_the_analytic_posterior_of_z(missing):
    # log p(x, z | theta) - log p(x | theta) = log p(z | x, theta), the Gaussian
    # N(M^-1 W^T Psi^-1 (x - mu), M^-1) with M = I + W^T Psi^-1 W (observed entries only).
    rng = np.random.default_rng(2)
    params, psi = _params("fa", rng)
    X = _data(params, psi, rng, n=12)
    if missing:
        X[rng.random(X.shape) < 0.3] = np.nan
    z = rng.normal(size=(12, K))
    explicit = functools.partial(MODELS["fa"], n_components=K, latent="explicit")
    marginal = functools.partial(MODELS["fa"], n_components=K)
    joint, _ = log_density(explicit, (X,), {}, {**params, "z": z})
    evidence, _ = log_density(marginal, (X,), {}, params)
    ref = 0.0
    for row, zi in zip(X, z, strict=True):
        o = ~np.isnan(row)
        Wo, po = params["W"][o], psi[o]
        M = np.eye(K) + Wo.T @ (Wo / po[:, None])
        mean = np.linalg.solve(M, Wo.T @ ((row[o] - params["mu"][o]) / po))
        ref += stats.multivariate_normal(mean, np.linalg.inv(M)).logpdf(zi)
    np.testing.assert_allclose(float(joint - evidence), ref, rtol=1e-10)


def test_sufficient_statistics_log_density_is_sum_of_rows():
    rng = np.random.default_rng(3)
    params, psi = _params("ppca", rng)
    X = _data(params, psi, rng, n=200) + 50.0  # a large mean must not cancel digits
    params["mu"] = params["mu"] + 50.0
    stats_model = functools.partial(MODELS["ppca"], n_components=K, suff_stats=sufficient_statistics(X))
    row_model = functools.partial(MODELS["ppca"], n_components=K)
    ld_stats, _ = log_density(stats_model, (), {}, params)
    ld_rows, _ = log_density(row_model, (X,), {}, params)
    cov = params["W"] @ params["W"].T + np.diag(psi)
    loglik = stats.multivariate_normal(params["mu"], cov).logpdf(X).sum()
    # Same priors (computed from the same data) on both sides.
    np.testing.assert_allclose(float(ld_stats), float(ld_rows), rtol=1e-10)
    np.testing.assert_allclose(
        float(ld_rows) - float(_log_prior_default(X, params, "ppca")), loglik, rtol=1e-10
    )


def _log_prior_default(X, params, kind):
    """Log density of the documented default priors, written with scipy."""
    m, s = np.nanmean(X, axis=0), np.nanstd(X, axis=0)
    overall = np.sqrt(np.mean(s**2))
    lp = stats.norm(m, 10 * s).logpdf(params["mu"]).sum()
    if kind == "ppca":
        lp += stats.norm(0, overall).logpdf(params["W"]).sum()
        lp += stats.halfnorm(scale=overall).logpdf(params["sigma"])
    else:
        lp += stats.norm(0, s[:, None]).logpdf(params["W"]).sum()
        lp += stats.invgamma(2.5, scale=1.5 * pairwise_residual_variances(X)).logpdf(params["psi"]).sum()
    return lp


def test_default_priors_follow_the_data_scale():
    rng = np.random.default_rng(4)
    params, psi = _params("fa", rng)
    X = _data(params, psi, rng) * np.array([1.0, 10.0, 0.1, 3.0, 1.0])
    X[0, 1] = np.nan
    model = functools.partial(MODELS["fa"], n_components=K)
    ld, _ = log_density(model, (X,), {}, params)
    cov = params["W"] @ params["W"].T + np.diag(psi)
    loglik = _blockwise_logpdf(X, params["mu"], cov).sum()
    np.testing.assert_allclose(float(ld) - loglik, _log_prior_default(X, params, "fa"), rtol=1e-10)
    # A constant column falls back to the overall scale rather than a zero-width prior.
    X[:, 0] = 2.0
    p = default_priors(X, noise="isotropic")
    s = np.nanstd(X, axis=0)
    overall = np.sqrt(np.mean(s**2))
    np.testing.assert_allclose(np.asarray(p.mean.base_dist.scale)[0], 10 * overall, rtol=1e-12)
    # A column with no observed value: prior centred at 0 with the overall scale.
    X[:, 3] = np.nan
    p = default_priors(X, noise="diagonal")
    s = np.nanstd(X[:, [0, 1, 2, 4]], axis=0)
    overall = np.sqrt(np.mean(s**2))
    assert float(p.mean.base_dist.loc[3]) == 0.0
    # Constant and unobserved columns are uncorrelated with the rest: prior mean u_j = s^2.
    np.testing.assert_allclose(np.asarray(p.noise.mean)[[0, 3]], overall**2, rtol=1e-12)


@pytest.mark.parametrize("latent", ["marginal", "explicit"])
@pytest.mark.parametrize("kind", ["ppca", "fa"])
def test_prior_predictive_moments(kind, latent):
    # Defaults without data: W_jl ~ N(0,1), mu_j ~ N(0,10^2), sigma ~ HalfNormal(1) or
    # psi_j ~ InvGamma(2.5, 1.5), so Var(x_j) = k + E[noise variance] + 100 (E sigma^2 = 1,
    # E psi = 1.5 / (2.5 - 1) = 1), and distinct features are uncorrelated a priori.
    model = functools.partial(
        MODELS[kind], n_components=K, n_samples=1, n_features=D, latent=latent
    )
    draws = Predictive(model, num_samples=20000)(jax.random.key(0))
    x = np.asarray(draws["X"])[:, 0, :]
    expected = K + 1.0 + 100.0
    np.testing.assert_allclose(x.var(axis=0), expected, rtol=0.05)
    np.testing.assert_allclose(np.corrcoef(x.T)[np.triu_indices(D, 1)], 0.0, atol=0.04)
    noise_draws = np.asarray(draws["sigma" if kind == "ppca" else "psi"])
    # E sigma = sqrt(2 / pi); E psi = 1 (sd(psi) = sqrt(2): the mean of 20000 x 5 draws has sd 0.45%).
    expected_noise = np.sqrt(2 / np.pi) if kind == "ppca" else 1.0
    np.testing.assert_allclose(noise_draws.mean(), expected_noise, rtol=0.03)


def test_user_priors_replace_defaults():
    rng = np.random.default_rng(5)
    params, psi = _params("ppca", rng)
    X = _data(params, psi, rng)
    priors = {"noise": dist.Exponential(2.0), "mean": dist.Normal(0.0, 3.0)}
    model = functools.partial(MODELS["ppca"], n_components=K, prior=priors)
    flat = functools.partial(MODELS["ppca"], n_components=K, prior="flat")
    ld, _ = log_density(model, (X,), {}, params)
    ld_flat, _ = log_density(flat, (X,), {}, params)
    overall = np.sqrt(np.mean(X.var(axis=0)))
    ref = (
        stats.expon(scale=0.5).logpdf(params["sigma"])
        + stats.norm(0, 3.0).logpdf(params["mu"]).sum()
        + stats.norm(0, overall).logpdf(params["W"]).sum()
    )
    np.testing.assert_allclose(float(ld - ld_flat), ref, rtol=1e-10)
    cov = params["W"] @ params["W"].T + np.diag(psi)
    np.testing.assert_allclose(
        float(ld_flat), stats.multivariate_normal(params["mu"], cov).logpdf(X).sum(), rtol=1e-10
    )


def test_nuts_recovers_noise_and_log_likelihood_per_row():
    import arviz as az

    rng = np.random.default_rng(6)
    n, d = 300, 4
    W = rng.normal(size=(d, 1))
    X = rng.normal(size=(n, 1)) @ W.T + 0.5 * rng.normal(size=(n, d))
    model = functools.partial(ppca, n_components=1)  # shapes bound: jit_model_args works
    mcmc = MCMC(
        NUTS(model), num_warmup=60, num_samples=60, jit_model_args=True, progress_bar=False
    )
    mcmc.run(jax.random.key(1), X)
    sigma = np.asarray(mcmc.get_samples()["sigma"])
    # Posterior sd of sigma ~ sigma / sqrt(2 n (d - k)) = 0.012.
    ml_sigma = np.sqrt(np.linalg.eigvalsh(np.cov(X.T, bias=True))[:-1].mean())
    assert abs(sigma.mean() - ml_sigma) < 0.02
    tree = az.from_numpyro(mcmc, log_likelihood=True)
    ll = tree["log_likelihood"]["X"]
    assert ll.dims == ("chain", "draw", "obs") and ll.shape == (1, 60, n)
    draw = {name: np.asarray(v[-1]) for name, v in mcmc.get_samples().items()}
    cov = draw["W"] @ draw["W"].T + draw["sigma"] ** 2 * np.eye(d)
    ref = stats.multivariate_normal(draw["mu"], cov).logpdf(X)
    np.testing.assert_allclose(np.asarray(ll)[0, -1], ref, rtol=1e-10)


def test_subsampled_plate_scales_the_likelihood():
    rng = np.random.default_rng(7)
    params, psi = _params("ppca", rng)
    X = _data(params, psi, rng)
    model = functools.partial(MODELS["ppca"], n_components=K, prior="flat", subsample_size=10)
    with handlers.seed(rng_seed=0):
        trace = handlers.trace(handlers.substitute(model, params)).get_trace(X)
    idx = np.asarray(trace["obs"]["value"])
    site = trace["X"]
    scaled = site["scale"] * np.asarray(site["fn"].log_prob(site["value"]))
    cov = params["W"] @ params["W"].T + np.diag(psi)
    ref = N / 10 * stats.multivariate_normal(params["mu"], cov).logpdf(X[idx])
    assert np.unique(idx).size == 10
    np.testing.assert_allclose(scaled, ref, rtol=1e-10)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_components": 0}, ValueError, "n_components must be a positive int; got 0"),
        ({"n_components": 2.0}, ValueError, "n_components must be a positive int; got 2.0"),
        ({"n_components": True}, ValueError, "n_components must be a positive int"),
        ({"n_components": 6}, ValueError, "at most n_features=5; got 6"),
        ({"n_components": 2, "latent": "z"}, ValueError, "latent must be one of"),
        ({"n_components": 2, "n_samples": 3}, ValueError, "n_samples=3 does not match"),
        ({"n_components": 2, "prior": "weak"}, ValueError, "prior must be None, 'flat'.*got 'weak'"),
        ({"n_components": 2, "prior": {"W": dist.Normal()}}, ValueError, "unknown keys"),
        ({"n_components": 2, "prior": 3}, TypeError, "prior must be None"),
        ({"n_components": 2, "prior": Priors(noise=1.0)}, TypeError, "prior.noise must"),
        (
            {"n_components": 2, "prior": Priors(mean=dist.Normal(np.zeros(3), 1.0))},
            ValueError,
            r"priors.mean has batch shape \(3,\)",
        ),
        (
            {"n_components": 2, "prior": Priors(mean=dist.MultivariateNormal(np.zeros(3), np.eye(3)))},
            ValueError,
            r"event shape \(3,\), which is not a suffix",
        ),
        ({"n_components": 2, "prior": "horseshoe", "identification": "polar"}, ValueError,
         "identification must be None or one of \\['lower_triangular', 'none'\\] with the Horseshoe prior"),
        ({"n_components": 2, "prior": "horseshoe", "anchors": (1, 1)}, ValueError,
         "anchors must be None or 2 distinct integer features in \\[0, 5\\); got \\(1, 1\\)"),
        ({"n_components": 2, "prior": "horseshoe", "anchors": (0, 5)}, ValueError,
         "in \\[0, 5\\); got \\(0, 5\\)"),
        ({"n_components": 2, "prior": "horseshoe", "anchors": (0,)}, ValueError, "or 2 distinct"),
        ({"n_components": 2, "anchors": (0, 1)}, ValueError,
         "anchors needs identification='lower_triangular' and a prior that samples W's entries"),
        ({"n_components": 2, "gauge": np.ones((D, 2))}, ValueError,
         "gauge needs identification='none' or 'procrustes' and a rotation-invariant loadings prior"),
        ({"n_components": 2, "identification": "none", "prior": "ard", "gauge": np.ones((D, 2))}, ValueError,
         "got identification='none', prior ARD"),
        ({"n_components": 2, "identification": "none", "gauge": np.ones((D, 3))}, ValueError,
         r"gauge must be reference loadings of shape \(5, 2\); got shape \(5, 3\)"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    X = np.random.default_rng(8).normal(size=(N, D))
    with pytest.raises(error, match=match):
        _trace(functools.partial(ppca, **kwargs), X)


def test_bad_shapes_and_modes_are_named():
    X = np.random.default_rng(9).normal(size=(N, D))
    with pytest.raises(ValueError, match="both n_samples and n_features are needed"):
        Predictive(functools.partial(ppca, n_components=1), num_samples=1)(jax.random.key(0))
    with pytest.raises(ValueError, match="X must be 2-D"):
        _trace(functools.partial(ppca, n_components=1), X[0])
    with pytest.raises(ValueError, match="either X or suff_stats"):
        _trace(functools.partial(ppca, n_components=1, suff_stats=sufficient_statistics(X)), X)
    with pytest.raises(ValueError, match="suff_stats needs latent='marginal'"):
        _trace(
            functools.partial(
                ppca, n_components=1, suff_stats=sufficient_statistics(X), latent="explicit"
            )
        )
    with pytest.raises(ValueError, match="NaN"):
        sufficient_statistics(np.where(X > 2, np.nan, X))
    # Shape arguments traced by jit_model_args get a message naming the fix.
    mcmc = MCMC(NUTS(ppca), num_warmup=1, num_samples=1, jit_model_args=True, progress_bar=False)
    with pytest.raises(TypeError, match=r"functools.partial\(model, n_components=n_components\)"):
        mcmc.run(jax.random.key(0), X, n_components=1)


@pytest.mark.parametrize("multiple", [1, 8])
def test_pattern_likelihood_is_the_sum_over_rows_of_their_observed_blocks(multiple):
    """The likelihood from missing patterns (grouped or stacked, padded with empty patterns) equals
    the sum over rows of each row's observed-block Gaussian density, a row with one observed
    entry and a pattern with all entries observed included."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(90, 5)) @ rng.normal(size=(5, 5)) + 3.0
    X[rng.random(X.shape) < 0.25] = np.nan
    X[0, 1:] = np.nan
    observed = ~np.isnan(X)
    g = LowRankGaussian(rng.normal(size=(5, 2)), rng.uniform(0.2, 1.5, 5), rng.normal(size=5))
    reference = 0.0
    for x, o in zip(X, observed, strict=True):  # each row's observed block, by SciPy
        cov = g.loadings[o] @ g.loadings[o].T + np.diag(g.noise[o])
        reference += stats.multivariate_normal(g.mean[o], cov).logpdf(x[o]) if o.any() else 0.0
    patterns = missing_patterns(X)
    assert len(patterns.columns) > 8
    np.testing.assert_allclose(float(marginal_log_likelihood(g, patterns)), reference, rtol=1e-11)
    stacked = stack_patterns(patterns, multiple)
    assert stacked.n.size % multiple == 0
    np.testing.assert_allclose(float(marginal_log_likelihood(g, stacked)), reference, rtol=1e-11)
    np.testing.assert_allclose(float(np.sum(log_prob(g, np.nan_to_num(X), observed))), reference, rtol=1e-11)


def test_the_likelihood_and_its_gradient_run_eagerly_as_one_compiled_program(backend_compiles):
    """NumPyro and SVI evaluate the model and its gradient outside jit when they initialise.

    Shapes no other test uses (d=9, k=2): run operation by operation, the
    likelihood and its gradient compiled about 140 small programs here.
    NumPy parameters and statistics are scored in NumPy, compiling nothing.
    """
    rng = np.random.default_rng(8)
    X = rng.normal(size=(40, 9)) @ rng.normal(size=(9, 9))
    g = LowRankGaussian(rng.normal(size=(9, 2)), rng.uniform(0.5, 1.5, 9), rng.normal(size=9))
    s = sufficient_statistics(X)
    C = g.loadings @ g.loadings.T + np.diag(g.noise)
    reference = stats.multivariate_normal(g.mean, C).logpdf(X).sum()
    with backend_compiles() as compiles:
        numpy_value = marginal_log_likelihood(g, s)
    assert compiles == []
    assert numpy_value == pytest.approx(reference, rel=1e-12)
    w = jax.numpy.asarray(g.loadings)
    with backend_compiles() as compiles:
        value, gradient = jax.value_and_grad(lambda w: marginal_log_likelihood(g._replace(loadings=w), s))(w)
    assert len(compiles) <= 3, len(compiles)
    assert float(value) == pytest.approx(reference, rel=1e-12)
    # d/dW sum_i log N(x_i | mu, C) = (C^{-1} S_mu C^{-1} - n C^{-1}) W, S_mu = sum_i (x_i - mu)(x_i - mu)^T
    centred = X - g.mean
    c_inv_s, c_inv_w = np.linalg.solve(C, centred.T @ centred), np.linalg.solve(C, g.loadings)
    expected = c_inv_s @ c_inv_w - len(X) * c_inv_w
    np.testing.assert_allclose(np.asarray(gradient), expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_draws_marginal_log_likelihood_is_each_draws_sum_over_rows(backend):
    """Per draw, the statistics' total is SciPy's sum over rows: on NumPy input by blocks of draws
    (nothing compiled), on JAX input by the compiled map over draws."""
    rng = np.random.default_rng(6)
    X = rng.normal(size=(60, 4)) @ rng.normal(size=(4, 4)) + 2.0
    draws = (rng.normal(size=(7, 4, 2)), rng.uniform(0.3, 1.2, (7, 4)), 2.0 + rng.normal(size=(7, 4)))
    reference = [stats.multivariate_normal(m, w @ w.T + np.diag(p)).logpdf(X).sum()
                 for w, p, m in zip(*draws, strict=True)]
    if backend == "jax":
        draws = tuple(jax.numpy.asarray(a) for a in draws)
    got = draws_marginal_log_likelihood(draws, sufficient_statistics(X))
    assert isinstance(got, np.ndarray) == (backend == "numpy")
    np.testing.assert_allclose(np.asarray(got), reference, rtol=1e-10)


def test_pivot_anchors_are_the_rows_left_largest_in_turn_whatever_the_rotation():
    """Written out: each anchor is the row of ``Psi^{-1/2} W`` with the largest part orthogonal to the
    anchors before it; a rotation of ``W`` changes none of them."""
    from bayespca.models import pivot_anchors

    rng = np.random.default_rng(3)
    w = rng.normal(size=(9, 3)) * [3.0, 2.0, 1.0]
    psi = rng.uniform(0.5, 2.0, 9)
    scaled = w / np.sqrt(psi)[:, None]
    chosen, basis = [], np.zeros((3, 0))
    for _ in range(3):
        residual = scaled - scaled @ basis @ basis.T
        j = int(np.argmax(np.linalg.norm(residual, axis=1)))
        chosen.append(j)
        basis = np.column_stack([basis, residual[j] / np.linalg.norm(residual[j])])
    rotation = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    assert pivot_anchors(w, psi) == tuple(chosen) == pivot_anchors(w @ rotation, psi)


def test_horseshoe_triangle_start_gives_the_ml_loadings_with_zeros_at_the_anchors():
    """The horseshoe's start on anchors (2, 0), through the model's own transforms: W W^T of the ML
    loadings, ``W_{2,1} = W_{2,2} = W_{0,2} = 0``, and the triangle's other entries all free."""
    from numpyro.infer.util import constrain_fn, unconstrain_fn

    from bayespca.models import initial_values, lower_entries
    from bayespca.priors import Horseshoe

    rng = np.random.default_rng(4)
    X = rng.normal(size=(200, 3)) @ rng.normal(size=(3, 6)) + 0.3 * rng.normal(size=(200, 6))
    w = np.linalg.svd(X - X.mean(0), full_matrices=False)[2][:3].T * 2.0
    g = LowRankGaussian(w, np.full(6, 0.1), X.mean(0))
    anchors = (2, 0, 5)
    kwargs = {"n_components": 3, "prior": "horseshoe", "suff_stats": sufficient_statistics(X),
              "anchors": anchors}
    loadings = resolve(as_priors("horseshoe"), "isotropic", data_scales(X)).loadings
    assert isinstance(loadings, Horseshoe)
    values = initial_values("lower_triangular", loadings, g, "isotropic", 200, anchors=anchors)
    theta = unconstrain_fn(ppca, (), kwargs, values)
    back = np.asarray(constrain_fn(ppca, (), kwargs, theta, return_deterministic=True)["W"])
    np.testing.assert_allclose(back @ back.T, w @ w.T, atol=1e-10)
    assert back[2, 1] == back[2, 2] == back[0, 2] == 0.0
    assert values["W_z"].size == lower_entries(6, 3, anchors).sum() == 18 - 3


def _rotation(angle: float) -> np.ndarray:
    return np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])


def test_gauge_gives_every_orbit_of_w_the_same_mass():
    """The gauge ``exp(kappa tr Q((W R)^T B))`` averaged over ``R`` uniform on O(2) is
    ``(I_0(2 kappa) + 1) / 2`` whatever ``W``: the rotations by ``t`` give ``exp(2 kappa cos t)``, of
    mean ``I_0(2 kappa)``, the reflections (trace 0) 1. So the posterior of ``W W^T`` is unchanged.
    Quadrature on 256 equally spaced angles (exact to rounding for this smooth periodic integrand), for
    loadings of unequal, nearly equal and very unequal singular values, about one reference."""
    from scipy.special import i0

    from bayespca.models import GAUGE_CONCENTRATION, gauge_log_density

    rng = np.random.default_rng(3)
    b = rng.normal(size=(D, 2))
    expected = (i0(2 * GAUGE_CONCENTRATION) + 1) / 2
    angles = 2 * np.pi * np.arange(256) / 256
    for singular in ([3.0, 0.5], [1.0, 0.999], [2.0, 1e-3]):
        u = np.linalg.qr(rng.normal(size=(D, 2)))[0]
        w = u * singular @ _rotation(rng.uniform(0, 2 * np.pi))
        masses = [np.exp(float(gauge_log_density(w @ r, b)))
                  for t in angles for r in (_rotation(t), _rotation(t) @ np.diag([1.0, -1.0]))]
        assert np.mean(masses) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("kind", ["ppca", "fa"])
def test_gauge_adds_kappa_times_the_trace_of_scipys_polar_factor_to_the_log_joint(kind):
    """The model's log joint with ``gauge=B`` minus without it is ``kappa tr Q``, ``Q`` the orthogonal
    polar factor of ``W^T B`` by SciPy (from its SVD), at random points, k = 3."""
    from scipy.linalg import polar

    from bayespca.models import GAUGE_CONCENTRATION

    rng = np.random.default_rng(4)
    X = rng.normal(size=(N, D))
    b = rng.normal(size=(D, 3))
    for _ in range(3):
        params, _ = _params(kind, rng)
        params["W"] = rng.normal(size=(D, 3))
        joint = [log_density(functools.partial(MODELS[kind], n_components=3, **gauge), (X,), {}, params)[0]
                 for gauge in ({}, {"gauge": b}, {"gauge": b, "identification": "procrustes"})]
        reference = GAUGE_CONCENTRATION * np.trace(polar(params["W"].T @ b)[0])
        assert float(joint[1] - joint[0]) == pytest.approx(reference, rel=1e-12, abs=1e-10)
        assert float(joint[2]) == pytest.approx(float(joint[1]), rel=1e-14)


def test_polar_traces_gradient_is_scipys_polar_factor_differenced():
    """The gradient of ``tr Q(M)`` (its derivative written out) against central differences of SciPy's
    polar factor (from the SVD), for k = 3 and singular values 1, 1e-3 and 1e-3 + 1e-9 (two nearly
    equal: the SVD's own derivative divides by their difference). Step 1e-7 of an entry of size 1:
    the differences' error is O(step^2 / s_min^2) and rounding O(1e-16 / step)."""
    from scipy.linalg import polar

    from bayespca.models import polar_trace

    rng = np.random.default_rng(5)
    u, v = (np.linalg.qr(rng.normal(size=(3, 3)))[0] for _ in range(2))
    m = u * np.array([1.0, 1e-3, 1e-3 + 1e-9]) @ v.T
    gradient = np.asarray(jax.grad(polar_trace)(m))
    step, differences = 1e-7, np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            e = np.zeros((3, 3))
            e[i, j] = step
            differences[i, j] = (np.trace(polar(m + e)[0]) - np.trace(polar(m - e)[0])) / (2 * step)
    np.testing.assert_allclose(gradient, differences, rtol=1e-5, atol=1e-5 * np.abs(gradient).max())
