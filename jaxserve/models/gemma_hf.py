"""Gemma 2 and Gemma 3 (text) config.json fields: what models/model_config.py needs beyond the
Llama-family fields, read as transformers 5.x reads them (`Gemma2Config`, `Gemma3TextConfig`).

* Defaults of transformers' config classes for absent keys: head_dim 256 (model_config.py),
  tied embeddings, sliding_window 4096.
* Layer types: `layer_types` when present, else the checkpoint's pattern: layer i is
  "sliding_attention" unless (i + 1) is a multiple of the pattern (Gemma 2: every 2nd layer is
  global; Gemma 3: `sliding_window_pattern`, default 6).
* Attention scale `query_pre_attn_scalar ** -0.5` (default 256); soft caps of the attention
  scores (Gemma 2 only: transformers' Gemma 3 attention never applies `attn_logit_softcapping`,
  so neither does jaxserve) and of the final logits; Gemma 2's defaults 50 and 30 apply when the
  keys are absent.
* RoPE: Gemma 2 has one (the Llama-family keys). Gemma 3 rotates sliding layers by a local base
  (`rope_parameters.sliding_attention.rope_theta`, legacy `rope_local_base_freq`, default 10,000;
  "default" rope only) and global layers by `rope_parameters.full_attention` (legacy
  `rope_theta`, default 1,000,000, plus `rope_scaling`). `GemmaFields.global_rope` is the global
  rope as a flat config dict for model_config's Llama-family rope reader.
* Refused, naming the field: an activation other than gelu_pytorch_tanh, bidirectional
  attention, a layer type other than the two above.

No jax here: plain parsing, imported by model_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

GEMMA_ARCHITECTURES = ("gemma2", "gemma3_text")
SLIDING, FULL = "sliding_attention", "full_attention"
LAYER_TYPES = (SLIDING, FULL)
_PATTERN = {"gemma2": 2, "gemma3_text": 6}
_ATTN_SOFT_CAP = {"gemma2": 50.0, "gemma3_text": None}
_FINAL_SOFT_CAP = {"gemma2": 30.0, "gemma3_text": None}


def _fail(name: str, message: str) -> None:
  raise ValueError(f"{name}: {message}")


@dataclass(frozen=True)
class GemmaFields:
  layer_types: tuple[str, ...]
  sliding_window: int | None
  query_pre_attn_scalar: float
  attn_logit_softcapping: float | None
  final_logit_softcapping: float | None
  rope_local_base_freq: float | None
  global_rope: Mapping  # a flat config dict holding the global layers' rope keys


def gemma_fields(d: Mapping, architecture: str) -> GemmaFields:
  """The Gemma fields of config.json dict `d` (module docstring); ValueError names a field the
  model code does not implement."""
  activation = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
  if activation != "gelu_pytorch_tanh":
    _fail("hidden_activation", f"only gelu_pytorch_tanh is supported, got {activation!r}")
  if d.get("use_bidirectional_attention"):
    _fail("use_bidirectional_attention", "bidirectional attention is not supported")
  layer_types = _layer_types(d, architecture)
  window = d.get("sliding_window", 4096)
  final_cap = d.get("final_logit_softcapping", _FINAL_SOFT_CAP[architecture])
  attn_cap = d.get("attn_logit_softcapping", _ATTN_SOFT_CAP[architecture])
  if architecture == "gemma2":
    local_theta, global_rope = None, d
  else:
    local_theta, global_rope = _gemma3_rope(d)
    attn_cap = None  # transformers' Gemma3Attention does not pass it to the attention
  return GemmaFields(
    layer_types=layer_types,
    sliding_window=window if SLIDING in layer_types else None,
    query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)),
    attn_logit_softcapping=None if attn_cap is None else float(attn_cap),
    final_logit_softcapping=None if final_cap is None else float(final_cap),
    rope_local_base_freq=local_theta,
    global_rope=global_rope,
  )


def _layer_types(d: Mapping, architecture: str) -> tuple[str, ...]:
  num_layers = d.get("num_hidden_layers")
  if not isinstance(num_layers, int) or num_layers < 1:
    _fail("num_hidden_layers", f"must be a positive integer, got {num_layers!r}")
  layer_types = d.get("layer_types")
  if layer_types is None:
    pattern = d.get("sliding_window_pattern", _PATTERN[architecture])
    if not isinstance(pattern, int) or pattern < 1:
      _fail("sliding_window_pattern", f"must be a positive integer, got {pattern!r}")
    layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
  for layer_type in layer_types:
    if layer_type not in LAYER_TYPES:
      _fail("layer_types", f"each must be one of {LAYER_TYPES}, got {layer_type!r}")
  return tuple(layer_types)


def _gemma3_rope(d: Mapping) -> tuple[float, Mapping]:
  """(the sliding layers' base, the global layers' rope as a flat config dict)."""
  params = d.get("rope_parameters") or {}
  if SLIDING in params or FULL in params:  # transformers 5.x: one rope per layer type
    local = params.get(SLIDING) or {}
    full = dict(params.get(FULL) or {})
  else:  # legacy keys
    local = {"rope_theta": d.get("rope_local_base_freq", 10000.0)}
    full = {**(d.get("rope_scaling") or {}), **params}
  local_type = local.get("rope_type", "default")
  if local_type != "default":
    _fail(
      "rope_parameters.sliding_attention.rope_type",
      f"only default rope is supported for sliding layers, got {local_type!r}",
    )
  full.setdefault("rope_theta", d.get("rope_theta", 1_000_000.0))
  local_theta = float(local.get("rope_theta", d.get("rope_local_base_freq", 10000.0)))
  flat = {
    "rope_parameters": full,
    "partial_rotary_factor": d.get("partial_rotary_factor"),
    "max_position_embeddings": d.get("max_position_embeddings"),
  }
  return local_theta, flat
