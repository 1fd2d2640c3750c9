"""`jaxserve kv-plan`: what a KV-cache memory budget holds, paged versus contiguous.

Paged: the pool has budget // page_bytes pages (page 0 is the null page, never handed out) and a
sequence of L tokens holds ceil(L / page_size) pages, so the waste is under one page per sequence.
With sliding-window layers (Gemma 2, Gemma 3) the layers share pages in G KV groups of m slots
(messages/kv_layout.py): a page holds m layers' K/V, and a sequence of L tokens holds
pages(L) = ceil(L / P) + (G - 1) * min(ceil(L / P), ceil((w - 1) / P) + 1) pages, the sliding
groups' pages falling out of the window being freed; the plan reports that beside the figure
without freeing, G * ceil(L / P). Contiguous: every sequence reserves max_model_len tokens of
every layer up front, as a non-paged server must, so the number of concurrent sequences is
budget // (max_model_len * bytes_per_token) whatever their real length. The planned page count
is checked against device/kv_cache.kv_cache_spec (what the engine would allocate for the same
config and the current device's attention backend, whose kernels decide whether a layer's page
array may pass 2**31 elements) and, with --check, against a real engine's allocator.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from jaxserve.attention.backends import get_attention_backend
from jaxserve.config import EngineConfig
from jaxserve.device.device_memory import kv_pool_bytes, read_device_memory
from jaxserve.device.kv_cache import (
  CPU_DEFAULT_BYTES,
  kv_cache_spec,
  page_bytes,
  resolve_max_model_len,
)
from jaxserve.models.builtin import builtin_config, is_builtin
from jaxserve.models.kv_layout import kv_layout
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.registry import checkpoint_dir, model_path, model_quantization
from jaxserve.models.weights import load_hf_config
from jaxserve.tools.json_file import write_json
from jaxserve.tools.key_value_table import key_value_table

GIB = 2**30


@dataclass(frozen=True)
class KVPlan:
  model: str
  dtype: str
  page_size: int
  max_model_len: int
  avg_seq_len: int
  budget_bytes: int
  bytes_per_token: int  # K and V of one token in every layer
  bytes_per_page: int  # K and V of page_size tokens in the m layers of a KV group
  num_pages: int  # null page included
  num_kv_groups: int  # G (1: one kind of layer, every page kept)
  paged_token_capacity: int  # tokens in sequences of avg_seq_len the usable pages hold
  paged_token_capacity_without_freeing: int
  pages_per_seq: int  # pages(avg_seq_len), window pages freed
  pages_per_seq_without_freeing: int  # G * ceil(avg_seq_len / page_size)
  paged_max_seqs: int
  paged_max_seqs_without_freeing: int
  contiguous_max_seqs: int
  contiguous_token_capacity: int  # reserved tokens
  contiguous_used_tokens: int  # of which hold real tokens at avg_seq_len
  max_num_seqs: int  # the scheduler's cap on running sequences

  @property
  def paged_vs_contiguous(self) -> float:
    return self.paged_max_seqs / max(self.contiguous_max_seqs, 1)


def model_config_for(config: EngineConfig) -> ModelConfig:
  """The model's architecture without loading weights, in the scheme it would run (the
  checkpoint's own for a compressed-tensors one, else config.quantization)."""
  if is_builtin(config.model):
    return builtin_config(config.model, config.dtype).replace(quantization=config.quantization)
  model = model_path(config)
  quantization = model_quantization(model, config.quantization)
  return load_hf_config(checkpoint_dir(model), config.dtype).replace(quantization=quantization)


def weight_bytes(model_config: ModelConfig) -> int:
  """The params' bytes from their shapes and dtypes (8-bit kernels and their scales when
  quantized)."""
  import jax

  from jaxserve.models.weights import param_shapes

  leaves = jax.tree.leaves(param_shapes(model_config))
  return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in leaves)


def plan(
  model_config: ModelConfig,
  *,
  page_size: int,
  max_model_len: int,
  budget_bytes: int,
  avg_seq_len: int,
  max_num_seqs: int,
  model: str = "",
  kv_dtype: str | None = None,
) -> KVPlan:
  """kv_dtype: the pages' storage (CacheConfig.storage_dtype; None: the model's dtype). 8-bit
  pages are one byte an element and their static scales take no memory, so a budget holds
  twice bfloat16's pages."""
  kv_dtype = model_config.dtype if kv_dtype is None else kv_dtype
  if avg_seq_len < 1 or avg_seq_len > max_model_len:
    raise ValueError(
      f"avg_seq_len: must be in [1, max_model_len={max_model_len}], got {avg_seq_len}"
    )
  layout = kv_layout(model_config, page_size)
  shape = (model_config.num_kv_heads, model_config.head_dim)
  per_page = page_bytes(layout.num_slots, *shape, page_size, kv_dtype)
  per_token = page_bytes(model_config.num_layers, *shape, 1, kv_dtype)
  num_pages = budget_bytes // per_page
  if num_pages < 2:
    raise ValueError(f"memory_gb: {budget_bytes} bytes hold {num_pages} pages of {per_page} bytes")
  full_pages = math.ceil(avg_seq_len / page_size)
  pages_per_seq = layout.pages_held(avg_seq_len)
  without_freeing = layout.num_groups * full_pages
  usable_tokens = (num_pages - 1) * page_size
  contiguous_seqs = budget_bytes // (max_model_len * per_token)
  return KVPlan(
    model=model,
    dtype=kv_dtype,
    page_size=page_size,
    max_model_len=max_model_len,
    avg_seq_len=avg_seq_len,
    budget_bytes=budget_bytes,
    bytes_per_token=per_token,
    bytes_per_page=per_page,
    num_pages=num_pages,
    num_kv_groups=layout.num_groups,
    paged_token_capacity=usable_tokens * full_pages // pages_per_seq,
    paged_token_capacity_without_freeing=usable_tokens // layout.num_groups,
    pages_per_seq=pages_per_seq,
    pages_per_seq_without_freeing=without_freeing,
    paged_max_seqs=(num_pages - 1) // pages_per_seq,
    paged_max_seqs_without_freeing=(num_pages - 1) // without_freeing,
    contiguous_max_seqs=contiguous_seqs,
    contiguous_token_capacity=contiguous_seqs * max_model_len,
    contiguous_used_tokens=contiguous_seqs * avg_seq_len,
    max_num_seqs=max_num_seqs,
  )


def budget_for(config: EngineConfig, model_config: ModelConfig, memory_gb: float | None) -> int:
  """The KV budget in bytes: --memory-gb, else what the engine config asks for."""
  if memory_gb is not None:
    if memory_gb <= 0:
      raise ValueError(f"memory_gb: must be > 0, got {memory_gb}")
    return int(memory_gb * GIB)
  cache = config.cache
  if cache.num_pages is not None:
    return cache.num_pages * page_bytes(
      kv_layout(model_config, cache.page_size).num_slots,
      model_config.num_kv_heads,
      model_config.head_dim,
      cache.page_size,
      cache.storage_dtype(model_config.dtype),
    )
  if cache.memory_bytes is not None:
    return cache.memory_bytes
  memory = read_device_memory()  # the weights are not loaded here: their size is subtracted
  if memory is None:
    return int(CPU_DEFAULT_BYTES * cache.memory_fraction)
  return kv_pool_bytes(memory, cache.memory_fraction) - weight_bytes(model_config)


def engine_num_pages(config: EngineConfig) -> int:
  """Builds the engine on the current device; the page count its allocator got."""
  from jaxserve.composition.assembly import build_engine

  return build_engine(config, show_progress=False).allocator.num_pages


def main(args) -> int:
  from jaxserve.config.cli_args import engine_config_from_args

  config = engine_config_from_args(args)
  model_config = model_config_for(config)
  max_model_len = resolve_max_model_len(config, model_config)
  budget = budget_for(config, model_config, args.memory_gb)
  result = plan(
    model_config,
    page_size=config.cache.page_size,
    max_model_len=max_model_len,
    budget_bytes=budget,
    avg_seq_len=args.avg_seq_len,
    max_num_seqs=config.scheduler.max_num_seqs,
    model=config.model,
    kv_dtype=config.cache.storage_dtype(model_config.dtype),
  )
  budget_config = config.replace(
    cache=dataclasses.replace(config.cache, memory_bytes=budget, num_pages=None)
  )
  large = get_attention_backend(config.attention_backend).capabilities.large_page_arrays
  spec_pages = kv_cache_spec(
    budget_config, model_config, max_model_len, None, large_page_arrays=large
  ).num_pages
  report = {
    **dataclasses.asdict(result),
    "paged_vs_contiguous": result.paged_vs_contiguous,
    "spec_num_pages": spec_pages,
    "engine_num_pages": None,
  }
  if args.check:
    report["engine_num_pages"] = engine_num_pages(budget_config)
  print(format_plan(report))
  if args.out:
    print(f"wrote {write_json(args.out, report)}")
  matches = spec_pages == result.num_pages and report["engine_num_pages"] in (
    None,
    result.num_pages,
  )
  return 0 if matches else 1


def format_plan(report: dict) -> str:
  rows = [
    ("model", f"{report['model']} (KV pages {report['dtype']})"),
    ("KV budget", f"{report['budget_bytes'] / GIB:.3f} GiB"),
    (
      "bytes per token / page",
      f"{report['bytes_per_token']} / {report['bytes_per_page']} (page_size {report['page_size']})",
    ),
    (
      "pages (planned / kv_cache_spec / engine)",
      f"{report['num_pages']} / {report['spec_num_pages']} / {report['engine_num_pages'] or '-'}",
    ),
    ("token capacity, paged", report["paged_token_capacity"]),
    (
      f"sequences of {report['avg_seq_len']} tokens, paged",
      f"{report['paged_max_seqs']} ({report['pages_per_seq']} pages each)",
    ),
  ]
  if report["num_kv_groups"] > 1:
    rows += [
      (
        f"token capacity, {report['num_kv_groups']} KV groups, no window freeing",
        report["paged_token_capacity_without_freeing"],
      ),
      (
        "sequences, no window freeing",
        f"{report['paged_max_seqs_without_freeing']} "
        f"({report['pages_per_seq_without_freeing']} pages each)",
      ),
    ]
  rows += [
    (
      f"sequences, contiguous max_model_len={report['max_model_len']}",
      report["contiguous_max_seqs"],
    ),
    (
      "contiguous tokens reserved / used",
      f"{report['contiguous_token_capacity']} / {report['contiguous_used_tokens']}",
    ),
    ("paged / contiguous sequences", f"{report['paged_vs_contiguous']:.2f}x"),
    ("scheduler max_num_seqs", report["max_num_seqs"]),
  ]
  return key_value_table(rows)
