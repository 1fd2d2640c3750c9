"""The adapter between the TPU build and the engine: the only module that touches the runtime.

It builds the server's device side as the factory does for a sharded engine (tensor_parallel_size
> 1), but abstract: every param and KV page is a jax.ShapeDtypeStruct carrying its partition-rule
sharding on a mesh of topology devices, and the runner is the engine's own ShardedModelRunner
around them, so its jitted step functions (in/out shardings, donation, compiler options) are the
very ones `jaxserve serve` compiles at warmup. Step inputs are the runner's own padded dummy
inputs; the only change is that its cached constants (the empty penalty history, the previous
step's ids) are host arrays, since topology devices hold no memory: lowering sees their shapes.

The programs (as ModelRunner.warmup compiles them): forward per bucket; the sampler per sequence
bucket and SamplerMode; prompt logprobs per token bucket; decode bursts per decode bucket in the
greedy and random modes when scheduler.num_scheduler_steps > 1.

Dependencies on the engine, all here: engine.factory (resolve_max_model_len, kv_cache_spec),
parallel.mesh (build_mesh, check_tensor_parallel), parallel.partition_rules (param_shardings,
kv_pages_sharding), parallel.sharded_attention / sharded_dense (the shard_mapped backends),
parallel.sharded_runner.ShardedModelRunner (its __init__, set_burst_steps, and the jitted
`_prompt` and `_burst`), runtime.model_runner (dummy_inputs, warmup_variants, burst_buckets,
lower_step), runtime.packing.pack, runtime.buckets, runtime.step_inputs.StepShape.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.attention.backends import get_attention_backend, head_count_invariant
from jaxserve.config import EngineConfig
from jaxserve.engine.factory import kv_cache_spec, resolve_max_model_len
from jaxserve.models.invariant_dense import REDUCTION_GROUPS
from jaxserve.models.llama import LlamaForCausalLM
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.weights import param_shapes
from jaxserve.parallel.mesh import build_mesh, check_tensor_parallel
from jaxserve.parallel.partition_rules import kv_pages_sharding, param_shardings
from jaxserve.parallel.sharded_attention import shard_attention_backend
from jaxserve.parallel.sharded_dense import shard_dense_backend
from jaxserve.parallel.sharded_runner import ShardedModelRunner
from jaxserve.runtime.buckets import Bucket, BucketSet
from jaxserve.runtime.kv_cache import page_bytes
from jaxserve.runtime.packing import pack
from jaxserve.runtime.sampler import SamplerMode
from jaxserve.runtime.step_inputs import StepShape

BURST_MODES = (SamplerMode(), SamplerMode(random=True))  # the modes a burst may run


@dataclass(frozen=True)
class ServerShape:
  """What a sharded server holds per chip before its KV pool is sized."""
  config: EngineConfig
  model_config: ModelConfig
  max_model_len: int
  num_chips: int
  weight_bytes_per_chip: int
  page_bytes_per_chip: int       # one page, all layers, K and V, this chip's kv heads
  params: dict                   # ShapeDtypeStructs with their shardings
  mesh: jax.sharding.Mesh


@dataclass(frozen=True)
class ProgramId:
  """One compiled step program: its kind, bucket and sampler mode."""
  kind: str                      # "forward" | "sampler" | "prompt_logprobs" | "burst"
  num_seqs: int                  # 0 where the program does not depend on it
  num_tokens: int                # 0 where the program does not depend on it
  mode: SamplerMode | None

  @property
  def name(self) -> str:
    shape = "x".join(str(n) for n in (self.num_seqs, self.num_tokens) if n)
    flags = [f for f, on in (("random", self.mode and self.mode.random),
                             ("penalties", self.mode and self.mode.penalties),
                             ("top", self.mode and self.mode.top_logprobs)) if on]
    mode = "" if self.mode is None else f" {'+'.join(flags) or 'greedy'}"
    return f"{self.kind}[{shape}]{mode}"


@dataclass(frozen=True)
class StepProgram:
  id: ProgramId
  resident_bytes: int            # of its per-chip arguments, the weights / KV pool it reads
  lower: Callable[[], jax.stages.Lowered]


def server_shape(config: EngineConfig, model_config: ModelConfig,
                 devices: Sequence[jax.Device]) -> ServerShape:
  """The abstract weights of `model_config` laid out over config.tensor_parallel_size devices."""
  tp = config.tensor_parallel_size
  if tp < 2:
    raise ValueError("tensor_parallel_size: compile-tpu builds sharded servers; got "
                     f"{tp} (the unsharded path fuses projections after loading real weights)")
  if config.dtype != "auto":
    model_config = model_config.replace(dtype=config.dtype)
  model_config = model_config.replace(tp_invariant_reductions=config.tp_invariant_reductions)
  check_tensor_parallel(model_config, tp)
  mesh = build_mesh(tp, devices)
  shapes = param_shapes(model_config)
  shardings = param_shardings(shapes, mesh, shard_vocab=not config.tp_invariant_reductions)
  params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)
  per_page = page_bytes(model_config.num_layers, model_config.num_kv_heads,
                        model_config.head_dim, config.cache.page_size, model_config.dtype) // tp
  return ServerShape(config, model_config, resolve_max_model_len(config, model_config), tp,
                     per_chip_bytes(params), per_page, params, mesh)


def per_chip_bytes(tree: dict) -> int:
  """Bytes one chip holds of a tree of sharded ShapeDtypeStructs (chip 0's shard of each)."""
  def leaf(x) -> int:
    return math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
  return sum(leaf(x) for x in jax.tree_util.tree_leaves(tree))


def pool_pages(shape: ServerShape, free_bytes_per_chip: int) -> int:
  """The KV pool's page count as the factory sizes it from a chip's free memory
  (cache.memory_fraction of it, or the config's explicit size); ValueError under 2 pages."""
  return kv_cache_spec(shape.config, shape.model_config, shape.max_model_len,
                       free_bytes_per_chip, shape.num_chips).num_pages


class _AbstractRunner(ShardedModelRunner):
  """The engine's runner over abstract arrays: its cached constants stay on the host."""

  def filled_array(self, shape: tuple[int, ...], dtype: np.dtype, value: int) -> jax.Array:
    return jnp.full(shape, value, dtype)


def _runner(shape: ServerShape, num_pages: int) -> ShardedModelRunner:
  config, model_config, mesh = shape.config, shape.model_config, shape.mesh
  backend = get_attention_backend(config.attention_backend, platform="tpu")
  dense = None
  if config.tp_invariant_reductions:
    backend, dense = head_count_invariant(backend), shard_dense_backend(mesh, REDUCTION_GROUPS)
  model = LlamaForCausalLM(model_config, shard_attention_backend(backend, mesh), dense)
  page = jax.ShapeDtypeStruct((model_config.num_kv_heads, num_pages, config.cache.page_size,
                               model_config.head_dim), jnp.dtype(model_config.dtype),
                              sharding=kv_pages_sharding(mesh))
  kv_pages = tuple((page, page) for _ in range(model_config.num_layers))
  step_shape = StepShape(config.cache.page_size,
                         math.ceil(shape.max_model_len / config.cache.page_size),
                         shape.max_model_len)
  runner = _AbstractRunner(model, shape.params, kv_pages,
                           BucketSet.from_config(config.scheduler), step_shape, mesh)
  runner.set_burst_steps(config.scheduler.num_scheduler_steps)
  return runner


def step_programs(shape: ServerShape, num_pages: int) -> list[StepProgram]:
  """Every program the server compiles at warmup, with a KV pool of num_pages pages."""
  runner = _runner(shape, num_pages)
  weights = shape.weight_bytes_per_chip
  pool = num_pages * shape.page_bytes_per_chip
  programs: dict[ProgramId, StepProgram] = {}
  for bucket, mode, prompt in runner.warmup_variants():
    forward = ProgramId("forward", bucket.num_seqs, bucket.num_tokens, None)
    sampler = ProgramId("sampler", bucket.num_seqs, 0, mode)
    programs.setdefault(forward, StepProgram(forward, weights + pool,
                                             _lower_step(runner, bucket, mode, 0)))
    programs.setdefault(sampler, StepProgram(sampler, 0, _lower_step(runner, bucket, mode, 1)))
    if prompt:
      pid = ProgramId("prompt_logprobs", 0, bucket.num_tokens, None)
      programs[pid] = StepProgram(pid, weights, _lower_prompt(runner, bucket))
  if runner.burst_steps > 1:
    for bucket in runner.burst_buckets():
      for mode in BURST_MODES:
        pid = ProgramId("burst", bucket.num_seqs, bucket.num_tokens, mode)
        programs[pid] = StepProgram(pid, weights + pool, _lower_burst(runner, bucket, mode))
  return list(programs.values())


def _lower_step(runner: ShardedModelRunner, bucket: Bucket, mode: SamplerMode,
                index: int) -> Callable[[], jax.stages.Lowered]:
  """lower_step's forward (index 0) or sampler (index 1) on the bucket's dummy inputs."""
  return lambda: runner.lower_step(runner.dummy_inputs(bucket, mode), mode)[index]


def _lower_prompt(runner: ShardedModelRunner, bucket: Bucket) -> Callable[[], jax.stages.Lowered]:
  hidden = jax.ShapeDtypeStruct((bucket.num_tokens, runner.model.config.hidden_size),
                                jnp.dtype(runner.model.config.dtype))
  targets = jax.ShapeDtypeStruct((bucket.num_tokens,), jnp.int32)
  return lambda: runner._prompt.lower(runner.params, hidden, targets)


def _lower_burst(runner: ShardedModelRunner, bucket: Bucket,
                 mode: SamplerMode) -> Callable[[], jax.stages.Lowered]:
  def lower() -> jax.stages.Lowered:
    inputs = runner.dummy_inputs(bucket, mode)
    model_inputs = pack(dataclasses.replace(inputs, sampling=None))  # as dispatch packs them
    return runner._burst.lower(runner.params, runner.kv_pages, model_inputs,
                               pack(inputs.sampling), mode)
  return lower
