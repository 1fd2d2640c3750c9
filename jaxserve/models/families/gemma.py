"""Gemma 2 (`Gemma2ForCausalLM`) and Gemma 3's text stack (`Gemma3ForCausalLM`), as transformers
computes them, and their config.json read as transformers 5.x reads it (`Gemma2Config`,
`Gemma3TextConfig`).

Decoder: the shared stack (models/layers/decoder.py) with Gemma's choices (`GEMMA_BLOCKS`):
* every RMSNorm is Gemma's, (x / rms(x)) * (1 + weight) in float32 (models/layers/norms.py), the
  q/k norms of Gemma 3 included;
* the layer norms the attention output and the MLP output before each residual add
  (input_layernorm -> attention -> post_attention_layernorm -> + residual;
  pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm -> + residual);
* the MLP's activation is tanh GELU;
* embeddings are multiplied by sqrt(hidden_size) rounded to the model dtype (as HF's
  `embed_scale.to(weight.dtype)`).
The rest is configuration the shared stack reads: layer i attends over `layer_window(i)`
(sliding layers: the last `sliding_window` positions; global layers: the whole context; the KV
layout gives them separate groups, models/kv_layout.py) with scale query_pre_attn_scalar ** -0.5
and, for Gemma 2, scores soft-capped at attn_logit_softcapping inside the backend; Gemma 3's
sliding layers rotate by rope_local_base_freq, its global layers by rope_theta with rope_scaling
(models/layers/rope.py); final logits are soft-capped when final_logit_softcapping is set.

Config (`config_fields`):
* Defaults of transformers' config classes for absent keys: head_dim 256, tied embeddings,
  sliding_window 4096; Gemma 3 has q/k norms.
* Layer types: `layer_types` when present, else the checkpoint's pattern: layer i is
  "sliding_attention" unless (i + 1) is a multiple of the pattern (Gemma 2: every 2nd layer is
  global; Gemma 3: `sliding_window_pattern`, default 6).
* Attention scale `query_pre_attn_scalar ** -0.5` (default 256); soft caps of the attention
  scores (Gemma 2 only: transformers' Gemma 3 attention never applies `attn_logit_softcapping`,
  so neither does jaxserve) and of the final logits; Gemma 2's defaults 50 and 30 apply when the
  keys are absent.
* RoPE: Gemma 2 has one (the shared keys). Gemma 3 rotates sliding layers by a local base
  (`rope_parameters.sliding_attention.rope_theta`, legacy `rope_local_base_freq`, default 10,000;
  "default" rope only) and global layers by `rope_parameters.full_attention` (legacy
  `rope_theta`, default 1,000,000, plus `rope_scaling`).
* Refused, naming the field: an activation other than gelu_pytorch_tanh, bidirectional
  attention, a layer type other than the two above. Gemma3ForConditionalGeneration (the
  multimodal checkpoint, its text stack under `language_model`) is not an architecture here.

Params beside the shared ones (each `scale` holds HF's norm weight as stored; the norm adds the 1):
  layers_{i}/{pre_feedforward,post_feedforward}_layernorm/scale [H]
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxserve.attention import AttentionBackend
from jaxserve.models.families.family import ModelFamily
from jaxserve.models.hf_fields import check_no_mlp_bias, common_fields
from jaxserve.models.hf_tensors import POST_ATTENTION, decoder_specs
from jaxserve.models.invariant_dense import DenseBackend
from jaxserve.models.layers.attention import Attention
from jaxserve.models.layers.decoder import CausalLM, DecoderBlocks, dense_mlp
from jaxserve.models.layers.mlp import gelu_tanh
from jaxserve.models.layers.moe import ExpertsFn
from jaxserve.models.layers.norms import GemmaRMSNorm, norm_layer
from jaxserve.models.model_config import FULL, LAYER_TYPES, SLIDING, ModelConfig
from jaxserve.models.moe_config import require_dense
from jaxserve.models.tensor_spec import TensorSpec

_PATTERN = {"gemma2": 2, "gemma3_text": 6}
_ATTN_SOFT_CAP = {"gemma2": 50.0, "gemma3_text": None}
_FINAL_SOFT_CAP = {"gemma2": 30.0, "gemma3_text": None}
FEEDFORWARD_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


def _fail(name: str, message: str) -> None:
  raise ValueError(f"{name}: {message}")


class GemmaDecoderLayer(nn.Module):
  """Attention over `window` (None: the whole context) and MLP, each between two norms."""

  config: ModelConfig
  attention: AttentionBackend
  blocks: DecoderBlocks
  dense: DenseBackend | None = None
  experts: ExpertsFn | None = None
  window: int | None = None

  @nn.compact
  def __call__(self, x, cos, sin, k_pool, v_pool, kv_slot, slot_mapping, metadata):
    cfg, blocks = self.config, self.blocks
    h = norm_layer(blocks.norm, cfg, "input_layernorm")(x)
    h, k_pool, v_pool = Attention(
      cfg, self.attention, blocks.norm, self.dense, self.window, name="self_attn"
    )(h, cos, sin, k_pool, v_pool, kv_slot, slot_mapping, metadata)
    x = x + norm_layer(blocks.norm, cfg, "post_attention_layernorm")(h)  # [T, H]
    h = norm_layer(blocks.norm, cfg, "pre_feedforward_layernorm")(x)
    h = blocks.mlp(cfg, blocks, self.dense, self.experts)(h)
    x = x + norm_layer(blocks.norm, cfg, "post_feedforward_layernorm")(h)  # [T, H]
    return x, k_pool, v_pool


def scaled_embedding(x: jax.Array, hidden_size: int) -> jax.Array:
  """Embeddings x [T, H] times sqrt(hidden_size), the scale rounded to float32 and then to x's
  dtype as transformers' Gemma embeddings do (bfloat16: 55.4256 becomes 55.5 for H = 3072)."""
  return x * jnp.asarray(np.float32(hidden_size**0.5)).astype(x.dtype)


GEMMA_BLOCKS = DecoderBlocks(
  norm=GemmaRMSNorm,
  activation=gelu_tanh,
  mlp=dense_mlp,
  layer=GemmaDecoderLayer,
  scale_embedding=scaled_embedding,
)


class GemmaForCausalLM(CausalLM):
  """Gemma 2 / Gemma 3 decoder (the shared stack with GEMMA_BLOCKS)."""

  blocks = GEMMA_BLOCKS


def config_fields(d: Mapping, architecture: str) -> dict[str, object]:
  """The ModelConfig fields of Gemma config.json dict `d` (module docstring); ValueError names a
  field the model code does not implement."""
  activation = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
  if activation != "gelu_pytorch_tanh":
    _fail("hidden_activation", f"only gelu_pytorch_tanh is supported, got {activation!r}")
  if d.get("use_bidirectional_attention"):
    _fail("use_bidirectional_attention", "bidirectional attention is not supported")
  check_no_mlp_bias(d)
  layer_types = _layer_types(d, architecture)
  window = d.get("sliding_window", 4096)
  final_cap = d.get("final_logit_softcapping", _FINAL_SOFT_CAP[architecture])
  attn_cap = d.get("attn_logit_softcapping", _ATTN_SOFT_CAP[architecture])
  if architecture == "gemma2":
    local_theta, global_rope = None, d
  else:
    local_theta, global_rope = _gemma3_rope(d)
    attn_cap = None  # transformers' Gemma3Attention does not pass it to the attention
  return common_fields(d, head_dim=256, rope=global_rope, tied=True) | dict(
    qk_norm=architecture == "gemma3_text",
    layer_types=layer_types,
    sliding_window=window if SLIDING in layer_types else None,
    query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)),
    attn_logit_softcapping=None if attn_cap is None else float(attn_cap),
    final_logit_softcapping=None if final_cap is None else float(final_cap),
    rope_local_base_freq=local_theta,
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


def tensor_specs(config: ModelConfig) -> list[TensorSpec]:
  return decoder_specs(config, norms=POST_ATTENTION + FEEDFORWARD_NORMS)


def _integral(value: float | None) -> float | int | None:
  """An integer-valued number as an int (transformers' Gemma3TextConfig types
  query_pre_attn_scalar as int, as the published files write it)."""
  return int(value) if value is not None and float(value).is_integer() else value


def gemma3_config_json(c: ModelConfig) -> dict[str, object]:
  """Gemma 3's config.json fields beyond the shared ones (models/hf_config_json.py): a text-only
  Gemma3ForCausalLM config with its `layer_types` spelled out and its local RoPE base as
  `rope_local_base_freq`, an integral query_pre_attn_scalar as an int."""
  return {
    "hidden_activation": "gelu_pytorch_tanh",
    "layer_types": list(c.layer_types),
    "sliding_window": c.sliding_window,
    "query_pre_attn_scalar": _integral(c.query_pre_attn_scalar),
    "rope_local_base_freq": c.rope_local_base_freq,
    "attn_logit_softcapping": c.attn_logit_softcapping,
    "final_logit_softcapping": c.final_logit_softcapping,
  }


FAMILY = ModelFamily(
  name="gemma",
  architectures={"Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text"},
  config_fields=config_fields,
  check=require_dense,
  tensor_specs=tensor_specs,
  decoder=GemmaForCausalLM,
  config_writers={"gemma3_text": gemma3_config_json},
)
