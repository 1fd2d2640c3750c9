"""Tests here need 8 devices; on CPU that means XLA_FLAGS=--xla_force_host_platform_device_count=8
before jax starts, which tests/parallel/test_mesh_suite.py arranges in a subprocess (the flag
slows every other CPU test, so the main test process runs without it and skips these)."""

from __future__ import annotations

import jax
import pytest

from jaxserve.engine.llm_engine import LLMEngine
from tests.integration.engine_helpers import small_engine

NUM_DEVICES = 8


def pytest_collection_modifyitems(config, items):
  if jax.device_count() >= NUM_DEVICES:
    return
  skip = pytest.mark.skip(
    reason=f"needs {NUM_DEVICES} devices: run through tests/parallel/test_mesh_suite.py"
  )
  for item in items:
    if "tests/parallel/mesh/" in str(item.fspath).replace("\\", "/"):
      item.add_marker(skip)


def tp_engine(
  checkpoint, tensor_parallel_size: int, attention_backend: str = "xla", **fields
) -> LLMEngine:
  """One engine shape for every test here, so buckets compile once per tensor_parallel_size: one
  token bucket (a step program a shape; what these tests compare is where the math runs)."""
  return small_engine(
    str(checkpoint),
    tensor_parallel_size=tensor_parallel_size,
    max_model_len=128,
    max_num_seqs=8,
    max_tokens_per_step=32,
    seq_buckets=(8,),
    token_buckets=(32,),
    num_pages=64,
    prefix_caching=False,
    attention_backend=attention_backend,
    **fields,
  )


@pytest.fixture(scope="session")
def engine_for():
  """engine_for(checkpoint, tp) -> a cached engine (built once per session)."""
  cache: dict = {}

  def get(checkpoint, tensor_parallel_size: int) -> LLMEngine:
    key = (str(checkpoint), tensor_parallel_size)
    if key not in cache:
      cache[key] = tp_engine(checkpoint, tensor_parallel_size)
    return cache[key]

  return get
