"""The engine's settings: EngineConfig, the root of the config tree, holding the sections
(cache.py, scheduler.py, distributed.py here; ServerConfig is jaxserve/config/server.py's) and
the fixed sets of values its keys take (CHOICES). Validated on construction (ValueError naming
the field); no jax."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from jaxserve.config.cache import KV_CACHE_DTYPES, KV_CACHE_STORAGE, CacheConfig
from jaxserve.config.distributed import DistributedConfig
from jaxserve.config.kernel_choices import (
  AttentionChoice,
  GpuGemm,
  KernelChoice,
  KernelChoices,
  values,
)
from jaxserve.config.require import is_int_at_least, require_bool
from jaxserve.config.require import require as _require
from jaxserve.config.scheduler import SCHEDULING_POLICIES, SchedulerConfig
from jaxserve.config.server import ServerConfig
from jaxserve.quantization.scheme import NONE, QUANTIZATION_NAMES, check_quantization

# the kernel keys' strings are their enums' values (config/kernel_choices.py)
ATTENTION_BACKENDS = values(AttentionChoice)
DTYPES = ("auto", "float32", "bfloat16")
GPU_GEMMS = values(GpuGemm)
SAMPLER_BACKENDS = values(KernelChoice)
QUANTIZED_GEMMS = values(KernelChoice)
WARMUP_MODES = ("auto", "lazy", "background", "full")
# The dotted config keys whose value is one of a fixed set: EngineConfig validates them against
# these, and the engine arguments (jaxserve/config/engine_args.py) offer these as their choices.
CHOICES: Mapping[str, tuple[str, ...]] = {
  "dtype": DTYPES,
  "attention_backend": ATTENTION_BACKENDS,
  "gpu_gemm": GPU_GEMMS,
  "sampler_backend": SAMPLER_BACKENDS,
  "quantized_gemm": QUANTIZED_GEMMS,
  "warmup": WARMUP_MODES,
  "scheduler.policy": SCHEDULING_POLICIES,
  "cache.kv_cache_dtype": KV_CACHE_DTYPES,
  "quantization": QUANTIZATION_NAMES,  # jaxserve/quantization/scheme.py owns them
}


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
  (`jaxserve serve`: background; LLM and `jaxserve generate`: lazy). compile_threads: how many
  step programs compile at once (0: a quarter of the host's cores, 1 to 4).
  tokenizer: a tokenizer directory other than the model's; chat_template: a template file (or the
  template text itself) replacing the tokenizer's (models/registry.load_configured_tokenizer).
  revision: which revision (a branch or tag the cache has a ref of, or a commit) of a Hugging
  Face model id loads from the local cache, model and tokenizer (null: main; models/hf_cache.py);
  a built-in model or a directory has none, and the engine logs that it changes nothing.
  generation_config: where the sampling defaults of requests that leave a field unset come from
  (vLLM's --generation-config; jaxserve/config/generation_config.py): "auto" the model's
  generation_config.json, "vllm" none, or a directory holding one.
  quantization: the weight scheme the projections run (jaxserve/quantization/scheme.py): a
  bfloat16 checkpoint is quantized as it loads; "none" loads a checkpoint as it is stored (a
  compressed-tensors checkpoint runs its own scheme). Quantized weights shard under
  tensor_parallel_size (parallel/partition_rules.py); not yet with tp_invariant_reductions,
  batch_invariant or a multi-host job. With attention_backend pallas_tpu, 8-bit KV pages
  (cache.kv_cache_dtype fp8 / int8) need cache.page_size 32 or 64.
  quantized_gemm: how a quantized model's projections run in steps of at most 16 tokens (decode):
  "pallas_gpu" one Pallas kernel per projection that reads the 8-bit weight in place
  (pallas_kernels/quantized_matmul; fp8 quantizes x in the kernel, per token and 128 of K, and
  multiplies on fp8 operands; the other schemes compute weight-only), "xla" the scheme's own
  GEMM; "auto" is pallas_gpu on one GPU and xla otherwise (larger steps keep cuBLASLt's 8-bit
  GEMMs); "pallas_gpu" off a GPU runs the kernel in interpret mode (tests).
  enable_sleep_mode (vLLM's --enable-sleep-mode): the engine may sleep (LLM.sleep, POST /sleep
  under VLLM_SERVER_DEV_MODE=1): level 1 moves the weights to host memory and frees the KV pool,
  wake_up puts them back (engine/sleep_mode.py, device/sleep_mode.py)."""

  model: str = "tiny-random"
  revision: str | None = None
  tokenizer: str | None = None
  chat_template: str | None = None
  generation_config: str = "auto"
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
  compile_threads: int = 0
  quantization: str = NONE
  quantized_gemm: str = "auto"
  enable_sleep_mode: bool = False
  cache: CacheConfig = field(default_factory=CacheConfig)
  scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
  server: ServerConfig = field(default_factory=ServerConfig)
  distributed: DistributedConfig = field(default_factory=DistributedConfig)
  # the dotted keys the user set (config file, --set, flags, LLM keywords): the device-aware
  # defaults (jaxserve/config/device_defaults.py) change only the others. Not a config-file key.
  explicit_keys: frozenset[str] = field(default=frozenset(), compare=False)

  def __post_init__(self) -> None:
    _require(
      isinstance(self.model, str) and self.model != "", "model", "must be a non-empty string"
    )
    object.__setattr__(self, "explicit_keys", frozenset(self.explicit_keys))
    for name in ("revision", "tokenizer", "chat_template"):
      value = getattr(self, name)
      _require(
        value is None or (isinstance(value, str) and value.strip() != ""),
        name,
        f"must be a non-empty string or null, got {value!r}",
      )
    _require(
      isinstance(self.generation_config, str) and self.generation_config.strip() != "",
      "generation_config",
      f"must be auto, vllm or a directory, got {self.generation_config!r}",
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
      self.quantized_gemm in QUANTIZED_GEMMS,
      "quantized_gemm",
      f"must be one of {QUANTIZED_GEMMS}, got {self.quantized_gemm!r}",
    )
    kernels = self.kernels  # every kernel key is one of its choices from here on
    _require(
      not (kernels.sampler.unsharded_only and self.tensor_parallel_size > 1),
      "sampler_backend",
      "pallas_gpu runs on unsharded models only (tensor_parallel_size 1); use auto or xla",
    )
    require_bool(self.enable_expert_parallel, "enable_expert_parallel")
    require_bool(self.tp_invariant_reductions, "tp_invariant_reductions")
    require_bool(self.batch_invariant, "batch_invariant")
    _require(
      is_int_at_least(self.compile_threads, 0),
      "compile_threads",
      f"must be an integer >= 0 (0: a quarter of the host's cores), got {self.compile_threads!r}",
    )
    _require(
      self.warmup in WARMUP_MODES, "warmup", f"must be one of {WARMUP_MODES}, got {self.warmup!r}"
    )
    require_bool(self.fuse_projections, "fuse_projections")
    require_bool(self.enable_sleep_mode, "enable_sleep_mode")
    _require(
      not (self.enable_sleep_mode and self.distributed.active),
      "enable_sleep_mode",
      "a distributed (multi-host) job does not sleep (its other hosts hold their own weights)",
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
      not (kernels.quantized_gemm.unsharded_only and self.tensor_parallel_size > 1),
      "quantized_gemm",
      "pallas_gpu runs on unsharded models only (tensor_parallel_size 1); use auto or xla",
    )
    _require(
      self.quantization == NONE or not self.batch_invariant,
      "batch_invariant",
      f"cannot be combined with quantization {self.quantization!r}: the fixed-tile GEMMs "
      "(models/batch_invariant_dense.py) run float weights only (set one of them off)",
    )
    page_sizes = kernels.attention.kv_8bit_page_sizes
    _require(
      page_sizes is None
      or self.cache.kv_cache_dtype not in KV_CACHE_STORAGE
      or self.cache.page_size in page_sizes,
      "cache.page_size",
      f"the {self.attention_backend} attention kernel reads {self.cache.kv_cache_dtype} KV pages "
      f"of {' or '.join(map(str, page_sizes or ()))} tokens only, got {self.cache.page_size}",
    )
    _require(
      not (self.distributed.active and self.scheduler.num_scheduler_steps > 1),
      "scheduler.num_scheduler_steps",
      "decode bursts do not run on multi-host jobs (the "
      "other hosts replay single steps); set it to 1",
    )

  @property
  def kernels(self) -> KernelChoices:
    """The kernel keys parsed into their typed values (config/kernel_choices.py); valid once
    the config is built."""
    return KernelChoices(
      attention=AttentionChoice(self.attention_backend),
      gpu_gemm=GpuGemm(self.gpu_gemm),
      sampler=KernelChoice(self.sampler_backend),
      quantized_gemm=KernelChoice(self.quantized_gemm),
    )

  def replace(self, **changes) -> EngineConfig:
    return dataclasses.replace(self, **changes)
