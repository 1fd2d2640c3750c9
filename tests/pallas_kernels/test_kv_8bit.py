"""The 8-bit KV cache (kv_quant.py): float8_e4m3fn and int8 pages holding K / k_scale and
V / v_scale, written by every write variant and read by every attention variant.

Hand-computed cases pin the format (the stored values, an attention output worked out on paper);
a randomized sweep compares the GPU kernel (Pallas interpreter), the XLA path and, on one tiny
shape, the TPU kernel (TPU interpret mode, slow) against the pure-jnp reference on the same 8-bit
pages; write-then-read round trips check the written bytes equal the reference's and that the
attention over them stays within the format's rounding of float pages' attention.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.attention.xla import ragged_paged_attention_xla
from pallas_kernels.ragged_paged_attention.gpu import attention as gpu
from pallas_kernels.ragged_paged_attention.kv_quant import dequantize_kv, quantize_kv
from pallas_kernels.ragged_paged_attention.reference import (
  ragged_paged_attention_reference,
  write_kv_reference,
)
from pallas_kernels.ragged_paged_attention.testing import (
  attention_args,
  make_random_case,
  quantize_pages,
  write_args,
)
from pallas_kernels.ragged_paged_attention.tpu import attention as tpu

FP8, INT8 = jnp.float8_e4m3fn, jnp.int8
DTYPES = [pytest.param(FP8, id="fp8"), pytest.param(INT8, id="int8")]
SCALES = {FP8: (1.0, 1.0), INT8: (5.0 / 127, 4.5 / 127)}  # int8: the N(0, 1) samples covered
ATTEND = {
  "reference": ragged_paged_attention_reference,
  "xla": ragged_paged_attention_xla,
  "gpu": functools.partial(gpu.ragged_paged_attention, interpret=True),
}


def test_quantize_by_hand():
  x = jnp.array([0.3, -1.26, 600.0, -0.0004])
  assert quantize_kv(x, FP8, 1.0).astype(jnp.float32).tolist() == [0.3125, -1.25, 448.0, -0.0]
  assert quantize_kv(x, INT8, 0.01).tolist() == [30, -126, 127, 0]
  assert dequantize_kv(jnp.array([30, -126], INT8), 0.01).tolist() == pytest.approx([0.3, -1.26])


def _hand_case(dtype):
  """One decode token (position 1) of one sequence over 2 cached tokens in page 1 of slot 1 (slot
  0 holds junk).

  K stored [10, 0, ...] and 0, k_scale ln(3) / 10, q [1, 0, ...], sm_scale 1: scores ln 3 and 0,
  softmax 3/4 and 1/4. V stored 4 and 8 everywhere, v_scale 0.5: out = 0.5 * (3 + 2) = 2.5."""
  head_dim, page_size = 64, 16
  k = np.full((2, 1, 2, page_size, head_dim), 7.0, np.float32)
  v = np.full((2, 1, 2, page_size, head_dim), 7.0, np.float32)
  k[1], v[1] = 0.0, 0.0
  k[1, 0, 1, 0, 0] = 10.0
  v[1, 0, 1, 0], v[1, 0, 1, 1] = 4.0, 8.0
  q = np.zeros((1, 1, head_dim), np.float32)
  q[0, 0, 0] = 1.0
  return (
    jnp.asarray(q),
    jnp.asarray(k, dtype),
    jnp.asarray(v, dtype),
    jnp.array([1], jnp.int32),  # kv_slot
    jnp.array([[1]], jnp.int32),
    jnp.array([2], jnp.int32),
    jnp.array([0, 1], jnp.int32),
    jnp.array([1], jnp.int32),
  )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", list(ATTEND))
def test_attention_by_hand(variant, dtype):
  out = ATTEND[variant](*_hand_case(dtype), sm_scale=1.0, k_scale=math.log(3.0) / 10, v_scale=0.5)
  np.testing.assert_allclose(np.asarray(out), 2.5, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("write", ["reference", "gpu"])
def test_write_by_hand(write, dtype):
  pool = jnp.zeros((2, 1, 2, 16, 64), dtype)  # 2 slots; slot 1 written
  new = jnp.full((2, 1, 64), 0.3, jnp.float32).at[1].set(-1.26)
  fn = (
    write_kv_reference if write == "reference" else functools.partial(gpu.write_kv, interpret=True)
  )
  k_pool, v_pool = fn(
    pool,
    pool,
    jnp.array([1], jnp.int32),
    new,
    new,
    jnp.array([17, 18], jnp.int32),
    k_scale=0.01,
    v_scale=1.0,
  )
  assert not jnp.any(k_pool[0].astype(jnp.float32)) and not jnp.any(v_pool[0].astype(jnp.float32))
  k, v = k_pool[1, 0, 1].astype(jnp.float32), v_pool[1, 0, 1].astype(jnp.float32)
  expected_v = {FP8: (0.3125, -1.25), INT8: (0.0, -1.0)}[dtype]
  expected_k = {FP8: (30.0, -128.0), INT8: (30.0, -126.0)}[dtype]
  assert (k[1:3, 0].tolist(), v[1:3, 0].tolist()) == (list(expected_k), list(expected_v))
  assert float(jnp.abs(k).sum()) == 64 * (30.0 + abs(expected_k[1]))  # nothing else written


def _case(seed, **kwargs):
  return make_random_case(
    np.random.default_rng(seed),
    num_seqs=4,
    q_lens=[1, 1, 6],
    kv_lens=[37, 16, 6],
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=64,
    page_size=16,
    **kwargs,
  )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", ["gpu", "xla"])
@pytest.mark.parametrize(
  "options", [{}, {"sliding_window": 9, "soft_cap": 5.0}], ids=["plain", "window+cap"]
)
def test_matches_reference_on_8bit_pages(variant, dtype, options):
  k_scale, v_scale = SCALES[dtype]
  case = quantize_pages(_case(1), dtype, k_scale, v_scale)
  kwargs = dict(sm_scale=0.125, k_scale=k_scale, v_scale=v_scale, **options)
  out = ATTEND[variant](*attention_args(case), **kwargs)
  expected = ragged_paged_attention_reference(*attention_args(case), **kwargs)
  np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=2e-5, rtol=2e-5)


# Output error of 8-bit pages against float pages over the same random K/V (|x| ~ N(0, 1)),
# bounded a little above what was measured: fp8's 3 mantissa bits, int8's steps of scale.
ROUND_TRIP_ATOL = {FP8: 0.15, INT8: 0.04}  # measured: 0.119, 0.026


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_then_read_round_trip(dtype):
  """The GPU write kernel stores the reference's bytes; attention over them stays within the
  format's rounding of the same computation on float32 pages."""
  k_scale, v_scale = SCALES[dtype]
  floats = _case(2)
  case = quantize_pages(floats, dtype, k_scale, v_scale)
  scales = dict(k_scale=k_scale, v_scale=v_scale)
  k_pages, v_pages = gpu.write_kv(*write_args(case), interpret=True, **scales)
  ref_k, ref_v = write_kv_reference(*write_args(case), **scales)
  assert k_pages.dtype == jnp.dtype(dtype)
  np.testing.assert_array_equal(np.asarray(k_pages.astype(jnp.float32)), ref_k.astype(jnp.float32))
  np.testing.assert_array_equal(np.asarray(v_pages.astype(jnp.float32)), ref_v.astype(jnp.float32))
  out = gpu.ragged_paged_attention(
    *attention_args({**case, "k_pool": k_pages, "v_pool": v_pages}),
    sm_scale=0.125,
    interpret=True,
    **scales,
  )
  float_pages = write_kv_reference(*write_args(floats))
  exact = ragged_paged_attention_reference(
    *attention_args({**floats, "k_pool": float_pages[0], "v_pool": float_pages[1]}),
    sm_scale=0.125,
  )
  error = float(jnp.abs(out - exact).max())
  print(f"{jnp.dtype(dtype).name} pages: max |out - float pages' out| = {error:.4f}")
  assert 0 < error < ROUND_TRIP_ATOL[dtype]


@pytest.mark.parametrize("dtype", [INT8])  # fp8: compiled for a v5e in test_tpu_lowering.py
def test_tpu_kernel_in_interpret_mode(dtype):
  """One tiny shape: write then attend (8-bit tiles are 32 rows: page_size 32)."""
  k_scale, v_scale = SCALES[dtype]
  case = make_random_case(
    np.random.default_rng(3),
    num_seqs=2,
    q_lens=[1, 5],
    kv_lens=[40, 5],
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=128,
    page_size=32,
  )
  case = quantize_pages(case, dtype, k_scale, v_scale)
  scales = dict(k_scale=k_scale, v_scale=v_scale)
  k_pages, v_pages = jax.block_until_ready(
    tpu.write_kv(*write_args(case), interpret=True, **scales)
  )
  ref_k, ref_v = write_kv_reference(*write_args(case), **scales)
  np.testing.assert_array_equal(np.asarray(k_pages.astype(jnp.float32)), ref_k.astype(jnp.float32))
  np.testing.assert_array_equal(np.asarray(v_pages.astype(jnp.float32)), ref_v.astype(jnp.float32))
  args = attention_args({**case, "k_pool": ref_k, "v_pool": ref_v})
  kwargs = dict(sm_scale=0.125, **scales)
  out = jax.block_until_ready(
    tpu.ragged_paged_attention(*args, num_queries_per_block=16, interpret=True, **kwargs)
  )
  expected = ragged_paged_attention_reference(*args, **kwargs)
  np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=2e-5, rtol=2e-5)


def test_bad_scales_and_shapes_raise():
  case = _case(4)
  with pytest.raises(ValueError, match="k_scale: 0.5 given for float32 pages"):
    ragged_paged_attention_reference(*attention_args(case), sm_scale=0.1, k_scale=0.5)
  quantized = quantize_pages(case, INT8, 0.1, 0.1)
  with pytest.raises(ValueError, match="v_scale: must be a finite float > 0"):
    gpu.write_kv(*write_args(quantized), v_scale=0.0, interpret=True)
  with pytest.raises(ValueError, match="page_size 16 is not a multiple of the 32-row"):
    tpu.ragged_paged_attention(*attention_args(quantized), sm_scale=0.1, interpret=True)
