"""`jaxserve kv-plan`: page arithmetic by hand, paged vs contiguous, and the engine's page count."""

from __future__ import annotations

import json

from jaxserve.cli import main as jaxserve_main
from jaxserve.models.tiny_random import tiny_random_config
from jaxserve.tools.kv_plan import plan
from tests.models.gemma_shapes import gemma3
from tests.tools.tool_helpers import SMALL_ENGINE_ARGS, SMALL_NUM_PAGES

# tiny-random: 2 layers, 2 KV heads, head_dim 64, float32: K and V of one 16-token page
TINY_PAGE_BYTES = 2 * 2 * 2 * 16 * 64 * 4


def test_paged_fits_more_short_sequences_than_contiguous():
  budget = 100 * TINY_PAGE_BYTES + 123
  result = plan(
    tiny_random_config(),
    page_size=16,
    max_model_len=512,
    budget_bytes=budget,
    avg_seq_len=100,
    max_num_seqs=64,
  )
  assert (
    result.bytes_per_page == TINY_PAGE_BYTES and result.bytes_per_token == TINY_PAGE_BYTES // 16
  )
  assert result.num_pages == 100 and result.paged_token_capacity == 99 * 16
  assert result.pages_per_seq == 7 and result.paged_max_seqs == 99 // 7
  assert result.contiguous_max_seqs == budget // (512 * TINY_PAGE_BYTES // 16) == 3
  assert result.paged_max_seqs > result.contiguous_max_seqs
  # At avg_seq_len == max_model_len paging holds no more (the null page costs one page).
  full = plan(
    tiny_random_config(),
    page_size=16,
    max_model_len=512,
    budget_bytes=budget,
    avg_seq_len=512,
    max_num_seqs=64,
  )
  assert full.paged_max_seqs <= full.contiguous_max_seqs


def test_kv_plan_command_matches_the_engine(tmp_path, capsys):
  memory_gb = SMALL_NUM_PAGES * TINY_PAGE_BYTES / 2**30
  out = tmp_path / "kv_plan.json"
  code = jaxserve_main(
    [
      "kv-plan",
      *SMALL_ENGINE_ARGS,
      "--memory-gb",
      str(memory_gb),
      "--avg-seq-len",
      "40",
      "--check",
      "--out",
      str(out),
    ]
  )
  assert code == 0
  report = json.loads(out.read_text())
  assert report["num_pages"] == report["spec_num_pages"] == SMALL_NUM_PAGES
  assert report["engine_num_pages"] == SMALL_NUM_PAGES
  assert report["paged_max_seqs"] == (SMALL_NUM_PAGES - 1) // 3
  assert report["contiguous_max_seqs"] == SMALL_NUM_PAGES * 16 // 256
  assert report["paged_max_seqs"] > report["contiguous_max_seqs"]
  assert "paged / contiguous sequences" in capsys.readouterr().out


def test_quantized_weights_are_counted_in_eight_bits():
  """The planner's weights follow the scheme: 8-bit projection kernels plus float32 scales."""
  from jaxserve.config import EngineConfig
  from jaxserve.tools.kv_plan import model_config_for, weight_bytes

  config = model_config_for(EngineConfig(dtype="bfloat16"))
  int8 = model_config_for(EngineConfig(dtype="bfloat16", quantization="int8"))
  assert int8.quantization == "int8"
  c = config
  projections = c.num_layers * (
    c.hidden_size * (c.num_q_heads + 2 * c.num_kv_heads) * c.head_dim
    + c.num_q_heads * c.head_dim * c.hidden_size
    + 3 * c.hidden_size * c.intermediate_size
  )
  outputs = c.num_layers * (
    (c.num_q_heads + 2 * c.num_kv_heads) * c.head_dim + 2 * c.hidden_size + 2 * c.intermediate_size
  )
  assert weight_bytes(config) - weight_bytes(int8) == projections - 4 * outputs


def test_8bit_kv_pages_nearly_double_the_token_capacity():
  """fp8 / int8 pages are one byte an element (the static scales take no memory): a budget
  holds 4x float32's and 2x bfloat16's pages, null page aside; the engine's spec agrees."""
  from jaxserve.config import CacheConfig, EngineConfig
  from jaxserve.device.kv_cache import kv_cache_spec

  budget = 100 * TINY_PAGE_BYTES
  capacity = {}
  for kv_dtype in ("float32", "bfloat16", "float8_e4m3fn", "int8"):
    result = plan(
      tiny_random_config(),
      page_size=16,
      max_model_len=512,
      budget_bytes=budget,
      avg_seq_len=100,
      max_num_seqs=64,
      kv_dtype=kv_dtype,
    )
    itemsize = {"float32": 4, "bfloat16": 2}.get(kv_dtype, 1)
    assert result.bytes_per_page == TINY_PAGE_BYTES // 4 * itemsize
    capacity[kv_dtype] = result.paged_token_capacity
  assert capacity == {
    "float32": 99 * 16,
    "bfloat16": 199 * 16,
    "float8_e4m3fn": 399 * 16,
    "int8": 399 * 16,
  }
  assert capacity["int8"] / capacity["bfloat16"] == 399 / 199  # >= 1.9x, the bar
  for name, pages in (("auto", 100), ("fp8", 400), ("int8", 400)):
    config = EngineConfig(cache=CacheConfig(memory_bytes=budget, kv_cache_dtype=name))
    assert kv_cache_spec(config, tiny_random_config(), 512, None).num_pages == pages


def test_gemma_3_pages_follow_the_windows():
  """Gemma-3-12B's shape (8 global and 40 sliding layers of window 1024: 6 KV groups of 8 slots),
  bfloat16, 16-token pages: a page holds 8 layers' K/V; a context of 8448 tokens holds 528 global
  pages and 65 per sliding group (ceil(1023 / 16) + 1), 853 in all, against 6 * 528 without
  window freeing."""
  page_bytes = 2 * 8 * 8 * 16 * 256 * 2  # K and V, 8 slots, 8 kv heads, head_dim 256, bf16
  result = plan(
    gemma3(48),
    page_size=16,
    max_model_len=8448,
    budget_bytes=10_000 * page_bytes,
    avg_seq_len=8448,
    max_num_seqs=64,
  )
  assert result.bytes_per_page == page_bytes and result.num_pages == 10_000
  assert result.bytes_per_token == 2 * 48 * 8 * 256 * 2
  assert result.num_kv_groups == 6
  assert (result.pages_per_seq, result.pages_per_seq_without_freeing) == (853, 3168)
  assert (result.paged_max_seqs, result.paged_max_seqs_without_freeing) == (11, 3)
  assert result.paged_token_capacity == 9999 * 16 * 528 // 853
  assert result.paged_token_capacity_without_freeing == 9999 * 16 // 6
