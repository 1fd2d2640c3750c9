"""Attention kernels under batch_invariant, bitwise: one probe sequence's output rows are the same
whether its prompt runs in one step alone or in chunks among other sequences' decodes and
prefills (hypothesis draws the compositions). The XLA path, the GPU kernel with the mode's fixed
tiles (Pallas interpret mode) and the TPU kernel (TPU interpret mode), whose query and KV blocks
never follow the batch: its reduction order is the batch's by construction."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.attention.backends import XLA, batch_invariant_attention, pallas_gpu, pallas_tpu
from jaxserve.bench.invariance_attention import Harness, PagePool
from jaxserve.config import EngineConfig
from jaxserve.messages.buckets import BucketSet
from jaxserve.models.builtin import builtin_config

MODEL = builtin_config("tiny-random")  # 4 q heads, 2 kv heads of 64
BUCKETS = BucketSet((4, 8), (16, 64, 128))
MATE_LENGTHS = (40, 23, 9)


BACKENDS = {
  "xla": lambda: batch_invariant_attention(XLA),
  "gpu": lambda: batch_invariant_attention(pallas_gpu(interpret=True)),
  "tpu": lambda: pallas_tpu(interpret=True),
}


@functools.cache
def _harness(backend: str, probe_len: int) -> Harness:
  lengths = [probe_len, *MATE_LENGTHS]
  rng = np.random.default_rng(probe_len)
  queries = [
    jnp.asarray(rng.standard_normal((n, MODEL.num_q_heads, MODEL.head_dim), np.float32))
    for n in lengths
  ]
  return Harness(
    EngineConfig(), MODEL, BUCKETS, BACKENDS[backend](), PagePool(MODEL, 16, lengths), queries
  )


def _mate(index: int, decode: bool) -> tuple[int, int, int]:
  """(pool sequence, query tokens, seq_len) of mate `index`: a decode or its prompt's start."""
  length = MATE_LENGTHS[index]
  return (index + 1, 1, length) if decode else (index + 1, min(length, 12), min(length, 12))


compositions = st.fixed_dictionaries(
  {
    "probe_len": st.sampled_from([20, 45]),
    "chunk": st.sampled_from([8, 16, 32]),
    "mates": st.lists(
      st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=3, unique_by=lambda m: m[0]
    ),
  }
)


def _check(backend: str, draw: dict) -> None:
  harness, length, chunk = _harness(backend, draw["probe_len"]), draw["probe_len"], draw["chunk"]
  alone = harness.run([(0, length, length)])[0]
  mates = sorted((_mate(i, d) for i, d in draw["mates"]), key=lambda m: m[1])  # decodes first
  parts = [
    harness.run(mates + [(0, min(chunk, length - s), min(s + chunk, length))])[-1]
    for s in range(0, length, chunk)
  ]
  np.testing.assert_array_equal(np.concatenate(parts).view(np.uint32), alone.view(np.uint32))


@pytest.mark.parametrize("backend,examples", [("xla", 4), ("gpu", 3), ("tpu", 2)])
def test_probe_rows_bitwise_alone_and_chunked_in_company(backend, examples):
  settings(max_examples=examples, deadline=None, derandomize=True)(
    given(draw=compositions)(lambda draw: _check(backend, draw))
  )()
