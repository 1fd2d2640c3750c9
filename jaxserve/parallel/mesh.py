"""The device mesh of a sharded engine: one `model` axis over tensor_parallel_size devices.

Tensor parallelism is the only axis: every device holds 1/tp of each attention and MLP weight and
of every layer's KV pages (by kv head), and runs the same step. With several hosts the mesh spans
all devices of all processes, so tensor_parallel_size must equal jax.device_count().
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from jaxserve.models.model_config import ModelConfig

MODEL_AXIS = "model"


def build_mesh(tensor_parallel_size: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh named MODEL_AXIS over the first tensor_parallel_size devices."""
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
  return Mesh(np.array(devices[:tensor_parallel_size]), (MODEL_AXIS,))


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
