"""Executables compiled for a TPU topology cannot be read back from JAX's persistent compilation
cache (tests/conftest.py sets one up): these tests compile without it, as `jaxserve compile-tpu`
does (the fixture is tests/conftest.py's no_persistent_compilation_cache)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _without_persistent_cache(no_persistent_compilation_cache):
  yield
