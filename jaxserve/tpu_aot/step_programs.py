"""The adapter between the TPU build and the engine: the only module of tpu_aot that touches the
engine's device side.

It builds the server's device side as jaxserve/composition/assembly.py does, but abstract: for a
sharded engine (tensor_parallel_size > 1, or tp_invariant_reductions) the Placement is
parallel/placement.py's abstract_placement (every param a jax.ShapeDtypeStruct carrying the sharding
the sharded loader gives it, on a mesh of topology devices; the shard_mapped attention and dense
backends load_placement builds), for one chip its abstract_one_device_placement (the one-device
params, projections merged as fuse_projections says, whole on a mesh of that chip, and the unsharded
backends); quantized weights are 8-bit kernels and float32 scales either way. The KV pages are
ShapeDtypeStructs with the placement's KV sharding (and cache.kv_cache_dtype's type), and the
programs come from the public builder (device/step_programs.build_step_programs) with the
placement's StepShardings, the config's compiler options (step_options.step_compiler_options) and
greedy pick (step_options.step_greedy), so the jitted functions (in/out shardings, donation,
compiler options) are the very ones `jaxserve serve` compiles at warmup. Step inputs are the padding
inputs warmup runs (device/lowering.standalone_dummy_inputs: the runner's cached constants as
uncommitted arrays of this host, since topology devices hold no memory; they pack as the runner's
device constants do), lowered as abstract values (device/lowering.abstract). No ModelRunner is
built: the programs are lowered directly, as tests/device/test_step_programs.py does.

The programs are warmup's plan (device/warmup.warmup_plan): forward per bucket; the sampler per
sequence bucket and SamplerMode; prompt logprobs per token bucket; decode bursts per decode
bucket in the greedy and random modes when scheduler.num_scheduler_steps > 1.

The KV pool is sized as assembly sizes it on a TPU chip (device/device_memory.planned_memory and
kv_budget with the unmeasured sharded-step scratch kept, then device/kv_cache.kv_cache_spec):
cache.memory_fraction of the chip's memory as the TPU client reports it (its bytes_limit, the
whole device: taken to be TpuChip.usable_bytes), less the weights and the streaming loader's slack
(weights on a TPU are streamed), the allocator's headroom, and 10% for the step's scratch; or the
config's cache.num_pages / cache.memory_bytes. (On one chip the engine measures the step's
scratch instead of keeping 10%; the build keeps the 10%, and its memory check counts the compiled
programs' transients either way.)

Every dependency of tpu_aot on parallel/ and device/ is an import of this module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxserve.config import EngineConfig
from jaxserve.device.device_memory import (
  DeviceMemory,
  kv_budget,
  max_concurrency,
  planned_memory,
)
from jaxserve.device.kv_cache import (
  kv_cache_spec,
  kv_pool_shapes,
  kv_pool_spec,
  page_bytes,
  resolve_max_model_len,
)
from jaxserve.device.lowering import abstract, standalone_dummy_inputs
from jaxserve.device.model_runner import packed_model_inputs
from jaxserve.device.packing import pack
from jaxserve.device.sampler import SamplerMode
from jaxserve.device.step_inputs import StepInputs, StepShape
from jaxserve.device.step_options import step_compiler_options, step_greedy
from jaxserve.device.step_programs import StepPrograms, build_step_programs
from jaxserve.device.warmup import warmup_plan
from jaxserve.messages.buckets import Bucket, BucketSet
from jaxserve.models.kv_layout import kv_layout
from jaxserve.models.model_config import ModelConfig
from jaxserve.parallel.partition_rules import build_mesh
from jaxserve.parallel.placement import (
  Placement,
  abstract_one_device_placement,
  abstract_placement,
  is_sharded,
)


@dataclass(frozen=True)
class ServerShape:
  """What a sharded server holds per chip before its KV pool is sized."""

  config: EngineConfig
  placement: Placement  # abstract params with their shardings, backends, mesh
  max_model_len: int
  num_chips: int
  weight_bytes_per_chip: int
  page_bytes_per_chip: int  # one page, all KV slots, K and V, this chip's kv heads

  @property
  def model_config(self) -> ModelConfig:
    return self.placement.model.config


@dataclass(frozen=True)
class ProgramId:
  """One compiled step program: its kind, bucket and sampler mode."""

  kind: str  # "forward" | "sampler" | "prompt_logprobs" | "burst"
  num_seqs: int  # 0 where the program does not depend on it
  num_tokens: int  # 0 where the program does not depend on it
  mode: SamplerMode | None

  @property
  def name(self) -> str:
    shape = "x".join(str(n) for n in (self.num_seqs, self.num_tokens) if n)
    flags = [
      f
      for f, on in (
        ("random", self.mode and self.mode.random),
        ("penalties", self.mode and self.mode.penalties),
        ("top", self.mode and self.mode.top_logprobs),
      )
      if on
    ]
    mode = "" if self.mode is None else f" {'+'.join(flags) or 'greedy'}"
    return f"{self.kind}[{shape}]{mode}"

  @property
  def parts(self) -> int:
    """The sampler mode's costly parts (random, penalties, top logprobs): 0 greedy, 3 fullest."""
    mode = self.mode
    return 0 if mode is None else mode.random + mode.penalties + mode.top_logprobs


@dataclass(frozen=True)
class StepProgram:
  id: ProgramId
  resident_bytes: int  # of its per-chip arguments, the weights / KV pool it reads
  lower: Callable[[], jax.stages.Lowered]


def server_shape(
  config: EngineConfig, model_config: ModelConfig, devices: Sequence[jax.Device]
) -> ServerShape:
  """The abstract weights of `model_config` laid out over config.tensor_parallel_size devices,
  as the engine's loader lays them out (sharded, or whole on one chip)."""
  tp = config.tensor_parallel_size
  if is_sharded(config):
    placement = abstract_placement(config, model_config, build_mesh(tp, devices), platform="tpu")
  else:
    placement = abstract_one_device_placement(config, model_config, devices[0], platform="tpu")
  model_config = placement.model.config
  per_page = (
    page_bytes(
      kv_layout(model_config, config.cache.page_size).num_slots,
      model_config.num_kv_heads,
      model_config.head_dim,
      config.cache.page_size,
      config.cache.storage_dtype(model_config.dtype),
    )
    // placement.num_shards
  )  # as kv_cache_spec splits it
  return ServerShape(
    config,
    placement,
    resolve_max_model_len(config, model_config),
    placement.num_shards,
    per_chip_bytes(placement.model.params),
    per_page,
  )


def per_chip_bytes(tree: dict) -> int:
  """Bytes one chip holds of a tree of sharded ShapeDtypeStructs (chip 0's shard of each)."""

  def leaf(x: jax.ShapeDtypeStruct) -> int:
    return math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize

  return sum(leaf(x) for x in jax.tree_util.tree_leaves(tree))


def pool_pages(shape: ServerShape, device_bytes: int, memory_fraction: float | None = None) -> int:
  """The KV pool's page count as assembly sizes it on a chip whose TPU client reports
  device_bytes as its limit (the whole device) with the weights in use; memory_fraction defaults
  to the config's. ValueError under 2 pages."""
  config = shape.config
  fraction = config.cache.memory_fraction if memory_fraction is None else memory_fraction
  chip = DeviceMemory(total_bytes=device_bytes, limit_bytes=device_bytes, in_use_bytes=0)
  memory = planned_memory(chip, shape.weight_bytes_per_chip)  # sharded loading streams
  budget = kv_budget(memory, fraction, scratch_measured=False)  # sharded: scratch not measured
  return kv_cache_spec(
    config, shape.model_config, shape.max_model_len, budget, shape.num_chips
  ).num_pages


def _programs(shape: ServerShape, num_pages: int) -> tuple[StepPrograms, dict, tuple]:
  """The server's step programs as assembly builds them, with abstract params and the KV pool's
  groups."""
  config, placement = shape.config, shape.placement
  model_config = shape.model_config
  spec = kv_pool_spec(
    kv_layout(model_config, config.cache.page_size).num_slots,
    model_config.num_kv_heads,
    model_config.head_dim,
    config.cache.page_size,
    num_pages,
    config.cache.storage_dtype(model_config.dtype),
    shape.num_chips,
  )  # grouped as kv_cache_spec groups the pool pool_pages sized
  kv_pages = kv_pool_shapes(spec, placement.kv_sharding)
  shardings = placement.step_shardings(kv_pages)
  programs = build_step_programs(
    placement.module(),
    shardings,
    burst_steps=config.scheduler.num_scheduler_steps,
    page_size=config.cache.page_size,
    greedy=step_greedy(config, sharded=is_sharded(config)),
    compiler_options=step_compiler_options(config),
  )
  return programs, placement.model.params, kv_pages


def decode_program_ids(bucket: Bucket) -> tuple[ProgramId, ProgramId]:
  """The programs of a greedy decode step in `bucket`: its forward and the greedy sampler."""
  return (
    ProgramId("forward", bucket.num_seqs, bucket.num_tokens, None),
    ProgramId("sampler", bucket.num_seqs, 0, SamplerMode()),
  )


def step_programs(shape: ServerShape, num_pages: int) -> list[StepProgram]:
  """Every program the server compiles at warmup, with a KV pool of num_pages pages."""
  config = shape.config
  programs, params, kv_pages = _programs(shape, num_pages)
  page_size = config.cache.page_size
  layout = kv_layout(shape.model_config, page_size)
  buckets = BucketSet.from_config(config.scheduler)
  if config.scheduler.pool_seq_rungs:  # as the server adds them (assembly.build_device)
    held = layout.pages_held(shape.max_model_len) if layout.num_groups > 1 else None
    capacity = max_concurrency(num_pages, page_size, shape.max_model_len, held)
    buckets = buckets.with_pool_rungs(int(capacity))
  step_shape = StepShape(
    page_size,
    math.ceil(shape.max_model_len / page_size),
    shape.max_model_len,
    shape.model_config.vocab_size,
    layout.num_groups,
  )
  lowering = _Lowering(programs, params, kv_pages, buckets, step_shape, shape.model_config)
  weights = shape.weight_bytes_per_chip
  pool = num_pages * shape.page_bytes_per_chip
  found: dict[ProgramId, StepProgram] = {}
  for run in warmup_plan(buckets, programs.burst_steps):
    bucket, mode = run.bucket, run.mode
    if run.num_steps > 1:
      pid = ProgramId("burst", bucket.num_seqs, bucket.num_tokens, mode)
      found[pid] = StepProgram(pid, weights + pool, functools.partial(lowering.burst, bucket, mode))
      continue
    forward = ProgramId("forward", bucket.num_seqs, bucket.num_tokens, None)
    sampler = ProgramId("sampler", bucket.num_seqs, 0, mode)
    found.setdefault(
      forward, StepProgram(forward, weights + pool, functools.partial(lowering.forward, bucket))
    )
    found.setdefault(
      sampler, StepProgram(sampler, 0, functools.partial(lowering.sampler, bucket, mode))
    )
    if run.prompt_logprobs:
      pid = ProgramId("prompt_logprobs", 0, bucket.num_tokens, None)
      found.setdefault(pid, StepProgram(pid, weights, functools.partial(lowering.prompt, bucket)))
  return list(found.values())


@dataclass(frozen=True)
class _Lowering:
  """The step programs lowered on abstract arguments: a bucket's padding inputs as warmup builds
  them, the params and KV pages as ShapeDtypeStructs with their shardings."""

  programs: StepPrograms
  params: dict
  kv_pages: tuple
  buckets: BucketSet
  shape: StepShape
  model_config: ModelConfig

  def inputs(self, bucket: Bucket, mode: SamplerMode = SamplerMode()) -> StepInputs:
    return standalone_dummy_inputs(self.buckets, self.shape, bucket, mode)

  def forward(self, bucket: Bucket) -> jax.stages.Lowered:
    packed = abstract(packed_model_inputs(self.inputs(bucket)))
    return self.programs.forward.lower(self.params, self.kv_pages, packed)

  def sampler(self, bucket: Bucket, mode: SamplerMode) -> jax.stages.Lowered:
    inputs = self.inputs(bucket, mode)
    logits = jax.ShapeDtypeStruct((bucket.num_seqs, self.model_config.vocab_size), jnp.float32)
    return self.programs.sample.lower(
      logits, abstract(pack(inputs.sampling)), abstract(inputs.prev_sampled_ids), mode
    )

  def prompt(self, bucket: Bucket) -> jax.stages.Lowered:
    hidden = jax.ShapeDtypeStruct(
      (bucket.num_tokens, self.model_config.hidden_size), jnp.dtype(self.model_config.dtype)
    )
    targets = abstract(self.inputs(bucket).prompt_target_ids)
    return self.programs.prompt_logprobs.lower(self.params, hidden, targets)

  def burst(self, bucket: Bucket, mode: SamplerMode) -> jax.stages.Lowered:
    inputs = self.inputs(bucket, mode)
    return self.programs.burst.lower(
      self.params,
      self.kv_pages,
      abstract(packed_model_inputs(inputs)),
      abstract(pack(inputs.sampling)),
      mode,
    )
