"""Tests of the data-dependent default priors in bayespca.priors against NumPy and SciPy references."""

import numpy as np
import pytest
from scipy import stats
from sklearn.datasets import load_diabetes, load_iris, load_wine

import bayespca  # noqa: F401  (sets float64)
from bayespca.priors import as_priors, data_scales, resolve
from bayespca.statistics import missing_patterns, stack_patterns, sufficient_statistics


def _regression_residual_variances(X):
    """Mean squared residual of the least-squares fit of each column on the others (with intercept)."""
    out = []
    for j in range(X.shape[1]):
        others = np.column_stack([np.ones(len(X)), np.delete(X, j, axis=1)])
        residual = X[:, j] - others @ np.linalg.lstsq(others, X[:, j], rcond=None)[0]
        out.append(np.mean(residual**2))
    return np.array(out)


def pairwise_residual_variances(X):
    """s_j^2 / (R^-1)_jj, R entry by entry over the rows where both columns are observed (documented)."""
    m, s = np.nanmean(X, axis=0), np.nanstd(X, axis=0)
    d = X.shape[1]
    corr = np.eye(d)
    for i in range(d):
        for j in range(d):
            if i != j:
                both = ~np.isnan(X[:, i]) & ~np.isnan(X[:, j])
                corr[i, j] = np.mean((X[both, i] - m[i]) * (X[both, j] - m[j])) / (s[i] * s[j])
    return s**2 / np.diag(np.linalg.inv(corr))


@pytest.mark.parametrize("load", [load_wine, load_iris])
@pytest.mark.parametrize("source", ["X", "statistics"])
def test_fa_noise_prior_is_centred_on_the_regression_residual_variance(load, source):
    # Wine and iris: smallest correlation eigenvalue 0.10 and 0.021, above the 0.01 floor,
    # so u_j = 1 / (S^-1)_jj exactly, the residual variance of x_j regressed on the others.
    X = load().data
    scales = data_scales(X) if source == "X" else data_scales(suff_stats=sufficient_statistics(X))
    prior = resolve(as_priors(None), "diagonal", scales).noise
    u = _regression_residual_variances(X)
    np.testing.assert_allclose(np.asarray(scales.residual), u, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(prior.mean), u, rtol=1e-10)
    psi = np.linspace(0.5, 2.0, X.shape[1]) * u
    np.testing.assert_allclose(
        float(prior.log_prob(psi)), stats.invgamma(2.5, scale=1.5 * u).logpdf(psi).sum(), rtol=1e-12
    )


def test_residual_variance_floors_the_correlation_eigenvalues():
    # Diabetes: s1, s2 and s4 are nearly collinear (smallest correlation eigenvalue 0.0086), so
    # the floor at 0.01 lifts u_j above the least-squares residual variance of those columns
    # and never below it; the reference floors numpy's eigendecomposition of np.corrcoef.
    X = load_diabetes().data
    vals, vecs = np.linalg.eigh(np.corrcoef(X.T))
    assert vals.min() < 0.01
    reference = X.var(0) / np.sum(vecs**2 / np.maximum(vals, 0.01), axis=1)
    u = np.asarray(data_scales(X).residual)
    np.testing.assert_allclose(u, reference, rtol=1e-10)
    assert np.all(u >= _regression_residual_variances(X) * (1 - 1e-12))
    assert np.all(u >= 0.01 * X.var(0))


@pytest.mark.parametrize("max_patterns", [64, 1, "stacked"])
def test_residual_variance_with_missing_values_is_pairwise(max_patterns):
    # Pooled over missing patterns (grouped, stacked and padded, or over rows when there are too
    # many patterns), from the raw rows with NaN, and in the loop over pairs: the same pairwise
    # correlation matrix; the column moments are NumPy's nanmean and nanvar.
    X = load_wine().data[:, :6].copy()
    X[np.random.default_rng(0).random(X.shape) < 0.1] = np.nan
    reference = pairwise_residual_variances(X)
    np.testing.assert_allclose(np.asarray(data_scales(X).residual), reference, rtol=1e-10)
    if max_patterns == "stacked":
        patterns = stack_patterns(missing_patterns(X), multiple=8)
    else:
        patterns = missing_patterns(X, max_patterns)
    got = data_scales(suff_stats=patterns, n_features=X.shape[1])
    np.testing.assert_allclose(np.asarray(got.residual), reference, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(got.mean), np.nanmean(X, axis=0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(got.sd), np.nanstd(X, axis=0), rtol=1e-10)
    assert float(got.n) == X.shape[0]


def test_fa_noise_prior_is_equivariant():
    # psi scales as x^2: the prior of the rescaled data is the pushforward of the original.
    X = load_wine().data
    scale = np.exp(np.linspace(-3.0, 3.0, X.shape[1]))
    u = np.asarray(data_scales(X).residual)
    np.testing.assert_allclose(np.asarray(data_scales(X * scale).residual), u * scale**2, rtol=1e-10)


def test_fa_noise_prior_without_residual_variances_names_the_fix():
    with pytest.raises(ValueError, match="residual=True"):
        resolve(as_priors(None), "diagonal", data_scales(np.eye(3), residual=False))


def test_per_feature_units_push_each_prior_by_its_feature():
    """``to_units`` with one scale per feature: each prior of ``X / u`` at ``theta / u^power`` has the
    density of the data-unit prior at ``theta`` times the Jacobian ``u^power`` (feature by feature)."""
    import numpyro.distributions as dist

    from bayespca.priors import Normal, Priors, to_units

    u = np.array([0.5, 1.0, 4.0, 0.25])
    pushed = to_units(Priors(Normal(2.0), dist.HalfCauchy(1.0), dist.Normal(1.0, 10.0)), "diagonal", u)
    psi, mu = np.array([0.1, 0.2, 3.0, 0.4]), np.array([-1.0, 0.5, 2.0, 7.0])
    np.testing.assert_allclose(pushed.noise.log_prob(psi / u**2), stats.halfcauchy.logpdf(psi) + np.log(u**2),
                               rtol=1e-12)
    np.testing.assert_allclose(pushed.mean.log_prob(mu / u), stats.norm.logpdf(mu, 1.0, 10.0) + np.log(u),
                               rtol=1e-12)
    np.testing.assert_allclose(np.ravel(pushed.loadings.scale), 2.0 / u)  # row j of W / u_j


_LEAVES = """
import json
import jax
import numpyro.distributions as dist
from bayespca.priors import Custom, Priors, pushforward
priors = Priors(
    loadings=Custom(dist.Normal(1.0, 2.0)),
    noise=pushforward(dist.InverseGamma(3.0, 4.0), 5.0),
    mean=dist.StudentT(6.0, 7.0, 8.0),
)
leaves = jax.tree.leaves(priors)
back = jax.tree.unflatten(jax.tree.structure(priors), leaves)
print(json.dumps({"leaves": [float(v) for v in leaves],
                  "back": [float(back.loadings.prior.loc), float(back.noise.base_dist.rate),
                           float(back.mean.df)]}))
"""


def test_priors_flatten_in_the_same_order_in_every_process():
    # NumPyro orders a distribution's parameters by a set of their names (per-process hash
    # order); compiled programs take the leaves in that order, so the persistent cache found
    # the sampler in only some processes. Reference: the parameters sorted by name.
    import json
    import os
    import subprocess
    import sys

    outputs = []
    for seed in range(4):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        done = subprocess.run([sys.executable, "-c", _LEAVES], env=env, capture_output=True, text=True,
                              check=True)
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    # Without the stable order, seeds 0 and 1 put Normal's loc and scale in opposite orders.
    assert all(out["leaves"] == outputs[0]["leaves"] for out in outputs)
    assert outputs[0]["leaves"][:2] == [1.0, 2.0]  # Normal(loc=1, scale=2): loc < scale by name
    assert all(out["back"] == [1.0, 4.0, 6.0] for out in outputs)
