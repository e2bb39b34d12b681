"""The parameter checks and the one random_state rule (bayespca.params)."""

import re

import jax
import numpy as np
import pytest

from bayespca.params import as_generator, as_key, check_bool, check_choice, check_number, check_seed


@pytest.mark.parametrize("bad", ["seed", 1.5, True, [1], object()])
def test_seed_rule_refuses_everything_but_the_four_kinds(bad):
    with pytest.raises(TypeError, match="random_state must be None, an int >= 0"):
        check_seed(bad)


def test_negative_seed_is_a_value_error():
    with pytest.raises(ValueError, match="got -1"):
        as_generator(-1)


def test_int_seeds_reproduce_numpy_and_jax():
    assert as_generator(5).standard_normal() == np.random.default_rng(5).standard_normal()
    a = jax.random.normal(as_key(11))
    assert float(a) == float(jax.random.normal(jax.random.key(11)))


def test_huge_int_seed_gives_a_key_and_is_reproducible():
    seed = 2**70
    assert float(jax.random.normal(as_key(seed))) == float(jax.random.normal(as_key(seed)))
    assert as_generator(seed).integers(10**9) == as_generator(seed).integers(10**9)


def test_generator_and_randomstate_advance():
    rng = np.random.default_rng(0)
    assert as_generator(rng) is rng
    rs = np.random.RandomState(0)
    first, second = as_generator(rs).integers(10**9), as_generator(rs).integers(10**9)
    assert first != second  # the RandomState's state advanced between the two draws
    expected = np.random.default_rng(np.random.RandomState(0).randint(np.iinfo(np.int64).max, dtype=np.int64))
    assert first == expected.integers(10**9)


@pytest.mark.parametrize(
    ("value", "kwargs", "error"),
    [
        (True, {"integer": True}, TypeError),
        (2.0, {"integer": True}, TypeError),
        (np.inf, {}, ValueError),
        (np.nan, {"low": 0}, ValueError),
        (0, {"integer": True, "low": 1}, ValueError),
        (1.0, {"high": 1, "high_open": True}, ValueError),
        (None, {}, TypeError),
    ],
)
def test_check_number_refusals(value, kwargs, error):
    with pytest.raises(error, match="x must be"):
        check_number(value, "x", **kwargs)


def test_check_number_accepts_numpy_scalars_and_none():
    assert check_number(np.int64(4), "k", integer=True, low=1) == 4
    assert isinstance(check_number(np.float32(0.5), "t", low=0, high=1), float)
    assert check_number(None, "t", allow_none=True) is None


def test_check_choice_and_bool():
    assert check_choice(None, "m", ("a",), allow_none=True) is None
    with pytest.raises(ValueError, match=r"m must be one of \['a'\]; got \['a'\]"):
        check_choice(["a"], "m", {"a"})
    with pytest.raises(TypeError, match="flag must be True or False; got 1"):
        check_bool(1, "flag")


@pytest.mark.parametrize(
    ("estimator", "option", "value", "error", "message"),
    [
        ("PPCA", "num_chains", 0, ValueError, "num_chains must be an int >= 1; got 0"),
        ("PPCA", "chain_method", "bogus", ValueError, "chain_method must be one of"),
        ("PPCA", "guide", "bogus", ValueError, "guide must be one of ['delta', 'normal', 'lowrank']"),
        ("PPCA", "batch_size", "x", TypeError, "batch_size must be"),
        ("FactorAnalysis", "num_samples", 0, ValueError, "num_samples must be an int >= 1"),
        ("FactorAnalysis", "target_accept_prob", 1.5, ValueError, "target_accept_prob must be a finite"),
        ("RobustPPCA", "learning_rate", -1, ValueError, "learning_rate must be"),
        ("RobustPPCA", "target_accept_prob", 0, ValueError, "target_accept_prob must be"),
        ("MixturePPCA", "chain_method", "bogus", ValueError, "chain_method must be one of"),
        ("MixturePPCA", "num_warmup", 2.5, TypeError, "num_warmup must be an int"),
    ],
)
def test_every_method_s_options_are_checked_whatever_the_method(estimator, option, value, error, message):
    # scikit-learn checks every parameter at fit: a typo in a sampler's option is an error with the
    # default (maximum-likelihood) method too, before any work.
    import bayespca

    X = np.random.default_rng(0).normal(size=(40, 4))
    cls = getattr(bayespca, estimator)
    args = (2, 1) if estimator == "MixturePPCA" else (1,)
    with pytest.raises(error, match=re.escape(message)):
        cls(*args, **{option: value}).fit(X)


@pytest.mark.parametrize(
    ("estimator", "args", "error", "message"),
    [
        ("PCA", ("bogus",), ValueError, "n_components must be None, an int in [0, min(n_samples"),
        ("RobustPPCA", (0,), ValueError, "RobustPPCA: n_components must be an int >= 1 and <= 3 or None"),
        ("MixturePPCA", (2, 0), ValueError, "MixturePPCA: n_components must be an int >= 1 and <= 3; got 0."),
    ],
)
def test_n_components_errors_say_all_that_is_accepted(estimator, args, error, message):
    import bayespca

    with pytest.raises(error, match=re.escape(message)):
        getattr(bayespca, estimator)(*args).fit(np.random.default_rng(0).normal(size=(40, 4)))
