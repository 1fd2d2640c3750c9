"""A mixture of experts' FFN run shard by shard: grouped_matmul.expert_ffn in a shard_map over the
mesh's model axis.

The stacked experts are laid out by the partition rules (partition_rules.EXPERT_SPECS): by their
intermediate dimension (tensor parallel) or by expert (expert parallel). The tokens, their
routing (the router is replicated) and the output are replicated. Each device runs the
unsharded code on its shard:

  tensor parallel  gate/up [E, H, I/tp], down [E, I/tp, H], first_expert 0
  expert parallel  gate/up [E/tp, H, I], down [E/tp, I, H], first_expert = device index * E/tp
  (fp8 experts: the same slices of [E, out, in] weights, each with its slice of the scales;
  per-channel activation scales of the down projection then cover the device's I/tp columns)
    -> float32 partial [T, H]: the assignments to its experts through its slice of them (every
       other assignment adds exactly zero)

and one psum over the axis adds the partials, in float32, before the model rounds the sum to its
dtype. Tokens are not exchanged: every device already holds every token (attention's output is
all-reduced), so the sum is the only collective, vLLM's all-reduce after its experts. The
shard_map keeps the grouped matmul a per-device one (the Pallas kernel on CUDA GPUs, ragged_dot
elsewhere: models/grouped_matmul.py) rather than asking XLA's partitioner to split one. The model
receives this function from parallel/placement.py and stays free of sharding.

With tp_invariant_reductions the placement passes num_groups = REDUCTION_GROUPS: each device cuts
its slice into num_groups // devices (at least 1) slices of the same kind and adds their partials
before the all-reduce (models/invariant_experts.py), so one device computes exactly what two do.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxserve.models.fp8_experts import Fp8Weights
from jaxserve.models.grouped_matmul import ExpertWeights, expert_dims, expert_ffn
from jaxserve.models.invariant_experts import grouped_expert_ffn
from jaxserve.models.layers.moe import ExpertsFn
from jaxserve.parallel.partition_rules import EXPERT_SPECS, MODEL_AXIS, expert_specs

REPLICATED = P()


def _in_spec(spec: P, w: ExpertWeights) -> P | Fp8Weights:
  """A projection's in_spec: `spec`, or for Fp8Weights the weight's and its scale's (the
  weight's truncated to the scale's rank, partition_rules' rule)."""
  if isinstance(w, Fp8Weights):
    return Fp8Weights(spec, P(*tuple(spec)[: w.scale.ndim]))
  return spec


def shard_experts(mesh: Mesh, expert_parallel: bool, num_groups: int | None = None) -> ExpertsFn:
  """The ExpertsFn of a model whose experts the partition rules lay out over `mesh`, by expert
  when `expert_parallel`; num_groups (tp_invariant_reductions): the slices of a num_groups-way
  mesh, however many devices `mesh` has (module docstring). fp8 experts (Fp8Weights) take
  partition_rules.FP8_EXPERT_SPECS, their scales sharded with them."""
  local_groups = None if num_groups is None else max(1, num_groups // mesh.shape[MODEL_AXIS])
  by_expert = EXPERT_SPECS[expert_parallel].by_expert

  def body(x, expert_ids, weights, gate, up, down):
    first_expert = jax.lax.axis_index(MODEL_AXIS) * expert_dims(gate)[0] if by_expert else 0
    operands = (x, expert_ids, weights, gate, up, down, first_expert)
    if local_groups is None:
      partial = expert_ffn(*operands)  # f32 [T, H]
    else:
      partial = grouped_expert_ffn(*operands, local_groups, by_expert)  # f32 [T, H]
    return jax.lax.psum(partial, MODEL_AXIS)

  def run(x, expert_ids, weights, gate, up, down):
    specs = expert_specs(expert_parallel, isinstance(gate, Fp8Weights))
    local = jax.shard_map(
      body,
      mesh=mesh,
      in_specs=(REPLICATED,) * 3
      + (_in_spec(specs.gate_up, gate), _in_spec(specs.gate_up, up), _in_spec(specs.down, down)),
      out_specs=REPLICATED,
      check_vma=False,
    )
    return local(x, expert_ids, weights, gate, up, down)

  return run
