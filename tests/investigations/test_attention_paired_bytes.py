"""investigations/attention_paired_bytes.py: 8-bit pages as uint16 pairs, the byte layout by
hand, and the paired kernel (interpret mode) against the pure-jnp reference on a step of a
5-token prefill beside two decodes, fp8 and int8 pages, bfloat16 and float16 MMAs."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from investigations.attention_paired_bytes import as_pairs, paired_attention
from investigations.bench_paired_bytes import random_batch
from pallas_kernels.ragged_paged_attention.gpu.tiling import choose_tiling
from pallas_kernels.ragged_paged_attention.reference import ragged_paged_attention_reference


def test_pairs_hold_the_even_dim_in_the_low_byte():
  pages = jnp.asarray([[1, 2, 3, -1]], jnp.int8)  # bytes 0x01 0x02 0x03 0xff
  assert as_pairs(pages).tolist() == [[0x0201, 0xFF03]]
  fp8 = jnp.asarray([[1.0, -2.0]], jnp.float8_e4m3fn)  # e4m3: 1.0 = 0x38, -2.0 = 0xc0
  assert as_pairs(fp8).tolist() == [[0xC038]]


@pytest.mark.parametrize(
  "dtype8, mma", [("float8_e4m3fn", "bfloat16"), ("float8_e4m3fn", "float16"), ("int8", "bfloat16")]
)
def test_paired_kernel_matches_the_reference(dtype8, mma):
  heads = dict(kv_heads=2, q_heads=4, head_dim=64, page_size=16)
  q, k, v, tables, seq_lens, _, n = random_batch(3, 40, dtype8=jnp.dtype(dtype8), **heads)
  # a prefill of 5 tokens for the first sequence beside two decodes
  q = jnp.concatenate([q[:1]] * 5 + [q[1:]])  # [7, 4, 64]
  qsl = jnp.asarray([0, 5, 6, 7], jnp.int32)
  tiling = choose_tiling(7, 3, 4, 2, 64, max_kv_len=48, page_itemsize=1, num_kv_splits=1)
  got = paired_attention(
    q,
    as_pairs(k),
    as_pairs(v),
    tables,
    seq_lens,
    qsl,
    n,
    tiling=tiling,
    dtype8=jnp.dtype(dtype8),
    mma_dtype=jnp.dtype(mma),
    sm_scale=0.125,
    interpret=True,
  )
  slot = jnp.zeros((1,), jnp.int32)
  want = ragged_paged_attention_reference(
    q, k[None], v[None], slot, tables, seq_lens, qsl, n, sm_scale=0.125
  )
  assert got.shape == want.shape and got.dtype == want.dtype
  np.testing.assert_allclose(
    np.asarray(got, np.float32), np.asarray(want, np.float32), atol=2e-2, rtol=2e-2
  )


def test_bad_pairs_are_refused():
  q, k, v, tables, seq_lens, qsl, n = random_batch(
    1, 16, kv_heads=1, q_heads=2, head_dim=64, page_size=16, dtype8=jnp.dtype("int8")
  )
  tiling = choose_tiling(1, 1, 2, 1, 64, max_kv_len=16, page_itemsize=1, num_kv_splits=1)
  with pytest.raises(ValueError, match="uint16 pairs"):
    paired_attention(
      q,
      k,
      v,
      tables,
      seq_lens,
      qsl,
      n,
      tiling=tiling,
      dtype8=jnp.dtype("int8"),
      sm_scale=0.125,
      interpret=True,
    )
