"""The GPU kernels address a Gemma-3-12B-shaped stacked pool past 2**31 elements: both kernels are
lowered for CUDA (no GPU, no memory: the pages are jax.ShapeDtypeStructs), the Triton module
Pallas builds is captured and the integer type of every offset added to the K/V page pointers is
read. investigations/triton_static.py builds the kernels' calls and captures their modules, for
this test as for its reports (`AttentionShape`, `attention_call`, `write_kv_call`,
`lowered_modules`). gpu_addressing.offsets_are_64bit must say what the lowering does, and no
array that gpu_addressing.addressable admits may get offsets that wrap."""

from __future__ import annotations

import re

import jax.numpy as jnp
import pytest

from investigations import triton_static
from pallas_kernels.ragged_paged_attention.gpu.addressing import (
  INT32_MAX_ELEMENTS,
  addressable,
  offsets_are_64bit,
)

# Gemma 3 12B: 16 q heads, 8 kv heads, head_dim 256, 8 KV slots (its global layers); pages of 16.
Q_HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE, NUM_SLOTS = 16, 8, 256, 16, 8
NUM_SEQS, PAGES_PER_SEQ = 4, 64
PAGES_ARGS = {"ragged_paged_attention": (8, 9), "write_kv_pages": (6, 7)}  # (k, v) pointers


def _page_offset_types(module: str, page_args: tuple[int, ...]) -> set[str]:
  """The integer types of the offsets added to the page arrays' pointers in one Triton module."""
  splats = dict(re.findall(r"(%\d+) = tt\.splat %arg(\d+) :", module))
  adds = re.findall(r"tt\.addptr (%\d+), %\d+ : [^,]+, tensor<[\dx]+x(i\d+)>", module)
  return {kind for base, kind in adds if int(splats.get(base, -1)) in page_args}


def _lowered_modules(num_pages: int, dtype) -> dict[str, str]:
  shape = triton_static.AttentionShape(
    NUM_SEQS,
    PAGES_PER_SEQ,
    q_heads=Q_HEADS,
    kv_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    page_size=PAGE_SIZE,
    num_pages=num_pages,
    num_slots=NUM_SLOTS,
  )
  modules = triton_static.lowered_modules(
    triton_static.attention_call(shape, dtype), triton_static.write_kv_call(shape, dtype)
  )
  return {re.search(r"tt\.func public @(\w+)", m).group(1): m for m in modules}


@pytest.mark.parametrize(
  "dtype,num_pages,offset_type",
  [
    # 12,614 pages of 8 slots: 3.3e9 elements, 6.6 GB a pool.
    ("bfloat16", 12_614, "i64"),
    # 8,191 pages of 8 slots: just under 2**31 elements.
    ("bfloat16", 8_191, "i32"),
    # 8-bit pages, twice as many: 6.6e9 bytes.
    ("float8_e4m3fn", 25_228, "i64"),
    # 8-bit pools of 2**31 to 2**32 elements: int32 offsets past 2**31 - 1 (the gap).
    ("float8_e4m3fn", 12_614, "i32"),
  ],
)
def test_page_offsets_are_64bit_exactly_where_the_rule_says(dtype, num_pages, offset_type):
  modules = _lowered_modules(num_pages, jnp.dtype(dtype))
  assert set(modules) == set(PAGES_ARGS)
  for name, module in modules.items():
    assert _page_offset_types(module, PAGES_ARGS[name]) == {offset_type}, name
  elements = NUM_SLOTS * KV_HEADS * num_pages * PAGE_SIZE * HEAD_DIM
  itemsize = jnp.dtype(dtype).itemsize
  assert offsets_are_64bit(elements, itemsize) == (offset_type == "i64")
  # Addressable: 64-bit offsets, or int32 ones that cannot wrap.
  assert addressable(elements, itemsize) == (offset_type == "i64" or elements <= INT32_MAX_ELEMENTS)
