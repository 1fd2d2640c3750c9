"""The paged KV cache's settings (`cache:`): CacheConfig, and the 8-bit page formats it names.
Validated on construction (ValueError naming the field); no jax."""

from __future__ import annotations

from dataclasses import dataclass

from jaxserve.config.require import require as _require

# cache.kv_cache_dtype: the KV pages' storage ("auto": the model's dtype) and, for the 8-bit
# formats, the static per-layer scales K and V are divided by (pallas_kernels/
# ragged_paged_attention/kv_quant.py; docs/DECISIONS.md "An 8-bit KV cache with static scales").
KV_CACHE_DTYPES = ("auto", "fp8", "int8")
KV_CACHE_STORAGE = {"fp8": "float8_e4m3fn", "int8": "int8"}
DEFAULT_KV_SCALES = {"fp8": 1.0, "int8": 1.0 / 16}


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
