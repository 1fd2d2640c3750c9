"""A mixture of experts' two grouped products over a `Routing` (routing.py), with the rows
gathered from their tokens and the outputs scattered to their assignments inside the kernel
(gpu.py's Addressing), so neither the permuted copy of the tokens nor the inverse permutation is
ever an array:

  grouped_swiglu_gathered   x [T, H] -> hidden [M, I] in sorted order: sorted row r is
                            silu(x[t] @ gate[e]) * (x[t] @ up[e]), t = order[r] // K, e its group
  grouped_matmul_scattered  hidden [M, I] -> out [M, H] in assignment order: row a = order[r] is
                            route_w[a] * (hidden[r] @ down[e]), zero for the assignments outside
                            the groups (other devices' experts)

Both round once to the rows' dtype (the routing weight is applied in float32 before). The sum
over each token's K assignments is left to the caller, a plain reduction of out [T, K, H] that
XLA fuses with whatever follows. Every output row is written by exactly one program per column
block: no atomics, deterministic.

The routing must be built for the tiling's block_m (tiles.default_block_m for the default
tilings, which both products share: block_m depends on M and G only); both are checked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.grouped_matmul.gpu import Addressing, Tiling, check_operands, grouped_call
from pallas_kernels.grouped_matmul.tiles import Routing, num_tiles


def check_routing(name: str, routing: Routing, m: int, num_groups: int, tiling: Tiling) -> None:
  tiles = num_tiles(m, num_groups, tiling.block_m) if m else 0
  if routing.order.shape != (m,) or routing.block_m != tiling.block_m:
    raise ValueError(
      f"{name}: routing: expected order [{m}] and tiles of {tiling.block_m} rows, got "
      f"order {list(routing.order.shape)} and tiles of {routing.block_m}"
    )
  if routing.tile_group.shape != (tiles,):
    raise ValueError(f"{name}: routing: expected {tiles} tiles, got {routing.tile_group.shape}")


def grouped_swiglu_gathered(
  x: jax.Array,  # [T, K] the tokens: bfloat16, float16 or float32
  gate: jax.Array,  # [G, K, N] in x's dtype, K and N multiples of 16
  up: jax.Array,  # [G, K, N] like gate
  routing: Routing,  # of T * top_k assignments over the G groups
  top_k: int,  # each token's assignments
  *,
  tiling: Tiling | None = None,
  interpret: bool = False,
) -> jax.Array:
  """-> [M, N] (M = T * top_k) in x's dtype, sorted: row r is silu(x[t] @ gate[g]) *
  (x[t] @ up[g]) for t = order[r] // top_k in group g's run, zero past the groups."""
  if top_k < 1:
    raise ValueError(f"grouped_swiglu_gathered: top_k: expected >= 1, got {top_k}")
  m = x.shape[0] * top_k if x.ndim == 2 else 0
  tiling = check_operands(
    "grouped_swiglu_gathered", x, (gate, up), routing.group_sizes, tiling, num_rows=m
  )
  check_routing("grouped_swiglu_gathered", routing, m, gate.shape[0], tiling)
  if m == 0:
    return jnp.zeros((0, gate.shape[2]), x.dtype)
  return grouped_call(
    routing.tile_args,
    routing.order,
    None,
    x,
    gate,
    up,
    num_rows=m,
    tiling=tiling,
    addressing=Addressing(gather_top_k=top_k),
    interpret=interpret,
  )


def grouped_matmul_scattered(
  rows: jax.Array,  # [M, K] sorted (grouped_swiglu_gathered's): bfloat16, float16 or float32
  weights: jax.Array,  # [G, K, N] in rows' dtype, K and N multiples of 16
  routing: Routing,  # of the M assignments over the G groups
  route_weights: jax.Array,  # float32[M]: each assignment's routing weight, assignment order
  *,
  tiling: Tiling | None = None,
  interpret: bool = False,
) -> jax.Array:
  """-> [M, N] in rows' dtype, in assignment order: row order[r] is route_weights[order[r]] *
  (rows[r] @ weights[g]) for sorted row r of group g, zero for the rows past the groups."""
  m = rows.shape[0] if rows.ndim == 2 else 0
  tiling = check_operands("grouped_matmul_scattered", rows, (weights,), routing.group_sizes, tiling)
  check_routing("grouped_matmul_scattered", routing, m, weights.shape[0], tiling)
  check_route_weights("grouped_matmul_scattered", route_weights, m)
  if m == 0:
    return jnp.zeros((0, weights.shape[2]), rows.dtype)
  return grouped_call(
    routing.tile_args,
    routing.order,
    route_weights,
    rows,
    weights,
    num_rows=m,
    tiling=tiling,
    addressing=Addressing(scatter=True),
    interpret=interpret,
  )


def routed_swiglu_ffn(
  x: jax.Array,  # [T, H] the tokens: bfloat16, float16 or float32
  gate: jax.Array,  # [G, H, I] in x's dtype, H and I multiples of 16
  up: jax.Array,  # [G, H, I] like gate
  down: jax.Array,  # [G, I, H] like gate
  routing: Routing,  # of T * top_k assignments over the G groups
  top_k: int,
  route_weights: jax.Array,  # float32[M]: each assignment's routing weight, assignment order
  *,
  tilings: tuple[Tiling, Tiling] | None = None,  # gate/up's and down's (default: tiles.py's)
  interpret: bool = False,
) -> jax.Array:
  """-> [M, H] in x's dtype, assignment order: grouped_matmul_scattered of
  grouped_swiglu_gathered (both tilings' block_m the routing's). When the gate/up product splits
  K (a few rows: a small decode step), the down product reads its float32 partials and gates
  them as it loads them (Addressing.swiglu_partials): no epilogue kernel between the two, and
  the hidden rows are never an array of their own (rounded to x's dtype as they are loaded, as
  the epilogue would)."""
  m = x.shape[0] * top_k if x.ndim == 2 else 0
  name = "routed_swiglu_ffn"
  gate_up_tiling, down_tiling = tilings or (None, None)
  tiling = check_operands(name, x, (gate, up), routing.group_sizes, gate_up_tiling, num_rows=m)
  check_routing(name, routing, m, gate.shape[0], tiling)
  hidden = jax.ShapeDtypeStruct((m, gate.shape[2]), x.dtype)
  down_tiling = check_operands(name, hidden, (down,), routing.group_sizes, down_tiling)
  check_routing(name, routing, m, down.shape[0], down_tiling)
  check_route_weights(name, route_weights, m)
  if m == 0:
    return jnp.zeros((0, down.shape[2]), x.dtype)
  split = tiling.num_splits > 1
  rows = grouped_call(
    routing.tile_args,
    routing.order,
    None,
    x,
    gate,
    up,
    num_rows=m,
    tiling=tiling,
    addressing=Addressing(gather_top_k=top_k),
    interpret=interpret,
    partials=True,
  )  # [M, I] sorted, or gate's and up's float32 partials [S, M, I]
  return grouped_call(
    routing.tile_args,
    routing.order,
    route_weights,
    rows,
    down,
    num_rows=m,
    tiling=down_tiling,
    addressing=Addressing(scatter=True, swiglu_partials=split),
    interpret=interpret,
  )


def check_route_weights(name: str, route_weights: jax.Array, m: int) -> None:
  if route_weights.shape != (m,) or route_weights.dtype != jnp.float32:
    raise ValueError(
      f"{name}: route_weights: expected float32[{m}], "
      f"got {route_weights.dtype}{list(route_weights.shape)}"
    )
