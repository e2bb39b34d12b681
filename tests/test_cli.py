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
from sklearn.datasets import load_wine
from sklearn.decomposition import PCA as SkPCA

from bayespca import PPCA, FactorAnalysis
from bayespca.cli import main, parse_components

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
    # The printed summary labels W[feature, component] with that entry's posterior mean.
    w_mean = api.loadings_samples_.mean((0, 1))
    line = next(row for row in printed.splitlines() if row.startswith("W[b, 0]"))
    np.testing.assert_allclose(float(line.split()[2]), w_mean[1, 0], rtol=1e-3)
    table = api.summary()
    np.testing.assert_allclose(table.loc["W[b, 0]", "mean"], w_mean[1, 0], rtol=1e-12)
    np.testing.assert_allclose(table.loc["W[a, 1]", "mean"], w_mean[0, 1], rtol=1e-12)


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
    assert tree.attrs["model"] == "fa"


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
                        types.SimpleNamespace(compare_n_components=compare_n_components))
    out, plot = tmp_path / "table.csv", tmp_path / "elpd.png"
    argv = ["compare", str(csv), "--n-components", "1:3", "--model", "fa", "--cv", "4", "--seed", "9",
            "--chains", "2", "--draws", "30", "--warmup", "20", "--out", str(out), "--plot", str(plot),
            "--no-progress"]
    assert main(argv) == 0
    ((X, ks, kwargs),) = calls
    np.testing.assert_array_equal(X.to_numpy(), frame.to_numpy())
    assert ks == [1, 2, 3]
    assert kwargs == {"model": "fa", "cv": 4, "random_state": 9, "progress_bar": False,
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
