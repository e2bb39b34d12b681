"""Test-session set-up."""

# Import numpyro.distributions before any test module is collected. When it was
# first imported while the NUTS tests were being collected, numpyro's own lookups
# of the attribute numpyro.distributions.distribution (numpyro.factor, NUTS set-up)
# failed later in the session with AttributeError; the root cause is not known yet.
import numpyro.distributions  # noqa: F401
