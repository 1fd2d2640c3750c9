"""A mixture of experts' FFN whose bits do not depend on how many devices share the experts
(tp_invariant_reductions with MoE layers).

Sharded, each device runs grouped_matmul.expert_ffn on its slice of the stacked experts and the
devices' float32 partials meet in one all-reduce (parallel/sharded_experts.py):

  tensor parallel  slice g: gate/up [E, H, I/G], down [E, I/G, H] (every expert's intermediate
                   columns g*I/G .. (g+1)*I/G - 1), first_expert 0
  expert parallel  slice g: gate/up [E/G, H, I], down [E/G, I, H] (experts g*E/G ..), first_expert
                   g*E/G

`grouped_expert_ffn` makes one device compute the same: it cuts its experts into `num_groups`
such slices, runs expert_ffn on each exactly as a device of a num_groups-way mesh would (same
shapes, so the same grouped-matmul programs), and adds the float32 partials in slice order. With
num_groups = REDUCTION_GROUPS (2) on one device and 1 per device on two, the sum is p0 + p1
either way (the all-reduce of two values is commutative), so the experts' output, and with the
tp-invariant projections of models/invariant_dense.py the whole forward, is bitwise that of
tensor_parallel_size 1 and 2. The one-device reference therefore depends on the layout it
mirrors: run it with the same enable_expert_parallel as the mesh it is compared with.

Each slice's operands and partial pass through `lax.optimization_barrier`, so XLA neither merges
the slices' gathers and products nor folds the additions into their reductions. Slicing copies
the weights each step on one device: this is a parity mode, not a fast one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.models.grouped_matmul import expert_ffn


def _slices(size: int, num_groups: int, what: str) -> list[slice]:
  if size % num_groups != 0:
    raise ValueError(f"{what}: {size} is not divisible into {num_groups} groups")
  width = size // num_groups
  return [slice(g * width, (g + 1) * width) for g in range(num_groups)]


def grouped_expert_ffn(
  x: jax.Array,
  expert_ids: jax.Array,
  weights: jax.Array,
  gate: jax.Array,
  up: jax.Array,
  down: jax.Array,
  first_expert: jax.Array | int,
  num_groups: int,
  by_expert: bool,
) -> jax.Array:
  """x [T, H], expert_ids int32[T, K], weights float32[T, K], gate/up [E, H, I], down [E, I, H]
  (this device's experts, the first of them global id first_expert) -> float32 [T, H]:
  expert_ffn over num_groups slices of the experts, by expert when `by_expert` else by
  intermediate column, the partials added in slice order (module docstring)."""
  if num_groups < 1:
    raise ValueError(f"num_groups: expected at least 1, got {num_groups}")
  num_local, _, intermediate = gate.shape
  total = None
  if by_expert:
    parts = [
      (gate[s], up[s], down[s], first_expert + s.start)  # [E/G, H, I], [E/G, I, H]
      for s in _slices(num_local, num_groups, "experts")
    ]
  else:
    parts = [
      (gate[:, :, s], up[:, :, s], down[:, s, :], first_expert)  # [E, H, I/G], [E, I/G, H]
      for s in _slices(intermediate, num_groups, "moe_intermediate_size")
    ]
  for g_gate, g_up, g_down, g_first in parts:
    operands = jax.lax.optimization_barrier((x, expert_ids, weights, g_gate, g_up, g_down))
    partial = jax.lax.optimization_barrier(expert_ffn(*operands, g_first))  # f32 [T, H]
    total = partial if total is None else total + partial
  return total.astype(jnp.float32)
