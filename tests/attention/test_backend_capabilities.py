"""Every attention backend carries capabilities that say what it is and does; each factory sets
them, each wrapper keeps them true, and the wrappers decide by them, never by the name."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from jaxserve.attention.backends import (
  REFERENCE,
  XLA,
  AttentionBackend,
  batch_invariant_attention,
  get_attention_backend,
  head_count_invariant,
  pallas_gpu,
  pallas_tpu,
)
from jaxserve.attention.capabilities import BackendCapabilities, BackendKind
from jaxserve.config import EngineConfig
from jaxserve.parallel.partition_rules import MODEL_AXIS
from jaxserve.parallel.placement import attention_for
from jaxserve.parallel.sharded_attention import shard_attention_backend

# name -> (kind, kv_split, tile_invariant, large_page_arrays) as the factories build them
FACTORY_FLAGS = {
  "reference": (BackendKind.REFERENCE, False, False, False),
  "xla": (BackendKind.XLA, False, False, False),
  "pallas_gpu": (BackendKind.PALLAS_GPU, True, False, True),
  "pallas_tpu": (BackendKind.PALLAS_TPU, False, True, False),
}


def _kwargs(fn) -> dict:
  return fn.keywords if isinstance(fn, functools.partial) else {}


@pytest.mark.parametrize("name", sorted(FACTORY_FLAGS))
def test_each_factory_sets_its_capabilities(name):
  capabilities = get_attention_backend(name).capabilities
  kind, kv_split, tile_invariant, large_page_arrays = FACTORY_FLAGS[name]
  assert capabilities == BackendCapabilities(
    kind, kv_split=kv_split, tile_invariant=tile_invariant, large_page_arrays=large_page_arrays
  )
  assert kind.value == name
  assert capabilities.dtypes == ("float32", "bfloat16", "float8_e4m3fn", "int8")
  assert capabilities.sliding_window and capabilities.soft_cap and not capabilities.interpret


@pytest.mark.parametrize(
  "factory,kind", [(pallas_gpu, BackendKind.PALLAS_GPU), (pallas_tpu, BackendKind.PALLAS_TPU)]
)
def test_interpreted_kernels_say_so_and_run_interpreted(factory, kind):
  backend = factory(interpret=True)
  # The interpreter runs XLA ops on the host: no page array past 2**31 elements is claimed.
  assert backend.capabilities == factory().capabilities.replace(
    interpret=True, large_page_arrays=False
  )
  assert backend.capabilities.kind is kind
  assert _kwargs(backend.attend) == {"interpret": True}
  assert _kwargs(backend.write_kv) == {"interpret": True}


def test_head_count_invariant_pins_the_kv_split_of_a_splitting_backend():
  for backend in (pallas_gpu(), pallas_gpu(interpret=True)):
    fixed = head_count_invariant(backend)
    assert fixed.capabilities == backend.capabilities.replace(kv_split=False)
    assert _kwargs(fixed.attend)["num_kv_splits"] == 1
    assert fixed.write_kv is backend.write_kv
  for backend in (REFERENCE, XLA, pallas_tpu()):
    assert head_count_invariant(backend) is backend


def test_batch_invariant_attention_makes_xla_and_the_gpu_kernel_tile_invariant():
  xla = batch_invariant_attention(XLA)
  assert xla.capabilities == XLA.capabilities.replace(tile_invariant=True)
  assert _kwargs(xla.attend) == {"fixed_order": True}
  for backend in (pallas_gpu(), pallas_gpu(interpret=True), head_count_invariant(pallas_gpu())):
    fixed = batch_invariant_attention(backend)
    assert fixed.capabilities == backend.capabilities.replace(kv_split=False, tile_invariant=True)
  tpu = pallas_tpu()
  assert batch_invariant_attention(tpu) is tpu  # tile invariant as it is
  assert batch_invariant_attention(REFERENCE) is REFERENCE  # the dense oracle is left as it is
  assert batch_invariant_attention(xla) is xla  # idempotent


def test_the_wrappers_decide_by_capabilities_not_by_name():
  """A GPU-kind backend under any name gets the fixed tiles, in either wrapping order."""
  calls = []

  def attend(q, k_pool, *args, **kwargs):
    calls.append(kwargs)
    return q

  capabilities = BackendCapabilities(BackendKind.PALLAS_GPU, kv_split=True, tile_invariant=False)
  backend = AttentionBackend("xla", attend, lambda *a: a[:2], capabilities)
  q, k_pool = jnp.zeros((3, 4, 64)), jnp.zeros((3, 2, 5, 16, 64))  # 2 q heads per kv head
  for wrapped in (
    batch_invariant_attention(head_count_invariant(backend)),
    head_count_invariant(batch_invariant_attention(backend)),
  ):
    assert wrapped.capabilities == capabilities.replace(kv_split=False, tile_invariant=True)
    wrapped.attend(q, k_pool, sm_scale=1.0)
    assert calls.pop() == {"num_kv_splits": 1, "block_kv": 64, "block_q": 8, "sm_scale": 1.0}
  assert batch_invariant_attention(XLA.replace(name="pallas_gpu")).capabilities.tile_invariant


@pytest.mark.parametrize(
  "backend",
  [
    XLA,
    batch_invariant_attention(XLA),
    pallas_gpu(),
    head_count_invariant(pallas_gpu()),
    pallas_tpu(),
  ],
)
def test_the_shard_map_wrapper_keeps_the_capabilities(backend):
  mesh = Mesh(np.array(jax.devices()[:1]), (MODEL_AXIS,))
  sharded = shard_attention_backend(backend, mesh)
  assert sharded.capabilities == backend.capabilities


def test_the_unsharded_placement_applies_the_mode():
  assert attention_for(EngineConfig(attention_backend="xla")).capabilities == XLA.capabilities
  invariant = attention_for(EngineConfig(attention_backend="xla", batch_invariant=True))
  assert invariant.capabilities.kind is BackendKind.XLA and invariant.capabilities.tile_invariant
