"""The device mesh of a sharded engine: two axes, `expert` x `model`, over tensor_parallel_size
devices.

Tensor parallelism runs on the `model` axis: every device holds 1/tp of each attention and MLP
weight and of every layer's KV pages (by kv head), and runs the same step. The `expert` axis
splits a mixture of experts' stacked experts by expert (parallel/partition_rules.py); whatever
its rules do not name it in (attention, norms, embeddings, KV pages) is replicated along it.
Without expert parallelism the mesh is (1, tp): the expert axis is a no-op and the experts are
tensor-parallel like any MLP (their intermediate dimension split). With `expert_parallel`
(`--enable-expert-parallel`) the devices lie along the expert axis instead, (tp, 1): each holds
num_experts / tp whole experts and a whole copy of the other weights and KV pages, so attention
runs replicated (vLLM keeps attention tensor-parallel beside its experts; here the two are
orthogonal axes and the flag picks the expert one). With several hosts the mesh spans all devices
of all processes, so tensor_parallel_size must equal jax.device_count().
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from jaxserve.models.model_config import ModelConfig

EXPERT_AXIS = "expert"
MODEL_AXIS = "model"


def build_mesh(
  tensor_parallel_size: int,
  devices: Sequence[jax.Device] | None = None,
  expert_parallel: bool = False,
) -> Mesh:
  """A (EXPERT_AXIS, MODEL_AXIS) mesh over the first tensor_parallel_size devices: (1, n), or
  (n, 1) with expert_parallel."""
  devices = list(devices if devices is not None else jax.devices())
  if tensor_parallel_size > len(devices):
    raise ValueError(
      f"tensor_parallel_size: {tensor_parallel_size} exceeds the {len(devices)} available devices"
    )
  if jax.process_count() > 1 and tensor_parallel_size != len(devices):
    raise ValueError(
      f"tensor_parallel_size: must equal the {len(devices)} devices of all "
      f"{jax.process_count()} processes when serving on several hosts, "
      f"got {tensor_parallel_size}"
    )
  shape = (tensor_parallel_size, 1) if expert_parallel else (1, tensor_parallel_size)
  return Mesh(np.array(devices[:tensor_parallel_size]).reshape(shape), (EXPERT_AXIS, MODEL_AXIS))


def check_tensor_parallel(model_config: ModelConfig, tensor_parallel_size: int) -> None:
  """Attention shards whole kv heads (and their q-head groups) per device."""
  tp = tensor_parallel_size
  if model_config.num_kv_heads % tp != 0:
    raise ValueError(
      f"tensor_parallel_size: {tp} does not divide the model's {model_config.num_kv_heads} kv heads"
    )
  if model_config.num_q_heads % tp != 0:
    raise ValueError(
      f"tensor_parallel_size: {tp} does not divide the model's "
      f"{model_config.num_q_heads} query heads"
    )


def check_experts(model_config: ModelConfig, mesh: Mesh) -> None:
  """A mixture of experts' experts split evenly over the mesh: whole experts over the expert
  axis, their intermediate dimension over the model axis (parallel/sharded_experts.py)."""
  ep, tp = mesh.shape[EXPERT_AXIS], mesh.shape[MODEL_AXIS]
  if not model_config.num_experts:
    if ep > 1:
      raise ValueError(f"enable_expert_parallel: {model_config.architecture} has no experts")
    return
  if model_config.num_experts % ep != 0:
    raise ValueError(
      f"enable_expert_parallel: {ep} devices do not divide the model's "
      f"{model_config.num_experts} experts"
    )
  if model_config.moe_intermediate_size % tp != 0:
    raise ValueError(
      f"tensor_parallel_size: {tp} does not divide the experts' intermediate size "
      f"{model_config.moe_intermediate_size}"
    )
