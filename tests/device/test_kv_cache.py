"""The KV pool's page count: the stacked K/V array (every slot) stays within what the attention
backend's kernels address (pallas_kernels/ragged_paged_attention/gpu/addressing.py for the GPU
kernels, 2**31 elements for the others)."""

from __future__ import annotations

import logging
import math

import pytest

from jaxserve.attention.backends import XLA, get_attention_backend, pallas_gpu, pallas_tpu
from jaxserve.config import CacheConfig, EngineConfig
from jaxserve.device.kv_cache import MAX_ARRAY_ELEMENTS, kv_cache_spec
from jaxserve.models.named_shapes import named_model_config
from jaxserve.parallel.placement import attention_for

GIB = 1 << 30
MIB = 1 << 20


def test_a_budget_past_int32_offsets_is_capped_with_a_warning(caplog):
  # Llama 3.2 1B (16 layers, 8 kv heads, head_dim 64) with 8-bit pages of 16 tokens: 131,072
  # elements per page in the stacked K (V) pool of 16 slots, so 2**31 elements hold 16,383
  # pages; a 200 GiB budget would hold 819,200 (16 layers x K, V x 8192 bytes a page).
  model = named_model_config("llama-3.2-1b")
  config = EngineConfig(cache=CacheConfig(page_size=16, kv_cache_dtype="fp8"))
  caplog.set_level(logging.WARNING, logger="jaxserve.device.kv_cache")
  spec = kv_cache_spec(config, model, 2048, free_bytes=200 * GIB)
  per_page = 16 * 8 * 16 * 64
  assert spec.num_pages == MAX_ARRAY_ELEMENTS // per_page == 16_383
  assert math.prod(spec.pool_shape) < 2**31
  assert "KV pool capped at 16383 pages (the memory budget holds 819200)" in caplog.text
  # Sharded over 2 devices each holds 4 heads: twice the pages fit.
  assert kv_cache_spec(config, model, 2048, free_bytes=200 * GIB, num_shards=2).num_pages == (
    MAX_ARRAY_ELEMENTS // (per_page // 2)
  )
  # Under the limit nothing changes.
  assert kv_cache_spec(config, model, 2048, free_bytes=GIB).num_pages == GIB // (2 * per_page)


def test_an_explicit_page_count_past_int32_offsets_is_an_error():
  model = named_model_config("llama-3.2-1b")
  config = EngineConfig(cache=CacheConfig(page_size=16, num_pages=300_000))
  with pytest.raises(ValueError, match=r"^cache.num_pages: 300000 pages .* at most 16383"):
    kv_cache_spec(config, model, 2048, free_bytes=None)


def test_the_gpu_kernels_take_a_gemma_3_12b_budget_past_2_31_elements(caplog):
  # Gemma 3 12B (8 kv heads, head_dim 256, 8 global-layer KV slots), bfloat16 pages of 16
  # tokens: 262,144 elements a page in the stacked K (V) pool, 1 MiB a page. An H200's budget of
  # 100,910 pages (2.6e10 elements a pool) is capped at 8,191 for the other backends; the Triton
  # kernels address it with int64 offsets (tests/pallas_kernels/test_gpu_addressing.py).
  model = named_model_config("gemma-3-12b")
  config = EngineConfig(cache=CacheConfig(page_size=16))
  budget = 100_910 * MIB
  large = pallas_gpu().capabilities.large_page_arrays
  caplog.set_level(logging.WARNING, logger="jaxserve.device.kv_cache")
  spec = kv_cache_spec(config, model, 4096, free_bytes=budget, large_page_arrays=large)
  assert spec.bytes_per_page == MIB
  assert spec.num_pages == 100_910
  assert "capped" not in caplog.text
  # The backends not shown to address such arrays keep the cap.
  for backend in (XLA, pallas_tpu(), pallas_gpu(interpret=True)):
    assert not backend.capabilities.large_page_arrays, backend.name
  assert kv_cache_spec(config, model, 4096, free_bytes=budget).num_pages == 8_191
  # The 8-bit pages' wrapper keeps it, and "auto" on a GPU picks the kernel.
  for name in ("fp8", "int8"):
    fp8_config = EngineConfig(
      attention_backend="pallas_gpu", cache=CacheConfig(page_size=16, kv_cache_dtype=name)
    )
    assert attention_for(fp8_config, "gpu").capabilities.large_page_arrays
  assert get_attention_backend("auto", "gpu").capabilities.large_page_arrays


def test_8bit_pages_of_2_31_to_2_32_elements_are_capped_for_the_gpu_kernels(caplog):
  # The same Gemma 3 12B with 8-bit pages (512 KiB a page): 12,614 pages are 3.3e9 one-byte
  # elements a stacked pool, which Pallas addresses with int32 offsets (past 2**31 - 1: they
  # wrap). Twice that, past 2**32 bytes, gets int64 offsets and is taken whole.
  model = named_model_config("gemma-3-12b")
  config = EngineConfig(cache=CacheConfig(page_size=16, kv_cache_dtype="fp8"))
  caplog.set_level(logging.WARNING, logger="jaxserve.device.kv_cache")
  gap = kv_cache_spec(config, model, 4096, free_bytes=12_614 * MIB // 2, large_page_arrays=True)
  assert gap.num_pages == 8_191
  assert "8-bit pools of 2**31 to 2**32 elements" in caplog.text
  whole = kv_cache_spec(config, model, 4096, free_bytes=12_614 * MIB, large_page_arrays=True)
  assert whole.num_pages == 25_228
  explicit = EngineConfig(cache=CacheConfig(page_size=16, kv_cache_dtype="fp8", num_pages=12_000))
  with pytest.raises(ValueError, match=r"^cache.num_pages: 12000 pages .*8-bit.* at most 8191"):
    kv_cache_spec(explicit, model, 4096, free_bytes=None, large_page_arrays=True)
