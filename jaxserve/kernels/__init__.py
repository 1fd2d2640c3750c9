"""Pallas kernels used by jaxserve. Each kernel ships a validated wrapper, a pure-jnp reference,
an interpret path and tests."""
