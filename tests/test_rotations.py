"""Tests of bayespca.rotations against R, scikit-learn and the defining properties.

References:
- R 4.2 stats::varimax / stats::promax and GPArotation::quartimax / oblimin on R's
  ability.cov and Harman74.cor and on scikit-learn's fixed test matrix
  (tests/data/rotation_reference.json, produced by tests/data/rotations.R);
- scikit-learn's FactorAnalysis(rotation=...) and its published varimax case;
- scipy.linalg.orthogonal_procrustes;
- the optimality of each criterion, checked by finite differences of criteria
  written out here from their definitions.
"""

import json
import pathlib
import warnings

import numpy as np
import pytest
import scipy.linalg
from scipy.optimize import linear_sum_assignment
from sklearn.datasets import load_iris
from sklearn.decomposition import FactorAnalysis
from sklearn.decomposition._factor_analysis import _ortho_rotation
from sklearn.exceptions import ConvergenceWarning

from bayespca.rotations import procrustes, rotate

REFERENCE = json.loads(
    (pathlib.Path(__file__).parent / "data" / "rotation_reference.json").read_text()
)
HARMAN = np.array(REFERENCE["datasets"][2]["loadings"])  # 24 x 4, factanal of Harman74.cor
METHODS = ["varimax", "quartimax", "promax", "oblimin"]


def _align(result, reference):
    """Column permutation and signs that best map ``result`` onto ``reference``."""
    gain = np.abs(result.T @ reference)
    rows, cols = linear_sum_assignment(-gain)
    perm = np.empty(reference.shape[1], dtype=int)
    perm[cols] = rows
    signs = np.sign(np.sum(result[:, perm] * reference, axis=0))
    return perm, signs


def _simple_structure(seed, d=12, k=3):
    """Loadings with a clear simple structure, seen through a random orthogonal rotation."""
    rng = np.random.default_rng(seed)
    pattern = np.repeat(np.eye(k), d // k, axis=0) * rng.uniform(0.5, 0.9, (d, 1))
    pattern += 0.15 * rng.standard_normal((d, k))
    q, _ = np.linalg.qr(rng.standard_normal((k, k)))
    return pattern @ q


# --------------------------------------------------------------------------------------
# R references


def _r_cases():
    for data in REFERENCE["datasets"]:
        for case in data["cases"]:
            name = f"{data['name'].split(',')[0]}: {case['source']}"
            yield pytest.param(np.array(data["loadings"]), case, id=name)


@pytest.mark.parametrize(("loadings", "case"), list(_r_cases()))
def test_matches_r(loadings, case):
    # stats::varimax (eps = 0) stops once rounding stalls its criterion, which is flat
    # at the optimum: its loadings are good to ~sqrt(machine eps) = 1.5e-8. GPArotation
    # stops at a projected-gradient norm below eps, leaving an error of order eps.
    atol = 10 * case["eps"] if "eps" in case else 1e-7
    result = rotate(loadings, case["method"], normalize=case["normalize"], **case["options"])
    assert result.converged
    expected = np.array(case["loadings"])
    perm, signs = _align(result.loadings, expected)
    np.testing.assert_allclose(result.loadings[:, perm] * signs, expected, rtol=0, atol=atol)
    np.testing.assert_allclose(result.matrix[:, perm] * signs, np.array(case["matrix"]),
                               rtol=0, atol=10 * atol)
    np.testing.assert_allclose(
        result.factor_correlation[np.ix_(perm, perm)] * np.outer(signs, signs),
        np.array(case["factor_correlation"]),
        rtol=0,
        atol=atol,
    )


# --------------------------------------------------------------------------------------
# scikit-learn


def test_sklearn_published_varimax():
    # scikit-learn's test_factor_analysis: varimax of this 4 x 2 matrix, against values
    # from R's psych::principal(rotate="varimax"), compared in absolute value to 3
    # decimals. They are unnormalised varimax (scikit-learn's rotation has no Kaiser
    # normalisation); the converged Kaiser-normalised solution differs from them by
    # 1.8e-3 in entry (2, 1) (R's stats::varimax with its loose default eps = 1e-5
    # happens to stop within 3 decimals of them).
    factors = np.array(
        [
            [0.89421016, -0.35854928],
            [-0.45081822, -0.89132754],
            [0.99500666, -0.02031465],
            [0.96822861, -0.06299656],
        ]
    )
    published = np.array([[0.962, 0.052], [-0.141, 0.989], [0.949, -0.300], [0.937, -0.251]])
    rotated = rotate(factors, "varimax", normalize=False).loadings
    np.testing.assert_array_less(np.abs(np.abs(rotated) - np.abs(published)), 1.5e-3)


def _fa_data():
    rng = np.random.default_rng(0)
    loadings = _simple_structure(1, d=12, k=3) * 2.0
    synthetic = rng.standard_normal((400, 3)) @ loadings.T + rng.standard_normal((400, 12))
    return [("iris", load_iris().data, 2), ("synthetic", synthetic, 3)]


@pytest.mark.parametrize("method", ["varimax", "quartimax"])
@pytest.mark.parametrize(("name", "X", "k"), _fa_data(), ids=["iris", "synthetic"])
def test_sklearn_factor_analysis_rotation(method, name, X, k):
    unrotated = FactorAnalysis(k, svd_method="lapack").fit(X).components_.T
    fitted = FactorAnalysis(k, svd_method="lapack", rotation=method).fit(X).components_.T
    result = rotate(unrotated, method, normalize=False)
    scale = np.abs(unrotated).max()
    perm, signs = _align(result.loadings, fitted)
    # scikit-learn stops when its criterion grows by less than a factor 1 + 1e-6,
    # which leaves an error of order sqrt(1e-6) relative in the loadings.
    np.testing.assert_allclose(result.loadings[:, perm] * signs, fitted, rtol=0,
                               atol=1e-3 * scale)
    # The same algorithm run to convergence agrees to our own tolerance.
    tight = _ortho_rotation(unrotated, method=method, tol=1e-15, max_iter=100_000).T
    perm, signs = _align(result.loadings, tight)
    np.testing.assert_allclose(result.loadings[:, perm] * signs, tight, rtol=0,
                               atol=1e-8 * scale)


# --------------------------------------------------------------------------------------
# Invariants


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("loadings", [HARMAN, _simple_structure(2)], ids=["harman", "random"])
def test_invariants_and_conventions(loadings, method, normalize):
    result = rotate(loadings, method, normalize=normalize)
    k = loadings.shape[1]
    lrot, matrix, phi = result.loadings, result.matrix, result.factor_correlation
    np.testing.assert_allclose(lrot, loadings @ matrix, rtol=0, atol=1e-13)
    # The model covariance never changes.
    np.testing.assert_allclose(lrot @ phi @ lrot.T, loadings @ loadings.T, rtol=0, atol=1e-12)
    matrix_inv = np.linalg.inv(matrix)
    np.testing.assert_allclose(phi, matrix_inv @ matrix_inv.T, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.diag(phi), np.ones(k), rtol=0, atol=1e-12)
    assert np.linalg.eigvalsh(phi).min() > 0
    if method in ("varimax", "quartimax"):
        np.testing.assert_allclose(matrix.T @ matrix, np.eye(k), rtol=0, atol=1e-13)
        np.testing.assert_array_equal(phi, np.eye(k))
    else:
        assert np.abs(phi - np.eye(k)).max() > 0.05  # these factors do correlate
    # Conventions: positive column sums, factors by decreasing sum_i l_ij (L Phi)_ij.
    assert np.all(lrot.sum(axis=0) > 0)
    explained = np.einsum("ij,ij->j", lrot, lrot @ phi)
    assert np.all(np.diff(explained) <= 0)
    np.testing.assert_allclose(explained.sum(), np.sum(loadings**2), rtol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_invariant_to_orthogonal_rotation_of_input(method):
    # L and L Q have the same set of rotations, so the result must not depend on Q.
    q, _ = np.linalg.qr(np.random.default_rng(3).standard_normal((4, 4)))
    first = rotate(HARMAN, method)
    second = rotate(HARMAN @ q, method)
    np.testing.assert_allclose(second.loadings, first.loadings, rtol=0, atol=1e-8)
    np.testing.assert_allclose(second.factor_correlation, first.factor_correlation, rtol=0,
                               atol=1e-8)
    np.testing.assert_allclose(q @ second.matrix, first.matrix, rtol=0, atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
def test_idempotent(method):
    # Rotating the result again (written with uncorrelated factors, L_rot chol(Phi))
    # returns it.
    first = rotate(HARMAN, method)
    again = rotate(first.loadings @ np.linalg.cholesky(first.factor_correlation), method)
    np.testing.assert_allclose(again.loadings, first.loadings, rtol=0, atol=1e-8)
    np.testing.assert_allclose(again.factor_correlation, first.factor_correlation, rtol=0,
                               atol=1e-8)
    if method in ("varimax", "quartimax"):
        assert again.n_iter <= 3


def test_scale_equivariant():
    first = rotate(HARMAN, "oblimin", normalize=False)
    scaled = rotate(1e3 * HARMAN, "oblimin", normalize=False)
    np.testing.assert_allclose(scaled.loadings, 1e3 * first.loadings, rtol=1e-9)


# --------------------------------------------------------------------------------------
# Optimality of the criteria, by finite differences of the definitions


def _orthomax_value(a, gamma):
    """Orthomax criterion, to be maximised (Kaiser 1958 for gamma = 1)."""
    d = a.shape[0]
    return np.sum(a**4) - gamma / d * np.sum(np.sum(a**2, axis=0) ** 2)


def _oblimin_value(a, gamma):
    """Direct oblimin, to be minimised (Jennrich & Sampson 1966), as a sum over pairs."""
    d, k = a.shape
    sq = a**2
    return sum(
        sq[:, j] @ sq[:, m] - gamma / d * sq[:, j].sum() * sq[:, m].sum()
        for j in range(k)
        for m in range(k)
        if j != m
    )


def _givens(k, p, q, angle):
    g = np.eye(k, dtype=complex)
    g[p, p] = g[q, q] = np.cos(angle)
    g[p, q], g[q, p] = -np.sin(angle), np.sin(angle)
    return g


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(("method", "gamma"), [("varimax", 1.0), ("quartimax", 0.0)])
@pytest.mark.parametrize("loadings", [HARMAN, _simple_structure(4)], ids=["harman", "random"])
def test_orthogonal_optimum(loadings, method, gamma, normalize):
    result = rotate(loadings, method, normalize=normalize)
    weights = np.linalg.norm(loadings, axis=1) if normalize else np.ones(len(loadings))
    a, a_rot = loadings / weights[:, None], result.loadings / weights[:, None]
    best = _orthomax_value(a_rot, gamma)
    assert best >= _orthomax_value(a, gamma)
    k, h = loadings.shape[1], 1e-4
    for p in range(k):
        for q in range(p + 1, k):
            # Complex-step derivative (exact to rounding): stationary in every plane.
            slope = _orthomax_value(a_rot @ _givens(k, p, q, 1e-30j), gamma).imag / 1e-30
            assert abs(slope) < 1e-8
            plus = _orthomax_value(a_rot @ _givens(k, p, q, h), gamma).real
            minus = _orthomax_value(a_rot @ _givens(k, p, q, -h), gamma).real
            assert plus < best and minus < best  # a local maximum


def _oblique_value(a, t, gamma):
    return _oblimin_value(np.linalg.solve(t, a.T).T, gamma)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("gamma", [0.0, 0.5])
@pytest.mark.parametrize("loadings", [HARMAN, _simple_structure(5)], ids=["harman", "random"])
def test_oblimin_optimum(loadings, gamma, normalize):
    result = rotate(loadings, "oblimin", normalize=normalize, gamma=gamma)
    weights = np.linalg.norm(loadings, axis=1) if normalize else np.ones(len(loadings))
    a = loadings / weights[:, None]
    # L_rot = A T^{-T} with T of unit columns: T = R^{-T}.
    t_best = np.linalg.inv(result.matrix).T
    np.testing.assert_allclose(np.linalg.norm(t_best, axis=0), 1.0, rtol=1e-12)
    best = _oblique_value(a, t_best, gamma)
    assert best <= _oblimin_value(a, gamma)
    k, h = loadings.shape[1], 1e-4
    for p in range(k):
        for q in range(k):
            if p == q:
                continue
            values = []
            for step in (1e-30j, h, -h):
                t = t_best.astype(complex)
                t[p, q] += step
                values.append(_oblique_value(a, t / np.sqrt(np.sum(t**2, axis=0)), gamma))
            # Complex-step derivative (exact to rounding): stationary.
            assert abs(values[0].imag / 1e-30) < 1e-8
            assert min(values[1].real, values[2].real) > best  # a local minimum


# --------------------------------------------------------------------------------------
# Options, edge cases and bad input


def test_one_factor_is_not_rotated():
    loadings = np.array([[0.5], [-0.9], [0.2]])
    for method in METHODS:
        result = rotate(loadings, method)
        np.testing.assert_array_equal(result.loadings, loadings)
        np.testing.assert_array_equal(result.matrix, [[1.0]])
        np.testing.assert_array_equal(result.factor_correlation, [[1.0]])
        assert (result.n_iter, result.converged, result.method) == (0, True, method)


def test_not_converged_warns():
    with pytest.warns(ConvergenceWarning, match=r"projected gradient norm .* > tol=1e-10 after 2 "
                                                r"iterations \(max_iter=2\)"):
        result = rotate(HARMAN, "oblimin", max_iter=2)
    assert not result.converged and result.n_iter == 2
    # The covariance is still exact.
    lrot = result.loadings
    np.testing.assert_allclose(lrot @ result.factor_correlation @ lrot.T, HARMAN @ HARMAN.T,
                               atol=1e-12)


def test_unreachable_tol_stops_with_warning():
    # Far below rounding no step can shrink the projected gradient: stop, do not spin.
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        result = rotate(HARMAN, "varimax", tol=1e-300)
    assert not result.converged and result.n_iter < 1000
    tight = rotate(HARMAN, "varimax")
    np.testing.assert_allclose(result.loadings, tight.loadings, rtol=0, atol=1e-10)


def test_array_types():
    pd = pytest.importorskip("pandas")
    jnp = pytest.importorskip("jax.numpy")
    expected = rotate(HARMAN, "promax").loadings
    for loadings in (pd.DataFrame(HARMAN), jnp.asarray(HARMAN), HARMAN.tolist()):
        np.testing.assert_array_equal(rotate(loadings, "promax").loadings, expected)


def test_no_warning_when_converged():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rotate(HARMAN, "quartimax").converged


@pytest.mark.parametrize(
    ("loadings", "kwargs", "error", "match"),
    [
        (np.ones(3), {}, ValueError, r"loadings must be a 2-D array .* got a 1-D array"),
        (np.ones((2, 3, 2)), {}, ValueError, "got a 3-D array"),
        (np.empty((0, 2)), {}, ValueError, "loadings has 0 row"),
        ([[1.0, np.nan], [0.0, 1.0]], {}, ValueError,
         "loadings contains 1 NaN and 0 infinite entries; rotations need finite loadings"),
        ([[1.0, np.inf], [0.0, -np.inf]], {}, ValueError,
         "loadings contains 0 NaN and 2 infinite"),
        ([["1", "nan"], ["0", "1"]], {}, TypeError, "loadings contains non-numeric values: strings"),
        (HARMAN, {"normalize": "yes"}, TypeError, "normalize must be True or False; got 'yes'"),
        ([["a", "b"], ["c", "d"]], {}, TypeError, "loadings contains non-numeric values"),
        (HARMAN, {"method": "Varimax"}, ValueError,
         r"method must be one of \['oblimin', 'promax', 'quartimax', 'varimax'\]; got 'Varimax'"),
        (HARMAN, {"method": None}, ValueError, "method must be one of"),
        (HARMAN, {"method": "varimax", "gamma": 1.0}, TypeError,
         r"method='varimax'\) got unexpected option\(s\) \['gamma'\]; accepted: none"),
        (HARMAN, {"method": "promax", "m": 4}, TypeError, r"accepted: \['power'\]"),
        (HARMAN, {"method": "promax", "power": 1.0}, ValueError,
         "power must be a finite number > 1; got 1.0"),
        (HARMAN, {"method": "oblimin", "gamma": np.nan}, ValueError,
         "gamma must be a finite number; got nan"),
        (HARMAN, {"method": "oblimin", "gamma": "0"}, TypeError, "gamma must be"),
        (HARMAN, {"tol": 0.0}, ValueError, "tol must be a finite number > 0; got 0.0"),
        (HARMAN, {"max_iter": 0}, ValueError, "max_iter must be an int >= 1; got 0"),
        (HARMAN, {"max_iter": 2.5}, TypeError, "max_iter must be an int >= 1"),
        (np.ones((5, 2)), {"method": "promax"}, ValueError,
         "promax needs loadings of full column rank 2; got rank 1"),
    ],
)
def test_bad_input(loadings, kwargs, error, match):
    with pytest.raises(error, match=match):
        rotate(loadings, **kwargs)


# --------------------------------------------------------------------------------------
# Procrustes


def test_procrustes_matches_scipy():
    rng = np.random.default_rng(6)
    source, target = rng.standard_normal((10, 3)), rng.standard_normal((10, 3))
    aligned, matrix = procrustes(source, target)
    expected, _ = scipy.linalg.orthogonal_procrustes(source, target)
    np.testing.assert_allclose(matrix, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(aligned, source @ expected, rtol=0, atol=1e-12)


def test_procrustes_recovers_rotation_and_reflection_for_each_draw():
    rng = np.random.default_rng(7)
    target = rng.standard_normal((8, 3))
    qs = np.stack([np.linalg.qr(rng.standard_normal((3, 3)))[0] for _ in range(5)])
    qs[0] = np.diag([1.0, -1.0, 1.0])  # a pure sign flip
    draws = target @ np.swapaxes(qs, 1, 2)  # draw i = target Q_i^T
    aligned, matrices = procrustes(draws, target)
    assert aligned.shape == (5, 8, 3) and matrices.shape == (5, 3, 3)
    np.testing.assert_allclose(aligned, np.broadcast_to(target, aligned.shape), atol=1e-12)
    np.testing.assert_allclose(matrices, qs, atol=1e-12)


def test_procrustes_bad_input():
    with pytest.raises(ValueError, match=r"source must have shape \(\.\.\., 4, 2\) to match "
                                         r"target; got shape \(4, 3\)"):
        procrustes(np.ones((4, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="source contains 1 NaN"):
        procrustes([[np.nan, 1.0], [0.0, 1.0]], np.eye(2))
    with pytest.raises(ValueError, match="target contains 1 NaN"):
        procrustes(np.eye(2), [[np.nan, 1.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="target must be a 2-D array"):
        procrustes(np.ones((3, 2, 2)), np.ones((3, 2, 2)))



@pytest.mark.parametrize("c", [1e-300, 1e-200, 1e200, 1e300])
@pytest.mark.parametrize("method", METHODS)
def test_rotation_does_not_depend_on_the_scale_of_the_loadings(method, c):
    # Reference: the rotation of the unscaled loadings (checked against R above).
    ref = rotate(HARMAN, method)
    ours = rotate(HARMAN * c, method)
    np.testing.assert_allclose(ours.matrix, ref.matrix, atol=1e-12)
    np.testing.assert_allclose(ours.loadings / c, ref.loadings, atol=1e-12)
    np.testing.assert_allclose(ours.factor_correlation, ref.factor_correlation, atol=1e-12)
    _, R = procrustes(HARMAN * c, ref.loadings)
    np.testing.assert_allclose(R, procrustes(HARMAN, ref.loadings)[1], atol=1e-12)
