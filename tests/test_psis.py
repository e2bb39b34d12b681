"""PSIS and PSIS-LOO of many rows at once, against ArviZ's row-by-row estimate and known tails."""

import warnings

import arviz_stats
import numpy as np
import pytest
from arviz_base import from_dict
from sklearn.datasets import load_iris
from xarray import DataArray

import bayespca.psis as psis
from bayespca import PPCA
from bayespca.psis import (
    loo_terms,
    pareto_smoothed_log_weights,
    psis_loo,
    relative_efficiency,
    tail_length,
)


def _arviz_loo(ll: np.ndarray, r_eff: float):
    tree = from_dict({"posterior": {"mu": np.zeros(ll.shape[:2])}, "log_likelihood": {"X": ll}},
                     dims={"X": ["obs"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return arviz_stats.loo(tree, pointwise=True, var_name="X", reff=r_eff), tree


def _assert_same_loo(new, ref):
    for name in ("elpd", "se", "p"):
        assert getattr(new, name) == pytest.approx(getattr(ref, name), rel=1e-10), name
    assert (new.n_samples, new.n_data_points, new.good_k, new.warning) == (
        ref.n_samples, ref.n_data_points, ref.good_k, ref.warning)
    np.testing.assert_allclose(new.elpd_i, ref.elpd_i, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(new.pareto_k, ref.pareto_k, rtol=1e-10, atol=1e-12)  # NaN where NaN
    # Sorted per row: tied ratios may take the smoothed tail values in another order.
    def by_row(lw):
        return np.sort(lw.transpose(..., "chain", "draw").values.reshape(new.n_data_points, -1))

    np.testing.assert_allclose(by_row(new.log_weights), by_row(ref.log_weights), rtol=1e-10, atol=1e-10)
    assert new.elpd_i.dims == ref.elpd_i.dims


def _mixed_rows(rng, shape=(4, 250), n=120):
    """Rows with light, heavy (k-hat > 1) and degenerate tails (first quartile at the minimum)."""
    scale = rng.uniform(0.1, 3.0, n)
    ll = -2.0 + rng.normal(size=(*shape, n)) * scale
    # Clipped so that no ratio underflows exp(): ArviZ's fit turns NaN there (see below).
    ll[..., : n // 4] += np.clip(0.5 * rng.standard_t(1.2, size=(*shape, n // 4)), -40, 40)
    ll[..., -3:] = np.round(ll[..., -3:], 0)  # ties: the tail's first quartile equals its minimum
    return ll


@pytest.mark.parametrize("r_eff", [1.0, 0.3, 0.05])
@pytest.mark.parametrize("shape", [(4, 250), (1, 2000), (2, 60)])
def test_psis_loo_equals_arviz_row_by_row(shape, r_eff):
    # r_eff 0.05 at 1000 draws: S r_eff < 225, the tail is S / 5 instead of 3 sqrt(S / r_eff).
    ll = _mixed_rows(np.random.default_rng(0), shape)
    ref, tree = _arviz_loo(ll, r_eff)
    assert np.nanmax(ref.pareto_k) > 1 and np.isnan(ref.pareto_k).sum() >= 1  # every branch is met
    _assert_same_loo(psis_loo(tree["log_likelihood"]["X"], r_eff), ref)


@pytest.mark.filterwarnings("ignore::bayespca.posterior.SamplingWarning")  # short chains suffice here
def test_psis_loo_on_iris_nuts_fit_equals_arviz():
    X = load_iris().data
    model = PPCA(2, method="nuts", num_warmup=150, num_samples=150, num_chains=2, random_state=0,
                 progress_bar=False).fit(X)
    ll = model.to_arviz(log_likelihood=True)["log_likelihood"]["X"].transpose("chain", "draw", ...)
    r_eff = relative_efficiency(ll.values)
    ref, _ = _arviz_loo(ll.values, r_eff)
    _assert_same_loo(psis_loo(ll), ref)


def test_blocks_of_rows_give_the_same_weights(monkeypatch):
    ll = _mixed_rows(np.random.default_rng(1)).reshape(1000, -1).T
    whole = loo_terms(ll, 0.8)
    monkeypatch.setattr(psis, "_BLOCK_VALUES", 1)  # one row a block
    for a, b in zip(loo_terms(ll, 0.8), whole, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape_k", [0.2, 0.5, 0.9])
def test_khat_recovers_a_pareto_tail(shape_k):
    # Weights w = U^-k have a generalized Pareto tail of shape k. The estimate
    # of M = 189 tail draws shrinks towards 0.5 by 10 pseudo-observations.
    rng = np.random.default_rng(2)
    _, khat = pareto_smoothed_log_weights(-shape_k * np.log(rng.uniform(size=(200, 4000))))
    expected = (189 * shape_k + 10 * 0.5) / 199
    assert np.median(khat) == pytest.approx(expected, abs=0.03)


def test_loo_of_a_gaussian_mean_matches_the_exact_leave_one_out():
    # x_i ~ N(mu, 1), flat prior: mu | x ~ N(xbar, 1/n) and p(x_i | x_-i) = N(xbar_-i, 1 + 1/(n-1)).
    rng = np.random.default_rng(3)
    n, draws = 40, 4000
    x = rng.normal(size=n)
    mu = x.mean() + rng.normal(size=(draws, 1)) / np.sqrt(n)
    ll = (-0.5 * (x - mu) ** 2 - 0.5 * np.log(2 * np.pi)).T
    var, rest = 1 + 1 / (n - 1), (x.sum() - x) / (n - 1)
    exact = -0.5 * (x - rest) ** 2 / var - 0.5 * np.log(2 * np.pi * var)
    terms = loo_terms(ll)
    np.testing.assert_allclose(terms.elpd_i, exact, atol=5e-3)  # Monte Carlo error ~ 1e-3
    assert np.all(terms.pareto_k < 0.5)


def test_rows_without_information_score_zero():
    # A row observed nowhere has log p = 0 under every draw: exact LOO, nothing to smooth (ArviZ raises).
    ll = _mixed_rows(np.random.default_rng(4)).reshape(1000, -1).T
    ll[7] = 0.0
    terms = loo_terms(ll)
    assert terms.elpd_i[7] == 0.0 and terms.p_loo_i[7] == 0.0 and np.isnan(terms.pareto_k[7])
    np.testing.assert_allclose(terms.log_weights[7], -np.log(1000), rtol=1e-14)


def test_a_tail_beyond_floating_point_is_flagged_and_left_raw():
    # The 94 largest of 1000 log ratios: exp() of their first quartile is subnormal, so the
    # Pareto fit has no estimate (ArviZ's gives k-hat 0.05 and NaN weights). Here k-hat is inf
    # and the weights are the plain normalised ratios.
    rng = np.random.default_rng(6)
    ratios = np.concatenate([rng.uniform(-900, -800, 905), [-745.0], np.linspace(-740, -712, 30),
                             np.linspace(-700, 0, 64)])
    log_weights, khat = pareto_smoothed_log_weights(ratios[None, rng.permutation(1000)])
    assert khat[0] == np.inf
    raw = np.sort(ratios) - np.log(np.sum(np.exp(ratios)))
    np.testing.assert_allclose(np.sort(log_weights[0]), raw, rtol=1e-12)


def test_invalid_ratios_are_refused():
    with pytest.raises(ValueError, match="finite"):
        pareto_smoothed_log_weights(np.array([[0.0, np.nan] * 50]))
    with pytest.raises(ValueError, match="more than 5 draws"):
        pareto_smoothed_log_weights(np.zeros((2, 5)))


def test_tail_length_follows_the_draws_and_their_efficiency():
    assert tail_length(4000, 1.0) == int(3 * np.sqrt(4000))
    assert tail_length(4000, 0.25) == int(3 * np.sqrt(16000))
    assert tail_length(1000, 0.1) == 200  # S r_eff <= 225
    assert tail_length(10, 1.0) == 5


def test_relative_efficiency_of_autocorrelated_draws():
    # AR(1) draws of a mean: the ESS of a posterior mean is S (1 - rho) / (1 + rho).
    rng = np.random.default_rng(0)
    rho, chains, draws = 0.8, 4, 4000
    theta = np.empty((chains, draws))
    theta[:, 0] = rng.normal(size=chains)
    for s in range(1, draws):
        theta[:, s] = rho * theta[:, s - 1] + np.sqrt(1 - rho**2) * rng.normal(size=chains)
    # A likelihood nearly linear in theta inherits its autocorrelation.
    ll = 0.01 * theta[..., None] * np.ones(3)
    assert relative_efficiency(ll) == pytest.approx((1 - rho) / (1 + rho), rel=0.15)


def test_psis_loo_keeps_the_observation_labels():
    rng = np.random.default_rng(5)
    ll = DataArray(rng.normal(-1.0, 0.2, size=(6, 2, 100)), dims=["obs", "chain", "draw"],
                   coords={"obs": list("abcdef")})
    result = psis_loo(ll, 1.0)
    assert list(result.elpd_i["obs"].values) == list("abcdef")
    assert result.log_weights.dims == ("chain", "draw", "obs")
    ref, _ = _arviz_loo(ll.transpose("chain", "draw", "obs").values, 1.0)
    np.testing.assert_allclose(result.elpd_i, ref.elpd_i, rtol=1e-10)
