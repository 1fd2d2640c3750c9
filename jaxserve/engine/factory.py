"""Builds an LLMEngine from an EngineConfig: model, tokenizer, KV pool, scheduler, runner, warmup.

Everything the server logs at start-up (model, buckets, KV pages, warmup time) is decided here.
With tensor_parallel_size > 1, or on a multi-host job, the device side is laid out over a mesh
(jaxserve/parallel/): params loaded into their shards, KV pages sharded by kv head, attention
shard_mapped, and the step jitted with explicit shardings. On a multi-host job process 0 builds the
engine and the other processes build only the runner (`build_runner`) and follow its steps.
"""
from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np

from jaxserve.attention.backends import get_attention_backend, head_count_invariant
from jaxserve.config import EngineConfig
from jaxserve.device_memory import kv_budget_bytes, max_concurrency
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.scheduler import Scheduler
from jaxserve.models.fused_projections import fuse_params
from jaxserve.models.invariant_dense import REDUCTION_GROUPS
from jaxserve.models.llama import LlamaForCausalLM
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.registry import LoadedModel, load_model
from jaxserve.runtime.buckets import Bucket, BucketSet
from jaxserve.runtime.compile_ledger import CompileLedger
from jaxserve.runtime.kv_cache import KVCacheSpec, allocate_kv_pages, page_bytes, plan_num_pages
from jaxserve.runtime.model_runner import ModelRunner
from jaxserve.runtime.sampler import GreedyFn, xla_greedy
from jaxserve.parallel.sharded_runner import StepSink
from jaxserve.runtime.step_inputs import StepShape
from jaxserve.tokenizer.configured import load_configured_tokenizer

logger = logging.getLogger(__name__)


def resolve_max_model_len(config: EngineConfig, model_config: ModelConfig) -> int:
  limit = model_config.max_position_embeddings
  if config.max_model_len is None:
    return limit
  if config.max_model_len > limit:
    raise ValueError(f"max_model_len: {config.max_model_len} exceeds the model's "
                     f"max_position_embeddings {limit}")
  return config.max_model_len


def kv_cache_spec(config: EngineConfig, model_config: ModelConfig, max_model_len: int,
                  free_bytes: int | None, num_shards: int = 1) -> KVCacheSpec:
  """The pool's spec; free_bytes is one device's budget for the pool (memory_fraction applied,
  device_memory.py), that device holding 1/num_shards of every page."""
  page_size = config.cache.page_size
  per_page = page_bytes(model_config.num_layers, model_config.num_kv_heads, model_config.head_dim,
                        page_size, model_config.dtype) // num_shards
  num_pages = plan_num_pages(config.cache, per_page, free_bytes)
  if free_bytes is None and config.cache.num_pages is None and config.cache.memory_bytes is None:
    enough = config.scheduler.max_num_seqs * math.ceil(max_model_len / page_size) + 1
    num_pages = min(num_pages, enough)
  return KVCacheSpec(model_config.num_layers, model_config.num_kv_heads, model_config.head_dim,
                     page_size, num_pages, model_config.dtype)


def enable_compilation_cache(directory: str | None) -> None:
  """Points JAX's persistent compilation cache at `directory` unless the process chose one."""
  if not directory or jax.config.jax_compilation_cache_dir:
    return
  directory = os.path.expanduser(directory)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  logger.info("XLA compilation cache: %s", directory)


@dataclass(frozen=True)
class BuiltRunner:
  """The device side of an engine: what build_runner made."""
  model_config: ModelConfig
  runner: ModelRunner
  spec: KVCacheSpec
  max_model_len: int


def _is_sharded(config: EngineConfig) -> bool:
  """tp_invariant_reductions runs the sharded path even at tp = 1 (a one-device mesh), so every
  tensor_parallel_size compiles the same step with the same options (sharded_runner)."""
  return (config.tensor_parallel_size > 1 or jax.process_count() > 1
          or config.tp_invariant_reductions)


def build_runner(config: EngineConfig, *,
                 agree_num_pages: Callable[[int], int] | None = None,
                 publisher: StepSink | None = None) -> BuiltRunner:
  """Loads the model, sizes and allocates the KV pool and builds the (unwarmed) runner.

  agree_num_pages(local) -> num_pages lets the hosts of a multi-host job settle on one pool size;
  publisher.publish(inputs) runs before each step (process 0 sends the step to the other hosts)."""
  dense = None
  if _is_sharded(config):
    from jaxserve.parallel.mesh import build_mesh
    from jaxserve.parallel.partition_rules import kv_pages_sharding
    from jaxserve.parallel.sharded_attention import shard_attention_backend
    from jaxserve.parallel.sharded_dense import shard_dense_backend
    from jaxserve.parallel.sharded_loading import load_model_sharded
    from jaxserve.parallel.sharded_runner import ShardedModelRunner
    mesh = build_mesh(config.tensor_parallel_size)
    loaded = load_model_sharded(config.model, config.dtype, mesh,
                                tp_invariant_reductions=config.tp_invariant_reductions)
    backend = get_attention_backend(config.attention_backend)
    if config.tp_invariant_reductions:
      backend = head_count_invariant(backend)
      dense = shard_dense_backend(mesh, REDUCTION_GROUPS)
    backend = shard_attention_backend(backend, mesh)
    kv_sharding, num_shards = kv_pages_sharding(mesh), config.tensor_parallel_size
  else:
    loaded = load_model(config.model, config.dtype)
    model_config = loaded.config.replace(tp_invariant_reductions=config.tp_invariant_reductions,
                                         fused_projections=config.fuse_projections)
    params, source = dict(jax.device_put(loaded.params)), loaded.source
    del loaded  # `params` alone holds the weights: fusing frees each layer's separate kernels
    if config.fuse_projections:
      fuse_params(params)
    loaded = LoadedModel(model_config, params, source)
    backend = get_attention_backend(config.attention_backend)
    kv_sharding, num_shards = None, 1
  model_config = loaded.config
  max_model_len = resolve_max_model_len(config, model_config)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(loaded.params))
  logger.info("model %s: %s, %.1fM params, %s, attention backend %s", config.model,
              model_config.architecture, num_params / 1e6, model_config.dtype, backend.name)

  buckets = BucketSet.from_config(config.scheduler)
  model = LlamaForCausalLM(model_config, backend, dense)
  free_bytes = kv_budget_bytes(config.cache.memory_fraction, scratch_measured=kv_sharding is None)
  if free_bytes is not None and kv_sharding is None and config.cache.num_pages is None \
      and config.cache.memory_bytes is None:
    free_bytes -= _step_scratch_bytes(config, model_config, model, loaded.params, buckets,
                                      max_model_len)
  spec = kv_cache_spec(config, model_config, max_model_len, free_bytes, num_shards)
  if agree_num_pages is not None:
    spec = KVCacheSpec(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.page_size,
                       agree_num_pages(spec.num_pages), spec.dtype)
  kv_pages = allocate_kv_pages(spec, kv_sharding)
  logger.info("KV cache: %d pages of %d tokens (%d usable tokens, %.1f MiB%s), max_model_len %d",
              spec.num_pages, spec.page_size, (spec.num_pages - 1) * spec.page_size,
              spec.total_bytes / 2**20, f" over {num_shards} shards" if num_shards > 1 else "",
              max_model_len)
  logger.info("maximum concurrency for %d tokens per request: %.2fx", max_model_len,
              max_concurrency(spec.num_pages, spec.page_size, max_model_len))
  shape = StepShape(spec.page_size, math.ceil(max_model_len / spec.page_size), max_model_len)
  options = step_compiler_options(config)
  if kv_sharding is None:
    sampler = sampler_backend(config, sharded=False)
    logger.info("%s", describe_step_choices(sampler, options))
    runner = ModelRunner(model, loaded.params, kv_pages, buckets, shape, options,
                         greedy_sampler(sampler))
  else:
    runner = ShardedModelRunner(model, loaded.params, kv_pages, buckets, shape, mesh, publisher,
                                options)
  runner.set_burst_steps(config.scheduler.num_scheduler_steps)
  return BuiltRunner(model_config, runner, spec, max_model_len)


def step_compiler_options(config: EngineConfig) -> dict[str, object] | None:
  """XLA options of the step programs: on GPUs with gpu_gemm "cublas" or "cublaslt", no Triton
  GEMM fusions, and with "cublaslt" GEMMs called through cuBLASLt."""
  if jax.default_backend() != "gpu" or config.gpu_gemm == "xla":
    return None
  options: dict[str, object] = {"xla_gpu_enable_triton_gemm": False}
  if config.gpu_gemm == "cublaslt":
    options["xla_gpu_enable_cublaslt"] = True
  return options


def describe_step_choices(sampler: str, options: dict[str, object] | None) -> str:
  """What the sampler and GEMM settings mean for this run, with the config key to change each."""
  where = ("the Pallas GPU kernel" if sampler == "pallas_gpu" else "XLA reductions")
  text = f"greedy picks and logprobs: {where} (sampler_backend={sampler})"
  if options:
    gemms = "cuBLASLt" if options.get("xla_gpu_enable_cublaslt") else "cuBLAS"
    text += f"; GEMMs: {gemms}, XLA's Triton GEMM fusions off (gpu_gemm)"
  return text


def sampler_backend(config: EngineConfig, sharded: bool) -> str:
  """EngineConfig.sampler_backend with "auto" resolved: the Pallas kernel for unsharded models
  on GPUs, XLA elsewhere."""
  if config.sampler_backend != "auto":
    return config.sampler_backend
  return "pallas_gpu" if jax.default_backend() == "gpu" and not sharded else "xla"


def greedy_sampler(backend: str) -> GreedyFn:
  """The sampler's greedy pick and log-normalizer for a resolved sampler backend (the Pallas
  kernel runs in interpret mode off a GPU)."""
  if backend == "xla":
    return xla_greedy
  from pallas_kernels.greedy_sample.gpu import greedy_sample
  return functools.partial(greedy_sample, interpret=jax.default_backend() != "gpu")


def _step_scratch_bytes(config: EngineConfig, model_config: ModelConfig, model, params,
                        buckets: BucketSet, max_model_len: int) -> int:
  """Device scratch the largest bucket's step needs (compiled once against a 2-page pool), plus
  a quarter for fragmentation: the KV pool is sized from what is left."""
  page_size = config.cache.page_size
  probe_spec = KVCacheSpec(model_config.num_layers, model_config.num_kv_heads,
                           model_config.head_dim, page_size, 2, model_config.dtype)
  shape = StepShape(page_size, math.ceil(max_model_len / page_size), max_model_len)
  probe = ModelRunner(model, params, allocate_kv_pages(probe_spec), buckets, shape,
                      step_compiler_options(config))
  largest = Bucket(buckets.seq_buckets[-1], buckets.token_buckets[-1])
  scratch = probe.temp_bytes(largest) or 0
  logger.info("step scratch memory: %.2f GiB for bucket %s (reserved before sizing the KV pool)",
              scratch / 2**30, largest)
  return int(scratch * 1.25)


def build_engine(config: EngineConfig, *, show_progress: bool = True) -> LLMEngine:
  """Loads the model and tokenizer, sizes and allocates the KV pool, and compiles every bucket.
  On a multi-host job this runs on process 0 and sends every step (warmup too) to the others."""
  tokenizer = load_configured_tokenizer(config)  # a bad tokenizer / template fails before loading
  enable_compilation_cache(config.compilation_cache_dir)
  ledger = CompileLedger().start()
  publisher = None
  if jax.process_count() > 1:
    from jaxserve.parallel.multihost import StepPublisher, is_worker
    if is_worker():
      raise ValueError(f"distributed: process {jax.process_index()} is a worker; only process 0 "
                       "builds the engine (workers run jaxserve.parallel.worker.run_worker)")
    publisher = StepPublisher()
  built = build_runner(config, agree_num_pages=publisher and publisher.agree_num_pages,
                       publisher=publisher)
  model_config, runner, spec = built.model_config, built.runner, built.spec
  allocator = PageAllocator(spec.num_pages, spec.page_size, config.scheduler.enable_prefix_caching)
  scheduler = Scheduler(config.scheduler, allocator, built.max_model_len)
  logger.info("buckets: %s", runner.buckets.describe())
  warmup_seconds = runner.warmup(show_progress=show_progress)
  eos = tuple(dict.fromkeys(tuple(model_config.eos_token_ids) + tuple(tokenizer.eos_token_ids)))
  return LLMEngine(tokenizer=tokenizer, runner=runner, scheduler=scheduler, allocator=allocator,
                   max_model_len=built.max_model_len, vocab_size=model_config.vocab_size,
                   eos_token_ids=eos, ledger=ledger, seed=config.seed, model_name=config.model,
                   warmup_seconds=warmup_seconds)
