"""Pure-jnp reference of the grouped matmul: row m, in the run of group g (group g owns the
group_sizes[g] rows after those of groups < g), times weights[g], float32 accumulation, rounded
once to the rows' dtype; rows past sum(group_sizes) are zero. The gated form is
silu(rows @ gate) * (rows @ up) in float32, rounded once. The kernel's values match these to
rounding (it sums K in its own order)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
