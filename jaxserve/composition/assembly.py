"""The composition root: builds an LLMEngine from an EngineConfig, and the device side alone for
the other hosts of a multi-host job (jaxserve/entrypoints/follower.py). The only module that knows
every package: models, attention, kernels, parallel, device, engine and tokenizer meet here, and
nowhere else.

Everything the server logs at start-up (model, buckets, KV pages, warmup time) is decided here:
1. check that the device runs the configured quantization scheme (quantization/capabilities.py),
   then load the model (load_placement): on one device, or laid out over a mesh when
   tensor_parallel_size > 1, on a multi-host job, or with tp_invariant_reductions (which runs
   the sharded path even at tp = 1, so every tensor_parallel_size compiles the same step with
   the same options). Either way the result is one Placement: params on device, the attention
   and dense backends, and the KV pages' sharding;
2. size and allocate the KV pool (composition/pool_sizing.py, which logs it), build the step
   programs (device/step_programs.py) with the placement's shardings, and the ModelRunner
   (build_device -> DeviceBundle);
3. on process 0 only: tokenizer, page allocator, scheduler, warmup, LLMEngine (build_engine).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxserve.composition.pool_sizing import log_kv_pool, size_kv_pool, with_pool_rungs
from jaxserve.config import EngineConfig, ServerConfig
from jaxserve.config.device_defaults import Usage, apply_device_defaults
from jaxserve.config.generation_config import GenerationDefaults
from jaxserve.device.compile_ledger import CompileLedger
from jaxserve.device.compile_threads import default_compile_threads
from jaxserve.device.device_memory import (
  describe_devices,
)
from jaxserve.device.kv_cache import (
  KVCacheSpec,
  KVPoolMaker,
  resolve_max_model_len,
)
from jaxserve.device.memory_gauge import DeviceMemoryGauge
from jaxserve.device.model_runner import ModelRunner, StepSink
from jaxserve.device.program_compiler import ProgramCompiler
from jaxserve.device.program_store import ProgramStore, engine_description
from jaxserve.device.step_inputs import StepShape
from jaxserve.device.step_options import (
  describe_step_choices,
  sampler_backend,
  step_compiler_options,
  step_greedy,
)
from jaxserve.device.step_programs import build_step_programs
from jaxserve.device.warmup import warmup
from jaxserve.engine.constraints import Constraints
from jaxserve.engine.engine_core import EngineCore
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.scheduler import Scheduler
from jaxserve.messages.buckets import BucketSet
from jaxserve.messages.kv_layout import KVLayout
from jaxserve.models.kv_layout import kv_layout
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.registry import (
  generation_defaults,
  load_configured_tokenizer,
  model_path,
  model_quantization,
  revision_note,
)
from jaxserve.parallel.multihost import StepPublisher, is_worker
from jaxserve.parallel.placement import load_placement
from jaxserve.quantization.capabilities import check_device_runs
from jaxserve.runtime.device_description import DeviceDescription

logger = logging.getLogger(__name__)

PROGRAM_STORE_FOLDER = "jaxserve-programs"  # under compilation_cache_dir


def enable_compilation_cache(directory: str | None) -> None:
  """Points JAX's persistent compilation cache at `directory` unless the process chose one."""
  if not directory or jax.config.jax_compilation_cache_dir:
    return
  directory = os.path.expanduser(directory)
  jax.config.update("jax_compilation_cache_dir", directory)
  # Every program, however fast it compiles, so a restart compiles none (docs/DECISIONS.md,
  # "Every program goes to the compilation cache").
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  logger.info("XLA compilation cache: %s", directory)


@dataclass(frozen=True)
class DeviceBundle:
  """The device side of an engine: what build_device made (sharded or not)."""

  model_config: ModelConfig
  runner: ModelRunner
  spec: KVCacheSpec
  max_model_len: int
  layout: KVLayout  # the KV groups the pool, the step programs and the scheduler share


def build_device(
  config: EngineConfig,
  *,
  agree_num_pages: Callable[[int], int] | None = None,
  publisher: StepSink | None = None,
  devices: Sequence[jax.Device] | None = None,
) -> DeviceBundle:
  """Loads the model, sizes and allocates the KV pool and builds the (unwarmed) runner.

  agree_num_pages(local) -> num_pages lets the hosts of a multi-host job settle on one pool size;
  publisher.publish(inputs) runs before each step (process 0 sends the step to the other hosts);
  devices: the engine's own (one engine core of several, parallel/device_slice.py), None: the
  process's."""
  description = DeviceDescription.of((devices or jax.devices())[0])
  note = revision_note(config)  # an uncached revision fails here
  if note is not None:
    logger.info("%s", note)
  quantization = model_quantization(model_path(config), config.quantization)
  check_device_runs(quantization, description)
  placement = load_placement(config, devices)
  model_config, params = placement.model.config, placement.model.params
  max_model_len = resolve_max_model_len(config, model_config)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
  logger.info(
    "model %s: %s, %.1fM params, %s, attention backend %s",
    config.model,
    model_config.architecture,
    num_params / 1e6,
    model_config.dtype
    if model_config.quantization == "none"
    else f"{model_config.dtype}, {model_config.quantization} projections",
    placement.attention.name,
  )
  buckets = BucketSet.from_config(config.scheduler)
  model = placement.module()
  page_size = config.cache.page_size
  layout = kv_layout(model_config, page_size)
  shape = StepShape(
    page_size,
    math.ceil(max_model_len / page_size),
    max_model_len,
    model_config.vocab_size,
    layout.num_groups,
  )
  spec = size_kv_pool(config, placement, buckets, shape, max_model_len, agree_num_pages)
  kv_pool = KVPoolMaker(spec, placement.kv_sharding)
  kv_pages = kv_pool()
  capacity = log_kv_pool(spec, layout, placement.num_shards, max_model_len)
  if config.scheduler.pool_seq_rungs:
    buckets = with_pool_rungs(buckets, capacity)
  options = step_compiler_options(config, model_config.quantization)
  sampler = sampler_backend(config, sharded=placement.mesh is not None)
  if placement.mesh is None:
    logger.info("%s", describe_step_choices(sampler, options))
  shardings = placement.step_shardings(kv_pages)
  programs = build_step_programs(
    model,
    shardings,
    burst_steps=config.scheduler.num_scheduler_steps,
    page_size=page_size,
    greedy=step_greedy(config, sharded=shardings is not None),
    compiler_options=options,
  )
  runner = ModelRunner(model, params, kv_pages, buckets, shape, programs, publisher, kv_pool)
  return DeviceBundle(model_config, runner, spec, max_model_len, layout)


def with_device_defaults(config: EngineConfig, usage: Usage) -> EngineConfig:
  """`config` with the device-aware defaults (jaxserve/config/device_defaults.py) for this process's
  devices and `usage` in every key the user did not set, logged with their reasons. A multi-host job
  keeps its config as it is (every host must build the same buckets)."""
  if config.distributed.active:
    return config
  device = describe_devices(config.tensor_parallel_size)
  config, choices = apply_device_defaults(config, device, usage)
  if choices:
    logger.info(
      "defaults for %s, %s (explicit settings win): %s",
      device.describe(),
      usage.value,
      "; ".join(f"{c.key}={c.value} ({c.reason})" for c in choices),
    )
  return config


def build_engine(
  config: EngineConfig,
  *,
  show_progress: bool = True,
  default_warmup: str = "full",
  usage: Usage = Usage.SERVE,
  devices: Sequence[jax.Device] | None = None,
) -> LLMEngine:
  """Loads the model and tokenizer, sizes and allocates the KV pool, and compiles the step
  programs as config.warmup says ("auto": `default_warmup`; device/program_compiler.py), with
  the device-aware defaults for `usage` (`with_device_defaults`; the engine's `config` holds
  the result). On a multi-host job this runs on process 0 and sends every step (warmup too) to
  the others, which always warm up fully. devices: the engine core's own when
  data_parallel_size cores share the host (core/process.py passes them; without them
  data_parallel_size > 1 is refused: one engine runs here)."""
  if config.data_parallel_size > 1 and devices is None:
    raise ValueError(
      f"data_parallel_size: {config.data_parallel_size} engine cores run under `jaxserve serve` "
      "only; the offline LLM and the in-process benchmarks run one engine (set it to 1)"
    )
  config = with_device_defaults(config, usage)
  tokenizer = load_configured_tokenizer(config)  # a bad tokenizer / template fails before loading
  defaults = log_generation_defaults(generation_defaults(config))
  enable_compilation_cache(config.compilation_cache_dir)
  ledger = CompileLedger().start()
  publisher = None
  if jax.process_count() > 1:
    if is_worker():
      raise ValueError(
        f"distributed: process {jax.process_index()} is a worker; only process 0 "
        "builds the engine (workers run jaxserve.entrypoints.follower.run_follower)"
      )
    publisher = StepPublisher()
  device = build_device(
    config,
    agree_num_pages=publisher and publisher.agree_num_pages,
    publisher=publisher,
    devices=devices,
  )
  model_config, runner, spec = device.model_config, device.runner, device.spec
  allocator = PageAllocator(spec.num_pages, spec.page_size, config.scheduler.enable_prefix_caching)
  scheduler = Scheduler(config.scheduler, allocator, device.max_model_len, device.layout)
  logger.info("buckets: %s", runner.buckets.describe())
  mode = config.warmup if config.warmup != "auto" else default_warmup
  if publisher is not None:
    mode = "full"
  hits, misses = ledger.cache_hits, ledger.cache_misses
  threads = config.compile_threads or default_compile_threads()
  store = open_program_store(config, model_config) if publisher is None else None
  programs, warmup_seconds = compile_programs(runner, mode, show_progress, threads, store)
  if config.compilation_cache_dir and mode != "lazy":
    logger.info(
      "warmup: %d programs read from the program store, %d loaded from the compilation cache, "
      "%d compiled and cached",
      programs.num_loaded if programs is not None else 0,
      ledger.cache_hits - hits,
      ledger.cache_misses - misses,
    )
  eos = tuple(dict.fromkeys(tuple(model_config.eos_token_ids) + tuple(tokenizer.eos_token_ids)))
  core = EngineCore(
    runner=runner,
    scheduler=scheduler,
    allocator=allocator,
    max_model_len=device.max_model_len,
    vocab_size=model_config.vocab_size,
    eos_token_ids=eos,
    ledger=ledger,
    seed=config.seed,
    buckets=runner.buckets,
    programs=programs,
    constraints=Constraints(tokenizer, model_config.vocab_size, supported=runner.supports_async),
    memory=DeviceMemoryGauge(devices or jax.local_devices()),
    sleep_mode=config.enable_sleep_mode,
  )
  return LLMEngine(
    core,
    tokenizer=tokenizer,
    model_name=config.model,
    warmup_seconds=warmup_seconds,
    config=config,
    generation_defaults=defaults,
  )


def log_generation_defaults(defaults: GenerationDefaults) -> GenerationDefaults:
  """Says once, at start-up, which sampling defaults a generation config sets (vLLM's notice)."""
  if defaults.as_dict():
    logger.info(
      "default sampling params from %s's generation_config.json: %s (requests that set a "
      "field override it; --generation-config vllm ignores the file)",
      defaults.source,
      ", ".join(f"{k}={v}" for k, v in defaults.as_dict().items()),
    )
  return defaults


def open_program_store(config: EngineConfig, model_config: ModelConfig) -> ProgramStore | None:
  """The store of compiled step programs (device/program_store.py) under the compilation cache,
  for this engine's resolved config and model (not for how it compiles, warmup and threads, nor
  for the server's settings or which keys were set explicitly)."""
  if not config.compilation_cache_dir:
    return None
  programs_config = dataclasses.replace(  # what no step program depends on left out
    config,
    warmup="auto",
    compile_threads=0,
    compilation_cache_dir=None,
    server=ServerConfig(),
    explicit_keys=frozenset(),
  )
  root = os.path.join(os.path.expanduser(config.compilation_cache_dir), PROGRAM_STORE_FOLDER)
  return ProgramStore.open(root, engine_description(programs_config, model_config))


def compile_programs(
  runner: ModelRunner,
  mode: str,
  show_progress: bool,
  threads: int = 1,
  store: ProgramStore | None = None,
) -> tuple[ProgramCompiler | None, float]:
  """Warmup by mode: "full" compiles everything now (through the runner's steps on a multi-host
  job, whose other hosts compile as they replay them), "background" the largest bucket now and
  the rest on a compile thread, "lazy" nothing. Returns the compiler (None: every bucket is
  usable, compiled or on first use) and the seconds spent before serving."""
  if mode == "lazy":
    logger.info("warmup: lazy, each step program compiles on the first step that needs it")
    return None, 0.0
  if mode == "full" and runner.publisher is not None:
    return None, warmup(runner, show_progress=show_progress)
  compiler = ProgramCompiler(runner, threads, store=store)
  first = compiler.groups[: compiler.num_first_groups()]
  logger.info(
    "warmup: %d programs in %d groups (%s, %d compile threads); %d first (%s)",
    compiler.num_total,
    len(compiler.groups),
    mode,
    threads,
    sum(len(g.programs) for g in first),
    ", ".join(f"bucket {b.num_seqs}x{b.num_tokens}" for g in first for b in sorted(g.steps)),
  )
  start = time.perf_counter()
  # a full warmup (bench throughput's, minutes on a large model) shows its progress
  with tqdm(
    total=compiler.num_total,
    desc="compiling",
    unit="program",
    disable=not show_progress or mode != "full",
  ) as bar:
    compiler.compile_first()
    bar.update(compiler.readiness().num_compiled)
    if mode == "full":
      compiler.compile_rest(on_program=bar.update)
    else:
      compiler.start()
  seconds = time.perf_counter() - start
  logger.info(
    "warmup: %d of %d programs compiled in %.1f s%s",
    compiler.readiness().num_compiled,
    compiler.num_total,
    seconds,
    "; the rest compile in the background" if mode == "background" else "",
  )
  return compiler, seconds
