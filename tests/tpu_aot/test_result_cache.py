"""The compile results of TPU programs kept across runs (jaxserve/tpu_aot/result_cache.py): a
program compiled once for a target is taken back from the cache with the same memory, cost and
error, not compiled again; another target, toolchain flag or program is a miss; a damaged entry
is a miss."""

from __future__ import annotations

import platform
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxserve.tpu_aot.build import compile_one
from jaxserve.tpu_aot.chips import get_chip, topology_devices
from jaxserve.tpu_aot.result_cache import CompileResultCache
from jaxserve.tpu_aot.step_programs import ProgramId, StepProgram

pytestmark = pytest.mark.skipif(
  not (platform.system() == "Linux" and platform.machine() == "x86_64"),
  reason="libtpu is published for Linux x86-64 only",
)


def _matmul(rows: int, chip: str = "v5e") -> tuple[StepProgram, str]:
  """A [rows, 256] x [256, 512] matmul lowered for one chip of `chip`, and its target."""
  topology = get_chip(chip).topology(1)
  mesh = Mesh(np.array(topology_devices(topology)[:1]), ("x",))
  whole = NamedSharding(mesh, PartitionSpec())
  program = jax.jit(lambda a, b: a @ b, in_shardings=(whole, whole))
  args = (
    jax.ShapeDtypeStruct((rows, 256), jnp.bfloat16),
    jax.ShapeDtypeStruct((256, 512), jnp.bfloat16),
  )
  step = StepProgram(ProgramId("forward", rows, rows, None), 0, lambda: program.lower(*args))
  return step, topology


def test_a_result_is_taken_back_and_every_input_of_the_key_counts(tmp_path, monkeypatch):
  cache = CompileResultCache(tmp_path / "results")
  lock = threading.Lock()
  program, target = _matmul(8)
  first = compile_one(program, lock, cache, target)
  assert not first.cached and first.error is None and first.memory.outputs == 8 * 512 * 2
  assert len(list((tmp_path / "results").glob("*.json"))) == 1
  again = compile_one(program, lock, cache, target)
  assert again.cached and (again.memory, again.cost, again.error) == (
    first.memory,
    first.cost,
    first.error,
  )
  # another program, another target, another XLA flag: each a miss, compiled and kept
  assert not compile_one(_matmul(16)[0], lock, cache, target).cached
  v6e_program, v6e = _matmul(8, "v6e")
  assert v6e != target and not compile_one(v6e_program, lock, cache, v6e).cached
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_latency_hiding_scheduler=false")
  assert not compile_one(program, lock, cache, target).cached
  assert len(list((tmp_path / "results").glob("*.json"))) == 4
  # a damaged entry is a miss, and is written again
  monkeypatch.delenv("LIBTPU_INIT_ARGS")
  key = cache.key(program.lower().as_text(), target)
  (tmp_path / "results" / f"{key}.json").write_text("{not json")
  assert not compile_one(program, lock, cache, target).cached
  assert compile_one(program, lock, cache, target).cached
