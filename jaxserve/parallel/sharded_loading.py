"""Loads a model's params straight into their shards.

Safetensors checkpoints go through load_hf_weights with each leaf's target sharding: the raw
tensor is built from its shards (jax.make_array_from_callback) and transposed / cast on the
devices (models/weight_transfer.py): every device receives only its slice, and on several hosts
each process fills only its own devices. Orbax checkpoints are restored with the target
shardings in the abstract tree. A built-in model (models/builtin.py) is generated on the host and
then laid out the same way. `tp_invariant_reductions` is set on the loaded ModelConfig and keeps
the vocabulary-sized weights replicated (partition_rules).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from jaxserve.models.builtin import is_builtin
from jaxserve.models.checkpoint import restore_params
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.registry import PARAMS_SUBDIR, LoadedModel, checkpoint_dir, load_model
from jaxserve.models.weight_transfer import TransferOptions
from jaxserve.models.weights import ParamPath, load_hf_config, load_hf_weights, param_shapes
from jaxserve.parallel.mesh import MODEL_AXIS, check_tensor_parallel
from jaxserve.parallel.partition_rules import param_shardings, param_spec


def load_model_sharded(
  model: str,
  dtype: str,
  mesh: Mesh,
  *,
  tp_invariant_reductions: bool = False,
  transfer: TransferOptions = TransferOptions(),
) -> LoadedModel:
  """load_model(model, dtype), with every param laid out by the partition rules over `mesh`
  (`transfer`: how a safetensors checkpoint's tensors are moved, models/weight_transfer.py)."""
  shard_vocab = not tp_invariant_reductions
  if is_builtin(model):
    loaded = load_model(model, dtype)
    config = loaded.config.replace(tp_invariant_reductions=tp_invariant_reductions)
    check_tensor_parallel(config, mesh.shape[MODEL_AXIS])
    shardings = param_shardings(loaded.params, mesh, shard_vocab)
    params = jax.tree.map(
      lambda x, s: _shard_host_array(np.asarray(x), s), loaded.params, shardings
    )
    return LoadedModel(config, params, loaded.source)
  path = checkpoint_dir(model)
  config = load_hf_config(path, dtype)
  check_unquantized(config)
  config = config.replace(tp_invariant_reductions=tp_invariant_reductions)
  check_tensor_parallel(config, mesh.shape[MODEL_AXIS])
  orbax_dir = path / PARAMS_SUBDIR
  if orbax_dir.is_dir():
    return LoadedModel(
      config, restore_params(orbax_dir, sharded_param_shapes(config, mesh)), f"orbax:{orbax_dir}"
    )
  size = mesh.shape[MODEL_AXIS]

  def sharding(param_path: ParamPath, shape: tuple[int, ...]) -> jax.sharding.Sharding:
    return jax.sharding.NamedSharding(mesh, param_spec(param_path, shape, size, shard_vocab))

  params, stats = load_hf_weights(path, config, sharding=sharding, options=transfer)
  return LoadedModel(config, params, f"safetensors:{path}", stats.packed)


def sharded_param_shapes(config: ModelConfig, mesh: Mesh) -> dict:
  """The params of `config` as jax.ShapeDtypeStructs carrying the shardings the loader gives them
  (vocabulary-sized weights replicated under tp_invariant_reductions): the abstract tree an Orbax
  restore fills, and the weights of an ahead-of-time compilation."""
  check_unquantized(config)
  shapes = param_shapes(config)
  shardings = param_shardings(shapes, mesh, not config.tp_invariant_reductions)
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings
  )


def check_unquantized(config: ModelConfig) -> None:
  """Quantized weights are not laid out over a mesh yet (their scales have no layout rule)."""
  if config.quantization != "none":
    raise ValueError(
      f"quantization: {config.quantization} weights run on one device only for now "
      "(tensor_parallel_size 1, no tp_invariant_reductions, no multi-host job)"
    )


def _shard_host_array(array: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])
