"""Which page arrays the GPU (Pallas Triton) kernels address without overflow.

The kernels never compute an element offset themselves: they hand Pallas a block index (the kv
head, from the BlockSpec's index map) and gather indices (page id, token in page, dim) through
`ref.at[...]`, and Pallas's Triton lowering turns them into one offset per element, start *
stride summed over the dimensions (jax/_src/pallas/triton/lowering.py,
_compute_offsets_from_indices). It computes those offsets in int64 when the whole array is
larger than 2**32 bytes and in int32 otherwise: the head's base offset h * num_pages * page_size
* head_dim and each page's page_id * page_size * head_dim are then exact in int64, and in int32
up to 2**31 - 1 elements.

So an array is addressable when it holds at most 2**31 - 1 elements (int32 offsets suffice) or
more than 2**32 bytes (int64 offsets). For 16-bit and 32-bit pages that is every size; for
8-bit pages (one byte an element) an array of 2**31 to 2**32 elements gets int32 offsets that
wrap: the kernels read and write other pages (docs/DECISIONS.md, "A KV page array past 2**31
elements"). tests/pallas_kernels/test_gpu_addressing.py lowers both
kernels for CUDA at such shapes and reads the offsets' type in the Triton module, so a JAX
release that changes the rule fails there.
"""

from __future__ import annotations

INT32_MAX_ELEMENTS = 2**31 - 1  # the largest array int32 element offsets reach
INT64_OFFSETS_ABOVE_BYTES = 2**32  # Pallas Triton's lowering switches to int64 offsets past this


def offsets_are_64bit(num_elements: int, itemsize: int) -> bool:
  """Whether Pallas Triton computes this array's element offsets in int64."""
  return num_elements * itemsize > INT64_OFFSETS_ABOVE_BYTES


def addressable(num_elements: int, itemsize: int) -> bool:
  """Whether every element of an array of num_elements items of itemsize bytes has an exact
  offset in the GPU kernels (int32 offsets that do not wrap, or int64 ones)."""
  return num_elements <= INT32_MAX_ELEMENTS or offsets_are_64bit(num_elements, itemsize)
