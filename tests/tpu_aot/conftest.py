"""Executables compiled for a TPU topology cannot be read back from JAX's persistent compilation
cache (tests/conftest.py sets one up): these tests compile without it, as `jaxserve compile-tpu`
does, and leave it as they found it."""
from __future__ import annotations

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def no_persistent_compilation_cache():
  previous = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", previous)
