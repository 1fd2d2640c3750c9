"""A mixture of fp8 experts' two grouped products over a `Routing` (routing.py), the fp8 kernel
(fp8.py) with the bfloat16 kernel's gathered rows and scattered outputs (routed.py, gpu.py's
Addressing), so neither the permuted copy of the tokens nor the inverse permutation is an array:

  grouped_swiglu_fp8_gathered   x [T, H] -> hidden [M, I] sorted: sorted row r is
                                silu(q(x[t]) @ gate[e].T) * (q(x[t]) @ up[e].T), t = order[r] // K
  grouped_matmul_fp8_scattered  hidden [M, I] -> out [M, H] in assignment order: row a = order[r]
                                is route_w[a] * (q(hidden[r]) @ down[e].T), zero outside the groups

q quantizes a row to e4m3 (per row, or per row and 128 values of K with block scales; fp8.py's
quantize_rows). The tokens are quantized before they are gathered: a row's quantization is its
own, so the gathered rows are bitwise the sorted path's x[order // K] quantized. The hidden rows
are rounded to x's dtype and quantized again for the down product (XLA ops between the two
calls), as the sorted path does. Each output rounds once to the rows' dtype (the routing weight
applied in float32 before); the sum over each token's K assignments is the caller's. Weights
[G, N, K] with float32 scales [G, N] or [G, N / 128, K / 128], as fp8.py's.

The routing must be built for the tiling's block_m (tiles.default_block_m for the default
tilings, which both products share); both are checked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.grouped_matmul.fp8 import (
  check_fp8_operands,
  fp8_call,
  quantize_rows,
  scale_group,
)
from pallas_kernels.grouped_matmul.gpu import Addressing, Tiling
from pallas_kernels.grouped_matmul.routed import check_route_weights, check_routing
from pallas_kernels.grouped_matmul.tiles import Routing


def grouped_swiglu_fp8_gathered(
  x: jax.Array,  # [T, K] the tokens: bfloat16, float16 or float32 (quantized here)
  gate: jax.Array,  # float8_e4m3fn [G, N, K]
  gate_scale: jax.Array,  # float32 [G, N] or [G, N / 128, K / 128]
  up: jax.Array,  # like gate
  up_scale: jax.Array,  # like gate_scale
  routing: Routing,  # of T * top_k assignments over the G groups
  top_k: int,  # each token's assignments
  *,
  tiling: Tiling | None = None,
  interpret: bool = False,
) -> jax.Array:
  """-> [M, N] (M = T * top_k) in x's dtype, sorted: row r is silu(q(x[t]) @ gate[g].T) *
  (q(x[t]) @ up[g].T) for t = order[r] // top_k in group g's run, zero past the groups."""
  name = "grouped_swiglu_fp8_gathered"
  if top_k < 1:
    raise ValueError(f"{name}: top_k: expected >= 1, got {top_k}")
  m = x.shape[0] * top_k if x.ndim == 2 else 0
  scales = (gate_scale, up_scale)
  tiling = check_fp8_operands(name, x, (gate, up), scales, routing.group_sizes, tiling, num_rows=m)
  check_routing(name, routing, m, gate.shape[0], tiling)
  if m == 0:
    return jnp.zeros((0, gate.shape[1]), x.dtype)
  xq, x_scale = quantize_rows(x, scale_group(gate_scale.ndim, x.shape[1]))  # [T, K], [T, KS]
  return fp8_call(
    routing.tile_args,
    routing.order,
    None,
    xq,
    x_scale,
    (gate, up),
    scales,
    num_rows=m,
    tiling=tiling,
    addressing=Addressing(gather_top_k=top_k),
    out_dtype=x.dtype,
    interpret=interpret,
  )


def grouped_matmul_fp8_scattered(
  rows: jax.Array,  # [M, K] sorted (grouped_swiglu_fp8_gathered's): quantized here
  weights: jax.Array,  # float8_e4m3fn [G, N, K]
  w_scale: jax.Array,  # float32 [G, N] or [G, N / 128, K / 128]
  routing: Routing,  # of the M assignments over the G groups
  route_weights: jax.Array,  # float32[M]: each assignment's routing weight, assignment order
  *,
  tiling: Tiling | None = None,
  interpret: bool = False,
) -> jax.Array:
  """-> [M, N] in rows' dtype, in assignment order: row order[r] is route_weights[order[r]] *
  (q(rows[r]) @ weights[g].T) for sorted row r of group g, zero for the rows past the groups."""
  name = "grouped_matmul_fp8_scattered"
  tiling = check_fp8_operands(name, rows, (weights,), (w_scale,), routing.group_sizes, tiling)
  m = rows.shape[0]
  check_routing(name, routing, m, weights.shape[0], tiling)
  check_route_weights(name, route_weights, m)
  if m == 0:
    return jnp.zeros((0, weights.shape[1]), rows.dtype)
  xq, x_scale = quantize_rows(rows, scale_group(w_scale.ndim, rows.shape[1]))  # [M, K], [M, KS]
  return fp8_call(
    routing.tile_args,
    routing.order,
    route_weights,
    xq,
    x_scale,
    (weights,),
    (w_scale,),
    num_rows=m,
    tiling=tiling,
    addressing=Addressing(scatter=True),
    out_dtype=rows.dtype,
    interpret=interpret,
  )
