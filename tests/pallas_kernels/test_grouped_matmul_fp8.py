"""The W8A8 fp8 grouped matmul (pallas_kernels/grouped_matmul/fp8.py) against hand-computed values
and its pure-jnp reference: per-channel and 128 x 128 block scales, empty groups, ragged group
sizes, rows past the groups, split K, the gated SwiGLU form; its activation quantizer against
the dense W8A8 path's numpy reference (bitwise), its shape checks, and its lowering for CUDA.
Compiled on a GPU, in Pallas interpret mode elsewhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.quantization import reference as dense_reference
from jaxserve.quantization.scheme import SCHEMES
from pallas_kernels.grouped_matmul.fp8 import (
  Tiling,
  fp8_tiling,
  grouped_matmul_fp8,
  grouped_swiglu_fp8,
  quantize_rows,
)
from pallas_kernels.grouped_matmul.reference import (
  grouped_matmul_fp8_reference,
  grouped_swiglu_fp8_reference,
)
from tests.pallas_kernels.test_gpu_lowering import _custom_call_targets, _lower_for_cuda

INTERPRET = jax.default_backend() != "gpu"
E4M3 = jnp.float8_e4m3fn


def _silu(x):
  return x / (1.0 + np.exp(-x))


def test_hand_computed_per_channel():
  """Group 0 rows 0-1 (identity weights, channel scales 2), group 1 empty (its weights must not
  reach any row), group 2 row 2 (weights all ones in column 3, scale 0.5), row 3 past the groups.
  Row 2 is [1, 0.01, 0, ...]: 0.01 * 448 = 4.48 rounds to e4m3's 4.5, so its product is
  (448 + 4.5) / 448 * 0.5, the activation quantization visible."""
  k, n = 32, 16
  rows = np.zeros((4, k), np.float32)
  rows[0, 0], rows[1, 1], rows[2, 0], rows[2, 1], rows[3, 3] = 1.0, -3.0, 1.0, 0.01, 5.0
  weights = np.zeros((3, n, k), np.float32)
  weights[0] = np.eye(n, k)
  weights[1] = 100 * np.eye(n, k) / 448
  weights[2, 3, :] = 1.0
  scale = np.array([np.full(n, 2.0), np.full(n, 448.0), np.full(n, 0.5)], np.float32)
  sizes = jnp.array([2, 0, 1], jnp.int32)
  out = grouped_matmul_fp8(
    jnp.asarray(rows), jnp.asarray(weights, E4M3), jnp.asarray(scale), sizes,
    tiling=Tiling(16, 16, 16), interpret=INTERPRET,
  )  # fmt: skip
  want = np.zeros((4, n), np.float32)
  want[0, 0], want[1, 1], want[2, 3] = 2.0, -6.0, (448 + 4.5) / 448 * 0.5
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=0)


def test_hand_computed_block_scales():
  """K 256 = two 128-blocks with weight scales 3 (block 0) and 0.25 (block 1) for group 1's one
  block of columns: row 0 [x0 = 1, x130 = 4] gets 1 * 3 + 4 * 0.25 in column 0 (weights 1 at
  k 0 and 130) and 4 * 0.25 in column 5 (weight 1 at k 130): each K block its own scales, and
  the activations' per-128 scales (1 / 448 and 4 / 448) exact. Group 0 is empty."""
  k, n = 256, 128
  rows = np.zeros((2, k), np.float32)
  rows[0, 0], rows[0, 130], rows[1, 200] = 1.0, 4.0, 2.0
  weights = np.zeros((2, n, k), np.float32)
  weights[1, 0, 0] = weights[1, 0, 130] = weights[1, 5, 130] = 1.0
  weights[1, 7, 200] = -2.0
  scale = np.zeros((2, 1, 2), np.float32)
  scale[0] = 1000.0
  scale[1, 0] = [3.0, 0.25]
  gated = jnp.asarray(np.ones((2, n, k)), E4M3)  # up: all ones, scale 1
  for tiling in (Tiling(16, 64, 128), Tiling(16, 32, 64, 2)):
    args = (jnp.asarray(weights, E4M3), jnp.asarray(scale))
    sizes = jnp.array([0, 2], jnp.int32)
    out = grouped_matmul_fp8(jnp.asarray(rows), *args, sizes, tiling=tiling, interpret=INTERPRET)
    want = np.zeros((2, n), np.float32)
    want[0, 0], want[0, 5], want[1, 7] = 4.0, 1.0, -1.0
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=0)
    up_scale = jnp.ones((2, 1, 2), jnp.float32)
    swiglu = grouped_swiglu_fp8(
      jnp.asarray(rows), *args, gated, up_scale, sizes, tiling=tiling, interpret=INTERPRET
    )
    up = rows.sum(axis=1, keepdims=True)  # every up column: the row's sum (5, 2)
    np.testing.assert_allclose(np.asarray(swiglu), _silu(want) * up, rtol=1e-6, atol=1e-7)


def _case(rng, m, k, n, g, dtype, blocks, sizes=None):
  rows = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1)), dtype)
  weights, scales = [], []
  for _ in "gu":
    weights.append(jnp.asarray(rng.uniform(-448, 448, (g, n, k)), jnp.float32).astype(E4M3))
    shape = (g, n // 128, k // 128) if blocks else (g, n)
    scales.append(jnp.asarray(rng.uniform(0.1, 1.0, shape) / (448 * k**0.5), jnp.float32))
  if sizes is None:
    cuts = np.sort(rng.integers(0, m + 1, g))  # repeated cuts: empty groups; sum <= m
    sizes = np.diff(np.concatenate([[0], cuts]))
  return rows, weights, scales, jnp.asarray(sizes, jnp.int32)


@pytest.mark.parametrize(
  "m,k,n,g,dtype,blocks,tiling,sizes",
  [
    (1, 32, 16, 1, jnp.float32, False, Tiling(16, 16, 16), [1]),
    (37, 128, 32, 5, jnp.float32, False, Tiling(16, 32, 32, 2), None),
    (40, 256, 128, 4, jnp.bfloat16, True, None, [0, 40, 0, 0]),  # every row in one group
    (50, 256, 128, 3, jnp.bfloat16, True, Tiling(32, 64, 64, 2), [30, 30, 30]),  # overrun M
    (64, 256, 256, 6, jnp.bfloat16, True, Tiling(16, 128, 128, 2), None),
    (100, 128, 64, 6, jnp.bfloat16, False, Tiling(64, 32, 64, 1, num_warps=8), None),
    (24, 384, 128, 16, jnp.bfloat16, True, None, np.full(16, 1)),  # 8 rows past the groups
  ],
)
def test_random_sweep_against_reference(m, k, n, g, dtype, blocks, tiling, sizes):
  rng = np.random.default_rng(m * k + n)
  rows, (gate, up), (gs, us), sizes = _case(rng, m, k, n, g, dtype, blocks, sizes)
  tol = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=1e-2, atol=1e-2)
  out = grouped_matmul_fp8(rows, gate, gs, sizes, tiling=tiling, interpret=INTERPRET)
  assert out.shape == (m, n) and out.dtype == dtype
  want = np.asarray(grouped_matmul_fp8_reference(rows, gate, gs, sizes), np.float32)
  np.testing.assert_allclose(np.asarray(out, np.float32), want, **tol)
  assert np.abs(want).max() > 0.1  # the products are not all rounding noise
  past = min(int(np.sum(sizes)), m)
  assert not np.asarray(out, np.float32)[past:].any()  # zero past the groups
  gated = grouped_swiglu_fp8(rows, gate, gs, up, us, sizes, tiling=tiling, interpret=INTERPRET)
  want = np.asarray(grouped_swiglu_fp8_reference(rows, gate, gs, up, us, sizes), np.float32)
  np.testing.assert_allclose(np.asarray(gated, np.float32), want, **tol)


def test_per_token_quantizer_is_the_dense_w8a8_one():
  """quantize_rows over all of K is bitwise the dense fp8 path's per-token quantizer (numpy
  reference, jaxserve/quantization/reference.py), zero rows included."""
  x = np.random.default_rng(3).standard_normal((9, 256)).astype(np.float32) * 7
  x[4] = 0.0
  q, scale = quantize_rows(jnp.asarray(x), 256)
  want_q, want_scale = dense_reference.quantize_rows(x, SCHEMES["fp8"])
  np.testing.assert_array_equal(np.asarray(scale)[:, 0], want_scale)
  np.testing.assert_array_equal(np.asarray(q, np.float32), want_q.astype(np.float32))


def _args(m=4, k=128, n=128, g=3, scale=None):
  return (
    jnp.zeros((m, k), jnp.bfloat16),
    jnp.zeros((g, n, k), E4M3),
    jnp.zeros(scale or (g, n), jnp.float32),
    jnp.zeros((g,), jnp.int32),
  )


@pytest.mark.parametrize(
  "args,tiling,field",
  [
    ((jnp.zeros((4, 128), jnp.int8),) + _args()[1:], None, "rows: expected [M, K] bfloat16"),
    ((_args()[0], jnp.zeros((3, 128, 128), jnp.bfloat16)) + _args()[2:], None, "weights"),
    ((_args()[0], jnp.zeros((3, 128, 64), E4M3)) + _args()[2:], None, "weights: expected"),
    (_args(scale=(3, 64)), None, "w_scale: expected float32[3, 128]"),
    (_args(scale=(3, 1, 2)), None, "w_scale: expected"),
    (_args(n=48, k=128, scale=(3, 1, 1)), None, "w_scale: expected"),  # N not blocks of 128
    (_args()[:3] + (jnp.zeros((4,), jnp.int32),), None, "group_sizes: expected int[3]"),
    (_args(n=24), None, "weights: K and N must be multiples of 16"),
    (_args(), Tiling(16, 48, 16), "tiling: blocks must be powers of two"),
    (_args(scale=(3, 1, 1)), Tiling(16, 256, 128), "tiling: N 128 must be a multiple"),
    (_args(n=256, scale=(3, 2, 1)), Tiling(16, 256, 128), "tiling: block scales need"),
  ],
)
def test_bad_shapes_raise_value_errors_naming_the_array(args, tiling, field):
  with pytest.raises(ValueError, match="grouped_matmul_fp8: " + field.replace("[", r"\[")):
    grouped_matmul_fp8(*args, tiling=tiling, interpret=True)
  rows, weights, scale, sizes = args
  with pytest.raises(ValueError, match="grouped_swiglu_fp8: "):
    grouped_swiglu_fp8(rows, weights, scale, weights, scale, sizes, tiling=tiling, interpret=True)


def test_no_rows_gives_an_empty_output():
  rows, weights, scale, sizes = _args(m=0)
  out = grouped_matmul_fp8(rows, weights, scale, sizes, interpret=True)
  assert out.shape == (0, 128) and out.dtype == jnp.bfloat16


def test_default_tiling_walks_k_in_blocks_of_128():
  """Qwen3-30B-A3B's and Mixtral's experts at decode and prefill sizes: K slices of 128 (the
  block scales' width) that divide K with the splits, block_n dividing 128."""
  for e, h, i, top in ((128, 2048, 768, 8), (8, 4096, 14336, 2)):
    for tokens in (1, 64, 8192):
      for k, n, gated in ((h, i, True), (i, h, False)):
        t = fp8_tiling(tokens * top, k, n, e, gated)
        assert t.block_k == 128 and k % (t.block_k * t.num_splits) == 0
        assert 128 % t.block_n == 0 and n % t.block_n == 0


@pytest.mark.parametrize("tokens", [1, 8192])
@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "block"])
def test_lowers_to_one_triton_call_for_cuda(tokens, blocks):
  """Qwen3-30B-A3B's fp8 experts: the fused gate/up [E, I, H] and the down projection
  [E, H, I], each one Triton call."""
  m, e, h, i = tokens * 8, 128, 2048, 768
  sizes = jax.ShapeDtypeStruct((e,), jnp.int32)

  def scale(n, k):
    return jax.ShapeDtypeStruct((e, n // 128, k // 128) if blocks else (e, n), jnp.float32)

  gate = jax.ShapeDtypeStruct((e, i, h), E4M3)
  for text in (
    _lower_for_cuda(
      grouped_swiglu_fp8,
      jax.ShapeDtypeStruct((m, h), jnp.bfloat16), gate, scale(i, h), gate, scale(i, h), sizes,
    ),
    _lower_for_cuda(
      grouped_matmul_fp8,
      jax.ShapeDtypeStruct((m, i), jnp.bfloat16),
      jax.ShapeDtypeStruct((e, h, i), E4M3), scale(h, i), sizes,
    ),
  ):  # fmt: skip
    assert _custom_call_targets(text) == {"__gpu$xla.gpu.triton"}
    assert text.count('name = "grouped_matmul_fp8"') == 1
