"""A ModelConfig written back as a Hugging Face config.json dict, in the layout of the published
files (transformers 4.x keys: `rope_theta` + `rope_scaling`), for the architectures whose family
has a config writer (`ModelFamily.config_writers`, models/families/) for random-weight
checkpoints (bench/random_checkpoint.py): llama, qwen3_moe, mixtral and gemma3_text. The shared
fields are written here, the family's own by its writer.

Contract: `model_config_from_hf(hf_config_json(c)) == c` (models/hf_config.py) for every config
of those families without engine-set fields (quantization, fused projections and the invariance
modes are not checkpoint properties), and transformers reads the same architecture from it
(tests/bench/test_random_checkpoint_families.py). Gemma 3 is written as a text-only
Gemma3ForCausalLM config (model_type gemma3_text) with its `layer_types` spelled out and its
local RoPE base as `rope_local_base_freq`, an integral query_pre_attn_scalar as an int
(models/families/gemma.py). Another architecture is a ValueError naming it.
"""

from __future__ import annotations

from jaxserve.models.families import FAMILIES, family_of
from jaxserve.models.model_config import ModelConfig, RopeScaling


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


def _common(c: ModelConfig, hf_name: str) -> dict[str, object]:
  return {
    "architectures": [hf_name],
    "model_type": c.architecture,
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


def hf_config_json(c: ModelConfig) -> dict[str, object]:
  """config.json of `c` (module docstring); ValueError naming an unsupported architecture or a
  config without an eos token."""
  family = family_of(c)
  writer = family.config_writer(c)
  if writer is None:
    written = [arch for family in FAMILIES for arch in family.config_writers]
    raise ValueError(
      f"architecture: random checkpoints are written for {', '.join(written)}, "
      f"got {c.architecture!r}"
    )
  if not c.eos_token_ids:
    raise ValueError("eos_token_ids: a written config needs at least one")
  return _common(c, family.hf_name(c.architecture)) | writer(c)
