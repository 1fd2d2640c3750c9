"""Configuration: frozen dataclasses validated with exceptions.

EngineConfig and its sections (CacheConfig, SchedulerConfig, DistributedConfig; ServerConfig is
server_config.py's) check every value on construction and raise ValueError naming the field. The
YAML file and the `--set` overrides that build one are read by jaxserve/config_loader.py. This
module imports nothing from jax.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from jaxserve.config_require import is_int_at_least
from jaxserve.config_require import require as _require
from jaxserve.quantization.scheme import NONE, QUANTIZATION_NAMES, check_quantization
from jaxserve.server_config import ServerConfig

ATTENTION_BACKENDS = ("auto", "reference", "xla", "pallas_gpu", "pallas_tpu")
DTYPES = ("auto", "float32", "bfloat16")
GPU_GEMMS = ("cublas", "cublaslt", "xla")
SAMPLER_BACKENDS = ("auto", "xla", "pallas_gpu")
QUANTIZED_GEMMS = ("auto", "xla", "pallas_gpu")
WARMUP_MODES = ("auto", "lazy", "background", "full")
# cache.kv_cache_dtype: the KV pages' storage ("auto": the model's dtype) and, for the 8-bit
# formats, the static per-layer scales K and V are divided by (pallas_kernels/
# ragged_paged_attention/kv_quant.py; docs/DECISIONS.md "An 8-bit KV cache with static scales").
KV_CACHE_DTYPES = ("auto", "fp8", "int8")
KV_CACHE_STORAGE = {"fp8": "float8_e4m3fn", "int8": "int8"}
DEFAULT_KV_SCALES = {"fp8": 1.0, "int8": 1.0 / 16}
# The page sizes whose 8-bit pages the Pallas TPU kernel reads: a page is whole 32-row tiles of
# 8-bit data (pallas_kernels/ragged_paged_attention/tpu.py; its own check is at the call).
TPU_8BIT_KV_PAGE_SIZES = (32, 64)
# The dotted config keys whose value is one of a fixed set: EngineConfig validates them against
# these, and the engine arguments (jaxserve/engine_args.py) offer these as their choices.
CHOICES: Mapping[str, tuple[str, ...]] = {
  "dtype": DTYPES,
  "attention_backend": ATTENTION_BACKENDS,
  "gpu_gemm": GPU_GEMMS,
  "sampler_backend": SAMPLER_BACKENDS,
  "quantized_gemm": QUANTIZED_GEMMS,
  "warmup": WARMUP_MODES,
  "cache.kv_cache_dtype": KV_CACHE_DTYPES,
  "quantization": QUANTIZATION_NAMES,  # jaxserve/quantization/scheme.py owns them
}


@dataclass(frozen=True)
class CacheConfig:
  """Paged KV cache. The pool is sized by num_pages if given, else memory_bytes, else from
  memory_fraction: the share of the device's total memory the process uses (as vLLM's
  gpu_memory_utilization), the pool getting what the weights and step scratch leave of it
  (jaxserve/device/device_memory.py). kv_cache_dtype: the pages' storage, "auto" (the model's
  dtype), "fp8" (float8_e4m3fn) or "int8", the 8-bit ones holding K / kv_scale and V / kv_scale
  (null kv_scale: DEFAULT_KV_SCALES, 1.0 for fp8 as vLLM's k_scale / v_scale)."""

  page_size: int = 16
  num_pages: int | None = None
  memory_bytes: int | None = None
  memory_fraction: float = 0.9
  kv_cache_dtype: str = "auto"
  kv_scale: float | None = None

  def storage_dtype(self, model_dtype: str) -> str:
    """The pages' dtype name: the model's for "auto", else float8_e4m3fn or int8."""
    return KV_CACHE_STORAGE.get(self.kv_cache_dtype, model_dtype)

  def kv_scales(self) -> tuple[float, float]:
    """(k_scale, v_scale) of the pages: 1.0 for float pages."""
    if self.kv_cache_dtype not in KV_CACHE_STORAGE:
      return 1.0, 1.0
    scale = DEFAULT_KV_SCALES[self.kv_cache_dtype] if self.kv_scale is None else self.kv_scale
    return float(scale), float(scale)

  def __post_init__(self) -> None:
    _require(
      isinstance(self.page_size, int)
      and self.page_size > 0
      and self.page_size & (self.page_size - 1) == 0,
      "cache.page_size",
      f"must be a positive power of two, got {self.page_size!r}",
    )
    _require(
      self.num_pages is None or (isinstance(self.num_pages, int) and self.num_pages >= 2),
      "cache.num_pages",
      f"must be an integer >= 2 (page 0 is reserved), got {self.num_pages!r}",
    )
    _require(
      self.memory_bytes is None or (isinstance(self.memory_bytes, int) and self.memory_bytes > 0),
      "cache.memory_bytes",
      f"must be a positive integer, got {self.memory_bytes!r}",
    )
    _require(
      0.0 < float(self.memory_fraction) <= 1.0,
      "cache.memory_fraction",
      f"must be in (0, 1], got {self.memory_fraction!r}",
    )
    _require(
      self.kv_cache_dtype in KV_CACHE_DTYPES,
      "cache.kv_cache_dtype",
      f"must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}",
    )
    _require(
      self.kv_scale is None
      or (
        isinstance(self.kv_scale, (int, float))
        and not isinstance(self.kv_scale, bool)
        and 0 < self.kv_scale < float("inf")
        and self.kv_cache_dtype in KV_CACHE_STORAGE
      ),
      "cache.kv_scale",
      f"must be a float > 0 with an 8-bit kv_cache_dtype (fp8, int8), got {self.kv_scale!r} "
      f"with {self.kv_cache_dtype!r}",
    )


@dataclass(frozen=True)
class SchedulerConfig:
  """Continuous batching limits. Bucket lists default to powers of two up to the limits.
  async_scheduling: the engine core schedules and dispatches step N+1 while step N runs
  (EngineCore.step, engine/engine_core.py).
  num_scheduler_steps > 1 runs decode-only steps as bursts of that many decode steps in one
  dispatch when every running request allows it (engine/scheduler.py, device/step_fns.py).
  bucket_padding: the default bucket ladders grow by 1 / (1 - bucket_padding) a rung (0.5:
  powers of two), so padding fills at most that share of a bucket (messages/buckets.py).
  prefill_first: a step that can prefill (admit a waiting request or continue a chunked prompt)
  runs prefills only, and decoding requests wait for a step without prefill work (throughput
  over inter-token latency, as vLLM's non-chunked scheduler; engine/scheduler.py).
  mixed_step_prefill_tokens: P; a step in which D running requests decode carries at most
  max(P, max_num_batched_tokens x (max_num_seqs - D) / max_num_seqs) prompt tokens (running
  prompts' chunks and admissions; None: whatever the budget leaves), so a full batch's steps
  that also prefill run a bounded time longer than decode-only ones and streams' gaps between
  tokens stay even while prompts arrive; prompts then take more steps (engine/scheduler.py).
  pool_seq_rungs: once the KV pool is sized, add sequence rungs where it bounds the batch (the
  max_model_len sequences it holds, twice and four times that; BucketSet.with_pool_rungs), so a
  sparse ladder does not pad a KV-bound batch to its largest rung."""

  max_num_seqs: int = 64
  max_num_batched_tokens: int = 512
  enable_chunked_prefill: bool = True
  enable_prefix_caching: bool = True
  seq_buckets: tuple[int, ...] | None = None
  token_buckets: tuple[int, ...] | None = None
  async_scheduling: bool = True
  num_scheduler_steps: int = 1
  prefill_first: bool = False
  bucket_padding: float = 0.5
  pool_seq_rungs: bool = False
  mixed_step_prefill_tokens: int | None = None

  def __post_init__(self) -> None:
    _require(
      isinstance(self.bucket_padding, (int, float)) and 0 < self.bucket_padding < 1,
      "scheduler.bucket_padding",
      f"must be in (0, 1), got {self.bucket_padding!r}",
    )
    _require(
      isinstance(self.prefill_first, bool),
      "scheduler.prefill_first",
      f"must be true or false, got {self.prefill_first!r}",
    )
    _require(
      isinstance(self.pool_seq_rungs, bool),
      "scheduler.pool_seq_rungs",
      f"must be true or false, got {self.pool_seq_rungs!r}",
    )
    _require(
      isinstance(self.async_scheduling, bool),
      "scheduler.async_scheduling",
      f"must be true or false, got {self.async_scheduling!r}",
    )
    _require(
      isinstance(self.num_scheduler_steps, int) and 1 <= self.num_scheduler_steps <= 64,
      "scheduler.num_scheduler_steps",
      f"must be an integer in [1, 64], got {self.num_scheduler_steps!r}",
    )
    _require(
      isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1,
      "scheduler.max_num_seqs",
      f"must be an integer >= 1, got {self.max_num_seqs!r}",
    )
    _require(
      isinstance(self.max_num_batched_tokens, int)
      and self.max_num_batched_tokens >= self.max_num_seqs,
      "scheduler.max_num_batched_tokens",
      f"must be an integer >= max_num_seqs ({self.max_num_seqs}), "
      f"got {self.max_num_batched_tokens!r}",
    )
    _require(  # above max_num_batched_tokens it changes nothing
      self.mixed_step_prefill_tokens is None
      or (isinstance(self.mixed_step_prefill_tokens, int) and self.mixed_step_prefill_tokens >= 1),
      "scheduler.mixed_step_prefill_tokens",
      f"must be null or an integer >= 1, got {self.mixed_step_prefill_tokens!r}",
    )
    for name in ("seq_buckets", "token_buckets"):
      value = getattr(self, name)
      if value is not None:
        value = tuple(value)
        object.__setattr__(self, name, value)
        _require(
          len(value) > 0
          and all(isinstance(v, int) and v > 0 for v in value)
          and list(value) == sorted(set(value)),
          f"scheduler.{name}",
          f"must be a strictly increasing list of positive integers, got {value!r}",
        )
    if self.seq_buckets is not None:
      _require(
        self.seq_buckets[-1] >= self.max_num_seqs,
        "scheduler.seq_buckets",
        f"largest bucket must be >= max_num_seqs ({self.max_num_seqs})",
      )
    if self.token_buckets is not None:
      _require(
        self.token_buckets[-1] >= self.max_num_batched_tokens,
        "scheduler.token_buckets",
        f"largest bucket must be >= max_num_batched_tokens ({self.max_num_batched_tokens})",
      )


@dataclass(frozen=True)
class DistributedConfig:
  """Multi-host serving (jax.distributed). Off unless `enabled` or a coordinator_address is set.
  On a Cloud TPU VM, `enabled: true` with the rest null lets JAX detect the slice's hosts.
  Process 0 serves HTTP and schedules; the others run the same steps as workers."""

  enabled: bool = False
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  initialization_timeout_s: int = 300

  def __post_init__(self) -> None:
    _require(
      isinstance(self.enabled, bool),
      "distributed.enabled",
      f"must be true or false, got {self.enabled!r}",
    )
    _require(
      self.coordinator_address is None
      or (isinstance(self.coordinator_address, str) and ":" in self.coordinator_address),
      "distributed.coordinator_address",
      f"must be HOST:PORT, got {self.coordinator_address!r}",
    )
    _require(
      self.num_processes is None
      or (isinstance(self.num_processes, int) and self.num_processes >= 1),
      "distributed.num_processes",
      f"must be an integer >= 1, got {self.num_processes!r}",
    )
    _require(
      self.process_id is None
      or (
        isinstance(self.process_id, int)
        and self.process_id >= 0
        and (self.num_processes is None or self.process_id < self.num_processes)
      ),
      "distributed.process_id",
      f"must be in [0, num_processes), got {self.process_id!r}",
    )
    _require(
      isinstance(self.initialization_timeout_s, int) and self.initialization_timeout_s >= 1,
      "distributed.initialization_timeout_s",
      f"must be an integer >= 1, got {self.initialization_timeout_s!r}",
    )

  @property
  def active(self) -> bool:
    return self.enabled or self.coordinator_address is not None


@dataclass(frozen=True)
class EngineConfig:
  """Everything the engine needs. model is a built-in name (tiny-random) or a checkpoint path.
  compilation_cache_dir keeps compiled buckets across restarts (null disables it).
  tensor_parallel_size shards the model over that many devices (all devices of all hosts when
  distributed); it must divide the query heads, and divide the kv heads or be a multiple of them
  (each kv head then repeated, parallel/kv_head_replication.py). enable_expert_parallel splits a
  mixture of experts' experts whole over those devices (num_experts / tensor_parallel_size each)
  instead of splitting every expert's intermediate dimension; attention, the other weights and
  the KV pages stay tensor-parallel (parallel/partition_rules.py). data_parallel_size N serves
  with N engine cores on one host, each owning tensor_parallel_size devices of its own (core i:
  devices i*tp .. (i+1)*tp - 1; core/device_groups.py), behind the same API server processes,
  which route each request by load and prefix affinity (core/dp_routing.py); `jaxserve serve`
  only, with API server processes (server.api_server_count >= 1), on one host.
  tp_invariant_reductions makes the bfloat16 forward bitwise independent of tensor_parallel_size
  in {1, 2} (models/invariant_dense.py, and models/invariant_experts.py for a mixture of experts,
  whose one-device run mirrors the enable_expert_parallel layout; a parity mode, slower at
  tp = 1). batch_invariant makes every token's computation bitwise independent of the step's
  bucket, batch mates and prompt chunking (fixed-tile GEMMs, models/batch_invariant_dense.py;
  attention tiles fixed, attention/backends.py).
  gpu_gemm on GPUs: "cublas" compiles every GEMM of the step to cuBLAS and "cublaslt" to
  cuBLASLt (XLA's Triton GEMM fusions off in both; docs/DECISIONS.md, "cuBLAS for the step's
  GEMMs"), "xla" leaves the choice to XLA. sampler_backend: where the
  sampler takes the greedy pick and the log-normalizer from; "auto" is the Pallas GPU kernel
  (pallas_kernels/greedy_sample) for unsharded models on GPUs and XLA's reductions elsewhere;
  "pallas_gpu" off a GPU runs the kernel in Pallas interpret mode (tests).
  fuse_projections merges each layer's q/k/v and gate/up weights after loading, one GEMM each
  (models/fused_projections.py; unsharded models only: ignored when the model is sharded).
  warmup: when the step programs compile (device/program_compiler.py): "full" all before the
  engine starts, "background" the largest bucket's first and the rest on a compile thread while
  serving, "lazy" each on the first step that needs it; "auto" is the caller's default
  (`jaxserve serve`: background; LLM and `jaxserve generate`: lazy).
  tokenizer: a tokenizer directory other than the model's; chat_template: a template file (or the
  template text itself) replacing the tokenizer's (models/registry.load_configured_tokenizer).
  quantization: the weight scheme the projections run (jaxserve/quantization/scheme.py): a
  bfloat16 checkpoint is quantized as it loads; "none" loads a checkpoint as it is stored (a
  compressed-tensors checkpoint runs its own scheme). Quantized weights shard under
  tensor_parallel_size (parallel/partition_rules.py); not yet with tp_invariant_reductions,
  batch_invariant or a multi-host job. With attention_backend pallas_tpu, 8-bit KV pages
  (cache.kv_cache_dtype fp8 / int8) need cache.page_size 32 or 64.
  quantized_gemm: how a quantized model's projections run in steps of at most 16 tokens (decode):
  "pallas_gpu" one Pallas kernel per projection that reads the 8-bit weight and computes
  weight-only (x in the model's dtype; pallas_kernels/quantized_matmul), "xla" the scheme's own
  GEMM; "auto" is pallas_gpu on one GPU and xla otherwise (a W8A8 scheme's decode steps then
  compute weight-only, its larger steps keep cuBLASLt's 8-bit GEMMs); "pallas_gpu" off a GPU runs
  the kernel in interpret mode (tests)."""

  model: str = "tiny-random"
  tokenizer: str | None = None
  chat_template: str | None = None
  dtype: str = "auto"
  max_model_len: int | None = None
  attention_backend: str = "auto"
  seed: int = 0
  tensor_parallel_size: int = 1
  data_parallel_size: int = 1
  enable_expert_parallel: bool = False
  tp_invariant_reductions: bool = False
  batch_invariant: bool = False
  compilation_cache_dir: str | None = "~/.cache/jaxserve/xla"
  gpu_gemm: str = "cublas"
  sampler_backend: str = "auto"
  fuse_projections: bool = True
  warmup: str = "auto"
  quantization: str = NONE
  quantized_gemm: str = "auto"
  cache: CacheConfig = field(default_factory=CacheConfig)
  scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
  server: ServerConfig = field(default_factory=ServerConfig)
  distributed: DistributedConfig = field(default_factory=DistributedConfig)
  # the dotted keys the user set (config file, --set, flags, LLM keywords): the device-aware
  # defaults (jaxserve/defaults.py) change only the others. Not a config-file key.
  explicit_keys: frozenset[str] = field(default=frozenset(), compare=False)

  def __post_init__(self) -> None:
    _require(
      isinstance(self.model, str) and self.model != "", "model", "must be a non-empty string"
    )
    object.__setattr__(self, "explicit_keys", frozenset(self.explicit_keys))
    for name in ("tokenizer", "chat_template"):
      value = getattr(self, name)
      _require(
        value is None or (isinstance(value, str) and value.strip() != ""),
        name,
        f"must be a non-empty string or null, got {value!r}",
      )
    _require(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
    _require(
      self.attention_backend in ATTENTION_BACKENDS,
      "attention_backend",
      f"must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}",
    )
    _require(
      self.max_model_len is None
      or (isinstance(self.max_model_len, int) and self.max_model_len >= 1),
      "max_model_len",
      f"must be a positive integer, got {self.max_model_len!r}",
    )
    _require(
      isinstance(self.tensor_parallel_size, int) and self.tensor_parallel_size >= 1,
      "tensor_parallel_size",
      f"must be >= 1, got {self.tensor_parallel_size!r}",
    )
    _require(
      is_int_at_least(self.data_parallel_size, 1),
      "data_parallel_size",
      f"must be an integer >= 1, got {self.data_parallel_size!r}",
    )
    _require(
      self.data_parallel_size == 1 or not self.distributed.active,
      "data_parallel_size",
      f"{self.data_parallel_size} engine cores run on one host; a distributed (multi-host) job "
      "serves one engine (set data_parallel_size to 1)",
    )
    _require(
      self.data_parallel_size == 1 or self.server.api_server_count != 0,
      "data_parallel_size",
      f"{self.data_parallel_size} engine cores run in their own processes behind API server "
      "processes; server.api_server_count 0 (one process) serves one engine",
    )
    _require(
      self.gpu_gemm in GPU_GEMMS, "gpu_gemm", f"must be one of {GPU_GEMMS}, got {self.gpu_gemm!r}"
    )
    _require(
      self.sampler_backend in SAMPLER_BACKENDS,
      "sampler_backend",
      f"must be one of {SAMPLER_BACKENDS}, got {self.sampler_backend!r}",
    )
    _require(
      not (self.sampler_backend == "pallas_gpu" and self.tensor_parallel_size > 1),
      "sampler_backend",
      "pallas_gpu runs on unsharded models only (tensor_parallel_size 1); use auto or xla",
    )
    _require(
      isinstance(self.enable_expert_parallel, bool),
      "enable_expert_parallel",
      f"must be true or false, got {self.enable_expert_parallel!r}",
    )
    _require(
      isinstance(self.tp_invariant_reductions, bool),
      "tp_invariant_reductions",
      f"must be true or false, got {self.tp_invariant_reductions!r}",
    )
    _require(
      isinstance(self.batch_invariant, bool),
      "batch_invariant",
      f"must be true or false, got {self.batch_invariant!r}",
    )
    _require(
      self.warmup in WARMUP_MODES, "warmup", f"must be one of {WARMUP_MODES}, got {self.warmup!r}"
    )
    _require(
      isinstance(self.fuse_projections, bool),
      "fuse_projections",
      f"must be true or false, got {self.fuse_projections!r}",
    )
    check_quantization(self.quantization)
    for name, on in (
      ("tp_invariant_reductions", self.tp_invariant_reductions),
      ("a distributed (multi-host) job", self.distributed.active),
    ):
      _require(
        self.quantization == NONE or not on,
        "quantization",
        f"{self.quantization} weights do not run with {name} yet",
      )
    _require(
      self.quantized_gemm in QUANTIZED_GEMMS,
      "quantized_gemm",
      f"must be one of {QUANTIZED_GEMMS}, got {self.quantized_gemm!r}",
    )
    _require(
      not (self.quantized_gemm == "pallas_gpu" and self.tensor_parallel_size > 1),
      "quantized_gemm",
      "pallas_gpu runs on unsharded models only (tensor_parallel_size 1); use auto or xla",
    )
    _require(
      self.quantization == NONE or not self.batch_invariant,
      "batch_invariant",
      f"cannot be combined with quantization {self.quantization!r}: the fixed-tile GEMMs "
      "(models/batch_invariant_dense.py) run float weights only (set one of them off)",
    )
    _require(
      not (
        self.attention_backend == "pallas_tpu"
        and self.cache.kv_cache_dtype in KV_CACHE_STORAGE
        and self.cache.page_size not in TPU_8BIT_KV_PAGE_SIZES
      ),
      "cache.page_size",
      f"the pallas_tpu attention kernel reads {self.cache.kv_cache_dtype} KV pages of "
      f"{' or '.join(map(str, TPU_8BIT_KV_PAGE_SIZES))} tokens only, got {self.cache.page_size}",
    )
    _require(
      not (self.distributed.active and self.scheduler.num_scheduler_steps > 1),
      "scheduler.num_scheduler_steps",
      "decode bursts do not run on multi-host jobs (the "
      "other hosts replay single steps); set it to 1",
    )

  def replace(self, **changes) -> "EngineConfig":
    return dataclasses.replace(self, **changes)
