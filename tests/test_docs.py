"""The documentation builds with Sphinx without a single warning.

``sphinx-build -W --keep-going`` in a subprocess (autosummary imports every
module; keeping that out of the test process keeps its state clean), writing
into tmp_path. The notebooks are rendered with their stored outputs, without
executing them (``BAYESPCA_DOCS_EXECUTE=off``, the default of docs/conf.py):
tests/test_notebooks.py runs them and checks that the stored outputs are
current.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import bayespca

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs")
    env = dict(os.environ, BAYESPCA_DOCS_EXECUTE="off", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
           "-d", str(out / "doctrees"), str(ROOT / "docs"), str(out / "html")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc, out / "html"


def test_build_has_no_warnings(built):
    proc, _ = built
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "WARNING" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr[-5000:]


def test_every_public_name_has_an_api_page(built):
    _, html = built
    names = [n for n in bayespca.__all__ if not n.startswith("_")]
    missing = [n for n in names if not (html / "generated" / f"bayespca.{n}.html").is_file()]
    assert not missing, f"no API page for {missing}: add them to docs/api.rst"


def test_every_notebook_is_rendered(built):
    _, html = built
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    missing = [n for n in notebooks if not (html / "notebooks" / f"{n}.html").is_file()]
    assert notebooks and not missing, f"notebooks not in the docs: {missing} (list them in docs/examples.md)"


def test_rendered_pages_show_no_local_path(built):
    # A warning printed with its source file would show this machine's folders to every reader.
    _, html = built
    shown = [p.name for p in html.rglob("*.html") if str(ROOT) in p.read_text(errors="replace")]
    assert not shown, f"pages showing {ROOT}: {shown}"
