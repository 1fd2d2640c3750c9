"""Mixture-of-experts FFNs as grouped matmuls over the token assignments sorted by expert.

A step routes each of its T tokens to K experts (models/moe.py). `expert_ffn` computes

  out[t] = sum_k weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = expert_ids[t, k]

without a dense all-experts product and without a per-expert loop: the T*K assignments are
sorted by expert id (`jnp.argsort`, stable), each sorted row gathers its token's hidden state,
and every projection is one `jax.lax.ragged_dot` whose groups are the experts' contiguous runs of
rows (`group_sizes`, a bincount of length E). The rows are then put back in assignment order by
the inverse permutation (a gather, not a scatter-add, so the sum over k has a fixed order) and
combined with their routing weights in float32.

Shapes are fixed by (T, K, E, H, I) alone: M = T*K rows whatever the routing, group sizes are
data, and an expert with no token is an empty group. A step therefore compiles once per token
bucket, like the dense model.

Expert parallelism (parallel/sharded_experts.py) calls `expert_ffn` on each device with that
device's E_local stacked experts and `first_expert`, its first expert's global id. Assignments
to other devices' experts are sorted after every local group (outside the ragged groups) and
contribute exactly zero, so the devices' float32 partials sum to the whole result.

How `ragged_dot` lowers is the platform's. On TPU, XLA compiles it to libtpu's own Mosaic
kernels, a metadata kernel that tiles the groups and a grouped matmul over row tiles (the design of
JAX's megablox gmm; tests/tpu_aot/test_v6e_moe_and_gemma.py), so no Pallas kernel of ours sits
behind this function there. GPUs get XLA's ragged-dot instruction; on CPU JAX lowers it to a
masked dot over all E groups (correct, E times the FLOPs of the grouped product), which the CPU
tests of tiny models can afford.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def grouped_matmul(rows: jax.Array, weights: jax.Array, group_sizes: jax.Array) -> jax.Array:
  """rows [M, K] (sorted by group) @ weights [G, K, N] -> [M, N] in rows' dtype: row m is
  multiplied by the weights of the group whose run holds it (group g owns the group_sizes[g]
  rows after those of groups < g). Rows past sum(group_sizes) are unspecified."""
  if rows.ndim != 2 or weights.ndim != 3 or rows.shape[1] != weights.shape[1]:
    raise ValueError(
      f"rows/weights: expected [M, K] and [G, K, N], got {rows.shape}, {weights.shape}"
    )
  if group_sizes.shape != (weights.shape[0],):
    raise ValueError(f"group_sizes: expected [{weights.shape[0]}], got {group_sizes.shape}")
  return jax.lax.ragged_dot(rows, weights, group_sizes.astype(jnp.int32))  # [M, N]


def sort_by_expert(
  expert_ids: jax.Array, num_local: int, first_expert: jax.Array | int = 0
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """expert_ids [T, K] -> (order [M], local [M], group_sizes [num_local]), M = T*K.

  order[r] is the flat assignment (t*K + k) of sorted row r: the local experts' assignments by
  expert id (stable), then every other one. local[a]: assignment a goes to one of the
  num_local experts first_expert .. first_expert + num_local - 1."""
  flat = expert_ids.reshape(-1) - first_expert  # [M] local expert ids
  local = (flat >= 0) & (flat < num_local)  # [M]
  key = jnp.where(local, flat, num_local)  # [M] non-local assignments sort last
  order = jnp.argsort(key, stable=True)  # [M]
  group_sizes = jnp.bincount(key, length=num_local).astype(jnp.int32)  # [num_local]
  return order, local, group_sizes


def expert_ffn(
  x: jax.Array,
  expert_ids: jax.Array,
  weights: jax.Array,
  gate: jax.Array,
  up: jax.Array,
  down: jax.Array,
  first_expert: jax.Array | int = 0,
) -> jax.Array:
  """x [T, H], expert_ids int32[T, K], weights float32[T, K], gate/up [E, H, I], down [E, I, H]
  -> float32 [T, H]: the routing-weighted sum of each token's experts' SwiGLU FFNs, over the
  assignments to experts first_expert .. first_expert + E - 1 (the others add zero)."""
  num_tokens, top_k = expert_ids.shape
  num_local, hidden, _ = gate.shape
  if x.shape != (num_tokens, hidden) or weights.shape != expert_ids.shape:
    raise ValueError(
      f"x/weights: expected [{num_tokens}, {hidden}] and {expert_ids.shape}, "
      f"got {x.shape}, {weights.shape}"
    )
  if up.shape != gate.shape or down.shape != (num_local, gate.shape[2], hidden):
    raise ValueError(f"up/down: shapes {up.shape}, {down.shape} do not match gate {gate.shape}")
  order, local, group_sizes = sort_by_expert(expert_ids, num_local, first_expert)
  rows = x[order // top_k]  # [M, H] each sorted assignment's token
  hidden_rows = jax.nn.silu(grouped_matmul(rows, gate, group_sizes)) * grouped_matmul(
    rows, up, group_sizes
  )  # [M, I]
  out = grouped_matmul(hidden_rows, down, group_sizes)  # [M, H] sorted
  num_rows = order.shape[0]
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(num_rows, dtype=order.dtype))  # [M]
  out = out[inverse].astype(jnp.float32)  # [M, H] in assignment order
  scale = jnp.where(local, weights.reshape(-1).astype(jnp.float32), 0.0)  # [M]
  out = jnp.where(local[:, None], out, 0.0) * scale[:, None]  # [M, H]
  return out.reshape(num_tokens, top_k, hidden).sum(axis=1)  # [T, H]
