"""Pure-jnp reference of the grouped matmul: row m, in the run of group g (group g owns the
group_sizes[g] rows after those of groups < g), times weights[g], float32 accumulation, rounded
once to the rows' dtype; rows past sum(group_sizes) are zero. The gated form is
silu(rows @ gate) * (rows @ up) in float32, rounded once. The fp8 forms (fp8.py's W8A8 kernel)
quantize the rows to e4m3 as the kernel does, dequantize both operands and multiply in float32.
The kernels' values match these to rounding (they sum K in their own order). The routing
(routing.py) by a stable argsort, and the routed products (routed.py, fp8_routed.py) through a
copy of the gathered rows and a scatter."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.grouped_matmul.tiles import Routing, num_tiles, tile_map


def row_groups(group_sizes: jax.Array, num_rows: int) -> jax.Array:
  """int32[M]: each row's group, G for the rows past sum(group_sizes)."""
  ends = jnp.cumsum(jnp.maximum(group_sizes.astype(jnp.int32), 0))  # [G]
  rows = jnp.arange(num_rows, dtype=jnp.int32)  # [M]
  return jnp.sum(ends[None, :] <= rows[:, None], axis=1, dtype=jnp.int32)  # [M]


def _products(rows: jax.Array, weights: jax.Array, group_sizes: jax.Array) -> jax.Array:
  """float32 [M, N]: each row times its group's weights, zero past the groups."""
  groups = row_groups(group_sizes, rows.shape[0])  # [M]
  out = jnp.zeros((rows.shape[0], weights.shape[2]), jnp.float32)  # [M, N]
  for g in range(weights.shape[0]):
    product = jnp.dot(
      rows.astype(jnp.float32),
      weights[g].astype(jnp.float32),
      precision=jax.lax.Precision.HIGHEST,
    )  # [M, N]
    out = jnp.where((groups == g)[:, None], product, out)
  return out


def grouped_matmul_reference(
  rows: jax.Array, weights: jax.Array, group_sizes: jax.Array
) -> jax.Array:
  """rows [M, K], weights [G, K, N], group_sizes int[G] -> [M, N] in rows' dtype."""
  return _products(rows, weights, group_sizes).astype(rows.dtype)


def grouped_swiglu_reference(
  rows: jax.Array, gate: jax.Array, up: jax.Array, group_sizes: jax.Array
) -> jax.Array:
  """rows [M, K], gate/up [G, K, N], group_sizes int[G] -> silu(rows @ gate) * (rows @ up)
  [M, N] in rows' dtype."""
  g = _products(rows, gate, group_sizes)  # [M, N] float32
  u = _products(rows, up, group_sizes)  # [M, N] float32
  return (g * jax.nn.sigmoid(g) * u).astype(rows.dtype)


def _fp8_groups(rows: jax.Array, group: int) -> jax.Array:
  """rows [M, K] quantized to e4m3 per row and `group` values of K, dequantized: float32 [M, K]
  (scale = largest magnitude * (1 / 448), 1 for zeros; values * (1 / scale), clipped)."""
  m, k = rows.shape
  x = rows.astype(jnp.float32).reshape(m, k // group, group)
  amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
  scale = jnp.where(amax > 0, amax * jnp.float32(1.0 / 448.0), 1.0)
  q = jnp.clip(x * (1.0 / scale), -448.0, 448.0).astype(jnp.float8_e4m3fn)
  return (q.astype(jnp.float32) * scale).reshape(m, k)


def _fp8_weights(weights: jax.Array, w_scale: jax.Array) -> jax.Array:
  """e4m3 [G, N, K] times its scales ([G, N] or [G, N / 128, K / 128]) -> float32 [G, K, N]."""
  s = w_scale.astype(jnp.float32)
  if s.ndim == 2:
    s = s[:, :, None]  # [G, N, 1]
  else:
    s = jnp.repeat(jnp.repeat(s, 128, axis=1), 128, axis=2)  # [G, N, K]
  return jnp.swapaxes(weights.astype(jnp.float32) * s, 1, 2)


def grouped_matmul_fp8_reference(
  rows: jax.Array, weights: jax.Array, w_scale: jax.Array, group_sizes: jax.Array
) -> jax.Array:
  """The W8A8 fp8 grouped matmul (fp8.py): rows [M, K] quantized per row (w_scale [G, N]) or per
  row and 128 of K (w_scale [G, N / 128, K / 128]), weights e4m3 [G, N, K] -> [M, N] in rows'
  dtype, both operands dequantized and multiplied in float32."""
  group = rows.shape[1] if w_scale.ndim == 2 else 128
  x = _fp8_groups(rows, group)
  return _products(x, _fp8_weights(weights, w_scale), group_sizes).astype(rows.dtype)


def grouped_swiglu_fp8_reference(
  rows: jax.Array,
  gate: jax.Array,
  gate_scale: jax.Array,
  up: jax.Array,
  up_scale: jax.Array,
  group_sizes: jax.Array,
) -> jax.Array:
  """silu(rows @ gate.T) * (rows @ up.T) in float32 from grouped_matmul_fp8_reference's
  products, rounded once to rows' dtype."""
  group = rows.shape[1] if gate_scale.ndim == 2 else 128
  x = _fp8_groups(rows, group)
  g = _products(x, _fp8_weights(gate, gate_scale), group_sizes)
  u = _products(x, _fp8_weights(up, up_scale), group_sizes)
  return (g * jax.nn.sigmoid(g) * u).astype(rows.dtype)


def route_assignments_reference(
  expert_ids: jax.Array, num_local: int, block_m: int, first_expert: jax.Array | int = 0
) -> Routing:
  """routing.route_assignments by a stable argsort: the local assignments by expert, then the
  others, each in assignment order; the group sizes by bincount; the tiles by tiles.tile_map."""
  flat = expert_ids.reshape(-1).astype(jnp.int32) - first_expert  # [M] local ids
  key = jnp.where((flat >= 0) & (flat < num_local), flat, num_local)  # [M]
  order = jnp.argsort(key, stable=True).astype(jnp.int32)  # [M]
  sizes = jnp.bincount(key, length=num_local).astype(jnp.int32)  # [E]
  m = flat.shape[0]
  tiles = num_tiles(m, num_local, block_m) if m else 0
  return Routing(order, sizes, *tile_map(sizes, m, block_m, tiles), block_m=block_m)


def grouped_swiglu_gathered_reference(
  x: jax.Array, gate: jax.Array, up: jax.Array, routing: Routing, top_k: int
) -> jax.Array:
  """routed.grouped_swiglu_gathered: the sorted rows' tokens copied, then the grouped SwiGLU."""
  return grouped_swiglu_reference(x[routing.order // top_k], gate, up, routing.group_sizes)


def grouped_matmul_scattered_reference(
  rows: jax.Array, weights: jax.Array, routing: Routing, route_weights: jax.Array
) -> jax.Array:
  """routed.grouped_matmul_scattered: the sorted products in float32 times their assignments'
  routing weights (zero past the groups), rounded once, put back in assignment order."""
  order = routing.order
  product = _products(rows, weights, routing.group_sizes) * route_weights[order][:, None]
  return jnp.zeros_like(product).at[order].set(product).astype(rows.dtype)  # [M, N]


def grouped_swiglu_fp8_gathered_reference(
  x: jax.Array,
  gate: jax.Array,
  gate_scale: jax.Array,
  up: jax.Array,
  up_scale: jax.Array,
  routing: Routing,
  top_k: int,
) -> jax.Array:
  """fp8_routed.grouped_swiglu_fp8_gathered: the sorted rows' tokens copied, then the fp8
  grouped SwiGLU."""
  rows = x[routing.order // top_k]  # [M, K]
  return grouped_swiglu_fp8_reference(rows, gate, gate_scale, up, up_scale, routing.group_sizes)


def grouped_matmul_fp8_scattered_reference(
  rows: jax.Array,
  weights: jax.Array,
  w_scale: jax.Array,
  routing: Routing,
  route_weights: jax.Array,
) -> jax.Array:
  """fp8_routed.grouped_matmul_fp8_scattered: the sorted W8A8 products in float32 times their
  assignments' routing weights (zero past the groups), rounded once, in assignment order."""
  group = rows.shape[1] if w_scale.ndim == 2 else 128
  order = routing.order
  product = _products(_fp8_groups(rows, group), _fp8_weights(weights, w_scale), routing.group_sizes)
  product = product * route_weights[order][:, None]  # [M, N] float32
  return jnp.zeros_like(product).at[order].set(product).astype(rows.dtype)  # [M, N]
