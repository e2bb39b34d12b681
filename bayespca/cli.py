"""The ``bayespca`` command: fit a model to a CSV file, compare numbers of components, run a demo.

::

    bayespca fit data.csv --model ppca --n-components 3 --method nuts --out fit.nc
    bayespca compare data.csv --n-components 1:6
    bayespca demo --out report/ --small

The CSV file has a header row of feature names and one numeric column per
feature (an empty cell or ``NA`` is a missing value, which EM, SVI and NUTS
handle); a first column with an empty header holds row names and is not
data (as written by R's ``write.csv`` or pandas' ``to_csv``). The delimiter
is sniffed from the first lines: comma, semicolon (then a decimal comma is
read as such) or tab.

Errors a user can fix (a file that cannot be read as such, an output path
that cannot be written, an option the model refuses) stop the command with
one line on stderr and exit status 2, the status argparse gives to every
other usage error; every output path is checked before any work. Output
files are written to a temporary name and moved into place when complete,
so an interrupted command leaves no half-written file. Any other error is an
internal one: one line and exit status 1, the traceback with ``--debug``.
Warnings of the fit (sampler diagnostics, Heywood cases, unidentified
models) are printed after the results, one line each, naming the command
line options that act on them and, for ``compare``, the ``k`` they are about.

``fit`` writes the model as an ArviZ DataTree in netCDF: for NUTS the
posterior, sample statistics, pointwise log-likelihood and observed data,
plus a ``point_estimate`` group (the posterior mean of ``W``, the noise and
``mu``); for maximum-likelihood methods the ``point_estimate`` group alone.
The root attributes record the model, method, seed and sampler settings
(a seed beyond the int64 range as its decimal string; for NUTS the target
acceptance used, which by default depends on the prior).
Read it back with ``xarray.open_datatree(path)``.

Importing this module loads no numerical library: ``bayespca --help``
answers at once, and each subcommand imports what it needs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

__all__ = [
    "CLIError",
    "atomic_output",
    "build_parser",
    "check_output",
    "check_output_folder",
    "format_warning",
    "main",
    "parse_components",
    "read_csv",
    "read_data",
]

_MODELS = {"ppca": "PPCA", "fa": "FactorAnalysis"}
_PRIORS = {"default": None, "flat": "flat", "ard": "ard", "horseshoe": "horseshoe"}
_PLOT_SUFFIXES = (".png", ".pdf", ".svg")
# The estimators' parameter names in advice, as the options of this command.
_OPTION_NAMES = {
    r"\btarget_accept_prob\b": "--target-accept",
    r"\bnum_samples\b": "--draws",
    r"\bnum_warmup\b": "--warmup",
    r"\bnum_chains\b": "--chains",
    r"\bprior='(\w+)'": r"--prior \1",
    r"\bprior=\.\.\.": "--prior ...",
    r"\bmethod='(\w+)'": r"--method \1",
    r"\bn_components\b": "--n-components",
    r"\bmax_refits\b": "--max-refits",
    r"\banchors\b": "--anchors",
    r"\bguide='(\w+)'": r"--guide \1",
    r"\bguide\b": "--guide",
}


class CLIError(Exception):
    """A usage error reported as one line on stderr with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the usage itself is one ``--help`` away)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _one_line(text) -> str:
    return " ".join(str(text).split())


# ------------------------------------------------------------------- input
def _dialect(path: Path) -> tuple[str, str]:
    """The (delimiter, decimal mark) of a CSV file, sniffed from its first lines."""
    import csv

    with open(path, encoding="utf-8", errors="replace", newline="") as file:
        sample = "".join(line for _, line in zip(range(20), file, strict=False))
    try:
        delimiter = csv.Sniffer().sniff(sample, delimiters=",;\t").delimiter
    except csv.Error:
        return ",", "."
    # Spreadsheets that separate by semicolons write decimal commas ("1,5;2,25").
    decimal = "," if delimiter == ";" and "," in sample.partition("\n")[2] else "."
    return delimiter, decimal


def read_csv(path):
    """Read a numeric CSV file with a header row; raise CLIError saying what is wrong.

    The delimiter (comma, semicolon, tab) is sniffed from the first lines and
    kept in ``DataFrame.attrs["delimiter"]``. Floats are parsed exactly (pandas
    >= 3 always does; older pandas is asked for ``float_precision="round_trip"``),
    so a file written by ``DataFrame.to_csv`` gives back the very same numbers
    and the command fits the same data as the Python API.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "eu.csv"
    >>> _ = path.write_text("a;b\\n1,5;2\\n3;4,25\\n")
    >>> frame = read_csv(path)
    >>> frame["a"].tolist(), frame["b"].tolist(), frame.attrs["delimiter"]
    ([1.5, 3.0], [2.0, 4.25], ';')
    """
    import numpy as np
    import pandas as pd

    exact = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}
    path = Path(path)
    if not path.is_file():
        raise CLIError(f"data file {str(path)!r} does not exist or is not a file")
    delimiter, decimal = _dialect(path)
    try:
        df = pd.read_csv(path, sep=delimiter, decimal=decimal, **exact)
    except pd.errors.EmptyDataError:
        raise CLIError(f"data file {str(path)!r} is empty: expected a header row and numeric rows") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise CLIError(f"data file {str(path)!r} is not a well-formed CSV file: {_one_line(err)}") from None
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
    df = df.astype(float)
    df.attrs["delimiter"] = delimiter
    if all(_is_number(name) for name in df.columns):
        warnings.warn(
            f"every header cell of {str(path)!r} is a number ({', '.join(map(str, df.columns[:3]))}, ...): "
            "they are read as feature names, not as a row of data; if the file has no header row, add one",
            UserWarning, stacklevel=2,
        )
    return df


def _is_number(text) -> bool:
    try:
        float(str(text).replace(",", "."))
    except ValueError:
        return False
    return True


OUT_OF_CORE = (".parquet", ".zarr")


def read_data(path):
    """The data of ``bayespca fit``: a CSV file (:func:`read_csv`), or out of core through Dask.

    ``.parquet`` (a file or a folder of parts) is read lazily by
    ``dask.dataframe.read_parquet``, ``.zarr`` (a 2-D array store) by
    ``dask.array.from_zarr`` (columns named ``x0``, ``x1``, ...): the fit
    then runs on the reduced statistics (:mod:`bayespca.chunked`) and the
    rows are never loaded at once.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import pandas as pd
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "data.parquet"
    >>> pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 5.0]}).to_parquet(path)
    >>> frame = read_data(path)
    >>> list(frame.columns), frame.compute()["b"].tolist()
    (['a', 'b'], [3.0, 5.0])
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in OUT_OF_CORE:
        return read_csv(path)
    if not path.exists():
        raise CLIError(f"data file {str(path)!r} does not exist")
    try:
        import dask.array as da
        import dask.dataframe as dd
    except ImportError:
        raise CLIError(f"reading {suffix} needs Dask: pip install 'bayespca[dask]'") from None
    try:
        if suffix == ".parquet":
            frame = dd.read_parquet(path)
        else:
            arr = da.from_zarr(str(path))
            if arr.ndim != 2:
                raise CLIError(f"data store {str(path)!r} holds a {arr.ndim}-D array; expected 2-D")
            frame = dd.from_dask_array(arr, columns=[f"x{j}" for j in range(arr.shape[1])])
    except CLIError:
        raise
    except Exception as err:  # the readers raise many types; say which file and why, in one line
        raise CLIError(f"data file {str(path)!r} could not be read as {suffix}: {_one_line(err)}") from None
    return frame


# ------------------------------------------------------------------ output
def _probe_writable(folder: Path, what: str) -> None:
    """Create and remove a file in ``folder``: the only test that also holds for root and read-only mounts."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise CLIError(f"{what}: cannot write in folder {str(folder)!r} ({err.strerror})") from None


def check_output(path, option: str, suffixes) -> Path | None:
    """Check before any work that ``path`` can be written: a known suffix, an existing writable folder.

    Returns ``path`` as a Path (None stays None); raises CLIError naming the
    option otherwise.

    Examples
    --------
    >>> check_output("no/such/folder/fit.nc", "--out", (".nc",))
    Traceback (most recent call last):
    ...
    bayespca.cli.CLIError: --out 'no/such/folder/fit.nc': folder 'no/such/folder' does not exist
    >>> check_output("fit.txt", "--out", (".nc",))
    Traceback (most recent call last):
    ...
    bayespca.cli.CLIError: --out 'fit.txt': expected a file name ending in .nc
    """
    if path is None:
        return None
    path = Path(path)
    what = f"{option} {str(path)!r}"
    if path.suffix.lower() not in suffixes:
        raise CLIError(f"{what}: expected a file name ending in {' or '.join(suffixes)}")
    if path.is_dir():
        raise CLIError(f"{what} is a folder; expected a file name")
    folder = path.parent
    if not folder.is_dir():
        state = "is not a folder" if folder.exists() else "does not exist"
        raise CLIError(f"{what}: folder {str(folder)!r} {state}")
    _probe_writable(folder, what)
    return path


def check_output_folder(path, option: str) -> Path:
    """Check before any work that the folder ``path`` exists and is writable, or can be created."""
    path = Path(path)
    what = f"{option} {str(path)!r}"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise CLIError(f"{what}: {str(existing)!r} is a file, not a folder")
    _probe_writable(existing, what)
    return path


@contextlib.contextmanager
def atomic_output(path):
    """Yield a temporary path next to ``path``; move it onto ``path`` when the block succeeds.

    The temporary file has ``path``'s suffix (writers infer the format from
    it) and is removed when the block raises, so ``path`` is either the
    complete new file or untouched.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "table.csv"
    >>> with atomic_output(target) as tmp:
    ...     _ = tmp.write_text("k,elpd\\n1,-3.5\\n")
    >>> target.read_text(), sorted(p.name for p in target.parent.iterdir())
    ('k,elpd\\n1,-3.5\\n', ['table.csv'])
    """
    path = Path(path)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(handle)
    tmp = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the result private
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------- warnings
def format_warning(message, *, options=True) -> str:
    """One line for a person: the options of this command named, the ``k`` said.

    A ``n_components=K:`` prefix (the comparison's) becomes ``k``.
    ``options=False`` keeps the estimators' parameter names (for ``demo``,
    which has no sampler options).

    Examples
    --------
    >>> format_warning("n_components=3: 2 divergent transitions.\\n Increase target_accept_prob (e.g. 0.99)")
    'warning (k=3): 2 divergent transitions. Increase --target-accept (e.g. 0.99)'
    """
    from bayespca.messages import MORE_DRAWS

    k = None
    text = _one_line(message).removesuffix(MORE_DRAWS)  # no estimator to continue from the command line
    prefix = re.match(r"n_components=(\d+):\s*", text)
    if prefix:
        k, text = int(prefix.group(1)), text[prefix.end():]
    return f"warning{'' if k is None else f' (k={k})'}: {_option_names(text) if options else text}"


def _option_names(text: str) -> str:
    """``text``, a message of the Python API, with the parameters that are options here named as such."""
    for pattern, option in _OPTION_NAMES.items():
        text = re.sub(pattern, option, text)
    return text


@contextlib.contextmanager
def _collected_warnings():
    """Record the user warnings raised in the block as ``(category, message)``, in order, once each.

    Other categories (deprecations of the libraries underneath) are not the
    command line user's to act on and are dropped.
    """
    seen: list[tuple] = []

    def record(message, category, filename, lineno, file=None, line=None):
        entry = (category, str(message))
        if issubclass(category, UserWarning) and entry not in seen:
            seen.append(entry)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        yield seen


def _print_warnings(lines) -> None:
    shown = []
    for line in lines:
        if line is not None and line not in shown:
            shown.append(line)
            print(f"bayespca: {line}", file=sys.stderr)


# --------------------------------------------------------------------- fit
def _anchor_indices(args, names) -> list[int] | None:
    """``--anchors``: comma-separated feature names of the data, or their 0-based column indices."""
    if args.anchors is None:
        return None
    if args.prior != "horseshoe":
        raise CLIError(f"--anchors needs --prior horseshoe (its anchors fix the rotation); got --prior "
                       f"{args.prior}")
    indices = []
    for item in (part.strip() for part in args.anchors.split(",")):
        if item in names:
            index = names.index(item)
        elif item.isdecimal() and int(item) < len(names):
            index = int(item)
        else:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise CLIError(f"--anchors: {item!r} is neither a feature of the data ({shown}) nor a "
                           f"column index in [0, {len(names)})")
        if index in indices:
            raise CLIError(f"--anchors: feature {names[index]!r} given twice; each component needs its own")
        indices.append(index)
    k = args.n_components
    if k is not None and len(indices) != k:
        raise CLIError(f"--anchors names {len(indices)} feature{'s' * (len(indices) != 1)}; --n-components "
                       f"{k} needs {k}, one a component")
    return indices


def _estimator(args, n_components, names):
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
        "target_accept_prob": args.target_accept,
        "anchors": _anchor_indices(args, names),
    }
    if args.guide is not None and args.method != "svi":
        raise CLIError(f"--guide {args.guide} needs --method svi (got --method {args.method})")
    if args.guide is not None:
        options["guide"] = args.guide
    if args.model == "fa":
        options["rotation"] = args.rotation
    elif args.rotation is not None:
        raise CLIError(f"--rotation {args.rotation} needs --model fa (got --model {args.model})")
    return cls(n_components, **options)


def point_estimate_tree(model, feature_names):
    """The fitted ``W`` (``loadings_``), noise and ``mu`` as an xarray DataTree group ``point_estimate``."""
    import numpy as np
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
            # netCDF attributes hold at most int64; any larger seed (the rule allows any size) as text.
            "seed": args.seed if args.seed < 2**63 else str(args.seed),
            "prior": args.prior,
            "num_chains": int(args.chains),
            "num_samples": int(args.draws),
            "num_warmup": int(args.warmup),
            "data_file": os.path.basename(str(args.data)),
            "bayespca_version": bayespca.__version__,
        }
    )
    if model.method_ == "nuts":  # the default differs by prior: the value used, not the option given
        tree.attrs["target_accept"] = float(model.target_accept_prob_)
    if getattr(model, "anchors_", None) is not None:
        tree.attrs["anchors"] = [int(p) for p in model.anchors_]
    return tree


_ESS_COLUMNS = ("ess_bulk", "ess_tail")


def _summary(model, feature_names):
    """The table printed after a fit: ArviZ's posterior summary (ESS as counts), or the ML estimates."""
    import numpy as np
    import pandas as pd

    if getattr(model, "nuts_", None) is not None:
        table = model.summary()
        for column in _ESS_COLUMNS:
            if column in table.columns:
                table[column] = table[column].round().astype("Int64")
        return table
    k = model.n_components_
    table = pd.DataFrame(model.loadings_, index=list(feature_names), columns=[f"W[{j}]" for j in range(k)])
    table["noise"] = np.broadcast_to(model.noise_variance_, (len(table),))
    table["mu"] = model.mean_
    return table


_WHERE = {
    "nuts": "at the posterior mean of (W, noise, mu)",
    "svi": "at the SVI estimate of (W, noise, mu)",
}


def _fit(args) -> int:
    out = check_output(args.out, "--out", (".nc",))
    with _collected_warnings() as caught:
        df = read_data(args.data)
        names = [str(c) for c in df.columns]
        model = _estimator(args, args.n_components, names)
        try:
            model.fit(df)
        except (ValueError, TypeError) as err:
            raise CLIError(_option_names(str(err))) from None
    import pandas as pd

    sep = getattr(df, "attrs", {}).get("delimiter", ",")
    read_as = "" if sep == "," else f" ({'tab' if sep == chr(9) else repr(sep)}-separated)"
    print(f"{_MODELS[args.model]} with {model.n_components_} components by {model.method_} "
          f"on {len(df)} rows x {len(names)} features of {args.data}{read_as}")
    where = _WHERE.get(model.method_, "at the maximum-likelihood estimate")
    print(f"log-likelihood of the data {where}: {model.log_likelihood_:.6g}")
    if getattr(model, "anchors_", None) is not None:
        print("anchors (feature p_l loads on components 0..l only): "
              + ", ".join(f"{names[p]} ({c})" for c, p in enumerate(model.anchors_)))
    with pd.option_context("display.width", 120, "display.max_rows", 200):
        print(_summary(model, names).to_string())
    _print_warnings([format_warning(message) for _, message in caught])
    if out is not None:
        with atomic_output(out) as tmp:
            _datatree(model, args, names).to_netcdf(tmp, engine="h5netcdf")
        print(f"wrote {out}")
    return 0


# ----------------------------------------------------------------- compare
def parse_components(text: str) -> list[int]:
    """``"1:6"`` (inclusive, as in R), ``"2,3,5"`` or ``"4"`` -> a list of ints >= 1.

    Examples
    --------
    >>> parse_components("1:4"), parse_components("2,5")
    ([1, 2, 3, 4], [2, 5])
    """
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


def _span(ks) -> str:
    """``[1, 2, 3, 4]`` -> ``"1..4"``, ``[2, 5]`` -> ``"2,5"``."""
    if len(ks) > 2 and ks == list(range(ks[0], ks[-1] + 1)):
        return f"{ks[0]}..{ks[-1]}"
    return ",".join(map(str, ks))


def _candidates(args, n: int, d: int) -> list[int]:
    """The k to compare: the user's, checked against the one rule, or the default clipped to it (said so)."""
    from bayespca.comparison import noiseless_candidates
    from bayespca.probabilistic import default_candidates, ledermann_bound, max_components

    model = "factor analysis" if args.model == "fa" else "pPCA"
    if args.n_components is None:
        ks = default_candidates(args.model, d)
        if ks != list(range(1, 7)):
            rule = f"k <= {d}" if args.model == "ppca" else f"the Ledermann bound k <= {ledermann_bound(d)}"
            print(f"comparing k = {_span(ks)}: the default 1:6 clipped to what {d} features allow "
                  f"({model}: {rule})")
        dropped = noiseless_candidates(ks, args.model, n, d)
        if dropped:
            ks = [k for k in ks if k not in dropped]
            print(f"comparing k = {_span(ks)}: k = {_span(dropped)} dropped, as {n} rows allow (exact LOO "
                  f"refits of {n - 1} rows leave pPCA with {n - 2} <= k < {d} no noise)")
    else:
        ks = sorted(set(args.n_components))
        upper = max_components(args.model, d)
        if ks[-1] > upper:
            raise CLIError(
                f"--n-components {_span(ks)}: {model} on {d} features allows k <= {upper}"
            )
    if len(ks) < 2:
        fa_only = " (above the Ledermann bound the fits warn that they are not identified)"
        beyond = fa_only if args.model == "fa" else ""
        raise CLIError(
            f"--n-components: {model} on {n} rows of {d} features leaves only k = {_span(ks)} to compare; "
            f"give at least two values{beyond}"
        )
    return ks


def _comparable(path):
    """The CSV data of ``bayespca compare``, at least 2 x 2."""
    if Path(path).suffix.lower() in OUT_OF_CORE:
        raise CLIError(f"compare reads CSV files; {str(path)!r} is for `bayespca fit` (out of core), "
                       "or for compare_n_components in Python on a Dask array")
    df = read_csv(path)
    for size, what in zip(df.shape, ("row", "column"), strict=True):
        if size < 2:
            raise CLIError(f"data file {str(path)!r} has {size} {what}{'s' * (size != 1)}: "
                           f"comparing k needs at least 2")
    return df


def _compare(args) -> int:
    out = check_output(args.out, "--out", (".csv",))
    plot = check_output(args.plot, "--plot", _PLOT_SUFFIXES)
    with _collected_warnings() as read:
        df = _comparable(args.data)
    n, d = df.shape
    ks = _candidates(args, n, d)
    from bayespca.comparison import DEFAULT_FOLDS, compare_n_components

    if args.cv is None and n < DEFAULT_FOLDS:
        print(f"cross-validating with {n} folds: the default {DEFAULT_FOLDS} clipped to the {n} rows "
              "(leave-one-out)")

    fit_kwargs = {"num_chains": args.chains, "num_samples": args.draws, "num_warmup": args.warmup}
    if args.prior != "default":
        fit_kwargs["prior"] = _PRIORS[args.prior]
    if args.target_accept is not None:
        fit_kwargs["target_accept_prob"] = args.target_accept
    if args.progress:
        print(f"fitting k = {_span(ks)} by NUTS: {args.chains} chains x ({args.warmup} warm-up + "
              f"{args.draws} draws) each", file=sys.stderr)
    with _collected_warnings() as caught:
        try:
            result = compare_n_components(
                df, n_components=ks, model=args.model, cv=args.cv, max_refits=args.max_refits,
                random_state=args.seed, progress_bar=args.progress, **fit_kwargs,
            )
        except (ValueError, TypeError) as err:
            raise CLIError(_option_names(str(err))) from None
    import pandas as pd

    with pd.option_context("display.width", 160, "display.max_columns", 30):
        print(result.table.to_string())
    print(f"recommended n_components = {result.n_components} ({result.rule})")
    _print_warnings([format_warning(message) for _, message in read + caught])
    if out is not None:
        with atomic_output(out) as tmp:
            result.table.to_csv(tmp)
        print(f"wrote {out}")
    if plot is not None:
        from bayespca.plotting import plot_comparison

        with atomic_output(plot) as tmp:
            plot_comparison(result).figure.savefig(tmp, dpi=120, bbox_inches="tight")
        print(f"wrote {plot}")
    return 0


# -------------------------------------------------------------------- demo
def _demo(args) -> int:
    folder = check_output_folder(args.out, "--out")
    from bayespca.demo import run_demo

    with _collected_warnings() as caught:
        folder = run_demo(folder, small=args.small, random_state=args.seed, progress=args.progress)
    print(folder)
    _print_warnings([format_warning(message, options=False) for _, message in caught])
    return 0


# ------------------------------------------------------------------ parser
def _int_at_least(low: int):
    """An argparse type: an int >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}; got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)


def _seed(text: str) -> int:
    """A seed by the package's one random_state rule (:func:`bayespca.params.check_seed`): an int >= 0."""
    from bayespca.params import check_seed

    try:
        return check_seed(int(text), "--seed")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 0 (of any size); got {text!r}") from None


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a probability in (0, 1), e.g. 0.95; got {text!r}")
    return value


def _progress_default() -> bool:
    return sys.stderr.isatty()


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--seed", type=_seed, default=0, help="random seed, an int >= 0 (default 0)")
    common.add_argument("--progress", action=argparse.BooleanOptionalAction, default=_progress_default(),
                        help="progress bars on stderr (default: when stderr is a terminal)")
    common.add_argument("--debug", action="store_true",
                        help="show the traceback of an internal error instead of one line")
    return common


def _sampler_options() -> argparse.ArgumentParser:
    sampler = argparse.ArgumentParser(add_help=False)
    sampler.add_argument("--prior", choices=list(_PRIORS), default="default",
                         help="priors of svi/nuts: default (scale-aware), flat, ard (Bayesian PCA) or "
                         "horseshoe (sparse loadings)")
    sampler.add_argument("--chains", type=_positive_int, default=4, help="NUTS chains (default 4)")
    sampler.add_argument("--draws", type=_positive_int, default=500,
                         help="NUTS draws per chain (default 500)")
    sampler.add_argument("--warmup", type=_positive_int, default=500,
                         help="NUTS warm-up steps per chain (default 500)")
    sampler.add_argument("--target-accept", type=_probability, default=None, metavar="P",
                         help="NUTS target acceptance probability; larger means smaller steps and fewer "
                         "divergences (default: the estimator's, 0.9, or 0.99 with --prior horseshoe)")
    return sampler


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``bayespca`` command (it imports no numerical library)."""
    import bayespca

    parser = _Parser(
        prog="bayespca",
        description="PCA, probabilistic PCA and factor analysis as a Bayesian workflow.",
    )
    parser.add_argument("--version", action="version", version=f"bayespca {bayespca.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{fit,compare,demo}",
                                parser_class=_Parser)
    common, sampler = _common_options(), _sampler_options()
    _add_fit_parser(sub, [sampler, common])
    _add_compare_parser(sub, [sampler, common])
    _add_demo_parser(sub, [common])
    return parser


def _add_fit_parser(sub, parents) -> None:
    """The ``fit`` subcommand: its options, and :func:`_fit` to run it."""
    fit = sub.add_parser("fit", parents=parents, help="fit pPCA or factor analysis to a CSV file",
                         description="Fit pPCA or factor analysis to a CSV file; print a summary.")
    fit.add_argument(
        "data",
        help="CSV file (a header row, then one numeric column per feature), or .parquet / .zarr "
        "(read out of core through Dask)",
    )
    fit.add_argument("--model", choices=sorted(_MODELS), default="ppca",
                     help="ppca (probabilistic PCA) or fa (factor analysis); default ppca")
    fit.add_argument("--n-components", type=_positive_int, default=None, metavar="K",
                     help="number of components (default: the estimator's)")
    fit.add_argument("--method", choices=["nuts", "svi", "em", "closed_form"], default="nuts",
                     help="nuts: the posterior; svi, em, closed_form (ppca only): point estimates; "
                     "default nuts")
    fit.add_argument("--rotation", choices=["varimax", "quartimax", "promax", "oblimin"], default=None,
                     help="rotation of the factors (--model fa)")
    fit.add_argument("--guide", choices=["delta", "normal", "lowrank"], default=None,
                     help="with --method svi: the posterior's approximation, delta (a point, the "
                     "default) or normal / lowrank (needed with --prior horseshoe)")
    fit.add_argument("--anchors", default=None, metavar="FEATURES",
                     help="with --prior horseshoe: one anchor feature per component, names or 0-based "
                     "column indices separated by commas; feature l loads on components 0..l only "
                     "(default: chosen from the maximum-likelihood loadings)")
    fit.add_argument("--out", default=None, help="write the fit as an ArviZ DataTree in netCDF (a .nc file)")
    fit.set_defaults(run=_fit)


def _add_compare_parser(sub, parents) -> None:
    """The ``compare`` subcommand: its options, and :func:`_compare` to run it."""
    compare = sub.add_parser("compare", parents=parents,
                             help="compare numbers of components (PSIS-LOO and more)",
                             description="Compare numbers of components by PSIS-LOO, "
                             "cross-validation and the classical criteria.")
    compare.add_argument("data", help="CSV file: a header row, then one numeric column per feature")
    compare.add_argument("--n-components", type=parse_components, default=None, metavar="KS",
                         help="candidates: a range like 1:6 (inclusive) or a list like 1,2,4 (default 1:6, "
                         "clipped to what the data allow: pPCA k <= features, factor analysis the "
                         "Ledermann bound)")
    compare.add_argument("--model", choices=sorted(_MODELS), default="ppca", help="default ppca")
    compare.add_argument("--cv", type=_int_at_least(2), default=None,
                         help="cross-validation folds (default 5, or one a row where there are fewer rows)")
    compare.add_argument("--max-refits", type=_int_at_least(0), default=10, metavar="N",
                         help="rows of each k whose Pareto k-hat is too high for PSIS-LOO are scored by "
                         "exact refits, at most N of them (default 10; 0: none)")
    compare.add_argument("--out", default=None, help="write the comparison table (a .csv file)")
    compare.add_argument("--plot", default=None,
                         help=f"write the elpd-against-k plot ({', '.join(_PLOT_SUFFIXES)})")
    compare.set_defaults(run=_compare)


def _add_demo_parser(sub, parents) -> None:
    """The ``demo`` subcommand: its options, and :func:`_demo` to run it."""
    demo = sub.add_parser("demo", parents=parents,
                          help="run the whole workflow on the wine data; write a report",
                          description="Run the workflow (choosing k, PCA, Bayesian pPCA by NUTS, factor "
                          "analysis, kernel PCA) on scikit-learn's wine data and write plots and tables.")
    demo.add_argument("--out", default="bayespca-demo", help="report folder (default ./bayespca-demo)")
    demo.add_argument("--small", action="store_true", help="short chains: a quick run")
    demo.set_defaults(run=_demo)


def main(argv=None) -> int:
    """Run the ``bayespca`` command with the arguments ``argv`` (default ``sys.argv[1:]``).

    Returns the exit status: 0 on success, 2 for unusable input (argparse
    itself exits with 2 on malformed arguments), 1 for an internal error
    (one line; its traceback with ``--debug``), 130 when interrupted.

    Examples
    --------
    >>> main(["fit", "no-such-file.csv"])
    2
    """
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except CLIError as err:
        print(f"bayespca: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bayespca: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout (e.g. ``| head``) left: nothing more to say; keep Python's own
        # flush at exit from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as err:
        if args.debug:
            raise
        print(f"bayespca: internal error: {type(err).__name__}: {_one_line(err)} "
              "(rerun with --debug for the traceback, and please report it)", file=sys.stderr)
        return 1
