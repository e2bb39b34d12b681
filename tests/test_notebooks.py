"""Every notebook in notebooks/ runs top to bottom (small mode) in a fresh kernel.

The kernel is this interpreter (a kernelspec written into tmp_path), it
imports this checkout (PYTHONPATH), and BAYESPCA_NOTEBOOK_SMALL=1 selects the
small data and short NUTS runs. The notebooks check their own numbers against
independent references (scikit-learn, the generating truth, closed forms) and
print them; here a notebook fails if any cell raises or runs past the cell
timeout. Notebooks are stored without outputs, which is checked first.
"""

import json
import os
import sys
from pathlib import Path

import ipykernel  # noqa: F401 - the kernel the notebooks run in
import nbclient
import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # a NUTS cell takes ~30 s on a loaded 2-core machine
KERNEL = "bayespca-test"


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A kernelspec for this interpreter, found through JUPYTER_PATH, and the notebook environment."""
    spec = tmp_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec_json = {"argv": argv, "display_name": KERNEL, "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(spec_json))
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join([str(tmp_path), os.environ.get("JUPYTER_PATH", "")]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("BAYESPCA_NOTEBOOK_SMALL", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)


def test_notebooks_found():
    assert len(NOTEBOOKS) >= 6, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, kernel_env):
    nb = nbformat.read(path, as_version=4)
    stored = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not stored, f"{path.name}: cells {stored} were saved with outputs; clear them before committing."
    switch = any("BAYESPCA_NOTEBOOK_SMALL" in c.source for c in nb.cells)
    assert switch, f"{path.name} does not read BAYESPCA_NOTEBOOK_SMALL"
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
