"""Builds an LLMEngine from an EngineConfig: model, tokenizer, KV pool, scheduler, runner, warmup.

Everything the server logs at start-up (model, buckets, KV pages, warmup time) is decided here.
"""
from __future__ import annotations

import logging
import math
import os

import jax
import numpy as np

from jaxserve.attention.backends import get_attention_backend
from jaxserve.config import EngineConfig
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.scheduler import Scheduler
from jaxserve.models.llama import LlamaForCausalLM
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.registry import load_model
from jaxserve.runtime.buckets import BucketSet
from jaxserve.runtime.compile_ledger import CompileLedger
from jaxserve.runtime.kv_cache import (KVCacheSpec, allocate_kv_pages, device_memory_budget,
                                       page_bytes, plan_num_pages)
from jaxserve.runtime.model_runner import ModelRunner
from jaxserve.runtime.step_inputs import StepShape
from jaxserve.tokenizer.tokenizer import load_tokenizer

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
                  free_bytes: int | None) -> KVCacheSpec:
  page_size = config.cache.page_size
  per_page = page_bytes(model_config.num_layers, model_config.num_kv_heads, model_config.head_dim,
                        page_size, model_config.dtype)
  num_pages = plan_num_pages(config.cache, per_page, free_bytes)
  if free_bytes is None and config.cache.num_pages is None and config.cache.memory_bytes is None:
    enough = config.scheduler.max_num_seqs * math.ceil(max_model_len / page_size) + 1
    num_pages = min(num_pages, enough)
  return KVCacheSpec(model_config.num_layers, model_config.num_kv_heads, model_config.head_dim,
                     page_size, num_pages, model_config.dtype)


def _enable_compilation_cache(directory: str | None) -> None:
  """Points JAX's persistent compilation cache at `directory` unless the process chose one."""
  if not directory or jax.config.jax_compilation_cache_dir:
    return
  directory = os.path.expanduser(directory)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  logger.info("XLA compilation cache: %s", directory)


def build_engine(config: EngineConfig, *, show_progress: bool = True) -> LLMEngine:
  """Loads the model and tokenizer, sizes and allocates the KV pool, and compiles every bucket."""
  _enable_compilation_cache(config.compilation_cache_dir)
  ledger = CompileLedger().start()
  loaded = load_model(config.model, config.dtype)
  model_config = loaded.config
  tokenizer = load_tokenizer(config.model)
  max_model_len = resolve_max_model_len(config, model_config)
  backend = get_attention_backend(config.attention_backend)
  params = jax.device_put(loaded.params)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
  logger.info("model %s: %s, %.1fM params, %s, attention backend %s", config.model,
              model_config.architecture, num_params / 1e6, model_config.dtype, backend.name)

  spec = kv_cache_spec(config, model_config, max_model_len, device_memory_budget())
  kv_pages = allocate_kv_pages(spec)
  allocator = PageAllocator(spec.num_pages, spec.page_size, config.scheduler.enable_prefix_caching)
  logger.info("KV cache: %d pages of %d tokens (%d usable tokens, %.1f MiB), max_model_len %d",
              spec.num_pages, spec.page_size, (spec.num_pages - 1) * spec.page_size,
              spec.total_bytes / 2**20, max_model_len)

  scheduler = Scheduler(config.scheduler, allocator, max_model_len)
  buckets = BucketSet.from_config(config.scheduler)
  shape = StepShape(spec.page_size, math.ceil(max_model_len / spec.page_size), max_model_len)
  model = LlamaForCausalLM(model_config, backend)
  runner = ModelRunner(model, params, kv_pages, buckets, shape)
  logger.info("buckets: %s", buckets.describe())
  warmup_seconds = runner.warmup(show_progress=show_progress)
  eos = tuple(dict.fromkeys(tuple(model_config.eos_token_ids) + tuple(tokenizer.eos_token_ids)))
  return LLMEngine(tokenizer=tokenizer, runner=runner, scheduler=scheduler, allocator=allocator,
                   max_model_len=max_model_len, vocab_size=model_config.vocab_size,
                   eos_token_ids=eos, ledger=ledger, seed=config.seed, model_name=config.model,
                   warmup_seconds=warmup_seconds)
