"""Tests of the ``bayespca`` command (bayespca.cli, bayespca.demo, ``python -m bayespca``)."""

import argparse
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy.stats import multivariate_normal
from sklearn.datasets import load_wine
from sklearn.decomposition import PCA as SkPCA

from bayespca import PPCA, FactorAnalysis
from bayespca.cli import main, parse_components
from bayespca.comparison import noiseless_candidates

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["a", "b", "c", "d", "e"]


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(11)
    W = rng.standard_normal((5, 2)) * [2.0, 1.0]
    X = rng.standard_normal((40, 2)) @ W.T + 0.5 * rng.standard_normal((40, 5))
    # Values with long decimal expansions: the CSV round trip must keep every bit.
    return pd.DataFrame(X / 3.0 + np.pi, columns=NAMES)


@pytest.fixture
def csv(frame, tmp_path):
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    return path


def test_fit_nuts_netcdf_equals_python_api(frame, csv, tmp_path, capsys):
    out = tmp_path / "fit.nc"
    argv = ["fit", str(csv), "--model", "ppca", "--n-components", "2", "--method", "nuts",
            "--chains", "2", "--draws", "40", "--warmup", "40", "--seed", "3", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api = PPCA(2, method="nuts", num_chains=2, num_samples=40, num_warmup=40, random_state=3).fit(frame)
    tree = xr.open_datatree(out)
    expected = api.posterior_
    for name in ("W", "sigma2", "mu", "eigenvalues", "log_lik"):
        np.testing.assert_array_equal(tree["posterior"][name].values, expected["posterior"][name].values)
    np.testing.assert_array_equal(tree["log_likelihood"]["X"].values, expected["log_likelihood"]["X"].values)
    assert list(tree["posterior"]["W"].coords["feature"].values) == NAMES
    np.testing.assert_array_equal(tree["point_estimate"]["W"].values, api.loadings_)
    assert tree.attrs["model"] == "ppca" and tree.attrs["method"] == "nuts" and tree.attrs["seed"] == 3
    assert tree.attrs["target_accept"] == 0.9  # the documented default without the horseshoe
    # The printed summary labels W[feature, component] with that entry's posterior mean.
    w_mean = api.loadings_samples_.mean((0, 1))
    line = next(row for row in printed.splitlines() if row.startswith("W[b, 0]"))
    np.testing.assert_allclose(float(line.split()[2]), w_mean[1, 0], rtol=1e-3)
    table = api.summary()
    np.testing.assert_allclose(table.loc["W[b, 0]", "mean"], w_mean[1, 0], rtol=1e-12)
    np.testing.assert_allclose(table.loc["W[a, 1]", "mean"], w_mean[0, 1], rtol=1e-12)
    # ESS are counts: printed as the nearest integers of ArviZ's estimates.
    fields = next(row for row in printed.splitlines() if row.startswith("sigma2")).split()
    assert [int(f) for f in fields[5:7]] == [round(table.loc["sigma2", c]) for c in ("ess_bulk", "ess_tail")]
    # The log-likelihood is said to be at the posterior mean, and is: scipy's density at the mean draws.
    cov = w_mean @ w_mean.T + api.noise_variance_samples_.mean() * np.eye(5)
    at_mean = multivariate_normal(api.mean_samples_.mean((0, 1)), cov).logpdf(frame.to_numpy()).sum()
    line = next(row for row in printed.splitlines() if row.startswith("log-likelihood"))
    assert line.startswith("log-likelihood of the data at the posterior mean of (W, noise, mu): ")
    np.testing.assert_allclose(float(line.rsplit(" ", 1)[1]), at_mean, rtol=1e-5)


def test_fit_closed_form_writes_point_estimates(frame, csv, tmp_path, capsys):
    out = tmp_path / "ml.nc"
    assert main(["fit", str(csv), "--method", "closed_form", "--n-components", "2", "--out", str(out)]) == 0
    tree = xr.open_datatree(out)
    X = frame.to_numpy()
    evals = np.linalg.eigvalsh(np.cov(X, rowvar=False, bias=True))[::-1]
    np.testing.assert_allclose(tree["point_estimate"]["sigma2"].item(), evals[2:].mean(), rtol=1e-10)
    W = tree["point_estimate"]["W"].values
    np.testing.assert_allclose(W.T @ W, np.diag(evals[:2] - evals[2:].mean()), atol=1e-10)
    np.testing.assert_allclose(tree["point_estimate"]["mu"].values, X.mean(0), rtol=1e-12)
    assert "posterior" not in tree.children
    assert "log-likelihood" in capsys.readouterr().out


def test_fit_fa_em_varimax_equals_python_api(frame, csv, tmp_path):
    out = tmp_path / "fa.nc"
    argv = ["fit", str(csv), "--model", "fa", "--method", "em", "--n-components", "2",
            "--rotation", "varimax", "--out", str(out)]
    assert main(argv) == 0
    api = FactorAnalysis(2, rotation="varimax").fit(frame)
    tree = xr.open_datatree(out)
    np.testing.assert_array_equal(tree["point_estimate"]["W"].values, api.loadings_)
    np.testing.assert_array_equal(tree["point_estimate"]["psi"].values, api.noise_variance_)
    assert tree.attrs["model"] == "fa" and "target_accept" not in tree.attrs  # no sampler ran


def test_row_names_and_missing_values_as_r_writes_them(frame, tmp_path, capsys):
    from bayespca.cli import read_csv

    path = tmp_path / "r.csv"
    lines = ['"","a","b","c","d","e"'] + [
        f'"{i + 1}",' + ",".join("NA" if (i, j) == (2, 1) else repr(float(v)) for j, v in enumerate(row))
        for i, row in enumerate(frame.to_numpy())
    ]
    path.write_text("\n".join(lines) + "\n")
    read = read_csv(path)
    expected = frame.to_numpy().copy()
    expected[2, 1] = np.nan
    np.testing.assert_array_equal(read.to_numpy(), expected)
    assert list(read.columns) == NAMES
    assert main(["fit", str(path), "--method", "em", "--n-components", "1"]) == 0
    em = PPCA(1, method="em").fit(expected)
    assert f"{em.log_likelihood_:.6g}" in capsys.readouterr().out


BAD_CSV = {
    "empty": ("", "is empty"),
    "header only": ("a,b,c\n", "no data rows"),
    "non-numeric": ("a,b\n1.0,2.0\n3.0,abc\n", "column 'b' is not numeric (line 3 holds 'abc')"),
    "ragged": ("a,b\n1,2\n3,4,5\n", "not a well-formed CSV"),
    "boolean": ("a,b\n1,True\n2,False\n", "column 'b' is not numeric"),
}


@pytest.mark.parametrize("case", sorted(BAD_CSV))
def test_bad_csv_one_line_error_exit_2(case, tmp_path, capsys):
    text, message = BAD_CSV[case]
    path = tmp_path / "bad.csv"
    path.write_text(text)
    assert main(["fit", str(path), "--method", "em"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bayespca: error: ")
    assert message in err


def test_missing_file_and_model_errors_exit_2(csv, tmp_path, capsys):
    assert main(["fit", str(tmp_path / "nope.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
    # An estimator's own ValueError (FA has no closed form) becomes a one-line usage error too.
    assert main(["fit", str(csv), "--model", "fa", "--method", "closed_form"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "method must be one of" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", str(csv), "--n-components", "0"])
    assert exit_info.value.code == 2


def test_python_dash_m_bad_csv_exit_2(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("x,y\n1,2\noops,3\n")
    run = subprocess.run([sys.executable, "-m", "bayespca", "fit", str(path)], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"bayespca: error: data file {str(path)!r}: column 'x' is not numeric (line 3 holds 'oops'); "
        "every column must hold numbers"
    ]


def test_parse_components():
    assert parse_components("1:6") == [1, 2, 3, 4, 5, 6]
    assert parse_components("2,4") == [2, 4]
    assert parse_components("3") == [3]
    for bad in ("0:3", "a", "3:1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            parse_components(bad)


def test_compare_passes_the_contract_arguments(frame, csv, tmp_path, capsys, monkeypatch):
    # A stand-in for bayespca.comparison that records its call: the wiring of the command.
    calls = []
    table = pd.DataFrame({"elpd": [-90.0, -80.0, -81.0], "se": [5.0, 4.0, 4.5]},
                         index=pd.Index([1, 2, 3], name="n_components"))

    def compare_n_components(X, n_components, **kwargs):
        calls.append((X, n_components, kwargs))
        return types.SimpleNamespace(table=table, n_components=2, rule="largest elpd", comparison=None)

    monkeypatch.setitem(sys.modules, "bayespca.comparison",
                        types.SimpleNamespace(compare_n_components=compare_n_components, DEFAULT_FOLDS=5,
                                              noiseless_candidates=noiseless_candidates))
    out, plot = tmp_path / "table.csv", tmp_path / "elpd.png"
    argv = ["compare", str(csv), "--n-components", "1:3", "--model", "fa", "--cv", "4", "--seed", "9",
            "--chains", "2", "--draws", "30", "--warmup", "20", "--max-refits", "3", "--out", str(out),
            "--plot", str(plot), "--no-progress"]
    assert main(argv) == 0
    ((X, ks, kwargs),) = calls
    np.testing.assert_array_equal(X.to_numpy(), frame.to_numpy())
    assert ks == [1, 2, 3]
    assert kwargs == {"model": "fa", "cv": 4, "max_refits": 3, "random_state": 9, "progress_bar": False,
                      "num_chains": 2, "num_samples": 30, "num_warmup": 20}
    np.testing.assert_array_equal(pd.read_csv(out, index_col=0)["elpd"], table["elpd"])
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert "recommended n_components = 2 (largest elpd)" in capsys.readouterr().out


def test_demo_small_writes_its_report(tmp_path, capsys):
    folder = tmp_path / "report"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sampler warnings of the deliberately short chains
        assert main(["demo", "--small", "--out", str(folder), "--no-progress"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(folder.resolve())
    pngs = {"scree.png", "biplot.png", "loadings.png", "loadings_intervals.png", "latent.png", "noise.png",
            "trace.png", "fa_loadings.png", "fa_noise.png", "kernel_pca.png", "comparison.png"}
    assert pngs <= {p.name for p in folder.iterdir()}
    for name in pngs:
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (folder / "report.md").read_text()
    assert all(f"]({name})" in report for name in pngs)
    # The selection table holds the rules' k: Minka's matches scikit-learn on the same standardised data.
    data = load_wine().data
    z = (data - data.mean(0)) / data.std(0, ddof=1)
    selection = pd.read_csv(folder / "selection.csv", index_col=0)["n_components"]
    assert selection["mle"] == SkPCA(n_components="mle").fit(z).n_components_
    summary = pd.read_csv(folder / "summary.csv", index_col=0)
    assert summary.loc["sigma2", "r_hat"] < 1.1
    # The best k's elpd agrees with the K-fold held-out log-likelihood of its ML fit (independent estimate).
    row = pd.read_csv(folder / "comparison.csv", index_col=0).sort_values("elpd").iloc[-1]
    n = len(data)
    assert abs(row["elpd"] - n * row["cv_log_likelihood"]) < 3 * np.hypot(row["se"], n * row["cv_se"])


# ------------------------------------------------------------ import cost
HEAVY = ("jax", "numpyro", "arviz", "matplotlib", "sklearn", "scipy", "pandas", "xarray")


def test_help_loads_no_numerical_library():
    # A fresh process: what `bayespca --help` imports is the parser module and the package root.
    code = ("import sys, bayespca.cli as cli; cli.build_parser().format_help(); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
    run = subprocess.run([sys.executable, "-m", "bayespca", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert run.returncode == 0 and "{fit,compare,demo}" in run.stdout


def test_maximum_likelihood_fits_load_no_jax():
    # A fresh process: the estimators and their closed-form / EM / Newton fits need NumPy and SciPy only;
    # JAX (0.4 s to import) comes with the first Bayesian fit.
    code = ("import sys, numpy as np; from bayespca import PCA, PPCA, FactorAnalysis; "
            "X = np.random.default_rng(0).normal(size=(60, 5)); Y = X.copy(); Y[0, 1] = np.nan; "
            "fits = [PCA(2).fit(X), PPCA(2).fit(X), PPCA(2).fit(Y), FactorAnalysis(1).fit(X)]; "
            "[f.transform(X) for f in fits]; print('jax' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


@pytest.mark.parametrize("first", ["bayespca", "jax"])
def test_float64_whichever_is_imported_first(first):
    # The package promises float64 JAX whether JAX was imported before it or is imported after.
    second = "jax" if first == "bayespca" else "bayespca"
    code = (f"import {first}; import {second}; from bayespca.pca import PCA; import jax.numpy as jnp; "
            "print(jnp.asarray(1.0).dtype, PCA.__name__)")
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_ENABLE_X64"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120, env=env)
    assert run.stdout.split() == ["float64", "PCA"], run.stderr


# ------------------------------------------------------ errors before work
@pytest.fixture
def no_work(monkeypatch):
    """Every expensive step raises: an error must come before any of them."""

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the output path was checked")

    monkeypatch.setattr(PPCA, "fit", refuse)
    monkeypatch.setattr(FactorAnalysis, "fit", refuse)
    monkeypatch.setattr("bayespca.cli.read_csv", refuse)
    monkeypatch.setitem(sys.modules, "bayespca.comparison",
                        types.SimpleNamespace(compare_n_components=refuse))
    monkeypatch.setitem(sys.modules, "bayespca.demo", types.SimpleNamespace(run_demo=refuse))


# (command, option, path under tmp_path, what the one-line error says); "a_file" is a regular file.
OUTPUT_CASES = {
    "fit, no such folder": ("fit", "--out", "nope/f.nc", "does not exist"),
    "fit, folder is a file": ("fit", "--out", "a_file/f.nc", "is not a folder"),
    "fit, wrong suffix": ("fit", "--out", "f.csv", "ending in .nc"),
    "fit, out is a folder": ("fit", "--out", "a_folder.nc", "is a folder"),
    "compare, csv suffix": ("compare", "--out", "t.txt", "ending in .csv"),
    "compare, plot folder": ("compare", "--plot", "nope/e.png", "does not exist"),
    "compare, plot suffix": ("compare", "--plot", "e.gif", "ending in .png or .pdf"),
    "demo, under a file": ("demo", "--out", "a_file/report", "is a file, not a folder"),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_CASES))
def test_output_path_refused_before_any_work(case, csv, tmp_path, capsys, no_work):
    command, option, relative, message = OUTPUT_CASES[case]
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_folder.nc").mkdir()
    before = sorted(tmp_path.rglob("*"))
    data = [] if command == "demo" else [str(csv)]
    assert main([command, *data, option, str(tmp_path / relative)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bayespca: error: ") and message in err, err
    assert sorted(tmp_path.rglob("*")) == before


def test_failed_write_leaves_no_file_and_one_line(csv, tmp_path, capsys, monkeypatch):
    # A writer that dies half-way (disk full, a library bug): the target never appears, the
    # temporary file is removed, and the user reads one line, with the traceback behind --debug.
    def half_write(self, path, **kwargs):
        Path(path).write_bytes(b"\x89HDF\r\n")
        raise RuntimeError("disk full")

    monkeypatch.setattr(xr.DataTree, "to_netcdf", half_write)
    out = tmp_path / "fit.nc"
    argv = ["fit", str(csv), "--method", "closed_form", "--n-components", "2", "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == ("bayespca: internal error: RuntimeError: disk full (rerun with --debug for the traceback, "
                   "and please report it)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv"]
    with pytest.raises(RuntimeError, match="disk full"):
        main([*argv, "--debug"])


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--seed", "-1", "expected an int >= 0"),
    ("--seed", "1.5", "expected an int >= 0"),
    ("--target-accept", "1.2", "expected a probability in (0, 1)"),
    ("--prior", "wide", "invalid choice: 'wide'"),
    ("--cv", "1", "expected an int >= 2"),  # one fold leaves nothing to hold out
])
def test_bad_option_one_line_exit_2(option, value, message, csv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare" if option == "--cv" else "fit", str(csv), option, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and f"argument {option}" in err, err


# ----------------------------------------------------------- pass-through
def test_fit_passes_prior_target_accept_and_a_huge_seed(csv, capsys, monkeypatch):
    seen = {}

    def record(self, X, y=None):
        seen.update(self.get_params())
        raise ValueError("stop here")

    monkeypatch.setattr(PPCA, "fit", record)
    huge = 2**70
    argv = ["fit", str(csv), "--prior", "ard", "--target-accept", "0.97", "--seed", str(huge),
            "--chains", "3", "--draws", "20", "--warmup", "10"]
    assert main(argv) == 2
    assert capsys.readouterr().err == "bayespca: error: stop here\n"
    assert seen["prior"] == "ard" and seen["target_accept_prob"] == 0.97 and seen["random_state"] == huge
    assert (seen["num_chains"], seen["num_samples"], seen["num_warmup"]) == (3, 20, 10)


def test_anchors_by_name_or_index_are_the_python_api_s(frame, csv, tmp_path, capsys):
    """``--anchors c,0``: feature c anchors component 0 and feature a component 1, the fit the Python
    API gives with ``anchors=[2, 0]`` (same draws); the one structural zero, ``W[c, 1]``, is zero in
    every draw, left out of the printed table, and the anchors are said and kept in the file."""
    out = tmp_path / "hs.nc"
    sampler = {"num_chains": 2, "num_samples": 30, "num_warmup": 30, "random_state": 5}
    argv = ["fit", str(csv), "--n-components", "2", "--prior", "horseshoe", "--anchors", "c,0",
            "--chains", "2", "--draws", "30", "--warmup", "30", "--seed", "5", "--out", str(out),
            "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 0
        api = PPCA(2, method="nuts", prior="horseshoe", anchors=[2, 0], **sampler).fit(frame)
    printed = capsys.readouterr().out
    tree = xr.open_datatree(out)
    np.testing.assert_array_equal(tree["posterior"]["W"].values, api.posterior_["posterior"]["W"].values)
    assert np.all(tree["posterior"]["W"].sel(feature="c", component=1).values == 0.0)
    assert list(tree.attrs["anchors"]) == [2, 0] and api.anchors_ == (2, 0)
    assert tree.attrs["target_accept"] == 0.99  # the horseshoe's documented default, used and recorded
    assert "anchors (feature p_l loads on components 0..l only): c (0), a (1)" in printed.splitlines()
    rows = {line.split("  ")[0].strip() for line in printed.splitlines()}
    assert "W[a, 1]" in rows and "W[c, 1]" not in rows and "inclusion[c, 1]" not in rows
    table = api.summary()  # a DataFrame's names label the rows: the zero is left out by name
    assert "W[c, 1]" not in table.index and "inclusion[c, 1]" not in table.index and "W[c, 0]" in table.index


@pytest.mark.parametrize(("extra", "message"), [
    (["--prior", "horseshoe", "--anchors", "c,x"],
     "--anchors: 'x' is neither a feature of the data (a, b, c, d, e) nor a column index in [0, 5)"),
    (["--prior", "horseshoe", "--anchors", "c,5"], "--anchors: '5' is neither"),
    # a digit that is not a decimal one: int() refuses it
    (["--prior", "horseshoe", "--anchors", "c,\u00b2"], "--anchors: '\u00b2' is neither"),
    (["--prior", "horseshoe", "--anchors", "c,2"], "--anchors: feature 'c' given twice"),
    (["--prior", "horseshoe", "--anchors", "c"], "--anchors names 1 feature; --n-components 2 needs 2"),
    (["--anchors", "c,0"], "--anchors needs --prior horseshoe (its anchors fix the rotation); got --prior"),
    (["--prior", "horseshoe", "--method", "svi"], "--guide must be 'normal' or 'lowrank' with the horseshoe"),
    (["--guide", "normal"], "--guide normal needs --method svi (got --method nuts)"),
])
def test_bad_anchors_one_line_before_any_fit(extra, message, csv, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the sampler started")

    monkeypatch.setattr("bayespca.inference.nuts.fit_nuts", refuse)
    assert main(["fit", str(csv), "--n-components", "2", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_svi_guide_is_the_python_api_s(frame, csv, capsys):
    """``--method svi --prior horseshoe --guide normal`` fits what the Python API fits with those
    parameters (the same loadings, bitwise); the printed loadings are that fit's."""
    argv = ["fit", str(csv), "--n-components", "2", "--method", "svi", "--prior", "horseshoe",
            "--guide", "normal", "--seed", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    api = PPCA(2, method="svi", prior="horseshoe", guide="normal", random_state=2).fit(frame)
    line = next(row for row in printed.splitlines() if row.startswith("b "))
    np.testing.assert_allclose([float(v) for v in line.split()[1:3]], api.loadings_[1], rtol=1e-5)
    assert "anchors (feature p_l loads on components 0..l only)" in printed


def test_huge_seed_is_kept_in_the_netcdf_attributes(csv, tmp_path):
    # The seed rule takes ints of any size; netCDF attributes hold int64, so the seed goes as text.
    out = tmp_path / "em.nc"
    assert main(["fit", str(csv), "--method", "em", "--n-components", "1", "--seed", str(2**70),
                 "--out", str(out)]) == 0
    assert int(xr.open_datatree(out).attrs["seed"]) == 2**70


def _stand_in_comparison(monkeypatch, table, warn=None):
    """bayespca.comparison replaced by a recorder; ``warn(k)`` runs inside an estimator's fit per k."""
    calls = []

    class Estimator:
        __module__ = "bayespca.probabilistic"  # as the comparison's own fits

        def __init__(self, n_components):
            self.n_components = n_components

        def fit(self):
            if warn is not None:
                warn(self.n_components)

    class ParetoKWarning(UserWarning):
        pass

    def compare_n_components(X, n_components, **kwargs):
        calls.append((X, n_components, kwargs))
        for k in n_components:
            Estimator(k).fit()
        warnings.warn("n_components=2: Pareto k-hat > 0.7 for 1 of 40 rows (max 0.7004); try num_samples or "
                      "a larger max_refits.", ParetoKWarning, stacklevel=2)
        return types.SimpleNamespace(table=table, n_components=2, rule="largest elpd", comparison=None)

    module = types.SimpleNamespace(compare_n_components=compare_n_components, KHAT_THRESHOLD=0.7,
                                   ParetoKWarning=ParetoKWarning, DEFAULT_FOLDS=5,
                                   noiseless_candidates=noiseless_candidates)
    monkeypatch.setitem(sys.modules, "bayespca.comparison", module)
    return calls


def test_compare_warnings_say_which_k_and_keep_the_evidence(csv, capsys, monkeypatch):
    table = pd.DataFrame({"elpd": [-90.0, -80.0], "se": [5.0, 4.0], "pareto_k_max": [0.5, 0.7004]},
                         index=pd.Index([1, 2], name="n_components"))

    def warn(k):  # compare_n_components prefixes each fit's warnings with its k
        warnings.warn(f"n_components={k}: R-hat of sigma2 is {1 + k / 100:.3f} > 1.01: the chains disagree. "
                      "Increase num_warmup and num_samples.", UserWarning, stacklevel=2)
        warnings.warn("a library deprecation", DeprecationWarning, stacklevel=2)

    _stand_in_comparison(monkeypatch, table, warn)
    assert main(["compare", str(csv), "--n-components", "1,2", "--no-progress"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "bayespca: warning (k=1): R-hat of sigma2 is 1.010 > 1.01: the chains disagree. "
        "Increase --warmup and --draws.",
        "bayespca: warning (k=2): R-hat of sigma2 is 1.020 > 1.01: the chains disagree. "
        "Increase --warmup and --draws.",
        "bayespca: warning (k=2): Pareto k-hat > 0.7 for 1 of 40 rows (max 0.7004); try --draws or a larger "
        "--max-refits.",
    ]


# Ledermann (1937): the largest k with (d - k)^2 >= d + k is 1 for d = 4 and 2 for d = 5 (by hand).
@pytest.mark.parametrize(("model", "columns", "expected"), [
    ("ppca", 5, [1, 2, 3, 4, 5]),
    ("fa", 5, [1, 2]),
    ("ppca", 7, [1, 2, 3, 4, 5, 6]),
])
def test_compare_default_is_clipped_and_says_so(model, columns, expected, frame, tmp_path, capsys,
                                                monkeypatch):
    data = pd.concat([frame, frame.iloc[:, : columns - 5] ** 2], axis=1) if columns > 5 else frame.copy()
    data.columns = [f"v{j}" for j in range(columns)]
    path = tmp_path / "data.csv"
    data.to_csv(path, index=False)
    table = pd.DataFrame({"elpd": [-9.0, -8.0], "se": [1.0, 1.0]},
                         index=pd.Index([1, 2], name="n_components"))
    calls = _stand_in_comparison(monkeypatch, table)
    assert main(["compare", str(path), "--model", model, "--no-progress"]) == 0
    assert calls[0][1] == expected
    out = capsys.readouterr().out
    assert ("clipped" in out) == (expected != [1, 2, 3, 4, 5, 6])


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "fa", "--n-components", "1:5"], "allows k <= 4"),
    (["--n-components", "1:6"], "allows k <= 5"),
])
def test_compare_refuses_k_beyond_the_rule(argv, message, csv, capsys, monkeypatch):
    calls = _stand_in_comparison(monkeypatch, None)
    assert main(["compare", str(csv), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and not calls


def test_compare_on_fewer_rows_than_folds_clips_the_default_and_says_so(frame, tmp_path, capsys, monkeypatch):
    # The user gave no --cv: four rows get four folds (the library's default, said), not an error about --cv.
    path = tmp_path / "four_rows.csv"
    frame.iloc[:4].to_csv(path, index=False)
    table = pd.DataFrame({"elpd": [-9.0, -8.0], "se": [1.0, 1.0]},
                         index=pd.Index([1, 2], name="n_components"))
    calls = _stand_in_comparison(monkeypatch, table)
    assert main(["compare", str(path), "--n-components", "1,2", "--no-progress"]) == 0
    assert calls[0][2]["cv"] is None
    assert "cross-validating with 4 folds: the default 5 clipped to the 4 rows" in capsys.readouterr().out
    frame.iloc[:1].to_csv(path, index=False)
    assert main(["compare", str(path), "--n-components", "1,2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has 1 row: comparing k needs at least 2" in err and len(calls) == 1


def test_compare_default_drops_the_k_that_leave_refits_no_noise(frame, tmp_path, capsys, monkeypatch):
    # 5 rows x 5 features: a LOO refit's 4 rows have centred rank 3 (checked), so pPCA k = 3, 4 < d leave
    # them no noise; k = 5 = d keeps a bounded likelihood.
    path = tmp_path / "five_rows.csv"
    frame.iloc[:5].to_csv(path, index=False)
    rows = frame.iloc[:4].to_numpy()
    assert np.linalg.matrix_rank(rows - rows.mean(0)) == 3
    table = pd.DataFrame({"elpd": [-9.0, -8.0], "se": [1.0, 1.0]},
                         index=pd.Index([1, 2], name="n_components"))
    calls = _stand_in_comparison(monkeypatch, table)
    assert main(["compare", str(path), "--no-progress"]) == 0
    assert calls[0][1] == [1, 2, 5]
    assert "k = 3,4 dropped, as 5 rows allow" in capsys.readouterr().out


def test_compare_fa_on_four_columns_has_nothing_to_compare(frame, tmp_path, capsys, monkeypatch):
    path = tmp_path / "four.csv"
    frame.iloc[:, :4].to_csv(path, index=False)
    calls = _stand_in_comparison(monkeypatch, None)
    assert main(["compare", str(path), "--model", "fa"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only k = 1" in err and "Ledermann" in err and not calls


def test_compare_ppca_on_three_rows_has_nothing_to_compare(frame, tmp_path, capsys, monkeypatch):
    # 3 rows: LOO refits of 2 rows leave pPCA with 1 <= k < 5 no noise, so only k = 5 is left; the
    # message has no word of FA's Ledermann bound.
    path = tmp_path / "three_rows.csv"
    frame.iloc[:3].to_csv(path, index=False)
    calls = _stand_in_comparison(monkeypatch, None)
    assert main(["compare", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only k = 5" in err and "Ledermann" not in err and not calls


def test_fit_fa_above_ledermann_warns_in_one_line(csv, capsys):
    # d = 5: the bound is k <= 2 (see above); k = 3 is accepted (k <= d - 1) with one warning.
    assert main(["fit", str(csv), "--model", "fa", "--method", "em", "--n-components", "3"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "Ledermann" in line]
    assert len(lines) == 1 and "k <= 2" in lines[0] and lines[0].startswith("bayespca: warning")
    assert "Use --n-components <= 2." in lines[0]  # the option of this command, not the API's name


def test_errors_name_the_command_s_options(frame, tmp_path, capsys):
    path = tmp_path / "holes.csv"
    holes = frame.copy()
    holes.iloc[0, 1] = np.nan
    holes.to_csv(path, index=False)
    assert main(["fit", str(path), "--method", "closed_form"]) == 2
    err = capsys.readouterr().err
    assert "use --method em or 'svi'" in err and "method=" not in err, err


@pytest.mark.parametrize("suffix", [".parquet", ".zarr"])
def test_compare_says_it_reads_csv_only(suffix, tmp_path, capsys):
    assert main(["compare", str(tmp_path / f"survey{suffix}")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compare reads CSV files" in err and "bayespca fit" in err, err


def test_a_header_of_numbers_is_read_as_names_with_a_warning(frame, tmp_path, capsys):
    # A file without a header: its first row becomes the feature names, which the user is told.
    path = tmp_path / "no_header.csv"
    frame.to_csv(path, index=False, header=False)
    assert main(["fit", str(path), "--method", "closed_form", "--n-components", "1"]) == 0
    captured = capsys.readouterr()
    assert f"on {len(frame) - 1} rows x 5 features" in captured.out
    lines = [line for line in captured.err.splitlines() if "header" in line]
    assert len(lines) == 1 and "every header cell of" in lines[0] and "add one" in lines[0], captured.err
    frame.to_csv(path, index=False)  # named columns: nothing to say
    assert main(["fit", str(path), "--method", "closed_form", "--n-components", "1"]) == 0
    assert "header" not in capsys.readouterr().err


# ------------------------------------------------------------------- input
@pytest.mark.parametrize(("sep", "decimal"), [(";", ","), ("\t", "."), (";", ".")])
def test_sniffed_delimiters_read_the_same_numbers(sep, decimal, frame, tmp_path):
    from bayespca.cli import read_csv

    path = tmp_path / "data.csv"
    frame.to_csv(path, sep=sep, decimal=decimal, index=False)
    read = read_csv(path)
    np.testing.assert_array_equal(read.to_numpy(), frame.to_numpy())
    assert list(read.columns) == NAMES and read.attrs["delimiter"] == sep
