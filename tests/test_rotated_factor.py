"""The rotated Laplace factor of pPCA (bayespca.inference.rotated_factor) against the dense one."""

import warnings

import arviz_stats
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from bayespca.inference import laplace, nuts, rotated_factor
from bayespca.inference.contract import ModelSpec
from bayespca.inference.rotated_factor import RotatedFactor, apply, apply_transpose
from bayespca.statistics import prepare

LAYOUT = (("Z", (6, 2)), ("log_gaps", (2,)), ("mu", (6,)), ("sigma", ()))


def _random_factor(rng):
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    core = np.tril(rng.normal(size=(7, 7))) + 3 * np.eye(7)  # Z's 2 x 2 leading block, gaps, sigma
    return RotatedFactor(q, core, rng.uniform(0.5, 2.0, 21 - 7))


def test_the_transpose_is_the_adjoint_in_numpy_and_jax():
    """<S x, g> = <x, S^T g> for random rows, and JAX computes what NumPy does."""
    rng = np.random.default_rng(0)
    factor = _random_factor(rng)
    x, g = rng.normal(size=(3, 21)), rng.normal(size=(3, 21))
    sx, stg = apply(LAYOUT, factor, x), apply_transpose(LAYOUT, factor, g)
    np.testing.assert_allclose(np.sum(sx * g, axis=1), np.sum(x * stg, axis=1), rtol=1e-12)
    jax_factor = RotatedFactor(*(jnp.asarray(a) for a in factor))
    np.testing.assert_allclose(np.asarray(apply(LAYOUT, jax_factor, jnp.asarray(x))), sx, rtol=1e-12)
    # S is the product of an orthogonal map and a triangular-by-diagonal block: |det S| from its parts.
    s = apply(LAYOUT, factor, np.eye(21)).T
    expected = np.prod(np.diag(factor.core)) * np.prod(factor.scales)
    assert abs(np.linalg.det(s)) == pytest.approx(expected, rel=1e-10)


def _laplace(model, monkeypatch, k=5):
    """The dense Laplace factor, layout, scatter and the factor the runner chose, on breast cancer."""
    X = load_breast_cancer().data
    X = (X - X.mean(0)) / X.std(0)
    seen = {}
    dense = laplace.laplace_factor

    def record(hessian):
        seen["dense"] = dense(hessian)
        return seen["dense"]

    original = rotated_factor.rotated_factor

    def record_rotated(layout, covariance, scatter):
        seen.update(layout=layout, scatter=scatter, chosen=original(layout, covariance, scatter))
        return seen["chosen"]

    monkeypatch.setattr(laplace, "laplace_factor", record)
    monkeypatch.setattr(rotated_factor, "rotated_factor", record_rotated)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nuts.fit_nuts(prepare(X), ModelSpec(model, k), num_warmup=2, num_samples=2, num_chains=1,
                      random_state=0)
    return seen


def test_ppca_laplace_covariance_is_exactly_the_rotated_structure(monkeypatch):
    """Breast cancer (d=30), standardised, pPCA k=5 (186 parameters): S_rot S_rot^T = S S^T.

    The dense factor of the inverse Hessian at the mode is the reference; the
    rotated one is built from the covariance and the data's scatter only, and
    reproduces it to ~1e-5 (the structure is exact at the mode; the residual
    comes from the finite-difference Hessian), far inside the 0.1 that
    :func:`rotated_factor.rotated_factor` demands.
    """
    seen = _laplace("isotropic", monkeypatch)
    assert isinstance(seen["chosen"], RotatedFactor)
    s_dense = seen["dense"]
    p = s_dense.shape[0]
    s_rot = apply(seen["layout"], seen["chosen"], np.eye(p)).T
    whitened = np.linalg.solve(s_rot, np.linalg.solve(s_rot, s_dense @ s_dense.T).T)
    assert np.max(np.abs(np.linalg.eigvalsh(whitened) - 1.0)) < 1e-3


def test_factor_analysis_lacks_the_structure_and_keeps_the_dense_factor(monkeypatch):
    """FA's per-feature noise couples Z's rows with psi: the whitening check refuses the rotated factor."""
    seen = _laplace("diagonal", monkeypatch)
    assert seen["chosen"] is None


def _posterior_summary(fit):
    draws = fit.draws
    sigma2 = draws.noise[..., 0]
    w = draws.loadings
    eig = np.linalg.eigvalsh(np.swapaxes(w, -1, -2) @ w)[..., ::-1][..., :2]
    series = [sigma2, eig[..., 0], eig[..., 1]]
    means = np.array([s.mean() for s in series])
    errors = np.array([float(arviz_stats.mcse(s[..., None], method="mean")[0]) for s in series])
    return means, errors


def test_sampling_with_the_rotated_factor_draws_the_dense_factors_posterior(monkeypatch):
    """Same data and model, chains whitened by the rotated or by the dense factor (a linear map
    either way, so the same posterior): posterior means of sigma^2 and of the two leading
    eigenvalues of W^T W agree within 4 Monte Carlo standard errors of their difference."""
    rng = np.random.default_rng(5)
    w = rng.normal(size=(32, 5)) * np.linspace(3.0, 1.0, 5)
    X = rng.normal(size=(400, 5)) @ w.T + rng.normal(size=(400, 32))
    options = {"num_warmup": 300, "num_samples": 300, "num_chains": 2, "random_state": 1}
    spec = ModelSpec("isotropic", 5)  # p = 32 * 5 + 5 + 32 + 1 = 198 parameters
    chosen = []
    original = rotated_factor.rotated_factor

    def record(*args):
        chosen.append(original(*args))
        return chosen[-1]

    monkeypatch.setattr(rotated_factor, "rotated_factor", record)
    rotated = nuts.fit_nuts(prepare(X), spec, **options)
    assert isinstance(chosen[0], RotatedFactor)
    monkeypatch.setattr(nuts, "_ROTATED_ABOVE", 10**9)
    dense = nuts.fit_nuts(prepare(X), spec, **options)
    (m1, e1), (m2, e2) = _posterior_summary(rotated), _posterior_summary(dense)
    assert np.all(np.abs(m1 - m2) < 4 * np.sqrt(e1**2 + e2**2)), (m1, m2, e1, e2)
    for fit in (rotated, dense):
        assert not fit.draws.sample_stats["diverging"].any()
