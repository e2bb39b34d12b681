"""Checks of constructor and function parameters, and the one ``random_state`` rule.

Every estimator and fitter validates its scalar options here, so a bad value
gets the same kind of message everywhere: the parameter's name, the value
given and what is accepted, raised before any expensive work.

``random_state`` follows one rule across the package: None (fresh entropy),
a non-negative int (any size), a :class:`numpy.random.Generator` or a
:class:`numpy.random.RandomState`; anything else is a ``TypeError``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

__all__ = [
    "CHAIN_METHODS",
    "GUIDES",
    "as_generator",
    "as_key",
    "check_bool",
    "check_choice",
    "check_number",
    "check_sampler_options",
    "check_seed",
    "check_svi_options",
]

_SEED_ACCEPTED = "None, an int >= 0, a numpy.random.Generator or a numpy.random.RandomState"
# jax.random.key takes a seed in [0, 2^63): smaller ints are used as they are.
_KEY_SEEDS = 2**63


def check_number(
    value: Any,
    name: str,
    *,
    integer: bool = False,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
) -> int | float | None:
    """Validate a real (or integer) scalar parameter within bounds.

    Parameters
    ----------
    value : Any
        The value given.
    name : str
        The parameter's name, for the message.
    integer : bool, default=False
        Require an integer (``bool`` is never accepted).
    low, high : float or None
        Bounds; None for none. Non-integers must be finite.
    low_open, high_open : bool, default=False
        Whether the bound itself is excluded.
    allow_none : bool, default=False
        Accept (and return) None.

    Returns
    -------
    int, float or None
        ``value`` as a Python int or float.

    Raises
    ------
    TypeError
        ``value`` is not a number of the right kind.
    ValueError
        ``value`` is out of range (or not finite).

    Examples
    --------
    >>> check_number(3, "max_iter", integer=True, low=1)
    3
    >>> check_number(0.0, "tol", low=0, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: tol must be a finite number > 0; got 0.0.
    """
    if value is None and allow_none:
        return None
    kind = "an int" if integer else "a finite number"
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    accepted = f"{kind}{' ' + ' and '.join(bounds) if bounds else ''}{' or None' if allow_none else ''}"
    wanted = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool | np.bool_) or not isinstance(value, wanted):
        raise TypeError(f"{name} must be {accepted}; got {value!r}.")
    number = int(value) if integer else float(value)
    out_of_range = (
        (not integer and not math.isfinite(number))
        or (low is not None and (number <= low if low_open else number < low))
        or (high is not None and (number >= high if high_open else number > high))
    )
    if out_of_range:
        raise ValueError(f"{name} must be {accepted}; got {value!r}.")
    return number


def check_choice(value: Any, name: str, choices: Collection, *, allow_none: bool = False) -> Any:
    """Validate that ``value`` is one of ``choices`` (strings compared exactly).

    Examples
    --------
    >>> check_choice("em", "method", ("em", "svi"))
    'em'
    >>> check_choice("EM", "method", ("em", "svi"))
    Traceback (most recent call last):
    ...
    ValueError: method must be one of ['em', 'svi']; got 'EM'.
    """
    if value is None and allow_none:
        return None
    try:
        ok = value in choices
    except TypeError:  # an unhashable value against a set
        ok = False
    if not ok or isinstance(value, bool | np.bool_):
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be one of {list(choices)}{extra}; got {value!r}.")
    return value


def check_anchors(anchors: Any, n_features: int, n_components: int,
                  feature_names: Any = None) -> tuple[int, ...] | None:
    """The anchor features of the horseshoe's triangle: None, or ``n_components`` distinct ints in
    ``[0, n_features)``, as a tuple; names of ``feature_names`` (the data's columns) stand for
    their indices.

    Examples
    --------
    >>> check_anchors([3, 0], 5, 2), check_anchors(range(2), 5, 2)
    ((3, 0), (0, 1))
    >>> check_anchors(["c", 0], 3, 2, feature_names=["a", "b", "c"])
    (2, 0)
    >>> check_anchors((1, 1), 5, 2)
    Traceback (most recent call last):
    ...
    ValueError: anchors must be None or 2 distinct integer features in [0, 5); got (1, 1).
    """
    if anchors is None:
        return None
    one_d = isinstance(anchors, Sequence) or (hasattr(anchors, "__array__") and np.ndim(anchors) == 1)
    given = list(anchors) if one_d and not isinstance(anchors, str | bytes) else None
    names = [] if feature_names is None else [str(name) for name in feature_names]
    if given is not None:
        given = [names.index(a) if isinstance(a, str) and a in names else a for a in given]
    ok = given is not None and len(given) == n_components and all(
        isinstance(a, int | np.integer) and not isinstance(a, bool | np.bool_) and 0 <= a < n_features
        for a in given
    )
    if not ok or len(set(int(a) for a in given)) != n_components:
        named = " (or their names)" if names else ""
        raise ValueError(
            f"anchors must be None or {n_components} distinct integer features in [0, {n_features}){named}; "
            f"got {anchors!r}."
        )
    return tuple(int(a) for a in given)


def check_bool(value: Any, name: str) -> bool:
    """Validate a boolean flag (Python or NumPy bool).

    Examples
    --------
    >>> check_bool(np.True_, "whiten")
    True
    """
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False; got {value!r}.")
    return bool(value)


CHAIN_METHODS = ("parallel", "sequential", "vectorized")
GUIDES = ("delta", "normal", "lowrank")  # SVI's variational families


def check_sampler_options(
    num_warmup: Any, num_samples: Any, num_chains: Any, chain_method: Any, target_accept_prob: Any,
    dense_mass: Any = False,
) -> None:
    """Validate NUTS's run options, by the fitters and, whatever the method, by the estimators.

    Examples
    --------
    >>> check_sampler_options(500, 500, 4, "parallel", 0.9)
    >>> check_sampler_options(500, 500, 0, "parallel", 0.9)
    Traceback (most recent call last):
    ...
    ValueError: num_chains must be an int >= 1; got 0.
    """
    for value, name in ((num_warmup, "num_warmup"), (num_samples, "num_samples"), (num_chains, "num_chains")):
        check_number(value, name, integer=True, low=1)
    check_choice(chain_method, "chain_method", CHAIN_METHODS)
    check_number(target_accept_prob, "target_accept_prob", low=0, high=1, low_open=True, high_open=True)
    check_bool(dense_mass, "dense_mass")


def check_svi_options(guide: Any, batch_size: Any, n_samples: int) -> int | None:
    """Validate SVI's guide and minibatch size (at most ``n_samples`` rows); the size, or None.

    Examples
    --------
    >>> check_svi_options("normal", 100, 150)
    100
    >>> check_svi_options("mean_field", None, 150)
    Traceback (most recent call last):
    ...
    ValueError: guide must be one of ['delta', 'normal', 'lowrank']; got 'mean_field'.
    """
    check_choice(guide, "guide", GUIDES)
    return check_number(batch_size, "batch_size", integer=True, low=1, high=n_samples, allow_none=True)


def check_seed(random_state: Any, name: str = "random_state") -> Any:
    """Validate a ``random_state`` without consuming it (see the module rule).

    Examples
    --------
    >>> check_seed("seed")
    Traceback (most recent call last):
    ...
    TypeError: random_state must be None, an int >= 0, ... got 'seed'.
    """
    if random_state is None or isinstance(random_state, np.random.Generator | np.random.RandomState):
        return random_state
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool | np.bool_):
        if random_state < 0:
            raise ValueError(f"{name} must be {_SEED_ACCEPTED}; got {random_state!r}.")
        return int(random_state)
    raise TypeError(f"{name} must be {_SEED_ACCEPTED}; got {random_state!r}.")


def as_generator(random_state: Any, name: str = "random_state") -> np.random.Generator:
    """A NumPy Generator from a ``random_state`` (see the module rule).

    An int seeds a new Generator (the same draws every time); a Generator
    is returned as it is (its state advances); a RandomState seeds a new
    Generator from one of its draws (its state advances); None draws fresh
    entropy.

    Examples
    --------
    >>> as_generator(7).integers(100) == as_generator(7).integers(100)
    np.True_
    """
    random_state = check_seed(random_state, name)
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(np.iinfo(np.int64).max, dtype=np.int64))
    return np.random.default_rng(random_state)


def as_key(random_state: Any, name: str = "random_state"):
    """A JAX PRNG key from a ``random_state`` (see the module rule).

    An int below 2^63 is the key's seed itself (``jax.random.key(seed)``);
    a larger int, a Generator, a RandomState or None give a seed drawn
    from :func:`as_generator`.

    Examples
    --------
    >>> import jax
    >>> bool((jax.random.key_data(as_key(3)) == jax.random.key_data(jax.random.key(3))).all())
    True
    """
    import jax  # here: importing JAX costs ~1 s, and most callers of this module never need it

    random_state = check_seed(random_state, name)
    if isinstance(random_state, int) and random_state < _KEY_SEEDS:
        return jax.random.key(random_state)
    return jax.random.key(int(as_generator(random_state).integers(_KEY_SEEDS)))
