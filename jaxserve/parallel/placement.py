"""Where the model lives: on one device, or laid out over a mesh. load_placement(config) loads the
model either way and returns the same Placement, so the composition root
(jaxserve/composition/assembly.py) has one path from there on.

One device: the params are put on the default device and, with fuse_projections, q/k/v and
gate/up are merged (models/fused_projections.py); the attention backend is the configured one.

A mesh (tensor_parallel_size > 1, a multi-host job, or tp_invariant_reductions, which runs this
path even at tp = 1 so every tensor_parallel_size compiles the same step with the same options):
params are loaded straight into their shards (sharded_loading.py), attention is shard_mapped over
kv heads (sharded_attention.py), KV pages are sharded by kv head, with tp_invariant_reductions
the projections go through the sharded grouped GEMMs (sharded_dense.py), and a mixture of
experts' experts run shard by shard (sharded_experts.py), split by expert over the same devices
with enable_expert_parallel (attention and KV pages split by head as without it). Sharded models
keep HF's separate projections; quantized ones shard their 8-bit kernels and scales
(partition_rules.py, which also builds the one-axis mesh).

batch_invariant (either placement): the attention backend with fixed tiles
(attention/backends.batch_invariant_attention) and the projections through fixed-tile GEMMs
(models/batch_invariant_dense.py; on a mesh with tp_invariant_reductions the grouped GEMMs of
sharded_dense.py run through them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
from flax import linen as nn
from jax.sharding import Mesh

from jaxserve.attention.backends import (
  AttentionBackend,
  batch_invariant_attention,
  check_kv_dtype,
  get_attention_backend,
  head_count_invariant,
  quantized_kv_backend,
)
from jaxserve.attention.metadata import KVPages
from jaxserve.config import KV_CACHE_STORAGE, EngineConfig, KernelChoice
from jaxserve.device.step_programs import StepShardings
from jaxserve.models.batch_invariant_dense import batch_invariant_backend, invariant_matmul
from jaxserve.models.causal_lm import causal_lm
from jaxserve.models.fused_projections import fuse_params
from jaxserve.models.invariant_dense import REDUCTION_GROUPS, DenseBackend
from jaxserve.models.layers.moe import ExpertsFn
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.registry import LoadedModel, load_model, model_path
from jaxserve.models.weights import param_shapes
from jaxserve.parallel.device_slice import check_default_device
from jaxserve.parallel.partition_rules import (
  MODEL_AXIS,
  build_mesh,
  check_experts,
  check_tensor_parallel,
  kv_pages_sharding,
  logits_sharding,
  replicated,
  with_replicated_kv_heads,
)
from jaxserve.parallel.sharded_attention import shard_attention_backend
from jaxserve.parallel.sharded_dense import shard_dense_backend
from jaxserve.parallel.sharded_experts import shard_experts
from jaxserve.parallel.sharded_loading import load_model_sharded, sharded_param_shapes
from jaxserve.quantization.scheme import scheme_for


@dataclass(frozen=True)
class Placement:
  """A loaded model on its devices: config and params, the backends its module runs with, and
  the mesh (None on one device) with the KV pages' sharding."""

  model: LoadedModel
  attention: AttentionBackend
  dense: DenseBackend | None
  mesh: Mesh | None
  kv_sharding: jax.sharding.Sharding | None
  num_shards: int  # devices each KV page is split over
  experts: ExpertsFn | None = None  # a mixture of experts' on a mesh (None: unsharded)

  def module(self) -> nn.Module:
    """The model's decoder (models/causal_lm.py) over these backends."""
    return causal_lm(self.model.config, self.attention, self.dense, self.experts)

  def step_shardings(self, kv_pages: KVPages) -> StepShardings | None:
    """The step programs' shardings (None on one device: default placement)."""
    if self.mesh is None:
      return None
    params = self.model.params
    return StepShardings(
      jax.tree.map(lambda x: x.sharding, params),
      jax.tree.map(lambda x: x.sharding, kv_pages),
      logits_sharding(params, self.mesh),
      replicated(self.mesh),
    )


def is_sharded(config: EngineConfig) -> bool:
  return (
    config.tensor_parallel_size > 1 or jax.process_count() > 1 or config.tp_invariant_reductions
  )


def load_placement(config: EngineConfig, devices: Sequence[jax.Device] | None = None) -> Placement:
  """`devices`: the engine's own (an engine core of several on one host,
  parallel/device_slice.py); None: the process's, from the first."""
  check_kv_cache(config)
  if is_sharded(config):
    return _on_mesh(config, devices)
  if devices is not None:
    check_default_device(devices[0])
  return _on_one_device(config)


def _on_one_device(config: EngineConfig) -> Placement:
  """Weights put uncommitted on the default device, as every array of a one-device engine is:
  an array committed to a device (device_put's `device`, or one computed from committed inputs)
  gives jit a cache key of its own, so steps whose inputs come from the device would compile
  again after warmup lowered them on abstract, uncommitted inputs."""
  loaded = load_model(
    model_path(config),
    config.dtype,
    quantization=config.quantization,
    fuse_projections=config.fuse_projections,
  )
  model_config = loaded.config.replace(
    tp_invariant_reductions=config.tp_invariant_reductions,
    batch_invariant=config.batch_invariant,
    quantized_gemm=quantized_gemm(config, loaded.config.quantization),
  )
  params = dict(jax.device_put(loaded.params))
  return Placement(
    LoadedModel(model_config, params, loaded.source, loaded.packed),
    attention_for(config),
    dense_for(config),
    None,
    None,
    1,
  )


def quantized_gemm(
  config: EngineConfig, quantization: str, platform: str | None = None
) -> KernelChoice:
  """EngineConfig.quantized_gemm with AUTO resolved for an unsharded model running the weight
  scheme `quantization`: on a GPU the Pallas kernel for every scheme in decode steps (XLA has no
  GEMM that reads a weight-only scheme's 8-bit weights without writing a converted copy, and a
  W8A8 scheme's GEMM pays a per-token quantization of its input per projection; the kernel
  quantizes fp8's activations in registers), XLA's GEMMs off GPUs (`platform`, default JAX's
  backend)."""
  chosen = config.kernels.quantized_gemm
  if chosen is not KernelChoice.AUTO:
    return chosen
  quantized = scheme_for(quantization) is not None
  on_gpu = (platform or jax.default_backend()) == "gpu"
  return KernelChoice.PALLAS_GPU if quantized and on_gpu else KernelChoice.XLA


def check_kv_cache(config: EngineConfig, platform: str | None = None) -> None:
  """Before any weight or page takes device memory: the configured attention backend reads the
  configured 8-bit KV pages (a one-line ValueError naming both otherwise)."""
  kv_dtype = KV_CACHE_STORAGE.get(config.cache.kv_cache_dtype)
  if kv_dtype is not None:
    check_kv_dtype(get_attention_backend(config.attention_backend, platform), kv_dtype)


def with_kv_cache(backend: AttentionBackend, config: EngineConfig) -> AttentionBackend:
  """`backend` writing and reading the configured 8-bit KV pages, if any."""
  kv_dtype = KV_CACHE_STORAGE.get(config.cache.kv_cache_dtype)
  if kv_dtype is None:
    return backend
  return quantized_kv_backend(backend, kv_dtype, *config.cache.kv_scales())


def attention_for(config: EngineConfig, platform: str | None = None) -> AttentionBackend:
  """The attention backend of an unsharded model (batch_invariant: with fixed tiles; `platform`
  resolves "auto", default JAX's backend)."""
  backend = with_kv_cache(get_attention_backend(config.attention_backend, platform), config)
  return batch_invariant_attention(backend) if config.batch_invariant else backend


def dense_for(config: EngineConfig) -> DenseBackend | None:
  """The projections' backend of an unsharded model (None: flax's Dense)."""
  return batch_invariant_backend() if config.batch_invariant else None


def _on_mesh(config: EngineConfig, devices: Sequence[jax.Device] | None = None) -> Placement:
  mesh = build_mesh(config.tensor_parallel_size, devices)
  loaded = load_model_sharded(
    model_path(config),
    config.dtype,
    mesh,
    tp_invariant_reductions=config.tp_invariant_reductions,
    quantization=config.quantization,
    expert_parallel=config.enable_expert_parallel,
  )
  return _mesh_placement(config, loaded, mesh)


def abstract_placement(
  config: EngineConfig, model_config: ModelConfig, mesh: Mesh, platform: str | None = None
) -> Placement:
  """The mesh Placement of `model_config` with no weights loaded: every param a
  jax.ShapeDtypeStruct with the sharding load_placement would give it, the backends and KV
  sharding as load_placement's. `platform` resolves attention_backend "auto" (default: JAX's
  backend). For compiling ahead of time for devices this machine does not have
  (jaxserve/tpu_aot)."""
  if config.dtype != "auto":
    model_config = model_config.replace(dtype=config.dtype)
  model_config = model_config.replace(tp_invariant_reductions=config.tp_invariant_reductions)
  tp, expert_parallel = mesh.shape[MODEL_AXIS], config.enable_expert_parallel
  check_tensor_parallel(model_config, tp)
  check_experts(model_config, tp, expert_parallel)
  model_config = with_replicated_kv_heads(model_config, tp)  # as load_model_sharded loads it
  params = sharded_param_shapes(model_config, mesh, expert_parallel)
  loaded = LoadedModel(model_config, params, "abstract")
  return _mesh_placement(config, loaded, mesh, platform)


def abstract_one_device_placement(
  config: EngineConfig, model_config: ModelConfig, device: jax.Device, platform: str | None = None
) -> Placement:
  """The one-device Placement of `model_config` with no weights loaded, for compiling ahead of
  time for `device` (jaxserve/tpu_aot): the params load_placement's one-device path would hold
  (q/k/v and gate/up merged with fuse_projections) as jax.ShapeDtypeStructs, its backends, and a
  mesh of that one device over which every array is whole (the step programs need a device to
  compile for; one device splits nothing, so the programs compute what the default placement's
  do)."""
  if config.dtype != "auto":
    model_config = model_config.replace(dtype=config.dtype)
  model_config = model_config.replace(
    fused_projections=config.fuse_projections, batch_invariant=config.batch_invariant
  )
  shapes = param_shapes(model_config)
  if config.fuse_projections:
    shapes = jax.eval_shape(lambda tree: fuse_params(dict(tree)), shapes)
  mesh = build_mesh(1, [device])
  whole = replicated(mesh)
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=whole), shapes)
  return Placement(
    LoadedModel(model_config, params, "abstract"),
    attention_for(config, platform),
    dense_for(config),
    mesh,
    whole,
    1,
  )


def _mesh_placement(
  config: EngineConfig, loaded: LoadedModel, mesh: Mesh, platform: str | None = None
) -> Placement:
  loaded = LoadedModel(
    loaded.config.replace(batch_invariant=config.batch_invariant),
    loaded.params,
    loaded.source,
    loaded.packed,
  )
  backend = with_kv_cache(get_attention_backend(config.attention_backend, platform), config)
  dense = None
  matmul = invariant_matmul() if config.batch_invariant else None
  if config.tp_invariant_reductions:
    backend = head_count_invariant(backend)
    dense = shard_dense_backend(mesh, REDUCTION_GROUPS, matmul)
  elif config.batch_invariant:
    dense = batch_invariant_backend()
  if config.batch_invariant:
    backend = batch_invariant_attention(backend)
  return Placement(
    loaded,
    shard_attention_backend(backend, mesh),
    dense,
    mesh,
    kv_pages_sharding(mesh),
    mesh.shape[MODEL_AXIS],
    shard_experts(
      mesh,
      config.enable_expert_parallel,
      REDUCTION_GROUPS if config.tp_invariant_reductions else None,
    )
    if loaded.config.num_experts
    else None,
  )
