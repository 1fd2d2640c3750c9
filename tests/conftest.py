"""Test-wide settings: a persistent XLA compilation cache shared by every engine the tests build,
so each bucket shape compiles once per machine rather than once per engine."""
from __future__ import annotations

import os
import tempfile

import jax

_CACHE_DIR = os.environ.get(
    "JAXSERVE_TEST_XLA_CACHE", os.path.join(tempfile.gettempdir(), "jaxserve-test-xla-cache"))
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
