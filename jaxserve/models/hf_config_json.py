"""A ModelConfig written back as a Hugging Face config.json dict, in the layout of the published
files (transformers 4.x keys: `rope_theta` + `rope_scaling`), for the families random-weight
checkpoints are built in (bench/random_checkpoint.py): llama, qwen3_moe and gemma3_text.

Contract: `model_config_from_hf(hf_config_json(c)) == c` (models/hf_config.py) for every config
of those families without engine-set fields (quantization, fused projections and the invariance
modes are not checkpoint properties), and transformers reads the same architecture from it
(tests/bench/test_random_checkpoint_families.py). Gemma 3 is written as a text-only
Gemma3ForCausalLM config (model_type gemma3_text) with its `layer_types` spelled out and its
local RoPE base as `rope_local_base_freq`, an integral query_pre_attn_scalar as an int. Another
architecture is a ValueError naming it.
"""

from __future__ import annotations

from jaxserve.models.model_config import ModelConfig, RopeScaling

_HF = {
  "llama": ("LlamaForCausalLM", "llama"),
  "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
  "gemma3_text": ("Gemma3ForCausalLM", "gemma3_text"),
}


def _rope_scaling(scaling: RopeScaling | None) -> dict[str, object] | None:
  if scaling is None:
    return None
  if scaling.rope_type == "linear":
    return {"rope_type": "linear", "factor": scaling.factor}
  return {
    "rope_type": scaling.rope_type,
    "factor": scaling.factor,
    "low_freq_factor": scaling.low_freq_factor,
    "high_freq_factor": scaling.high_freq_factor,
    "original_max_position_embeddings": scaling.original_max_position_embeddings,
  }


def _common(c: ModelConfig) -> dict[str, object]:
  architecture, model_type = _HF[c.architecture]
  return {
    "architectures": [architecture],
    "model_type": model_type,
    "vocab_size": c.vocab_size,
    "hidden_size": c.hidden_size,
    "intermediate_size": c.intermediate_size,
    "num_hidden_layers": c.num_layers,
    "num_attention_heads": c.num_q_heads,
    "num_key_value_heads": c.num_kv_heads,
    "head_dim": c.head_dim,
    "rms_norm_eps": c.rms_norm_eps,
    "rope_theta": c.rope_theta,
    "rope_scaling": _rope_scaling(c.rope_scaling),
    "max_position_embeddings": c.max_position_embeddings,
    "tie_word_embeddings": c.tie_word_embeddings,
    "attention_bias": c.attention_bias,
    "bos_token_id": c.bos_token_id,
    "eos_token_id": list(c.eos_token_ids) if len(c.eos_token_ids) > 1 else c.eos_token_ids[0],
    "torch_dtype": c.dtype,
  }


def _qwen3_moe(c: ModelConfig) -> dict[str, object]:
  return {
    "hidden_act": "silu",
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": c.num_layers,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_experts": c.num_experts,
    "num_experts_per_tok": c.num_experts_per_tok,
    "moe_intermediate_size": c.moe_intermediate_size,
    "norm_topk_prob": c.norm_topk_prob,
  }


def _integral(value: float | None) -> float | int | None:
  """An integer-valued number as an int (transformers' Gemma3TextConfig types
  query_pre_attn_scalar as int, as the published files write it)."""
  return int(value) if value is not None and float(value).is_integer() else value


def _gemma3(c: ModelConfig) -> dict[str, object]:
  return {
    "hidden_activation": "gelu_pytorch_tanh",
    "layer_types": list(c.layer_types),
    "sliding_window": c.sliding_window,
    "query_pre_attn_scalar": _integral(c.query_pre_attn_scalar),
    "rope_local_base_freq": c.rope_local_base_freq,
    "attn_logit_softcapping": c.attn_logit_softcapping,
    "final_logit_softcapping": c.final_logit_softcapping,
  }


def hf_config_json(c: ModelConfig) -> dict[str, object]:
  """config.json of `c` (module docstring); ValueError naming an unsupported architecture or a
  config without an eos token."""
  if c.architecture not in _HF:
    raise ValueError(
      f"architecture: random checkpoints are written for {', '.join(_HF)}, got {c.architecture!r}"
    )
  if not c.eos_token_ids:
    raise ValueError("eos_token_ids: a written config needs at least one")
  extra = {"qwen3_moe": _qwen3_moe, "gemma3_text": _gemma3}.get(c.architecture)
  return _common(c) | (extra(c) if extra else {})
