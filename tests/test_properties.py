"""Property-based tests: any input gives a correct result or a documented error.

The contract (issues 14 and 18), checked over random inputs for every
estimator in :data:`REGISTRY`:

* a fit either raises a ``ValueError`` or ``TypeError`` (never a
  ``LinAlgError``, ``ArpackError``, ``RuntimeError``, ``OverflowError`` or a
  broadcasting error from inside) whose message names the argument at
  fault, or it returns fitted attributes and method results that are all
  finite (methods may refuse with a documented ``ValueError`` of their own,
  e.g. the density of a singular covariance);
* where a reference is cheap, the result is the reference's: PCA's singular
  values are NumPy's SVD of the centred data;
* fits of scaled data are the scaled fits (scale equivariance), for every
  estimator that is equivariant, at c in {1e-150, 1e-8, 1e8, 1e150};
* the reproducers of issues 14 and 18 give what the docs promise.

Inputs: shapes with n or d = 1 and n < d, constant and duplicate rows and
columns, rank deficiency, scales 1e-150..1e150 and mixed per column,
NaN/inf, and the containers users pass (lists, pandas, JAX, float32,
complex), with valid and invalid hyper-parameters. Hypothesis runs
derandomized with a bounded number of examples, so the module is
deterministic and takes about a minute.

To add an estimator, add a
:class:`Spec` to :data:`REGISTRY`: a strategy that draws its
hyper-parameters, how to build and fit it, the methods to call after the
fit, and optionally a reference check and a scale-equivariance check.

Run ``python tests/test_properties.py [examples per estimator]`` for a longer
campaign that prints how many inputs ended in each class per estimator.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import bayespca  # noqa: F401  (float64 JAX)
from bayespca import PCA, PPCA, FactorAnalysis, KernelPCA, SparsePCA, select_n_components
from bayespca.kernels import Kernel
from bayespca.linalg import SOLVERS as PCA_SOLVERS
from bayespca.probabilistic import ledermann_bound
from bayespca.selection import METHODS

SCALES = (1e-150, 1e-8, 1e8, 1e150)
SETTINGS = settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


# ----------------------------------------------------------------------------- inputs
@dataclass
class Data:
    """A drawn input: the container passed to the estimator and its float64 values (None if none)."""

    X: object
    values: np.ndarray | None
    kind: str
    container: str


def _structure(draw, n, d, kind):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    X = rng.standard_normal((n, d))
    if kind == "constant":
        X = np.full((n, d), rng.standard_normal())
    elif kind == "constant rows":
        X = np.repeat(X[:1], n, axis=0)
    elif kind == "duplicate rows":
        X[n // 2 :] = X[: n - n // 2]
    elif kind == "duplicate columns":
        X[:, d // 2 :] = X[:, : d - d // 2]
    elif kind == "constant column":
        X[:, draw(st.integers(0, d - 1))] = rng.standard_normal()
    elif kind == "rank one":
        X = rng.standard_normal((n, 1)) @ rng.standard_normal((1, d)) + rng.standard_normal(d)
    elif kind == "offset":
        X += draw(st.sampled_from([1e6, -1e9, 1e12]))
    return X


@st.composite
def data(draw, allow_bad=True):
    """Random matrices with the structures and containers of the module docstring."""
    n = draw(st.integers(1, 12))
    d = draw(st.integers(1, 7))
    kind = draw(st.sampled_from(["gaussian", "constant", "constant rows", "duplicate rows",
                                 "duplicate columns", "constant column", "rank one", "offset"]))
    X = _structure(draw, n, d, kind)
    scale = draw(st.sampled_from(["one", "one", "tiny", "huge", "mixed", "1e-300", "1e300"]))
    if scale == "mixed":  # one power of ten per column
        factor = 10.0 ** np.array(draw(st.lists(st.integers(-150, 150), min_size=d, max_size=d)))
    else:
        choices = {"one": [1.0], "tiny": SCALES[:2], "huge": SCALES[2:], "1e-300": [1e-300], "1e300": [1e300]}
        factor = draw(st.sampled_from(choices[scale]))
    with np.errstate(over="ignore"):  # 1e300 x an offset of 1e12 is inf: a documented refusal
        X = X * factor
    if allow_bad and draw(st.integers(0, 14)) == 0:  # plant NaN or inf
        X[draw(st.integers(0, n - 1)), draw(st.integers(0, d - 1))] = draw(
            st.sampled_from([np.nan, np.inf, -np.inf]))
    container = draw(st.sampled_from(["ndarray"] * 4 + ["list", "pandas", "jax", "float32", "complex"]
                                     if allow_bad else ["ndarray", "list", "pandas", "jax"]))
    wrap = {
        "ndarray": lambda a: a,
        "list": lambda a: a.tolist(),
        "pandas": lambda a: pd.DataFrame(a, columns=[f"c{j}" for j in range(a.shape[1])]),
        "jax": jnp.asarray,
        "float32": lambda a: a.astype(np.float32),
        "complex": lambda a: a + 1j,
    }[container]
    with np.errstate(over="ignore"):  # float32 of 1e150 is inf: a documented refusal
        values = {"float32": X.astype(np.float32).astype(np.float64), "complex": None}.get(container, X)
        return Data(wrap(X), values, f"{kind}, {scale}", container)


# ----------------------------------------------------------------------------- estimators
@st.composite
def _params(draw, valid: dict, invalid: dict):
    """Valid hyper-parameters; one in five draws has one of them replaced by an invalid value."""
    params = {name: draw(strategy) for name, strategy in valid.items()}
    if draw(st.integers(0, 4)) == 0:
        name = draw(st.sampled_from(sorted(invalid)))
        params[name] = draw(st.sampled_from(invalid[name]))
    return params


def _pca_params():
    return _params(
        {
            "n_components": st.one_of(st.none(), st.integers(0, 7), st.sampled_from([0.5, 0.95, *METHODS])),
            "solver": st.sampled_from(PCA_SOLVERS),
            "whiten": st.booleans(),
            "standardize": st.booleans(),
            "random_state": st.sampled_from([None, 0, 2**70, np.random.default_rng(1),
                                             np.random.RandomState(2)]),
        },
        {"n_components": [-1, 1.5, True, "nope", [2]], "solver": ["arpack", None], "whiten": ["yes"],
         "standardize": [1], "random_state": ["seed", -1, 1.5]},
    )


def _kernel_pca_params():
    return _params(
        {
            "n_components": st.one_of(st.none(), st.integers(1, 6)),
            "kernel": st.sampled_from(["rbf", "linear", "poly", "laplacian", "sigmoid", "cosine"]),
            "gamma": st.sampled_from([None, 0.0, 0.1, 1000.0]),
            "solver": st.sampled_from(["auto", "dense", "arpack", "randomized"]),
            "approximation": st.sampled_from([None, None, "nystroem", "rff"]),
            "n_approx": st.sampled_from([None, 5, 50]),
            "fit_inverse_transform": st.booleans(),
            "remove_zero_eig": st.booleans(),
            "random_state": st.sampled_from([None, 0, 2**70, np.random.default_rng(1)]),
        },
        {"n_components": [0, 2.5], "kernel": ["gauss", 3], "gamma": [-1.0, np.nan], "solver": ["lobpcg"],
         "approximation": ["svd"], "n_approx": [0], "random_state": ["seed"], "remove_zero_eig": [1]},
    )


def _sparse_pca_params():
    return _params(
        {
            "n_components": st.one_of(st.none(), st.integers(1, 6)),
            "alpha": st.sampled_from([0.0, 1e-3, 0.1, 10.0]),
            "l1_ratio": st.sampled_from([0.0, 0.5, 1.0]),
            "solver": st.sampled_from(["auto", "covariance", "data"]),
            "standardize": st.booleans(),
            "init": st.sampled_from(["pca", "random"]),
            "max_iter": st.just(50),
            "random_state": st.sampled_from([None, 0]),
        },
        {"n_components": [0, 2.5], "alpha": [-1.0, np.inf, "big"], "l1_ratio": [1.5], "solver": ["lars"],
         "init": ["svd"], "max_iter": [0], "random_state": ["seed"]},
    )


def _probabilistic_params(methods):
    return _params(
        {
            "n_components": st.one_of(st.none(), st.integers(1, 7)),
            "method": st.sampled_from(methods),
            "noise_floor": st.sampled_from([1e-12, 1e-9, 1e-6]),
            "tol": st.sampled_from([None, 1e-6]),
            "max_iter": st.sampled_from([None, 3, 200]),
        },
        {"n_components": [0, 2.5, "two"], "method": ["nuts!", None], "noise_floor": [0.0, -1.0, np.nan, 1.0],
         "tol": [-1.0, "small"], "max_iter": [0, 1.5]},
    )


def _ppca_reference(est, values):
    """Tipping and Bishop's closed form: sigma^2 is the mean of the discarded eigenvalues of the
    covariance (NumPy's eigvalsh), or the floor where that is higher (complete data only)."""
    n, d = values.shape
    k = est.n_components_
    if est.method_ != "closed_form" or k >= d or n < 2:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        centred = values - values.mean(0)
        centred -= centred.mean(0)  # the first mean's rounding would read as spread of constant data
        cov = centred.T @ centred / n
    if not np.all(np.isfinite(cov)):  # beyond a double's range: no reference
        return
    lam = np.linalg.eigvalsh(cov)[::-1]
    # The floor is a fraction of the mean variance (the trace / d); it binds when k reaches the rank.
    sigma2 = max(lam[k:].mean(), est.noise_floor * lam.sum() / d)
    rounding = 64 * n * d * np.finfo(float).eps * lam[0]
    if sigma2 > 1e3 * rounding:
        assert est.noise_variance_ == pytest.approx(sigma2, rel=1e-6, abs=rounding)


def _selection_params():
    return _params({"method": st.sampled_from(METHODS), "standardize": st.booleans()},
                   {"method": ["bogus", None], "standardize": ["yes"]})


def _ignore_convergence(make):
    def fit(params, X):
        return make(params).fit(X)
    return fit


class _SelectionResult:
    """A Selection with the attribute names the contract checks."""

    def __init__(self, params, X):
        options = dict(params)
        sel = select_n_components(X, options.pop("method"), **options)
        self.n_components_ = sel.n_components
        self.singular_values_ = sel.singular_values


def _pca_reference(est, values):
    """PCA's singular values are NumPy's SVD of the centred data, to the rounding of the data."""
    if est.standardize:
        return
    s = np.linalg.svd(values - values.mean(0), compute_uv=False)[: est.n_components_]
    n, d = values.shape
    rounding = 64 * n * np.sqrt(d) * np.finfo(float).eps * np.abs(values).max()
    atol = max(1e-6 * s.max(initial=0), rounding)
    np.testing.assert_allclose(est.singular_values_, s, rtol=1e-6, atol=atol)


@dataclass(frozen=True)
class Spec:
    """How to draw, fit and check one estimator (see the module docstring)."""

    params: Callable[[], st.SearchStrategy]
    fit: Callable[[dict, object], object]
    methods: tuple[str, ...]
    reference: Callable[[object, np.ndarray], None] | None = None


_PROBABILISTIC_METHODS = ("transform", "inverse_transform", "score_samples", "impute", "get_covariance",
                          "get_precision")
REGISTRY: dict[str, Spec] = {
    "PCA": Spec(_pca_params, _ignore_convergence(lambda p: PCA(**p)),
                ("transform", "inverse_transform", "score_samples", "get_covariance", "get_precision"),
                _pca_reference),
    "KernelPCA": Spec(_kernel_pca_params, _ignore_convergence(lambda p: KernelPCA(**p)),
                      ("transform", "inverse_transform")),
    "SparsePCA": Spec(_sparse_pca_params, _ignore_convergence(lambda p: SparsePCA(**p)),
                      ("transform", "inverse_transform")),
    "select_n_components": Spec(_selection_params, _SelectionResult, ()),
    "PPCA": Spec(lambda: _probabilistic_params(["auto", "closed_form", "em"]),
                 _ignore_convergence(lambda p: PPCA(**p)), _PROBABILISTIC_METHODS, _ppca_reference),
    "FactorAnalysis": Spec(lambda: _probabilistic_params(["auto", "em"]),
                           _ignore_convergence(lambda p: FactorAnalysis(**p)), _PROBABILISTIC_METHODS),
}

# Errors an estimator documents; LinAlgError subclasses ValueError but comes from inside LAPACK.
DOCUMENTED = (ValueError, TypeError)
INTERNAL = (np.linalg.LinAlgError,)
# Refusals of a method on a model that has no such value (documented in the method).
METHOD_REFUSALS = ("singular", "no pre-image map", "overflowed float64")


def _named(message: str, params: dict) -> bool:
    """Whether an error message names what is at fault: X, a parameter, or a kernel."""
    names = ["X", "kernel", "n_samples", "n_features", "random_state", *params]
    return any(name in message for name in names)


def _finite_attributes(est) -> None:
    for name, value in vars(est).items():
        if name.endswith("_") and not name.startswith("_") and isinstance(value, np.ndarray | float):
            arr = np.asarray(value)
            if arr.dtype.kind == "f":
                assert np.all(np.isfinite(arr)), f"{name} is not finite: {arr}"


def _call(est, method: str, X):
    if method == "inverse_transform":
        return est.inverse_transform(est.transform(X))
    if method.startswith("get_"):
        return getattr(est, method)()
    return getattr(est, method)(X)


def outcome(name: str, params: dict, data: Data) -> str:
    """Run one input through the contract; return "correct" or "named error", or raise AssertionError."""
    try:
        return _outcome(name, params, data)
    except AssertionError:
        raise
    except Exception as exc:  # anything undocumented: a crash or an unhandled RuntimeWarning
        raise AssertionError(f"{type(exc).__name__}: {exc}") from exc


def _outcome(name: str, params: dict, data: Data) -> str:
    spec = REGISTRY[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zero components, convergence: documented warnings
        warnings.simplefilter("error", RuntimeWarning)  # an overflow nobody handled
        try:
            est = spec.fit(params, data.X)
        except INTERNAL as exc:
            raise AssertionError(f"internal error from the fit: {type(exc).__name__}: {exc}") from exc
        except DOCUMENTED as exc:
            assert _named(str(exc), params), f"error does not name the argument: {exc}"
            return "named error"
        _finite_attributes(est)
        if spec.reference is not None and data.values is not None:
            spec.reference(est, data.values)
        for method in spec.methods:
            try:
                result = _call(est, method, data.X)
            except INTERNAL as exc:
                raise AssertionError(f"internal error from {method}: {exc}") from exc
            except DOCUMENTED as exc:
                assert any(reason in str(exc) for reason in METHOD_REFUSALS), f"{method}: {exc}"
                continue
            assert np.all(np.isfinite(np.asarray(result))), f"{method} returned non-finite values"
    return "correct"


def _contract_test(name):
    @SETTINGS
    @given(params=REGISTRY[name].params(), data=data())
    def test(params, data):
        outcome(name, params, data)

    test.__name__ = f"test_{name}_gives_a_correct_result_or_a_named_error"
    return test


test_pca_contract = _contract_test("PCA")
test_kernel_pca_contract = _contract_test("KernelPCA")
test_sparse_pca_contract = _contract_test("SparsePCA")
test_select_n_components_contract = _contract_test("select_n_components")
test_ppca_contract = _contract_test("PPCA")
test_factor_analysis_contract = _contract_test("FactorAnalysis")


# ----------------------------------------------------------------------------- scale equivariance
@st.composite
def generic_data(draw):
    """Gaussian data in general position (no ties), n >= 2."""
    n = draw(st.integers(3, 12))
    d = draw(st.integers(1, 6))
    X = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).standard_normal((n, d))
    return X * np.linspace(1.0, 3.0, d)


def _separated(ev, gap=1e-3):
    """Components whose variance is separated from its neighbours' (only those are unique)."""
    top = max(ev[0], np.finfo(float).tiny) if ev.size else 1.0
    keep = ev > gap * top
    gaps = np.abs(np.diff(ev)) > gap * top
    keep[:-1] &= gaps
    keep[1:] &= gaps
    return keep


@SETTINGS
@given(X=generic_data(), c=st.sampled_from(SCALES), solver=st.sampled_from(PCA_SOLVERS),
       standardize=st.booleans())
def test_pca_of_scaled_data_is_the_scaled_pca(X, c, solver, standardize):
    k = min(X.shape) if solver != "randomized" else max(min(X.shape) - 1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ref = PCA(k, solver=solver, standardize=standardize, random_state=0).fit(X)
        ours = PCA(k, solver=solver, standardize=standardize, random_state=0).fit(X * c)
    unit = 1.0 if standardize else c  # standardized data have no units
    ev = ref.explained_variance_
    np.testing.assert_allclose(ours.explained_variance_ / unit**2, ev, rtol=1e-8,
                               atol=1e-8 * ev.max(initial=0))
    keep = _separated(ev)
    np.testing.assert_allclose(ours.components_[keep], ref.components_[keep], rtol=1e-8, atol=1e-8)
    Z, Zref = ours.transform(X * c)[:, keep] / unit, ref.transform(X)[:, keep]
    np.testing.assert_allclose(Z, Zref, rtol=1e-8, atol=1e-8 * np.abs(Zref).max(initial=0))
    cov = ref.get_covariance()
    np.testing.assert_allclose(ours.get_covariance() / c**2, cov, rtol=1e-8, atol=1e-8 * np.abs(cov).max())


@SETTINGS
@given(X=generic_data(), c=st.sampled_from(SCALES),
       kernel=st.sampled_from(["linear", "cosine", "rbf", "laplacian"]),
       solver=st.sampled_from(["dense", "arpack"]))
def test_kernel_pca_of_scaled_data(X, c, kernel, solver):
    # linear: eigenvalues c^2, projections c. cosine: unchanged. rbf / laplacian: unchanged with
    # gamma / c^2 / gamma / c.
    gamma = {"rbf": 0.5 / c**2, "laplacian": 0.5 / c}.get(kernel)
    k = max(X.shape[0] - 2, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ref = KernelPCA(k, kernel=kernel, gamma=None if gamma is None else 0.5, solver=solver).fit(X)
        ours = KernelPCA(k, kernel=kernel, gamma=gamma, solver=solver).fit(X * c)
    power = 2 if kernel == "linear" else 0
    ev = ref.eigenvalues_
    np.testing.assert_allclose(ours.eigenvalues_ / c**power, ev, rtol=1e-8, atol=1e-8 * ev.max(initial=0))
    keep = _separated(ev)
    Z, Zref = ours.transform(X * c)[:, keep] / c ** (power / 2), ref.transform(X)[:, keep]
    np.testing.assert_allclose(Z, Zref, rtol=1e-7, atol=1e-7 * np.abs(Zref).max(initial=1e-300))


@SETTINGS
@given(X=generic_data(), c=st.sampled_from(SCALES), alpha=st.sampled_from([0.0, 0.05, 0.5]),
       l1_ratio=st.sampled_from([0.0, 0.5, 1.0]), solver=st.sampled_from(["covariance", "data"]))
def test_sparse_pca_of_scaled_data_with_alpha_scaled_alike(X, c, alpha, l1_ratio, solver):
    k = min(X.shape[1], 2, X.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ref = SparsePCA(k, alpha=alpha, l1_ratio=l1_ratio, solver=solver, tol=1e-12).fit(X)
        ours = SparsePCA(k, alpha=alpha * c**2, l1_ratio=l1_ratio, solver=solver, tol=1e-12).fit(X * c)
    np.testing.assert_allclose(ours.objective_ / c**2, ref.objective_, rtol=1e-6,
                               atol=1e-9 * np.var(X) * X.size)
    np.testing.assert_allclose(ours.explained_variance_ / c**2, ref.explained_variance_, rtol=1e-6,
                               atol=1e-8 * ref.explained_variance_.max(initial=0))


@SETTINGS
@given(X=generic_data(), c=st.sampled_from(SCALES), method=st.sampled_from(METHODS))
def test_selection_of_scaled_data_is_the_same(X, c, method):
    try:
        ref = select_n_components(X, method)
    except ValueError as exc:  # e.g. "mle" with n < d: the same refusal at every scale
        with pytest.raises(ValueError, match=str(exc)[:30].replace("(", r"\(")):
            select_n_components(X * c, method)
        return
    assert select_n_components(X * c, method).n_components == ref.n_components


@SETTINGS
@given(X=generic_data(), c=st.sampled_from(SCALES), model=st.sampled_from([PPCA, FactorAnalysis]))
def test_probabilistic_fit_of_scaled_data_is_the_scaled_fit(X, c, model):
    # pPCA and FA are equivariant: W scales as x, the noise variances as x^2, the log-likelihood
    # shifts by -(number of entries) log c, and the scores are unchanged.
    k = max(1, min(X.shape[1] - 1, X.shape[0] - 2))
    if model is FactorAnalysis:  # only an identified factor model has one answer to compare
        assume(ledermann_bound(X.shape[1]) >= 1)
        k = min(k, ledermann_bound(X.shape[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ref = model(k).fit(X)
        ours = model(k).fit(X * c)
    cov = ref.get_covariance()
    np.testing.assert_allclose(ours.get_covariance() / c**2, cov, rtol=1e-7, atol=1e-7 * np.abs(cov).max())
    assert ours.log_likelihood_ + X.size * np.log(c) == pytest.approx(ref.log_likelihood_, rel=1e-7,
                                                                      abs=1e-7 * X.size)
    if len(getattr(ref, "heywood_features_", ())) == 0:  # scores divide by psi: ill-posed at the floor
        Z, Zref = ours.transform(X * c), ref.transform(X)
        atol = 1e-6 * np.abs(Zref).max(initial=1.0)
        np.testing.assert_allclose(np.abs(Z), np.abs(Zref), rtol=1e-6, atol=atol)


# ----------------------------------------------------------------------------- reproducers
def _arpack_counts():
    X = np.full((27, 1), 1.26736591)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return {KernelPCA(16, kernel="sigmoid", coef0=0, solver="arpack", remove_zero_eig=True,
                          random_state=98).fit(X).n_components_ for _ in range(8)}


def _offset_kernel(name, offset):
    Z = np.round(np.random.default_rng(0).standard_normal((20, 3)) * 1024) / 1024
    return np.abs(Kernel(name, gamma=0.5)(Z + offset) - Kernel(name, gamma=0.5)(Z)).max()


RNG = np.random.default_rng(0)
X40 = RNG.standard_normal((40, 5))
REPRODUCERS = {
    # issue 14
    "KernelPCA arpack on constant rows": (
        lambda: KernelPCA(2, solver="arpack").fit(np.ones((30, 3))).eigenvalues_.tolist(), [0.0, 0.0]),
    "KernelPCA default solver, n=400, duplicate rows": (
        lambda: KernelPCA(2, kernel="cosine").fit(np.repeat(X40[:1], 400, 0)).eigenvalues_.tolist(),
        [0.0, 0.0]),
    "Nystroem rbf at 1e300": (
        lambda: KernelPCA(2, approximation="nystroem", n_approx=20).fit(X40 * 1e300).eigenvalues_.tolist(),
        [1.0, 1.0]),
    "PCA gram at 1e154": (lambda: PCA(2, solver="gram").fit(X40 * 1e154), "X has a spread of about"),
    "PCA randomized at 1e154": (
        lambda: PCA(2, solver="randomized").fit(X40 * 1e154), "X has a spread of about"),
    "PCA('aic') at 1e300": (lambda: PCA("aic").fit(X40 * 1e300), "X has a spread of about"),
    "PCA randomized random_state='seed'": (
        lambda: PCA(2, solver="randomized", random_state="seed").fit(X40), "random_state must be None"),
    "KernelPCA linear at 1e300": (
        lambda: KernelPCA(2, kernel="linear").fit(X40 * 1e300), "The linear kernel needs the inner products"),
    "SparsePCA negligible lasso (390 rounds)": (
        lambda: bool(np.isfinite(SparsePCA(7, alpha=0.1, l1_ratio=1.0, solver="covariance").fit(
            np.random.default_rng(0).standard_normal((7, 8)) * 1e8).components_).all()), True),
    "SparsePCA tiny ridge on n < d (singular matrix)": (
        lambda: bool(np.isfinite(SparsePCA(3, alpha=1e-30, l1_ratio=0.0, solver="data").fit(
            np.random.default_rng(1).standard_normal((6, 10))).components_).all()), True),
    # issue 18
    "rbf kernel at an offset of 1e9": (lambda: _offset_kernel("rbf", 1e9) <= 1e-10, True),
    "laplacian kernel at an offset of 1e12": (lambda: _offset_kernel("laplacian", 1e12) <= 1e-10, True),
    "KernelPCA gamma=1000": (
        lambda: KernelPCA(2, kernel="rbf", gamma=1000).fit(X40[:20, :3]).eigenvalues_.tolist(),
        [1.0, 1.0]),
    "ARPACK on constant rows, 8 calls": (_arpack_counts, {0}),
    "PCA on subnormal data (X * 1e-160)": (lambda: PCA().fit(X40 * 1e-160), "X has a spread of about"),
    "complex DataFrame": (lambda: PCA(1).fit(pd.DataFrame(X40 + 1j)), "Complex data not supported"),
}


@pytest.mark.parametrize("case", list(REPRODUCERS))
def test_reproducers_of_issues_14_and_18(case):
    run, expected = REPRODUCERS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if isinstance(expected, str):
            with pytest.raises((ValueError, TypeError), match=expected):
                run()
        else:
            result = run()
            if isinstance(expected, list):
                np.testing.assert_allclose(result, expected, rtol=1e-12, atol=1e-12)
            else:
                assert result == expected


# ----------------------------------------------------------------------------- campaign
def _campaign_one(name: str, examples: int) -> tuple[Counter, list[tuple[str, str]]]:
    tally, failures = Counter(), []

    @settings(SETTINGS, max_examples=examples, derandomize=False, database=None)
    @given(params=REGISTRY[name].params(), data=data())
    def run(params, data):
        try:
            tally[outcome(name, params, data)] += 1
        except AssertionError as exc:
            tally["anything else"] += 1
            failures.append((str(exc).split("\n")[0][:100], f"{data.kind} / {data.container} / {params}"))

    run()
    return tally, failures


def campaign(examples: int) -> dict[str, Counter]:
    """Run ``examples`` random inputs per estimator through :func:`outcome`; count the classes."""
    counts = {}
    for name in REGISTRY:
        counts[name], failures = _campaign_one(name, examples)
        tally = counts[name]
        classes = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
        print(f"{name:>20}: {sum(tally.values())} inputs: {classes}")
        kinds = Counter(message for message, _ in failures)
        for message, count in kinds.most_common(8):
            example = next(where for m, where in failures if m == message)
            print(f"    {count} x {message}\n        e.g. {example[:300]}")
    return counts


if __name__ == "__main__":
    campaign(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
