"""Every code block of README.md runs as written.

- ``python`` blocks run in order in one namespace, as a reader pastes them
  into one session (the workflow block uses the ``X`` of the quickstart).
  Blocks written as doctests (``>>>``) are run for their definitions here;
  their printed values are checked by pytest's ``--doctest-glob=README.md``.
- ``bash`` blocks of ``bayespca`` commands run line by line in a temporary
  folder, with this interpreter's ``bin`` first on PATH, and must exit 0
  without a traceback; the files their ``--out``/``--plot`` name must exist.
- ``bash`` blocks of ``make`` targets are checked with ``make -n`` (a dry
  run: the target exists and expands); running them would rerun this suite.
"""

import doctest
import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(language):
    return [body for lang, body in BLOCK.findall((ROOT / "README.md").read_text()) if lang == language]


def _commands(body):
    """The non-empty lines of a shell block, comments removed."""
    lines = [line.split("  #")[0].strip() for line in body.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_readme_has_the_blocks_this_test_reads():
    assert len(_blocks("python")) >= 3 and len(_blocks("bash")) >= 3
    assert set(lang for lang, _ in BLOCK.findall((ROOT / "README.md").read_text())) <= {"python", "bash"}


def test_python_blocks_run_in_order_in_one_session():
    namespace = {"__name__": "readme"}
    parser = doctest.DocTestParser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sampler diagnostics of the short chains the README shows
        for body in _blocks("python"):
            if ">>>" in body:
                for example in parser.get_examples(body):
                    exec(compile(example.source, "README.md", "exec"), namespace)
            else:
                exec(compile(body, "README.md", "exec"), namespace)
    # The workflow block ran on the quickstart's iris X and produced what it names.
    assert namespace["X"].shape == (150, 4)
    assert namespace["post"].n_components_ == 2
    assert list(namespace["result"].table.index) == [1, 2, 3]


def _is_make(body):
    return all(command.startswith("make ") for command in _commands(body))


@pytest.mark.parametrize("body", [b for b in _blocks("bash") if _is_make(b)], ids=lambda b: "make")
def test_make_targets_exist(body):
    for command in _commands(body):
        target = command.split()[1]
        run = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"make {target}: {run.stderr}"


@pytest.mark.parametrize("body", [b for b in _blocks("bash") if not _is_make(b)], ids=lambda b: "shell")
def test_shell_blocks_run_as_written(body, tmp_path):
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
               PYTHONPATH=str(ROOT))
    for command in _commands(body):
        run = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, f"{command}\n{run.stderr[-3000:]}"
        assert "Traceback" not in run.stderr, run.stderr[-3000:]
        words = shlex.split(command)
        for option in ("--out", "--plot"):
            if option in words:
                assert (tmp_path / words[words.index(option) + 1]).exists(), (command, option)
