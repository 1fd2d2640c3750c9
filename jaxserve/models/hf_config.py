"""A Hugging Face config.json dict mapped onto a ModelConfig (models/hf_config_json.py writes
one back): `model_config_from_hf(d, dtype)`.

Each field is read from its transformers name; Gemma's fields come through models/gemma_hf.py
and the experts' through models/moe_config.py. A field the model code does not implement (another
activation, MLP biases, partial rotary, a rope type other than llama3 / linear, mixed full and
sliding layers outside Gemma, an unknown architecture or dtype) is a ValueError naming it, so an
unsupported checkpoint fails at load time rather than producing wrong logits. Both config.json
flavours are read: transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x (`rope_parameters`
holding `rope_theta` and `rope_type`). dtype "auto" takes the checkpoint's (float16 ->
bfloat16).
"""

from __future__ import annotations

from typing import Mapping

from jaxserve.config_require import require as _require
from jaxserve.models.gemma_hf import GEMMA_ARCHITECTURES, gemma_fields
from jaxserve.models.model_config import ARCHITECTURES, DTYPES, ROPE_TYPES, ModelConfig, RopeScaling
from jaxserve.models.moe_config import hf_experts

_HF_ARCHITECTURES = {
  "LlamaForCausalLM": "llama",
  "MistralForCausalLM": "mistral",
  "Qwen2ForCausalLM": "qwen2",
  "Qwen3ForCausalLM": "qwen3",
  "Gemma2ForCausalLM": "gemma2",
  "Gemma3ForCausalLM": "gemma3_text",
  "Qwen3MoeForCausalLM": "qwen3_moe",
  "MixtralForCausalLM": "mixtral",
}
_HF_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "bfloat16"}


def model_config_from_hf(d: Mapping, dtype: str = "auto") -> ModelConfig:
  """Maps a Hugging Face config.json dict. dtype "auto" takes the checkpoint's (float16 ->
  bfloat16); otherwise "float32" or "bfloat16"."""
  architecture = _hf_architecture(d)
  num_q_heads = _hf_field(d, "num_attention_heads")
  hidden_size = _hf_field(d, "hidden_size")
  gemma = gemma_fields(d, architecture) if architecture in GEMMA_ARCHITECTURES else None
  head_dim = d.get("head_dim") or (hidden_size // num_q_heads if gemma is None else 256)
  _require(
    gemma is not None or d.get("hidden_act", "silu") == "silu",
    "hidden_act",
    f"only silu is supported, got {d.get('hidden_act')!r}",
  )
  _require(not d.get("mlp_bias", False), "mlp_bias", "MLP biases are not supported")
  rope_theta, rope_scaling = _hf_rope(d if gemma is None else gemma.global_rope)
  return ModelConfig(
    architecture=architecture,
    vocab_size=_hf_field(d, "vocab_size"),
    hidden_size=hidden_size,
    intermediate_size=_hf_field(d, "intermediate_size"),
    num_layers=_hf_field(d, "num_hidden_layers"),
    num_q_heads=num_q_heads,
    num_kv_heads=d.get("num_key_value_heads") or num_q_heads,
    head_dim=head_dim,
    rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
    rope_theta=rope_theta,
    rope_scaling=rope_scaling,
    max_position_embeddings=_hf_field(d, "max_position_embeddings"),
    tie_word_embeddings=bool(d.get("tie_word_embeddings", gemma is not None)),
    attention_bias=architecture == "qwen2" or bool(d.get("attention_bias", False)),
    qk_norm=architecture in ("qwen3", "gemma3_text", "qwen3_moe"),
    sliding_window=_hf_sliding_window(d, architecture) if gemma is None else gemma.sliding_window,
    layer_types=() if gemma is None else gemma.layer_types,
    query_pre_attn_scalar=None if gemma is None else gemma.query_pre_attn_scalar,
    attn_logit_softcapping=None if gemma is None else gemma.attn_logit_softcapping,
    final_logit_softcapping=None if gemma is None else gemma.final_logit_softcapping,
    rope_local_base_freq=None if gemma is None else gemma.rope_local_base_freq,
    **hf_experts(d, architecture),
    bos_token_id=d.get("bos_token_id"),
    eos_token_ids=_hf_eos(d.get("eos_token_id")),
    dtype=_hf_dtype(d, dtype),
  )


def _hf_field(d: Mapping, name: str):
  _require(d.get(name) is not None, name, "missing from the Hugging Face config")
  return d[name]


def _hf_architecture(d: Mapping) -> str:
  names = d.get("architectures") or []
  if names:
    _require(
      len(names) == 1 and names[0] in _HF_ARCHITECTURES,
      "architectures",
      f"unsupported architecture {', '.join(map(str, names))!r} "
      f"(supported: {', '.join(_HF_ARCHITECTURES)})",
    )
    return _HF_ARCHITECTURES[names[0]]
  model_type = d.get("model_type")
  _require(
    model_type in ARCHITECTURES,
    "model_type",
    f"unsupported architecture {model_type!r} (supported: {', '.join(ARCHITECTURES)})",
  )
  return model_type


def _hf_rope(d: Mapping) -> tuple[float, RopeScaling | None]:
  params = dict(d.get("rope_parameters") or {})  # transformers 5.x
  legacy = d.get("rope_scaling")  # transformers 4.x
  if legacy:
    params = {**legacy, **params}
  rope_theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
  partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
  _require(partial in (None, 1, 1.0), "partial_rotary_factor", f"must be 1.0, got {partial!r}")
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type in (None, "default"):
    return rope_theta, None
  _require(
    rope_type in ROPE_TYPES,
    "rope_scaling.rope_type",
    f"unsupported rope type {rope_type!r} (supported: default, {', '.join(ROPE_TYPES)})",
  )
  scaling = RopeScaling(
    rope_type=rope_type,
    factor=float(params.get("factor", 1.0)),
    low_freq_factor=float(params.get("low_freq_factor", 1.0)),
    high_freq_factor=float(params.get("high_freq_factor", 4.0)),
    original_max_position_embeddings=params.get(
      "original_max_position_embeddings", d.get("max_position_embeddings")
    )
    if rope_type == "llama3"
    else None,
  )
  return rope_theta, scaling


def _hf_sliding_window(d: Mapping, architecture: str) -> int | None:
  if architecture == "llama":
    return None
  if architecture in ("mistral", "mixtral"):
    return d.get("sliding_window")
  if not d.get("use_sliding_window", False) or d.get("sliding_window") is None:
    return None
  layer_types = d.get("layer_types")
  if layer_types is None:
    num_full = d.get("max_window_layers", 0)
    layer_types = [
      "full_attention" if i < num_full else "sliding_attention"
      for i in range(d["num_hidden_layers"])
    ]
  _require(
    all(t == "sliding_attention" for t in layer_types),
    "layer_types",
    "mixing full and sliding-window attention layers is not supported",
  )
  return d["sliding_window"]


def _hf_eos(value) -> tuple[int, ...]:
  if value is None:
    return ()
  return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _hf_dtype(d: Mapping, dtype: str) -> str:
  if dtype != "auto":
    _require(dtype in DTYPES, "dtype", f"must be 'auto' or one of {DTYPES}, got {dtype!r}")
    return dtype
  hf_dtype = d.get("dtype") or d.get("torch_dtype") or "float32"
  _require(
    hf_dtype in _HF_DTYPES,
    "dtype",
    f"unsupported checkpoint dtype {hf_dtype!r} (supported: {', '.join(_HF_DTYPES)})",
  )
  return _HF_DTYPES[hf_dtype]
