"""The routed fp8 grouped matmuls (pallas_kernels/grouped_matmul/fp8_routed.py: the tokens
gathered into the gate/up product, the down product's rows scattered to their assignments, times
their routing weights) against hand-computed values and their pure-jnp references: other
devices' experts, an expert with no assignment, split K, block scales; the gathered rows
bitwise the sorted kernel's; shape checks; lowering for CUDA. Compiled on a GPU, in Pallas
interpret mode elsewhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.grouped_matmul.fp8 import grouped_swiglu_fp8
from pallas_kernels.grouped_matmul.fp8_routed import (
  grouped_matmul_fp8_scattered,
  grouped_swiglu_fp8_gathered,
)
from pallas_kernels.grouped_matmul.gpu import Tiling
from pallas_kernels.grouped_matmul.reference import (
  grouped_matmul_fp8_scattered_reference,
  grouped_swiglu_fp8_gathered_reference,
)
from pallas_kernels.grouped_matmul.routing import route_assignments
from pallas_kernels.grouped_matmul.tiles import default_block_m
from tests.pallas_kernels.test_gpu_lowering import _custom_call_targets, _lower_for_cuda

INTERPRET = jax.default_backend() != "gpu"
E4M3 = jnp.float8_e4m3fn
SMALL = Tiling(16, 16, 16)
# 3 tokens, top 2, 2 local experts (id 2 another device's): assignments a = t * 2 + k go to
# experts [1, 0, 2, 1, 0, 0], so the sorted rows are expert 0's a = 1, 4, 5, expert 1's 0, 3,
# then the non-local 2
IDS = jnp.array([[1, 0], [2, 1], [0, 0]], jnp.int32)
ORDER = [1, 4, 5, 0, 3, 2]


def _silu(x):
  return x / (1.0 + np.exp(-x))


def _routing():
  routing = route_assignments(IDS, 2, 16, interpret=INTERPRET)
  assert np.asarray(routing.order).tolist() == ORDER
  return routing


def test_scattered_hand_computed():
  """Sorted row r holds r + 1 at column r (one value: it quantizes exactly); expert 0's weights
  are the identity with channel scales 2, expert 1's with 0.5, so assignment ORDER[r] gets
  (r + 1) * scale * route_w at column r; the non-local row stays zero."""
  k, n = 32, 16
  rows = np.zeros((6, k), np.float32)
  for r in range(6):
    rows[r, r] = r + 1
  weights = jnp.asarray(np.stack([np.eye(n, k), np.eye(n, k)]), E4M3)  # [2, N, K]
  scale = jnp.asarray([np.full(n, 2.0), np.full(n, 0.5)], jnp.float32)
  route_w = jnp.asarray([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], jnp.float32)
  out = grouped_matmul_fp8_scattered(
    jnp.asarray(rows), weights, scale, _routing(), route_w, tiling=SMALL, interpret=INTERPRET
  )
  want = np.zeros((6, n), np.float32)
  for r, (a, s) in enumerate(zip(ORDER[:5], (2.0, 2.0, 2.0, 0.5, 0.5), strict=True)):
    want[a, r] = (r + 1) * s * float(route_w[a])
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=0)


def test_gathered_hand_computed():
  """Token t holds t + 1 at column t; gate and up are the identity with channel scales 1
  (expert 0) and 2 (expert 1), so sorted row r of token t = ORDER[r] // 2 is silu(s (t + 1)) *
  s (t + 1) at column t; the non-local row is zero."""
  k, n = 32, 16
  x = np.zeros((3, k), np.float32)
  for t in range(3):
    x[t, t] = t + 1
  eye = jnp.asarray(np.stack([np.eye(n, k), np.eye(n, k)]), E4M3)
  scale = jnp.asarray([np.full(n, 1.0), np.full(n, 2.0)], jnp.float32)
  got = grouped_swiglu_fp8_gathered(
    jnp.asarray(x), eye, scale, eye, scale, _routing(), 2, tiling=SMALL, interpret=INTERPRET
  )
  want = np.zeros((6, n), np.float32)
  for r, s in enumerate((1.0, 1.0, 1.0, 2.0, 2.0)):
    t = ORDER[r] // 2
    want[r, t] = _silu(s * (t + 1)) * s * (t + 1)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=0)


def _experts(rng, g, n, k, blocks):
  w = jnp.asarray(rng.uniform(-448, 448, (g, n, k)), jnp.float32).astype(E4M3)
  shape = (g, n // 128, k // 128) if blocks else (g, n)
  return w, jnp.asarray(rng.uniform(0.1, 1.0, shape) / (448 * k**0.5), jnp.float32)


@pytest.mark.parametrize(
  "tokens,top_k,num_local,first,h,i,dtype,blocks,tiling",
  [
    (5, 2, 4, 0, 128, 256, jnp.float32, False, None),
    (5, 4, 8, 2, 256, 128, jnp.bfloat16, True, None),  # assignments to other devices' experts
    (3, 2, 4, 0, 256, 128, jnp.bfloat16, True, Tiling(16, 64, 64, 2)),  # split K
    (40, 2, 3, 0, 128, 128, jnp.float32, False, Tiling(32, 32, 32, 1, num_warps=8)),
  ],
)
def test_random_sweep_against_reference(
  tokens, top_k, num_local, first, h, i, dtype, blocks, tiling
):
  rng = np.random.default_rng(tokens * h + i)
  x = jnp.asarray(rng.standard_normal((tokens, h)) * rng.uniform(0.1, 10, (tokens, 1)), dtype)
  ids = jnp.asarray(rng.integers(0, num_local + 2, (tokens, top_k)), jnp.int32)
  m = tokens * top_k
  block_m = tiling.block_m if tiling else default_block_m(m, num_local)
  routing = route_assignments(ids, num_local, block_m, first, interpret=INTERPRET)
  (gate, gs), (up, us), (down, ds) = (
    _experts(rng, num_local, i, h, blocks),
    _experts(rng, num_local, i, h, blocks),
    _experts(rng, num_local, h, i, blocks),
  )
  tol = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=2e-2, atol=2e-2)
  hidden = grouped_swiglu_fp8_gathered(
    x, gate, gs, up, us, routing, top_k, tiling=tiling, interpret=INTERPRET
  )
  want = grouped_swiglu_fp8_gathered_reference(x, gate, gs, up, us, routing, top_k)
  np.testing.assert_allclose(np.asarray(hidden, np.float32), np.asarray(want, np.float32), **tol)
  assert np.abs(np.asarray(want, np.float32)).max() > 0.1  # not all rounding noise
  sorted_rows = x[routing.order // top_k]
  same = grouped_swiglu_fp8(
    sorted_rows, gate, gs, up, us, routing.group_sizes, tiling=tiling, interpret=INTERPRET
  )
  np.testing.assert_array_equal(np.asarray(hidden), np.asarray(same))  # the same rows, bitwise
  route_w = jnp.asarray(rng.random(m), jnp.float32)
  out = grouped_matmul_fp8_scattered(
    hidden, down, ds, routing, route_w, tiling=tiling, interpret=INTERPRET
  )
  want = grouped_matmul_fp8_scattered_reference(hidden, down, ds, routing, route_w)
  assert out.shape == (m, h) and out.dtype == dtype
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), **tol)
  flat = np.asarray(ids).ravel() - first
  assert not np.asarray(out, np.float32)[(flat < 0) | (flat >= num_local)].any()


def test_bad_arguments_raise_value_errors():
  routing = _routing()
  x = jnp.zeros((3, 32), jnp.bfloat16)
  w = jnp.zeros((2, 16, 32), E4M3)
  s = jnp.ones((2, 16), jnp.float32)
  with pytest.raises(ValueError, match="grouped_swiglu_fp8_gathered: top_k: expected >= 1"):
    grouped_swiglu_fp8_gathered(x, w, s, w, s, routing, 0, interpret=True)
  with pytest.raises(ValueError, match="grouped_swiglu_fp8_gathered: routing: expected"):
    grouped_swiglu_fp8_gathered(x, w, s, w, s, routing, 2, tiling=Tiling(32, 16, 16))
  rows = jnp.zeros((6, 32), jnp.bfloat16)
  with pytest.raises(ValueError, match="grouped_matmul_fp8_scattered: route_weights: expected"):
    grouped_matmul_fp8_scattered(rows, w, s, routing, jnp.zeros((6,), jnp.bfloat16))
  with pytest.raises(ValueError, match="grouped_matmul_fp8_scattered: weights: expected"):
    grouped_matmul_fp8_scattered(rows, w.astype(jnp.bfloat16), s, routing, jnp.zeros((6,)))


@pytest.mark.parametrize("tokens", [1, 256])
def test_each_product_lowers_to_one_triton_call(tokens):
  """Qwen3-30B-A3B's fp8 experts (E 128, H 2048, I 768, top 8, block scales): each product one
  Triton call and no gather or scatter of rows around it."""
  e, h, i, k = 128, 2048, 768, 8
  m = tokens * k
  sd = jax.ShapeDtypeStruct
  ids = sd((tokens, k), jnp.int32)
  routing = jax.eval_shape(lambda ids: route_assignments(ids, e, default_block_m(m, e)), ids)
  gate, gs = sd((e, i, h), E4M3), sd((e, i // 128, h // 128), jnp.float32)
  text = _lower_for_cuda(
    lambda x, g, s, r: grouped_swiglu_fp8_gathered(x, g, s, g, s, r, k),
    sd((tokens, h), jnp.bfloat16),
    gate,
    gs,
    routing,
  )
  assert _custom_call_targets(text) == {"__gpu$xla.gpu.triton"}
  assert text.count('name = "grouped_matmul_fp8"') == 1 and "stablehlo.gather" not in text
  down, ds = sd((e, h, i), E4M3), sd((e, h // 128, i // 128), jnp.float32)
  text = _lower_for_cuda(
    lambda rows, d, s, r, w: grouped_matmul_fp8_scattered(rows, d, s, r, w),
    sd((m, i), jnp.bfloat16),
    down,
    ds,
    routing,
    sd((m,), jnp.float32),
  )
  assert _custom_call_targets(text) == {"__gpu$xla.gpu.triton"}
  assert "stablehlo.scatter" not in text
