"""The KV pool's page count: a layer's K/V array stays under the kernels' int32 offsets."""

from __future__ import annotations

import logging

import pytest

from jaxserve.config import CacheConfig, EngineConfig
from jaxserve.device.kv_cache import MAX_ARRAY_ELEMENTS, kv_cache_spec
from jaxserve.models.named_shapes import named_model_config

GIB = 1 << 30


def test_a_budget_past_int32_offsets_is_capped_with_a_warning(caplog):
  # Llama 3.2 1B (8 kv heads, head_dim 64) with 8-bit pages of 16 tokens: 8192 elements per page
  # per layer array, so 2**31 elements hold 262,143 pages; a 200 GiB budget would hold 819,200
  # (16 layers x K, V x 8192 bytes a page).
  model = named_model_config("llama-3.2-1b")
  config = EngineConfig(cache=CacheConfig(page_size=16, kv_cache_dtype="fp8"))
  caplog.set_level(logging.WARNING, logger="jaxserve.device.kv_cache")
  spec = kv_cache_spec(config, model, 2048, free_bytes=200 * GIB)
  per_page = 8 * 16 * 64
  assert spec.num_pages == MAX_ARRAY_ELEMENTS // per_page == 262_143
  assert spec.num_kv_heads * spec.num_pages * spec.page_size * spec.head_dim < 2**31
  assert "KV pool capped at 262143 pages (the memory budget holds 819200)" in caplog.text
  # Sharded over 2 devices each holds 4 heads: twice the pages fit.
  assert kv_cache_spec(config, model, 2048, free_bytes=200 * GIB, num_shards=2).num_pages == (
    MAX_ARRAY_ELEMENTS // (4 * 16 * 64)
  )
  # Under the limit nothing changes.
  assert kv_cache_spec(config, model, 2048, free_bytes=10 * GIB).num_pages == 10 * GIB // (
    2 * 16 * per_page
  )


def test_an_explicit_page_count_past_int32_offsets_is_an_error():
  model = named_model_config("llama-3.2-1b")
  config = EngineConfig(cache=CacheConfig(page_size=16, num_pages=300_000))
  with pytest.raises(ValueError, match=r"^cache.num_pages: 300000 pages .* at most 262143"):
    kv_cache_spec(config, model, 2048, free_bytes=None)
