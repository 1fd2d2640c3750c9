"""Configuration: frozen dataclasses validated with exceptions, one module per section.

EngineConfig (engine.py) holds the sections: CacheConfig (cache.py), SchedulerConfig
(scheduler.py), DistributedConfig (distributed.py) and ServerConfig (jaxserve/config/server.py).
Each checks every value on construction and raises ValueError naming the field. The YAML file
and the `--set` overrides that build one are read by jaxserve/config/loader.py. This package
imports nothing from jax.
"""

from jaxserve.config.cache import (
  DEFAULT_KV_SCALES,
  KV_CACHE_DTYPES,
  KV_CACHE_STORAGE,
  CacheConfig,
)
from jaxserve.config.distributed import DistributedConfig
from jaxserve.config.engine import (
  ATTENTION_BACKENDS,
  CHOICES,
  DTYPES,
  GPU_GEMMS,
  QUANTIZED_GEMMS,
  SAMPLER_BACKENDS,
  WARMUP_MODES,
  EngineConfig,
)
from jaxserve.config.kernel_choices import (
  TPU_8BIT_KV_PAGE_SIZES,
  AttentionChoice,
  GpuGemm,
  KernelChoice,
  KernelChoices,
)
from jaxserve.config.scheduler import SchedulerConfig
from jaxserve.config.server import ServerConfig

__all__ = [
  "ATTENTION_BACKENDS",
  "CHOICES",
  "DEFAULT_KV_SCALES",
  "DTYPES",
  "GPU_GEMMS",
  "KV_CACHE_DTYPES",
  "KV_CACHE_STORAGE",
  "QUANTIZED_GEMMS",
  "SAMPLER_BACKENDS",
  "TPU_8BIT_KV_PAGE_SIZES",
  "WARMUP_MODES",
  "AttentionChoice",
  "CacheConfig",
  "DistributedConfig",
  "EngineConfig",
  "GpuGemm",
  "KernelChoice",
  "KernelChoices",
  "SchedulerConfig",
  "ServerConfig",
]
