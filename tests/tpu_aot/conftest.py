"""Executables compiled for a TPU topology cannot be read back from JAX's persistent compilation
cache (tests/conftest.py sets one up): these tests compile without it, as `jaxserve compile-tpu`
does (the fixture is tests/conftest.py's no_persistent_compilation_cache). What a compile said of a
program (its memory and cost when it compiled) is kept instead in RESULT_CACHE, inside the run's
test cache (empty on a fresh clone unless JAXSERVE_TEST_XLA_CACHE keeps one): the compile tests pass
it to `build` / `compile_programs` (`compile-tpu --result-cache`), so a warm run compiles only the
programs that changed (jaxserve/tpu_aot/result_cache.py; its own test is test_result_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

RESULT_CACHE = Path(os.environ["JAXSERVE_TEST_XLA_CACHE"]) / "tpu-aot-results"


@pytest.fixture(autouse=True, scope="module")
def _without_persistent_cache(no_persistent_compilation_cache):
  yield
