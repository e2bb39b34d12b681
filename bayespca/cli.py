"""The ``bayespca`` command: fit a model to a CSV file, compare numbers of components, run a demo.

::

    bayespca fit data.csv --model ppca --n-components 3 --method nuts --out fit.nc
    bayespca compare data.csv --n-components 1:6
    bayespca demo --out report/ --small

The CSV file has a header row of feature names and one numeric column per
feature (an empty cell or ``NA`` is a missing value, which EM, SVI and NUTS
handle); a first column with an empty header holds row names and is not
data (as written by R's ``write.csv`` or pandas' ``to_csv``).
A file that cannot be read as such (missing, empty, ragged, non-numeric)
stops the command with a one-line message on stderr and exit status 2, the
status argparse gives to every other usage error.

``fit`` writes the model as an ArviZ DataTree in netCDF: for NUTS the
posterior, sample statistics, pointwise log-likelihood and observed data,
plus a ``point_estimate`` group (the posterior mean of ``W``, the noise and
``mu``); for maximum-likelihood methods the ``point_estimate`` group alone.
The root attributes record the model, method, seed and sampler settings.
Read it back with ``xarray.open_datatree(path)``.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["main"]

_MODELS = {"ppca": "PPCA", "fa": "FactorAnalysis"}
_PRIORS = {"default": None, "flat": "flat", "ard": "ard"}
# pandas 3 parses floats exactly and deprecates the option that older versions need for it.
_EXACT_FLOATS = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}


class CLIError(Exception):
    """A usage error reported as one line on stderr with exit status 2."""


# ------------------------------------------------------------------- input
def read_csv(path) -> pd.DataFrame:
    """Read a numeric CSV file with a header row; raise CLIError saying what is wrong.

    Floats are parsed exactly (pandas >= 3 always does; older pandas is asked
    for ``float_precision="round_trip"``), so a file written by
    ``DataFrame.to_csv`` gives back the very same numbers and the command fits
    the same data as the Python API.
    """
    path = Path(path)
    if not path.is_file():
        raise CLIError(f"data file {str(path)!r} does not exist or is not a file")
    try:
        df = pd.read_csv(path, **_EXACT_FLOATS)
    except pd.errors.EmptyDataError:
        raise CLIError(f"data file {str(path)!r} is empty: expected a header row and numeric rows") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        detail = " ".join(str(err).split())
        raise CLIError(f"data file {str(path)!r} is not a well-formed CSV file: {detail}") from None
    if df.shape[0] == 0:
        raise CLIError(f"data file {str(path)!r} has a header but no data rows")
    if str(df.columns[0]).startswith("Unnamed: 0"):
        # An empty first header cell marks row names (R's write.csv, pandas' to_csv with its index).
        df = df.set_index(df.columns[0]).rename_axis(None)
        if df.shape[1] == 0:
            raise CLIError(f"data file {str(path)!r} has row names but no data columns")
    for column in df.columns:
        if pd.api.types.is_bool_dtype(df[column]) or not pd.api.types.is_numeric_dtype(df[column]):
            values = pd.to_numeric(df[column], errors="coerce")
            bad = np.flatnonzero(values.isna() & df[column].notna())
            if bad.size or pd.api.types.is_bool_dtype(df[column]):
                row = int(bad[0]) if bad.size else 0
                raise CLIError(
                    f"data file {str(path)!r}: column {column!r} is not numeric "
                    f"(line {row + 2} holds {df[column].iloc[row]!r}); every column must hold numbers"
                )
            df[column] = values
    return df.astype(float)


def _error(message: str) -> int:
    print(f"bayespca: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def _progress_default() -> bool:
    return sys.stderr.isatty()


# --------------------------------------------------------------------- fit
def _estimator(args, n_components):
    import bayespca

    cls = getattr(bayespca, _MODELS[args.model])
    options = {
        "method": args.method,
        "random_state": args.seed,
        "progress_bar": args.progress,
        "prior": _PRIORS[args.prior],
        "num_chains": args.chains,
        "num_samples": args.draws,
        "num_warmup": args.warmup,
    }
    if args.model == "fa":
        options["rotation"] = args.rotation
    elif args.rotation is not None:
        raise CLIError(f"--rotation {args.rotation} needs --model fa (got --model {args.model})")
    return cls(n_components, **options)


def point_estimate_tree(model, feature_names):
    """The fitted ``W`` (``loadings_``), noise and ``mu`` as an xarray DataTree group ``point_estimate``."""
    import xarray as xr

    d, k = model.loadings_.shape
    coords = {"feature": list(feature_names), "component": list(range(k))}
    data = {
        "W": (("feature", "component"), np.asarray(model.loadings_)),
        "mu": (("feature",), np.asarray(model.mean_)),
    }
    if np.ndim(model.noise_variance_) == 1:
        data["psi"] = (("feature",), np.asarray(model.noise_variance_))
    else:
        data["sigma2"] = ((), float(model.noise_variance_))
    group = xr.Dataset(data, coords=coords, attrs={"log_likelihood": float(model.log_likelihood_)})
    return xr.DataTree(group, name="point_estimate")


def _datatree(model, args, feature_names):
    import xarray as xr

    import bayespca

    point = point_estimate_tree(model, feature_names)
    if getattr(model, "nuts_", None) is not None:
        tree = model.posterior_.copy()
        tree["point_estimate"] = point
    else:
        tree = xr.DataTree(children={"point_estimate": point})
    tree.attrs.update(
        {
            "model": args.model,
            "method": model.method_,
            "n_components": int(model.n_components_),
            "seed": -1 if args.seed is None else int(args.seed),
            "prior": args.prior,
            "num_chains": int(args.chains),
            "num_samples": int(args.draws),
            "num_warmup": int(args.warmup),
            "data_file": os.path.basename(str(args.data)),
            "bayespca_version": bayespca.__version__,
        }
    )
    return tree


def _summary(model, feature_names) -> pd.DataFrame:
    if getattr(model, "nuts_", None) is not None:
        return model.summary()
    k = model.n_components_
    table = pd.DataFrame(model.loadings_, index=list(feature_names), columns=[f"W[{j}]" for j in range(k)])
    table["noise"] = np.broadcast_to(model.noise_variance_, (len(table),))
    table["mu"] = model.mean_
    return table


def _fit(args) -> int:
    df = read_csv(args.data)
    model = _estimator(args, args.n_components)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.fit(df)
        except (ValueError, TypeError) as err:
            raise CLIError(str(err)) from None
    names = [str(c) for c in df.columns]
    print(f"{_MODELS[args.model]} with {model.n_components_} components by {model.method_} "
          f"on {df.shape[0]} rows x {df.shape[1]} features of {args.data}")
    print(f"log-likelihood of the data: {model.log_likelihood_:.6g}")
    with pd.option_context("display.width", 120, "display.max_rows", 200):
        print(_summary(model, names).to_string())
    for w in caught:
        # The sampler's and estimators' advice (SamplingWarning, Heywood cases), not library deprecations.
        if issubclass(w.category, UserWarning):
            print(f"warning: {' '.join(str(w.message).split())}", file=sys.stderr)
    if args.out is not None:
        _datatree(model, args, names).to_netcdf(args.out, engine="h5netcdf")
        print(f"wrote {args.out}")
    return 0


# ----------------------------------------------------------------- compare
def parse_components(text: str) -> list[int]:
    """``"1:6"`` (inclusive, as in R), ``"2,3,5"`` or ``"4"`` -> a list of ints >= 1."""
    try:
        if ":" in text:
            lo, hi = (int(part) for part in text.split(":"))
            ks = list(range(lo, hi + 1))
        else:
            ks = [int(part) for part in text.split(",")]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a range like 1:6, a list like 1,2,4 or one int >= 1; got {text!r}"
        )
    return ks


def _compare(args) -> int:
    df = read_csv(args.data)
    from bayespca.comparison import compare_n_components

    fit_kwargs = {"num_chains": args.chains, "num_samples": args.draws, "num_warmup": args.warmup}
    try:
        result = compare_n_components(
            df,
            n_components=args.n_components,
            model=args.model,
            cv=args.cv,
            random_state=args.seed,
            progress_bar=args.progress,
            **fit_kwargs,
        )
    except (ValueError, TypeError) as err:
        raise CLIError(str(err)) from None
    with pd.option_context("display.width", 160, "display.max_columns", 30):
        print(result.table.to_string())
    print(f"recommended n_components = {result.n_components} ({result.rule})")
    if args.out is not None:
        result.table.to_csv(args.out)
        print(f"wrote {args.out}")
    if args.plot is not None:
        from bayespca.plotting import plot_comparison

        plot_comparison(result).figure.savefig(args.plot, dpi=120, bbox_inches="tight")
        print(f"wrote {args.plot}")
    return 0


# -------------------------------------------------------------------- demo
def _demo(args) -> int:
    from bayespca.demo import run_demo

    folder = run_demo(args.out, small=args.small, random_state=args.seed, progress=args.progress)
    print(folder)
    return 0


# ------------------------------------------------------------------ parser
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1; got {text!r}")
    return value


def _add_sampler_options(parser):
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--chains", type=_positive_int, default=4, help="NUTS chains (default 4)")
    parser.add_argument("--draws", type=_positive_int, default=500, help="NUTS draws per chain (default 500)")
    parser.add_argument("--warmup", type=_positive_int, default=500,
                        help="NUTS warm-up steps per chain (default 500)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=_progress_default(),
                        help="progress bars (default: when stderr is a terminal)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``bayespca`` command."""
    import bayespca

    parser = argparse.ArgumentParser(
        prog="bayespca",
        description="PCA, probabilistic PCA and factor analysis as a Bayesian workflow.",
    )
    parser.add_argument("--version", action="version", version=f"bayespca {bayespca.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{fit,compare,demo}")

    fit = sub.add_parser("fit", help="fit pPCA or factor analysis to a CSV file",
                         description="Fit pPCA or factor analysis to a CSV file; print a summary.")
    fit.add_argument("data", help="CSV file: a header row, then one numeric column per feature")
    fit.add_argument("--model", choices=sorted(_MODELS), default="ppca",
                     help="ppca (probabilistic PCA) or fa (factor analysis); default ppca")
    fit.add_argument("--n-components", type=_positive_int, default=None, metavar="K",
                     help="number of components (default: the estimator's)")
    fit.add_argument("--method", choices=["nuts", "svi", "em", "closed_form"], default="nuts",
                     help="nuts: the posterior; svi, em, closed_form (ppca only): point estimates; "
                     "default nuts")
    fit.add_argument("--prior", choices=sorted(_PRIORS), default="default",
                     help="priors of svi/nuts: default (scale-aware), flat, or ard (Bayesian PCA)")
    fit.add_argument("--rotation", choices=["varimax", "quartimax", "promax", "oblimin"], default=None,
                     help="rotation of the factors (--model fa)")
    fit.add_argument("--out", default=None, help="write the fit as an ArviZ DataTree in netCDF (e.g. fit.nc)")
    _add_sampler_options(fit)
    fit.set_defaults(run=_fit)

    compare = sub.add_parser("compare", help="compare numbers of components (PSIS-LOO and more)",
                             description="Compare numbers of components by PSIS-LOO, "
                             "cross-validation and the classical criteria.")
    compare.add_argument("data", help="CSV file: a header row, then one numeric column per feature")
    compare.add_argument("--n-components", type=parse_components, default=parse_components("1:6"),
                         help="candidates: a range like 1:6 (inclusive), a list like 1,2,4 (default 1:6)")
    compare.add_argument("--model", choices=sorted(_MODELS), default="ppca", help="default ppca")
    compare.add_argument("--cv", type=_positive_int, default=5, help="cross-validation folds (default 5)")
    compare.add_argument("--out", default=None, help="write the comparison table as CSV")
    compare.add_argument("--plot", default=None, help="write the elpd-against-k plot (PNG)")
    _add_sampler_options(compare)
    compare.set_defaults(run=_compare)

    demo = sub.add_parser("demo", help="run the whole workflow on the wine data; write a report",
                          description="Run the workflow (choosing k, PCA, Bayesian pPCA by NUTS, factor "
                          "analysis, kernel PCA) on scikit-learn's wine data and write plots and tables.")
    demo.add_argument("--out", default="bayespca-demo", help="report folder (default ./bayespca-demo)")
    demo.add_argument("--small", action="store_true", help="short chains: a quick run")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--progress", action=argparse.BooleanOptionalAction, default=_progress_default(),
                      help="progress bar (default: when stderr is a terminal)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv=None) -> int:
    """Run the ``bayespca`` command with the arguments ``argv`` (default ``sys.argv[1:]``).

    Returns the exit status: 0 on success, 2 for unusable input (argparse
    itself exits with 2 on malformed arguments).

    Examples
    --------
    >>> main(["fit", "no-such-file.csv"])
    2
    """
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except CLIError as err:
        return _error(str(err))
