"""Execute the notebooks in small mode and store them with their outputs (``make notebooks``).

    python tools/run_notebooks.py                 # every notebooks/*.ipynb, in place
    python tools/run_notebooks.py notebooks/03_bayesian_workflow.ipynb

Each notebook runs top to bottom in a fresh kernel of this interpreter
(a kernelspec written to a temporary folder), importing this checkout, with
``BAYESPCA_NOTEBOOK_SMALL=1``: the outputs a visitor sees on the code host
and in the documentation are those of the small mode. The notebook is then
written back with

- its outputs, without execution timestamps (a rerun changes only what the
  code printed) and without the progress bars' widgets (a stored widget
  shows only its text at creation, "0%", and has no state to render), and
- ``metadata["bayespca"] = {"code_sha256": ..., "small": true}``, the hash
  of its code cells (:func:`code_hash`), which tests/test_notebooks.py
  compares with the code as it is now: a notebook whose code was edited
  after its outputs were stored fails that test until this is rerun.

A notebook that raises is reported and left unchanged on disk; the exit
status is then 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = "bayespca-notebooks"
CELL_TIMEOUT_S = 600


def code_hash(nb) -> str:
    """SHA-256 of the notebook's code cells (their sources in order, as JSON).

    Only code decides what the outputs are; markdown and metadata may change
    without making the stored outputs stale.
    """
    sources = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def drop_widgets(nb) -> None:
    """Remove the outputs that display widgets (the progress bars), in place."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [out for out in cell.outputs
                            if "application/vnd.jupyter.widget-view+json" not in out.get("data", {})]


def kernel_folder(folder: Path) -> Path:
    """Write a kernelspec for this interpreter under ``folder``; return the folder for JUPYTER_PATH."""
    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec_json = {"argv": argv, "display_name": KERNEL, "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(spec_json))
    return folder


def execute(path: Path) -> None:
    """Run ``path`` in a fresh kernel (small mode) and store it with outputs and its code hash."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL, record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    drop_widgets(nb)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nb.metadata["bayespca"] = {"code_sha256": code_hash(nb), "small": True}
    # The stored kernel is the generic one a visitor has, not this script's temporary spec.
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nbformat.write(nb, path)


def main(paths) -> int:
    paths = [Path(p) for p in paths] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    failed = []
    with tempfile.TemporaryDirectory() as folder:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([str(kernel_folder(Path(folder))),
                                                      os.environ.get("JUPYTER_PATH", "")])
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        os.environ["BAYESPCA_NOTEBOOK_SMALL"] = "1"
        os.environ.pop("MPLBACKEND", None)
        for path in paths:
            start = time.perf_counter()
            try:
                execute(path)
            except Exception as err:  # report every notebook that fails, not only the first
                failed.append(path.name)
                print(f"{path.name}: FAILED: {type(err).__name__}: {' '.join(str(err).split())[:300]}")
                continue
            print(f"{path.name}: executed in {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
