"""A mixture of experts' FFN run shard by shard: grouped_matmul.expert_ffn in a shard_map over the
mesh's expert and model axes.

The stacked experts are laid out by the partition rules: whole experts over EXPERT_AXIS, each
expert's intermediate dimension over MODEL_AXIS. The tokens, their routing (the router is
replicated) and the output are replicated. Each device runs the unsharded code on its shard:

  gate/up [E/ep, H, I/tp], down [E/ep, I/tp, H], first_expert = its expert index * E/ep
    -> float32 partial [T, H]: the assignments to its experts, through its slice of their
       intermediate dimension (every other assignment adds exactly zero)

and one psum over both axes adds the partials, in float32, before the model rounds the sum to
its dtype. Tokens are not exchanged: every device already holds every token (attention and the
rest are tensor-parallel or replicated), so the sum is the only collective. The shard_map keeps
the grouped matmul a per-device ragged_dot rather than asking XLA's partitioner to split one.
The model receives this function from parallel/placement.py and stays free of sharding.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxserve.models.grouped_matmul import expert_ffn
from jaxserve.models.moe import ExpertsFn
from jaxserve.parallel.mesh import EXPERT_AXIS, MODEL_AXIS

REPLICATED = P()
GATE_UP = P(EXPERT_AXIS, None, MODEL_AXIS)  # [E, H, I]
DOWN = P(EXPERT_AXIS, MODEL_AXIS, None)  # [E, I, H]


def shard_experts(mesh: Mesh) -> ExpertsFn:
  """The ExpertsFn of a model whose experts are sharded by the partition rules over `mesh`."""

  def body(x, expert_ids, weights, gate, up, down):
    first_expert = jax.lax.axis_index(EXPERT_AXIS) * gate.shape[0]
    partial = expert_ffn(x, expert_ids, weights, gate, up, down, first_expert)  # f32 [T, H]
    return jax.lax.psum(partial, (EXPERT_AXIS, MODEL_AXIS))

  def run(x, expert_ids, weights, gate, up, down):
    local = jax.shard_map(
      body,
      mesh=mesh,
      in_specs=(REPLICATED, REPLICATED, REPLICATED, GATE_UP, GATE_UP, DOWN),
      out_specs=REPLICATED,
      check_vma=False,
    )
    return local(x, expert_ids, weights, gate, up, down)

  return run
