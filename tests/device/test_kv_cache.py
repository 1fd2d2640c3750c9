"""The KV pool's page count and groups of slots: each group's stacked K/V array stays within what
the attention backend's kernels address (pallas_kernels/ragged_paged_attention/gpu/addressing.py
for the GPU kernels, 2**31 elements for the others), in the largest groups that do, the pages
capped only where not even one slot's array is addressable (device/kv_cache.group_pool)."""

from __future__ import annotations

import logging
import math

import pytest

from jaxserve.attention.backends import XLA, get_attention_backend, pallas_gpu, pallas_tpu
from jaxserve.config import CacheConfig, EngineConfig
from jaxserve.device.kv_cache import (
  MAX_ARRAY_ELEMENTS,
  KVCacheSpec,
  PoolGroups,
  group_pool,
  kv_cache_spec,
)
from jaxserve.models.named_shapes import named_model_config
from jaxserve.parallel.placement import attention_for

GIB = 1 << 30
MIB = 1 << 20


def test_the_largest_addressable_divisor_of_the_slots_is_a_group():
  # 6 slots of 1000 elements a page, 100 pages: 100,000 elements a slot. Under a limit of
  # 400,000 at most 4 slots fit, and 3 is the largest divisor of 6 up to 4.
  assert group_pool(6, 1000, 2, 100, False, max_elements=400_000) == PoolGroups(3, 100)
  # Under 2**31 elements every slot fits in one group, on every backend.
  assert group_pool(6, 1000, 2, 100, False) == PoolGroups(6, 100)
  assert group_pool(6, 1000, 2, 100, True) == PoolGroups(6, 100)
  # A limit one slot fits exactly: one slot a group, nothing capped.
  assert group_pool(6, 1000, 2, 100, False, max_elements=100_000) == PoolGroups(1, 100)
  # A prime slot count has no group between 1 and all.
  assert group_pool(7, 1000, 2, 100, False, max_elements=600_000) == PoolGroups(1, 100)


def test_a_tpu_pool_past_2_31_elements_a_slot_is_capped_as_one_slot_a_group(caplog):
  # Llama 3.2 1B (16 slots, 8 kv heads, head_dim 64, pages of 16 tokens): 8192 elements a slot's
  # page. 819,200 pages are 6.7e9 elements a slot: even one slot a group is past 2**31, so the
  # pages are capped at 2**31 // 8192 = 262,143, 16 groups of one slot.
  caplog.set_level(logging.WARNING, logger="jaxserve.device.kv_cache")
  assert group_pool(16, 8192, 2, 819_200, False) == PoolGroups(1, 262_143)
  assert "KV pool capped at 262143 pages (the memory budget holds 819200)" in caplog.text
  with pytest.raises(ValueError, match=r"^cache.num_pages: 819200 pages .* at most 262143"):
    group_pool(16, 8192, 2, 819_200, False, asked=819_200)
  # 4096 pages are 33,554,432 elements a slot: 64 slots would fit, all 16 do.
  assert group_pool(16, 8192, 2, 4096, False) == PoolGroups(16, 4096)
  # 65,536 pages: 2**29 elements a slot, 3 slots would fit, 2 (a divisor of 16) do.
  assert group_pool(16, 8192, 2, 65_536, False) == PoolGroups(2, 65_536)


def test_the_gpu_kernels_take_one_group_past_2_32_bytes_and_split_8bit_ones_in_the_gap():
  # Gemma 3 12B (8 slots, 8 kv heads, head_dim 256, pages of 16 tokens): 32,768 elements a slot's
  # page. bfloat16, 100,910 pages: 2.6e10 elements in one group, past 2**32 bytes (int64
  # offsets): one group. Other backends take one slot a group, capped at 65,535 pages.
  assert group_pool(8, 32_768, 2, 100_910, True) == PoolGroups(8, 100_910)
  assert group_pool(8, 32_768, 2, 100_910, False) == PoolGroups(1, 65_535)
  # 8-bit, 12,614 pages: 3,306,684,416 one-byte elements in one group, 2**31 to 2**32 (int32
  # offsets that wrap); 4 slots are 1,653,342,208, under 2**31: 2 groups of 4, nothing capped.
  assert group_pool(8, 32_768, 1, 12_614, True) == PoolGroups(4, 12_614)
  # 8-bit, 100,910 pages: one slot is in the gap (3.3e9), 2 slots are past 2**32 bytes, and so
  # are 8: one group.
  assert group_pool(8, 32_768, 1, 100_910, True) == PoolGroups(8, 100_910)
  # One slot in the gap has no other group: capped at 2**31 // 32,768 = 65,535 pages.
  assert group_pool(1, 32_768, 1, 100_910, True) == PoolGroups(1, 65_535)
  with pytest.raises(ValueError, match=r"^cache.num_pages: 100000 pages .*8-bit.* at most 65535"):
    group_pool(1, 32_768, 1, 100_000, True, asked=100_000)


def test_a_spec_records_its_groups():
  spec = KVCacheSpec(12, 2, 64, 16, 10, "bfloat16", 4)
  assert spec.num_groups == 3 and spec.group_shape == (4, 2, 10, 16, 64)
  assert spec.bytes_per_page == 2 * 12 * 2 * 16 * 64 * 2  # every slot, K and V
  with pytest.raises(ValueError, match="slots_per_group: must divide num_slots 12, got 5"):
    KVCacheSpec(12, 2, 64, 16, 10, "bfloat16", 5)


def test_a_budget_past_int32_offsets_is_capped_with_a_warning(caplog):
  # Llama 3.2 1B (16 layers, 8 kv heads, head_dim 64) with 8-bit pages of 16 tokens: 8192 elements
  # per page of a slot's array, so 2**31 elements hold 262,143 pages; a 200 GiB budget would hold
  # 819,200 (16 layers x K, V x 8192 bytes a page): 16 groups of one slot.
  model = named_model_config("llama-3.2-1b")
  config = EngineConfig(cache=CacheConfig(page_size=16, kv_cache_dtype="fp8"))
  caplog.set_level(logging.WARNING, logger="jaxserve.device.kv_cache")
  spec = kv_cache_spec(config, model, 2048, free_bytes=200 * GIB)
  per_page = 8 * 16 * 64
  assert spec.num_pages == MAX_ARRAY_ELEMENTS // per_page == 262_143
  assert (spec.slots_per_group, spec.num_groups) == (1, 16)
  assert math.prod(spec.group_shape) < 2**31
  assert "KV pool capped at 262143 pages (the memory budget holds 819200)" in caplog.text
  # Sharded over 2 devices each holds 4 heads: twice the pages fit.
  assert kv_cache_spec(config, model, 2048, free_bytes=200 * GIB, num_shards=2).num_pages == (
    MAX_ARRAY_ELEMENTS // (4 * 16 * 64)
  )
  # Under the limit nothing is capped, and 16 slots of 4096 pages stack in one group.
  small = kv_cache_spec(config, model, 2048, free_bytes=GIB)
  assert small.num_pages == GIB // (2 * 16 * per_page) == 4096 and small.num_groups == 1


def test_an_explicit_page_count_past_int32_offsets_is_an_error():
  model = named_model_config("llama-3.2-1b")
  config = EngineConfig(cache=CacheConfig(page_size=16, num_pages=300_000))
  with pytest.raises(ValueError, match=r"^cache.num_pages: 300000 pages .* at most 262143"):
    kv_cache_spec(config, model, 2048, free_bytes=None)


def test_the_gpu_kernels_take_a_gemma_3_12b_budget_past_2_31_elements(caplog):
  # Gemma 3 12B (8 kv heads, head_dim 256, 8 global-layer KV slots), bfloat16 pages of 16
  # tokens: 32,768 elements a slot's page, 1 MiB a page (every slot, K and V). An H200's budget of
  # 100,910 pages (3.3e9 elements a slot) is capped at 65,535 for the other backends; the Triton
  # kernels address it in one group of every slot with int64 offsets
  # (tests/pallas_kernels/test_gpu_addressing.py).
  model = named_model_config("gemma-3-12b")
  config = EngineConfig(cache=CacheConfig(page_size=16))
  budget = 100_910 * MIB
  large = pallas_gpu().capabilities.large_page_arrays
  caplog.set_level(logging.WARNING, logger="jaxserve.device.kv_cache")
  spec = kv_cache_spec(config, model, 4096, free_bytes=budget, large_page_arrays=large)
  assert spec.bytes_per_page == MIB
  assert spec.num_pages == 100_910 and spec.num_groups == 1
  assert "capped" not in caplog.text
  # The backends not shown to address such arrays keep the cap.
  for backend in (XLA, pallas_tpu(), pallas_gpu(interpret=True)):
    assert not backend.capabilities.large_page_arrays, backend.name
  capped = kv_cache_spec(config, model, 4096, free_bytes=budget)
  assert capped.num_pages == 65_535 and capped.num_groups == 8
  # The 8-bit pages' wrapper keeps it, and "auto" on a GPU picks the kernel.
  for name in ("fp8", "int8"):
    fp8_config = EngineConfig(
      attention_backend="pallas_gpu", cache=CacheConfig(page_size=16, kv_cache_dtype=name)
    )
    assert attention_for(fp8_config, "gpu").capabilities.large_page_arrays
  assert get_attention_backend("auto", "gpu").capabilities.large_page_arrays


def test_8bit_pools_in_the_2_31_to_2_32_gap_take_smaller_groups_not_fewer_pages(caplog):
  # The same Gemma 3 12B with 8-bit pages (512 KiB a page): 12,614 pages are 3.3e9 one-byte
  # elements in one group of 8 slots, which Pallas would address with int32 offsets that wrap;
  # 2 groups of 4 slots hold 1.65e9 each. Twice the pages, past 2**32 bytes a group, are one.
  model = named_model_config("gemma-3-12b")
  config = EngineConfig(cache=CacheConfig(page_size=16, kv_cache_dtype="fp8"))
  caplog.set_level(logging.WARNING, logger="jaxserve.device.kv_cache")
  gap = kv_cache_spec(config, model, 4096, free_bytes=12_614 * MIB // 2, large_page_arrays=True)
  assert (gap.num_pages, gap.slots_per_group, gap.num_groups) == (12_614, 4, 2)
  assert "capped" not in caplog.text
  whole = kv_cache_spec(config, model, 4096, free_bytes=12_614 * MIB, large_page_arrays=True)
  assert (whole.num_pages, whole.num_groups) == (25_228, 1)
  explicit = EngineConfig(cache=CacheConfig(page_size=16, kv_cache_dtype="fp8", num_pages=12_000))
  assert kv_cache_spec(explicit, model, 4096, None, large_page_arrays=True).num_groups == 2
