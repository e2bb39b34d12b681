"""Test-session set-up."""

import os
import tempfile

# Compiled programs go to a cache of the test session, never to the user's own cache
# directory (bayespca.cache); subprocesses started by the tests inherit it.
os.environ.setdefault("BAYESPCA_CACHE_DIR", tempfile.mkdtemp(prefix="bayespca-test-cache-"))

# Import numpyro.distributions before any test module is collected. When it was
# first imported while the NUTS tests were being collected, numpyro's own lookups
# of the attribute numpyro.distributions.distribution (numpyro.factor, NUTS set-up)
# failed later in the session with AttributeError; the root cause is not known yet.
import numpyro.distributions  # noqa: E402, F401
