"""Test-wide settings.

XLA compilation cache: every engine the tests build, and every JAX process they start (engine
core processes, the mesh and multi-host subprocesses), share one persistent compilation cache, so
each program compiles once per run rather than once per engine. Its directory is
$JAXSERVE_TEST_XLA_CACHE when set (kept across runs: a warm cache, opt in); otherwise a new
temporary directory for this run, removed at its end, so a run on a fresh clone and a run here
compile the same programs and report the same times. pytest-xdist workers inherit the variable
from the controller, so they share the run's directory.

Compile and thread settings for every JAX and torch process of the run (set in the environment,
so the processes tests start inherit them):
- XLA's CPU backend compiles at LLVM optimization level 0 (TEST_XLA_FLAGS). The tests compile
  hundreds of small programs and run each a few times, so LLVM's optimization passes cost more
  than they save. The HLO passes, and so the programs' semantics (IEEE float arithmetic, no
  fast math, the same reduction orders), do not depend on it.
- torch runs one intra-op thread (OMP_NUM_THREADS=1). The test workers take one core each;
  torch's OpenMP pool spins waiting on a second core that another worker holds, which made the
  tiny reference models 10x slower.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax  # noqa: E402

CACHE_ENV = "JAXSERVE_TEST_XLA_CACHE"
if CACHE_ENV not in os.environ:  # the first process of the run (the controller under xdist)
  os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="jaxserve-test-xla-cache-")
  atexit.register(shutil.rmtree, os.environ[CACHE_ENV], ignore_errors=True)
_CACHE_DIR = os.environ[CACHE_ENV]
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
# the same cache for the JAX processes tests spawn (the server's engine core process)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE_DIR)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# libtpu (the test extra on Linux x86-64) locks /tmp/libtpu_lockfile for the chips it would drive;
# the TPU compile tests drive none, so neither this process nor the JAX processes tests start
# (which inherit the environment) wait on another's lock.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


import pytest  # noqa: E402

MAX_WORKERS = 8  # each worker holds jax, torch and its engines (1-2 GB)


def pytest_xdist_auto_num_workers(config) -> int:
  """`-n auto`: one worker per core, at most MAX_WORKERS."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return max(1, min(MAX_WORKERS, cores or 1))


from tests.models.hf_checkpoints import build_hf_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
  """hf_checkpoint(family, *, dtype="float32", sharded=False) -> a cached checkpoint directory."""
  cache = {}

  def get(family: str, *, dtype: str = "float32", sharded: bool = False):
    key = (family, dtype, sharded)
    if key not in cache:
      out_dir = tmp_path_factory.mktemp(f"hf_{family}_{dtype}{'_sharded' if sharded else ''}")
      cache[key] = build_hf_checkpoint(family, out_dir, dtype=dtype, sharded=sharded)
    return cache[key]

  return get


@pytest.fixture(scope="module")
def no_persistent_compilation_cache():
  """Compiles without JAX's persistent cache, and leaves it as it found it: executables compiled
  for a TPU topology cannot be read back from it (a warning and a recompile each run)."""
  previous = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", previous)


# The files that take longest on the 2-core CPU machine (a test run's --durations, summed per
# file; docs/PERFORMANCE.md "The test suite"; here run F's of "A fresh machine", with the cheaper
# drain, soak and TPU compile tests since), longest first. They are collected first, so the
# parallel workers start them at once and the run does not end with one worker on a long file.
SLOW_FILES_FIRST = (
  "tests/parallel/test_mesh_suite.py",
  "tests/tpu_aot/test_compile_tpu.py",
  "tests/server/test_drain.py",
  "tests/bench/test_soak.py",
  "tests/server/test_data_parallel.py",
  "tests/server/test_admission.py",
  "tests/server/test_process_faults.py",
  "tests/bench/test_serve_vs_offline.py",
  "tests/integration/test_batch_invariant_mode.py",
  "tests/integration/test_structured_outputs.py",
  "tests/integration/test_kernel_engines_interpret.py",
  "tests/bench/test_batch_invariance_bench.py",
  "tests/bench/test_gpu_dp_script.py",
  "tests/server/test_slow_clients.py",
  "tests/bench/test_bench_server_startup.py",
  "tests/tools/test_quantized_tools.py",
  "tests/server/test_lm_eval.py",
  "tests/integration/test_no_recompilation.py",
  "tests/investigations/test_bench_kernels.py",
  "tests/parallel/test_multihost.py",
  "tests/pallas_kernels/test_attention_batch_invariance.py",
  "tests/device/test_compile_cache_restart.py",
  "tests/engine/test_scheduler_properties.py",
  "tests/pallas_kernels/test_gpu_program_map.py",
  "tests/integration/test_hf_parity.py",
  "tests/investigations/test_profile_step.py",
  "tests/integration/test_decode_bursts.py",
  "tests/integration/test_batch_invariance.py",
  "tests/integration/test_async_scheduling.py",
  "tests/pallas_kernels/test_tpu_kernel.py",
  "tests/integration/test_quantized_features.py",
  "tests/server/test_stop_signals.py",
  "tests/server/test_quantized_server.py",
  "tests/tpu_aot/test_layouts.py",
  "tests/server/test_vllm_metrics.py",
)


def pytest_collection_modifyitems(config, items) -> None:
  """SLOW_FILES_FIRST's files first (in that order), the rest as collected."""
  rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
