"""The TPU kernels lower for the 'tpu' platform on any host, for every supported configuration.

Lowering runs the Pallas -> Mosaic translation (block-shape and memory-space rules, unsupported
primitives) and must produce the Mosaic custom call. Where libtpu is importable, the kernels are
also compiled ahead of time for a v5e topology: that runs Mosaic's own layout passes, the check
closest to a real TPU that a CPU host can make.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.ragged_paged_attention.tpu import attention as tpu

HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = tpu.SUPPORTED_PAGE_SIZES
DTYPES = (jnp.float32, jnp.bfloat16)
MOSAIC_CUSTOM_CALL = "tpu_custom_call"
NUM_TOKENS, NUM_SEQ_SLOTS, PAGES_PER_SEQ = 64, 8, 16
NUM_KV_SLOTS = 3  # the stacked pool's slots (layers)


def _attention_specs(head_dim, page_size, dtype, num_kv_heads=2, group=2, sharding=None):
  num_pages = NUM_SEQ_SLOTS * PAGES_PER_SEQ + 1
  spec = functools.partial(jax.ShapeDtypeStruct, sharding=sharding)
  kv = spec((NUM_KV_SLOTS, num_kv_heads, num_pages, page_size, head_dim), dtype)
  return (
    spec((NUM_TOKENS, num_kv_heads * group, head_dim), dtype),
    kv,
    kv,
    spec((1,), jnp.int32),  # kv_slot
    spec((NUM_SEQ_SLOTS, PAGES_PER_SEQ), jnp.int32),
    spec((NUM_SEQ_SLOTS,), jnp.int32),
    spec((NUM_SEQ_SLOTS + 1,), jnp.int32),
    spec((1,), jnp.int32),
  )


def _write_specs(head_dim, page_size, dtype, num_kv_heads=2, sharding=None):
  spec = functools.partial(jax.ShapeDtypeStruct, sharding=sharding)
  kv = spec((NUM_KV_SLOTS, num_kv_heads, 33, page_size, head_dim), dtype)
  new = spec((NUM_TOKENS, num_kv_heads, head_dim), dtype)
  return kv, kv, spec((1,), jnp.int32), new, new, spec((NUM_TOKENS,), jnp.int32)


def _attend(**options):
  return jax.jit(functools.partial(tpu.ragged_paged_attention, sm_scale=0.1, **options))


def _lowered_text(fn, specs) -> str:
  return fn.trace(*specs).lower(lowering_platforms=("tpu",)).as_text()


@pytest.mark.parametrize(
  "head_dim, page_size, dtype", list(itertools.product(HEAD_DIMS, PAGE_SIZES, DTYPES))
)
def test_attention_lowers_for_tpu(head_dim, page_size, dtype):
  fn = _attend(sliding_window=100, soft_cap=30.0)
  assert MOSAIC_CUSTOM_CALL in _lowered_text(fn, _attention_specs(head_dim, page_size, dtype))


@pytest.mark.parametrize("num_kv_heads, group", [(4, 1), (2, 4), (1, 8), (1, 6)])
def test_attention_lowers_for_gqa_ratios(num_kv_heads, group):
  specs = _attention_specs(128, 16, jnp.bfloat16, num_kv_heads=num_kv_heads, group=group)
  assert MOSAIC_CUSTOM_CALL in _lowered_text(_attend(), specs)


@pytest.mark.parametrize(
  "head_dim, page_size, dtype", list(itertools.product(HEAD_DIMS, PAGE_SIZES, DTYPES))
)
def test_write_kv_lowers_for_tpu(head_dim, page_size, dtype):
  text = _lowered_text(jax.jit(tpu.write_kv), _write_specs(head_dim, page_size, dtype))
  assert MOSAIC_CUSTOM_CALL in text


@pytest.mark.usefixtures("no_persistent_compilation_cache")
def test_compiles_for_tpu_topology():
  pytest.importorskip("libtpu")
  from jax.experimental import topologies

  device = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  for head_dim, page_size, dtype in itertools.product(HEAD_DIMS, PAGE_SIZES, DTYPES):
    _attend(sliding_window=100, soft_cap=30.0).lower(
      *_attention_specs(head_dim, page_size, dtype, sharding=sharding)
    ).compile()
    jax.jit(tpu.write_kv, donate_argnums=(0, 1)).lower(
      *_write_specs(head_dim, page_size, dtype, sharding=sharding)
    ).compile()
  for num_kv_heads, group in [(4, 1), (2, 4), (1, 8), (1, 6)]:
    _attend().lower(
      *_attention_specs(128, 16, jnp.bfloat16, num_kv_heads, group, sharding=sharding)
    ).compile()


@pytest.mark.usefixtures("no_persistent_compilation_cache")
def test_8bit_kv_compiles_for_tpu():
  """One small compile per 8-bit dtype for a v5e: the KV write, then attention over its pages
  (int8 and float8_e4m3fn pages, 32-row tiles: page_size 32)."""
  pytest.importorskip("libtpu")
  from jax.experimental import topologies

  device = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  scales = dict(k_scale=0.5, v_scale=0.25)

  def step(q, k_pool, v_pool, kv_slot, new_k, new_v, slots, *metadata):
    k_pool, v_pool = tpu.write_kv(k_pool, v_pool, kv_slot, new_k, new_v, slots, **scales)
    return tpu.ragged_paged_attention(q, k_pool, v_pool, kv_slot, *metadata, sm_scale=0.1, **scales)

  for dtype in (jnp.int8, jnp.float8_e4m3fn):
    q, kv, _, kv_slot, *metadata = _attention_specs(128, 32, jnp.bfloat16, sharding=sharding)
    kv = jax.ShapeDtypeStruct(kv.shape, dtype, sharding=sharding)
    new = jax.ShapeDtypeStruct((NUM_TOKENS, 2, 128), jnp.bfloat16, sharding=sharding)
    slots = jax.ShapeDtypeStruct((NUM_TOKENS,), jnp.int32, sharding=sharding)
    compiled = jax.jit(step, donate_argnums=(1, 2)).lower(
      q, kv, kv, kv_slot, new, new, slots, *metadata
    )
    assert MOSAIC_CUSTOM_CALL in compiled.as_text()
    compiled.compile()
