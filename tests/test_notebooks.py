"""The notebooks in notebooks/: stored executed and current, and each runs top to bottom (small mode).

Stored outputs are what a visitor sees on the code host and in the
documentation, so every notebook is kept executed (``make notebooks``, i.e.
tools/run_notebooks.py, in small mode). "Current" is defined by the code: when a
notebook is executed, the SHA-256 of its code cells is stored in its
metadata (``metadata.bayespca.code_sha256``); the stored outputs are current
when that hash equals the hash of the code cells now. This catches the usual
way outputs go stale (a code cell edited and saved without running) and
stays stable across machines, unlike a comparison of the outputs themselves
(NUTS draws, timings and floating-point digits differ between machines and
library versions). A change of the library that changes the numbers is not
seen by the hash: ``make notebooks`` is rerun before a release for that.

Each notebook also runs here in a fresh kernel: this interpreter (a
kernelspec written into tmp_path), importing this checkout (PYTHONPATH),
with BAYESPCA_NOTEBOOK_SMALL=1 selecting the small data and short NUTS runs
where a notebook's full run would take minutes (notebooks on small data, 02
and 03, run the same either way, at NUTS's default settings).
The notebooks check their own numbers against independent references
(scikit-learn, the generating truth, closed forms) and print them; a
notebook fails if any cell raises or runs past the cell timeout.
"""

import os
import sys
from pathlib import Path

import ipykernel  # noqa: F401 - the kernel the notebooks run in
import nbclient
import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from run_notebooks import KERNEL, code_hash, kernel_folder  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # a NUTS cell takes ~30 s on a loaded 2-core machine


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A kernelspec for this interpreter, found through JUPYTER_PATH, and the notebook environment."""
    folder = kernel_folder(tmp_path)
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join([str(folder), os.environ.get("JUPYTER_PATH", "")]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("BAYESPCA_NOTEBOOK_SMALL", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)


def test_notebooks_found():
    assert len(NOTEBOOKS) >= 6, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_executed_and_current(path):
    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    # Executed in order from a fresh kernel: execution counts 1, 2, 3, ...
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), (
        f"{path.name} is not stored executed top to bottom: run `make notebooks`")
    stored = nb.metadata.get("bayespca", {})
    assert stored.get("small") is True, f"{path.name}: outputs not from the small mode: run `make notebooks`"
    assert stored.get("code_sha256") == code_hash(nb), (
        f"{path.name}: code changed since its outputs were stored: run `make notebooks`")
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert not errors, f"{path.name} was stored with an error output"
    # No absolute path of this machine in what a visitor reads (e.g. a warning's source file).
    text = "".join(o.get("text", "") for cell in code for o in cell.outputs if o.output_type == "stream")
    assert str(ROOT) not in text and "site-packages" not in text, f"{path.name} shows a local path"
    # No stored widget (a progress bar): without its state a reader sees only its first text, "0%".
    widgets = [o for cell in code for o in cell.outputs
               if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert not widgets, f"{path.name} stores {len(widgets)} widget outputs: run `make notebooks`"


def test_code_hash_sees_code_not_markdown():
    cells = [nbformat.v4.new_markdown_cell("# a"), nbformat.v4.new_code_cell("x = 1")]
    nb = nbformat.v4.new_notebook(cells=cells)
    before = code_hash(nb)
    nb.cells[0].source = "# b"
    assert code_hash(nb) == before
    nb.cells[1].source = "x = 2"
    assert code_hash(nb) != before


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, kernel_env):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
