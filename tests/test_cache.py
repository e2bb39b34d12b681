"""The persistent compilation cache: a second process finds the first one's compiled sampler."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bayespca.cache import CACHE_ENV, cache_directory

_FIT = """
import json, sys
import jax.monitoring
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name))
import numpy as np
from bayespca import PPCA
X = np.random.default_rng(0).normal(size=(60, 4))
PPCA(1, method="nuts", num_warmup=20, num_samples=20, num_chains=1, random_state=0).fit(X)
print(json.dumps({"hits": hits.count("/jax/compilation_cache/cache_hits"),
                  "misses": hits.count("/jax/compilation_cache/cache_misses")}))
"""


def _run(cache: Path) -> dict:
    import json

    env = {**os.environ, CACHE_ENV: str(cache)}
    done = subprocess.run([sys.executable, "-c", _FIT], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _entries(cache: Path) -> set:
    return {p.name for p in cache.rglob("*") if p.is_file()}


def test_second_process_reads_the_compiled_sampler_from_the_cache(tmp_path):
    first = _run(tmp_path)
    stored = _entries(tmp_path)
    assert first["misses"] > 0 and stored, "the first process compiles and stores its programs"
    second = _run(tmp_path)
    # Same configuration, new process: every program the first one stored is read back.
    # (Which programs are stored depends on how long they took to compile, hence on the
    # machine's load: compare with what is there, not with a fixed list.)
    programs = [name for name in stored if name.endswith("-cache")]
    assert programs and any(name.startswith("jit__advance") for name in programs)
    assert second["hits"] >= len(programs)


@pytest.mark.parametrize("value", ["off", "0", ""])
def test_the_environment_variable_turns_the_cache_off(monkeypatch, value):
    monkeypatch.setenv(CACHE_ENV, value)
    assert cache_directory() is None


def test_the_environment_variable_moves_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "here"))
    assert cache_directory() == tmp_path / "here"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert cache_directory() == tmp_path / "bayespca" / "jax"
