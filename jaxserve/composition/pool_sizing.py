"""The KV pool of one engine: how many pages it gets and what the start-up log says of it.

Part of the composition root (jaxserve/composition/assembly.py builds the device side with it): it
knows the loaded Placement (parallel/), the device's memory (device/device_memory.py) and the step
programs (to measure the largest bucket's scratch), and decides: 1. the bytes the pool may take:
cache.memory_fraction of the device less the weights (their
   shard on this device), the loader's slack and, on one unsharded device with no explicit
   pool size, the largest bucket's step scratch, measured by compiling that step against a
   2-page pool (plus a quarter, in whole 64 MiB); fitted to the largest free block;
2. the KVCacheSpec (device/kv_cache.py: cache.num_pages / memory_bytes win; the slots stack
   into the largest groups whose arrays the attention backend's kernels address, past 2**31
   elements only with its capabilities' large_page_arrays), and in a multi-host job the page
   count every host agrees on (its groups chosen again for it);
3. the start-up lines a user acts on: pages and usable tokens, the KV groups of a model with
   sliding windows, the maximum concurrency at max_model_len; and, with
   scheduler.pool_seq_rungs, the sequence rungs the pool's capacity adds to the ladder.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import jax

from jaxserve.config import EngineConfig
from jaxserve.device.device_memory import fit_pool_bytes, kv_budget_bytes, max_concurrency
from jaxserve.device.kv_cache import KVCacheSpec, allocate_kv_pages, kv_cache_spec, kv_pool_spec
from jaxserve.device.lowering import temp_bytes
from jaxserve.device.model_runner import ModelRunner
from jaxserve.device.step_inputs import StepShape
from jaxserve.device.step_options import step_compiler_options
from jaxserve.device.step_programs import build_step_programs
from jaxserve.messages.buckets import Bucket, BucketSet
from jaxserve.messages.kv_layout import KVLayout
from jaxserve.models.kv_layout import kv_layout
from jaxserve.parallel.placement import Placement

logger = logging.getLogger(__name__)


def size_kv_pool(
  config: EngineConfig,
  placement: Placement,
  buckets: BucketSet,
  shape: StepShape,
  max_model_len: int,
  agree_num_pages: Callable[[int], int] | None = None,
) -> KVCacheSpec:
  """The pool's spec (items 1-2 of the module docstring)."""
  free_bytes = None
  planned = kv_budget_bytes(
    config.cache.memory_fraction,
    device_weight_bytes(placement.model.params),
    packed=placement.model.packed,
    scratch_measured=placement.mesh is None,
  )
  if planned is not None:
    free_bytes, memory = planned
    scratch = 0
    if (
      placement.mesh is None
      and config.cache.num_pages is None
      and config.cache.memory_bytes is None
    ):
      scratch = step_scratch_bytes(config, placement, buckets, shape)
    free_bytes = fit_pool_bytes(free_bytes - scratch, memory.largest_free_bytes, scratch)
  model_config = placement.model.config
  spec = kv_cache_spec(
    config,
    model_config,
    max_model_len,
    free_bytes,
    placement.num_shards,
    placement.attention.capabilities.large_page_arrays,
  )
  if agree_num_pages is None:
    return spec
  return kv_pool_spec(
    spec.num_slots,
    spec.num_kv_heads,
    spec.head_dim,
    spec.page_size,
    agree_num_pages(spec.num_pages),
    spec.dtype,
    placement.num_shards,
    placement.attention.capabilities.large_page_arrays,
  )


def log_kv_pool(spec: KVCacheSpec, layout: KVLayout, num_shards: int, max_model_len: int) -> int:
  """Logs the pool, its KV groups and the concurrency it allows; returns how many sequences of
  max_model_len tokens it holds."""
  logger.info(
    "KV cache: %d pages of %d tokens (%d usable tokens, %.1f MiB%s), max_model_len %d; %d K/V "
    "array pair(s) of %d slot(s)",
    spec.num_pages,
    spec.page_size,
    (spec.num_pages - 1) * spec.page_size,
    spec.total_bytes / 2**20,
    f" over {num_shards} shards" if num_shards > 1 else "",
    max_model_len,
    spec.num_groups,
    spec.slots_per_group,
  )
  if layout.num_groups > 1:
    logger.info(
      "KV groups: %d layers in %d groups (1 global, %d sliding with window %s) sharing %d "
      "K/V slot(s) a page; a sequence of %d tokens holds %d pages (%d without window freeing)",
      layout.num_layers,
      layout.num_groups,
      layout.num_groups - 1,
      "/".join(str(w) for w in sorted(set(layout.windows))),
      layout.num_slots,
      max_model_len,
      layout.pages_held(max_model_len),
      layout.num_groups * math.ceil(max_model_len / spec.page_size),
    )
  concurrency = max_concurrency(
    spec.num_pages,
    spec.page_size,
    max_model_len,
    layout.pages_held(max_model_len) if layout.num_groups > 1 else None,
  )
  logger.info("maximum concurrency for %d tokens per request: %.2fx", max_model_len, concurrency)
  return int(concurrency)


def with_pool_rungs(buckets: BucketSet, capacity: int) -> BucketSet:
  """`buckets` with the sequence rungs of a pool that holds `capacity` full-length sequences
  (scheduler.pool_seq_rungs), logged when it adds any."""
  widened = buckets.with_pool_rungs(capacity)
  if widened != buckets:
    logger.info(
      "sequence rungs %s added: the KV pool holds %d sequences of max_model_len "
      "(scheduler.pool_seq_rungs)",
      sorted(set(widened.seq_buckets) - set(buckets.seq_buckets)),
      capacity,
    )
  return widened


def device_weight_bytes(params: dict) -> int:
  """The params' bytes on one device, from their shapes, dtypes and shardings (run-invariant,
  unlike the allocator's live count)."""
  return sum(
    math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
    for x in jax.tree_util.tree_leaves(params)
  )


def step_scratch_bytes(
  config: EngineConfig, placement: Placement, buckets: BucketSet, shape: StepShape
) -> int:
  """Device scratch the largest bucket's step needs (compiled once against a 2-page pool), plus
  a quarter for fragmentation, in whole 64 MiB: the KV pool is sized from what is left."""
  model_config = placement.model.config
  probe_spec = kv_pool_spec(
    kv_layout(model_config, shape.page_size).num_slots,
    model_config.num_kv_heads,
    model_config.head_dim,
    shape.page_size,
    2,
    model_config.dtype,
  )
  model = placement.module()
  programs = build_step_programs(
    model, compiler_options=step_compiler_options(config, model_config.quantization)
  )
  probe = ModelRunner(
    model, placement.model.params, allocate_kv_pages(probe_spec), buckets, shape, programs
  )
  largest = Bucket(buckets.seq_buckets[-1], buckets.token_buckets[-1])
  scratch = temp_bytes(probe, largest) or 0
  logger.info(
    "step scratch memory: %.2f GiB for bucket %s (reserved before sizing the KV pool)",
    scratch / 2**30,
    largest,
  )
  quantum = 64 << 20  # rounded up: an autotuned GEMM's workspace may differ by a few MiB
  return -(-int(scratch * 1.25) // quantum) * quantum
