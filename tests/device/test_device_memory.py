"""The device-memory policy with hand-computed numbers: memory_fraction of the device's total less
what is live and the scratch; the JAX client's XLA_* setup, where the user's own settings win."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxserve.device.client_memory import (
  client_memory_env,
  configure_client_memory,
  fraction_var,
  gpu_expected,
)
from jaxserve.device.device_memory import (
  DeviceMemory,
  device_memory,
  kv_pool_bytes,
  max_concurrency,
  read_device_memory,
  unmeasured_scratch_bytes,
)
from jaxserve.runtime.memory_stats import free_bytes, memory_stats

GIB = 2**30
REPO = Path(__file__).resolve().parents[2]


def test_h100_pool_with_the_client_set_to_the_fraction():
  # 80 GiB card, client arena 0.9 x 80 = 72 GiB, 15 GiB of weights, 0.5 GiB of step scratch.
  memory = device_memory(
    {"bytes_limit": 72 * GIB, "bytes_in_use": 15 * GIB}, "gpu", {"XLA_CLIENT_MEM_FRACTION": "0.9"}
  )
  assert memory == DeviceMemory(80 * GIB, 72 * GIB, 15 * GIB)
  # headroom: 2% of the 72 GiB usable = 1.44 GiB
  assert kv_pool_bytes(memory, 0.9, scratch_bytes=GIB // 2) == (
    72 * GIB - 15 * GIB - GIB // 2 - int(0.02 * 72 * GIB)
  )


def test_jax_default_arena_caps_the_pool():
  # Nothing set: JAX pre-allocated 0.75 x 80 = 60 GiB; 0.9 of the total would be 72 GiB.
  memory = device_memory({"bytes_limit": 60 * GIB, "bytes_in_use": 15 * GIB}, "gpu", {})
  assert memory.total_bytes == 80 * GIB
  assert kv_pool_bytes(memory, 0.9) == 45 * GIB - int(0.02 * 60 * GIB)
  # under the cap: 0.5 x 80 - 15, less 2% of 40 GiB
  assert kv_pool_bytes(memory, 0.5) == 40 * GIB - 15 * GIB - int(0.02 * 40 * GIB)


def test_user_fraction_gives_the_total():
  memory = device_memory(
    {"bytes_limit": 76 * GIB, "bytes_in_use": 15 * GIB},
    "gpu",
    {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"},
  )
  assert memory.total_bytes == 80 * GIB
  assert kv_pool_bytes(memory, 0.9) == 72 * GIB - 15 * GIB - int(0.02 * 72 * GIB)


def test_tpu_limit_is_the_chip_and_cpu_has_no_stats():
  memory = device_memory(
    {"bytes_limit": 16 * GIB, "bytes_in_use": 2 * GIB}, "tpu", {"XLA_CLIENT_MEM_FRACTION": "0.5"}
  )  # a GPU-only variable: ignored
  assert memory.total_bytes == 16 * GIB
  budget = kv_pool_bytes(memory, 0.95)
  assert budget == int(0.95 * 16 * GIB) - 2 * GIB - GIB // 2  # 2% of 15.2 GiB < 0.5 GiB
  assert unmeasured_scratch_bytes(budget) == int(budget * 0.1)
  assert device_memory(None, "cpu", {}) is None
  assert device_memory({"bytes_in_use": 1}, "cpu", {}) is None


class _Device:
  def __init__(self, stats):
    self.stats, self.platform = stats, "gpu"

  def memory_stats(self):
    if isinstance(self.stats, Exception):
      raise self.stats
    return self.stats


def test_memory_stats_are_read_without_raising():
  """The weight loader's free bytes (memory_stats.free_bytes) and the pool's DeviceMemory
  (read_device_memory) read the same statistics; None where a device reports none or raises."""
  device = _Device({"bytes_limit": 72 * GIB, "bytes_in_use": 15 * GIB})
  memory = read_device_memory({"XLA_CLIENT_MEM_FRACTION": "0.9"}, device=device)
  assert free_bytes(device) == memory.limit_bytes - memory.in_use_bytes == 57 * GIB
  for stats in (None, {"bytes_in_use": 1}, RuntimeError("no statistics")):
    assert memory_stats(_Device(stats)) in (None, {"bytes_in_use": 1})
    assert free_bytes(_Device(stats)) is None
    assert read_device_memory({}, device=_Device(stats)) is None


def test_the_pool_fits_the_largest_free_block():
  # 72 GiB arena, 15 GiB of weights, but the loader's freed buffers left 3 GiB in holes: the
  # largest free block is 54 GiB, so the pool's layers must fit there (less 0.5 GiB).
  stats = {"bytes_limit": 72 * GIB, "bytes_in_use": 15 * GIB, "largest_free_block_bytes": 54 * GIB}
  memory = device_memory(stats, "gpu", {"XLA_CLIENT_MEM_FRACTION": "0.9"})
  assert memory.largest_free_bytes == 54 * GIB
  assert kv_pool_bytes(memory, 0.9) == 54 * GIB - GIB // 2
  assert kv_pool_bytes(memory, 0.9, scratch_bytes=GIB) == 53 * GIB - GIB // 2
  # no holes: the share's own headroom is the tighter bound
  stats["largest_free_block_bytes"] = 57 * GIB
  assert kv_pool_bytes(device_memory(stats, "gpu", {"XLA_CLIENT_MEM_FRACTION": "0.9"}), 0.9) == (
    57 * GIB - int(0.02 * 72 * GIB)
  )


def test_a_growing_arena_is_not_bounded_by_its_largest_free_block():
  # XLA_PYTHON_CLIENT_PREALLOCATE=false: the arena has grown to 15.5 GiB of its 105 GiB limit, the
  # free block inside it is 0.5 GiB; the allocator adds regions for the pool (an H200 run had its
  # pool cut from 86 to 12 GiB by the block of the regions so far)
  stats = {"bytes_limit": 105 * GIB, "bytes_in_use": 15 * GIB, "pool_bytes": 31 * GIB // 2}
  stats["largest_free_block_bytes"] = GIB // 2
  growing = device_memory(stats, "gpu", {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
  assert growing.largest_free_bytes is None
  assert kv_pool_bytes(growing, 0.75) == 105 * GIB - 15 * GIB - int(0.02 * 105 * GIB)
  stats["pool_bytes"] = 105 * GIB  # reserved whole: the block bounds the pool
  reserved = device_memory(stats, "gpu", {})
  assert reserved.largest_free_bytes == GIB // 2


def test_small_arenas_keep_half_a_gib():
  memory = device_memory(
    {"bytes_limit": 8 * GIB, "bytes_in_use": GIB}, "gpu", {"XLA_CLIENT_MEM_FRACTION": "0.5"}
  )
  assert kv_pool_bytes(memory, 0.5) == 8 * GIB - GIB - GIB // 2  # 2% of 8 GiB < 0.5 GiB


def test_max_concurrency():
  assert max_concurrency(num_pages=1025, page_size=16, max_model_len=2048) == 8.0
  assert max_concurrency(num_pages=101, page_size=16, max_model_len=1000) == 1.6


def test_env_sets_the_fraction_on_gpus_only():
  setup = client_memory_env(0.9, {}, gpu=True, backend_started=False)
  assert setup.set_vars == {"XLA_CLIENT_MEM_FRACTION": "0.9"} and "0.9" in setup.note
  assert client_memory_env(0.9, {}, gpu=False, backend_started=False).set_vars == {}
  again = client_memory_env(
    0.9, {"XLA_CLIENT_MEM_FRACTION": "0.9"}, gpu=True, backend_started=False
  )
  assert again.set_vars == {} and again.note == ""  # idempotent, silent


@pytest.mark.parametrize(
  "name, value",
  [
    ("XLA_CLIENT_MEM_FRACTION", "0.5"),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9"),
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform"),
  ],
)
def test_user_settings_win_with_a_log_line(name, value, caplog):
  environ = {name: value, "PATH": "/bin"}
  with caplog.at_level(logging.INFO, logger="jaxserve.device.client_memory"):
    setup = configure_client_memory(0.9, environ, gpu=True)
  assert setup.set_vars == {} and environ == {name: value, "PATH": "/bin"}
  assert setup.user_vars == {name: value}
  assert any(
    f"{name}={value}" in r.getMessage() and "wins" in r.getMessage() for r in caplog.records
  )


def test_older_spelling_where_jaxlib_reads_only_it():
  setup = client_memory_env(
    0.85, {}, gpu=True, backend_started=False, var="XLA_PYTHON_CLIENT_MEM_FRACTION"
  )
  assert setup.set_vars == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.85"}
  assert fraction_var() in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def test_backend_already_started_sets_nothing():
  setup = client_memory_env(0.9, {}, gpu=True, backend_started=True)
  assert setup.set_vars == {} and "already started" in setup.note


def test_gpu_expected_honours_jax_platforms():
  assert not gpu_expected({"JAX_PLATFORMS": "cpu"})
  assert not gpu_expected({"JAX_PLATFORMS": "tpu,cpu"})


_CLI_PROBE = """
import os, sys
import jaxserve.device.client_memory as client_memory
client_memory.gpu_expected = lambda environ: True  # this machine has no GPU plugin
from jaxserve.cli import main
code = main(["kv-plan", "--set", "cache.memory_fraction=0.8", "--memory-gb", "0.01",
             "--out", sys.argv[1]])
print("RESULT", code, os.environ.get(client_memory.fraction_var()))
"""


@pytest.mark.parametrize(
  "user_env, expected", [({}, "0.8"), ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, "None")]
)
def test_cli_sets_the_client_fraction_before_jax_starts(tmp_path, user_env, expected):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_CLIENT", "XLA_PYTHON"))}
  env.update(user_env, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  result = subprocess.run(
    [sys.executable, "-c", _CLI_PROBE, str(tmp_path / "plan.json")],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert f"RESULT 0 {expected}" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
  if user_env:
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false set by the user wins" in result.stderr
