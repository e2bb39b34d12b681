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


_CROWDED = """
import json
import jax
import numpy as np
import bayespca.cache as cache
import bayespca.inference.nuts  # JAX and NumPyro loaded: their own maps are not compiled programs
from bayespca import PPCA

compiles = []
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kw: compiles.append(event) if event == BACKEND_COMPILE else None
)
X = np.random.default_rng(0).normal(size=(60, 4))

def fit(method):
    model = PPCA(1, method=method, num_warmup=20, num_samples=20, num_chains=1, random_state=0,
                 progress_bar=False).fit(X)
    return np.ravel(model.noise_variance_samples_ if method == "nuts" else model.noise_variance_).tolist()

out = {"loaded": cache._maps_in_use()}
first = fit("nuts")
out["compiled"] = cache._maps_in_use()
real_limit = cache._map_limit
for method in ("nuts", "svi"):
    reference = fit(method)
    count = len(compiles)
    again = fit(method)
    out[method + " compiles again"] = len(compiles) - count
    cache._map_limit = lambda: 2  # as if the process held half of its memory maps
    if method == "nuts":
        out["released"] = cache.release_compiled_programs()
        out["after release"] = cache._maps_in_use()
    count = len(compiles)
    crowded = fit(method)
    out[method + " compiles crowded"] = len(compiles) - count
    cache._map_limit = real_limit
    out[method + " same draws"] = reference == again == crowded
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path("/proc/sys/vm/max_map_count").exists(), reason="a limit of Linux")
def test_a_crowded_process_releases_its_compiled_programs_and_fits_the_same():
    import json

    env = {**os.environ, CACHE_ENV: "off"}  # every program compiled again, none read back
    done = subprocess.run([sys.executable, "-c", _CROWDED], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # The premise, read from the kernel's own count: compiled programs hold memory maps.
    added = out["compiled"] - out["loaded"]
    assert added > 100, out
    # Released, they give most of them back (one NUTS configuration at d = 20 held ~1000,
    # and ~60 of them crashed a process at Linux's default limit of 65530).
    assert out["released"] and out["after release"] - out["loaded"] < added / 2, out
    for method in ("nuts", "svi"):
        assert out[method + " compiles again"] == 0, out  # not crowded: the programs are kept
        assert out[method + " compiles crowded"] > 0, out  # crowded: the fit released them first
        assert out[method + " same draws"], out
