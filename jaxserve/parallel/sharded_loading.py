"""Loads a model's params straight into their shards.

Safetensors checkpoints go through load_hf_weights with each leaf's target sharding: the raw
tensor is built from its shards (jax.make_array_from_callback) and transposed / cast on the
devices (models/weight_transfer.py): every device receives only its slice, and on several hosts
each process fills only its own devices. Orbax checkpoints are restored with the target
shardings in the abstract tree. A built-in model (models/builtin.py) is generated on the host and
then laid out the same way. `tp_invariant_reductions` is set on the loaded ModelConfig and keeps
the vocabulary-sized weights replicated (partition_rules).

Quantized models (`quantization`, or a compressed-tensors checkpoint's own scheme) load sharded
too: from safetensors each projection is quantized (or taken as stored) by a conversion whose
outputs, the 8-bit kernel and its scales, land in their target shardings (weight_transfer); a
built-in model or a float Orbax checkpoint is quantized after loading and then laid out. Every
target sharding is partition_rules.param_shardings of the abstract tree (weights.param_shapes),
the one place that tells a quantized projection's leaves from a float one's.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from jaxserve.models.builtin import is_builtin
from jaxserve.models.checkpoint import restore_params
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.quantized_dense import quantize_params
from jaxserve.models.quantized_loading import read_stored_quantization
from jaxserve.models.registry import PARAMS_SUBDIR, LoadedModel, checkpoint_dir, load_model
from jaxserve.models.weight_transfer import TransferOptions
from jaxserve.models.weights import ParamPath, load_hf_config, load_hf_weights, param_shapes
from jaxserve.parallel.kv_head_replication import replicate_kv_heads
from jaxserve.parallel.partition_rules import (
  MODEL_AXIS,
  check_experts,
  check_tensor_parallel,
  param_shardings,
  with_replicated_kv_heads,
)
from jaxserve.quantization.compressed_tensors import resolve_quantization
from jaxserve.quantization.scheme import check_quantization, scheme_for


def load_model_sharded(
  model: str,
  dtype: str,
  mesh: Mesh,
  *,
  tp_invariant_reductions: bool = False,
  quantization: str = "none",
  transfer: TransferOptions = TransferOptions(),
  expert_parallel: bool = False,
) -> LoadedModel:
  """load_model(model, dtype, quantization=...), with every param laid out by the partition
  rules over `mesh`, a mixture of experts' experts by expert when `expert_parallel`
  (`transfer`: how a safetensors checkpoint's tensors are moved, models/weight_transfer.py).
  With fewer kv heads than devices the result is the model with_replicated_kv_heads runs
  (kv_head_replication.py)."""
  loaded = _load(
    model, dtype, mesh, tp_invariant_reductions, quantization, transfer, expert_parallel
  )
  expanded = with_replicated_kv_heads(loaded.config, mesh.shape[MODEL_AXIS])
  if expanded == loaded.config:
    return loaded
  targets = sharded_param_shapes(expanded, mesh, expert_parallel)
  return replicate_kv_heads(loaded, mesh, targets)


def _load(
  model: str,
  dtype: str,
  mesh: Mesh,
  tp_invariant_reductions: bool,
  quantization: str,
  transfer: TransferOptions,
  expert_parallel: bool,
) -> LoadedModel:
  """load_model_sharded's load, for the checkpoint's own config."""
  check_quantization(quantization)
  tp = mesh.shape[MODEL_AXIS]
  if is_builtin(model):
    loaded = load_model(model, dtype, quantization=quantization)
    config = loaded.config.replace(tp_invariant_reductions=tp_invariant_reductions)
    check_tensor_parallel(config, tp)
    check_experts(config, tp, expert_parallel)
    shardings = param_shardings(loaded.params, mesh, not tp_invariant_reductions, expert_parallel)
    params = jax.tree.map(
      lambda x, s: _shard_host_array(np.asarray(x), s), loaded.params, shardings
    )
    return LoadedModel(config, params, loaded.source)
  path = checkpoint_dir(model)
  config = load_hf_config(path, dtype)
  config = config.replace(tp_invariant_reductions=tp_invariant_reductions)
  check_tensor_parallel(config, tp)
  check_experts(config, tp, expert_parallel)
  quantization = resolve_quantization(quantization, read_stored_quantization(path))
  orbax_dir = path / PARAMS_SUBDIR
  if orbax_dir.is_dir():
    params = restore_params(orbax_dir, sharded_param_shapes(config, mesh, expert_parallel))
    loaded = LoadedModel(config, params, f"orbax:{orbax_dir}")
    return _quantized(loaded, quantization, mesh, expert_parallel)
  config = config.replace(quantization=quantization)
  shardings = _by_path(sharded_param_shapes(config, mesh, expert_parallel))

  def sharding(param_path: ParamPath, shape: tuple[int, ...]) -> jax.sharding.Sharding:
    return shardings[param_path].sharding

  params, stats = load_hf_weights(path, config, sharding=sharding, options=transfer)
  return LoadedModel(config, params, f"safetensors:{path}", stats.packed)


def _quantized(
  loaded: LoadedModel, quantization: str, mesh: Mesh, expert_parallel: bool
) -> LoadedModel:
  """A float model quantized after loading (a float Orbax checkpoint), each leaf then moved to
  its quantized sharding; a model already in that scheme as it is."""
  scheme = scheme_for(quantization)
  if scheme is None or loaded.config.quantization == quantization:
    return loaded
  config = loaded.config.replace(quantization=quantization)
  params = quantize_params(dict(loaded.params), scheme)
  targets = sharded_param_shapes(config, mesh, expert_parallel)
  params = jax.tree.map(lambda x, target: jax.device_put(x, target.sharding), params, targets)
  return LoadedModel(config, params, loaded.source)


def sharded_param_shapes(config: ModelConfig, mesh: Mesh, expert_parallel: bool = False) -> dict:
  """The params of `config` as jax.ShapeDtypeStructs carrying the shardings the loader gives them
  (vocabulary-sized weights replicated under tp_invariant_reductions; a quantized config's 8-bit
  kernels and float32 scales by the quantized rules; experts by expert when `expert_parallel`):
  the abstract tree an Orbax restore fills, and the weights of an ahead-of-time compilation."""
  shapes = param_shapes(config)
  shardings = param_shardings(shapes, mesh, not config.tp_invariant_reductions, expert_parallel)
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings
  )


def _by_path(tree: dict) -> dict[ParamPath, jax.ShapeDtypeStruct]:
  return {
    tuple(str(k.key) for k in key_path): leaf
    for key_path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


def _shard_host_array(array: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])
