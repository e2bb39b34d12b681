"""Sphinx configuration of the bayespca documentation.

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html``.
The notebooks in ``notebooks/`` (linked here as ``docs/notebooks``) are
stored executed in their small mode (``make notebooks``); the build renders
those stored outputs, so the pages show what the code host shows and the
build takes seconds. ``BAYESPCA_DOCS_EXECUTE=force`` executes them again
during the build (with ``BAYESPCA_NOTEBOOK_SMALL=1`` unless the environment
sets it).
"""

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The notebook kernels are subprocesses: they must import this checkout too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)
os.environ.setdefault("BAYESPCA_NOTEBOOK_SMALL", "1")

import bayespca  # noqa: E402

project = "bayespca"
author = "bayespca developers"
copyright = "2026, bayespca developers"  # noqa: A001 - the name Sphinx reads
version = release = bayespca.__version__

extensions = [
    "myst_nb",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "notebooks/README.md"]
templates_path = ["_templates"]

# API reference: one page per public object, generated from the docstrings.
autosummary_generate = True
autosummary_imported_members = False
autodoc_typehints = "none"
# Methods a class inherits from bayespca's own bases are documented on its page (PPCA's transform,
# summary, sample_more, ...); those of scikit-learn's bases and of tuples are not.
_FOREIGN_BASES = ("BaseEstimator", "ClassNamePrefixFeaturesOutMixin", "ClusterMixin", "DensityMixin",
                  "TransformerMixin", "_SetOutputMixin", "_MetadataRequester", "_HTMLDocumentationLinkMixin",
                  "tuple", "object")
autodoc_default_options = {"members": True, "inherited-members": ",".join(_FOREIGN_BASES)}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set[str] = set()

# MyST: $...$ and $$...$$ math, ::: fences, definition lists.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

nb_execution_mode = os.environ.get("BAYESPCA_DOCS_EXECUTE", "off")
nb_execution_timeout = 300
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

html_theme = "pydata_sphinx_theme"
html_title = f"bayespca {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path: list[str] = []


# Docstrings follow scikit-learn in naming fitted attributes bare, e.g.
# "shape (n_samples, n_components_)", which reads well in help() but is a
# hyperlink reference to reStructuredText. Escape such trailing underscores
# outside literals and roles before the docstring is parsed.
_LITERAL = re.compile(r"(``.*?``|:?[\w:]*`[^`]*`_{0,2})")
_TRAILING = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*[A-Za-z0-9])_(?![\w`])")


def _escape_trailing_underscores(app, what, name, obj, options, lines):
    for i, line in enumerate(lines):
        parts = _LITERAL.split(line)
        parts[::2] = [_TRAILING.sub(r"\1\\_", p) for p in parts[::2]]
        lines[i] = "".join(parts)


def setup(app):
    app.connect("autodoc-process-docstring", _escape_trailing_underscores)
