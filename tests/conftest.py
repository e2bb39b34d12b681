"""Test-session set-up."""

import atexit
import gc
import os
import shutil
import sys
import tempfile

import pytest

# Compiled programs go to a cache of the test session, never to the user's own cache
# directory (bayespca.cache); subprocesses started by the tests inherit it. Removed at exit.
if "BAYESPCA_CACHE_DIR" not in os.environ:
    os.environ["BAYESPCA_CACHE_DIR"] = tempfile.mkdtemp(prefix="bayespca-test-cache-")
    atexit.register(shutil.rmtree, os.environ["BAYESPCA_CACHE_DIR"], ignore_errors=True)

# Import numpyro.distributions before any test module is collected. When it was
# first imported while the NUTS tests were being collected, numpyro's own lookups
# of the attribute numpyro.distributions.distribution (numpyro.factor, NUTS set-up)
# failed later in the session with AttributeError; the root cause is not known yet.
import numpyro.distributions  # noqa: E402, F401


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module.

    Each compiled program holds ~60 memory maps; one process running the whole
    suite compiles thousands (every model, shape and option the tests cover) and
    would reach the kernel's limit on maps (vm.max_map_count, 65530), where XLA
    aborts. A user's session compiles per configuration, not per test.
    """
    yield
    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
        gc.collect()


@pytest.fixture
def backend_compiles():
    """A context manager recording JAX's backend compilations inside it (one entry each).

    JAX's public monitoring events report each XLA compilation; a test of
    "nothing compiled again" asserts the list stays empty.
    """
    import contextlib

    import jax

    @contextlib.contextmanager
    def record():
        seen = []

        def listen(name, secs, **kwargs):
            if name == "/jax/core/compile/backend_compile_duration":
                seen.append(secs)

        jax.monitoring.register_event_duration_secs_listener(listen)
        try:
            yield seen
        finally:
            jax.monitoring.unregister_event_duration_listener(listen)

    return record
