"""The persistent compilation cache: a second process finds the first one's compiled sampler."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bayespca.cache import CACHE_ENV, cache_directory

_FIT = """
import json, logging
import jax
import numpy as np
from bayespca import PPCA
import bayespca.inference.nuts  # turns the cache on
# Every program is stored, however fast this machine compiled it (the default threshold
# would make what is stored depend on the load).
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
hits = []
class Hits(logging.Handler):
    def emit(self, record):
        if record.msg.startswith("Persistent compilation cache hit"):
            hits.append(record.args[1])
logger = logging.getLogger("jax._src.compiler")
logger.setLevel(logging.DEBUG)
logger.addHandler(Hits())
X = np.random.default_rng(0).normal(size=(60, 4))
PPCA(1, method="nuts", num_warmup=20, num_samples=20, num_chains=1, random_state=0).fit(X)
print(json.dumps({"hits": hits}))
"""


def _run(cache: Path, hash_seed: int) -> dict:
    import json

    env = {**os.environ, CACHE_ENV: str(cache), "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run([sys.executable, "-c", _FIT], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _entries(cache: Path) -> set:
    return {p.name for p in cache.rglob("*") if p.is_file()}


def test_second_process_reads_the_compiled_sampler_from_the_cache(tmp_path):
    # Two string hash seeds, as two processes of a user have: NumPyro's parameter order follows it.
    first = _run(tmp_path, 0)
    stored = _entries(tmp_path)
    second = _run(tmp_path, 1)
    # Same configuration, new process: the sampler's programs, compiled and stored by the
    # first process, are read back by the second instead of compiled.
    sampler = {name[: -len("-cache")] for name in stored if name.startswith(("jit__advance", "jit__start"))}
    assert sampler, f"no sampler program stored; first process read {len(first['hits'])} from the cache"
    assert sampler <= set(second["hits"])


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
