"""The Hugging Face config.json readers every family shares: the common ModelConfig fields
(`common_fields`), RoPE in both config.json flavours (`hf_rope`), the SiLU/no-MLP-bias checks of
the Llama-style families, and eos ids. The families (models/families/) read their own fields with
these and models/hf_config.py assembles the ModelConfig.

Both config.json flavours are read: transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x
(`rope_parameters` holding `rope_theta` and `rope_type`). A field the model code does not
implement (another activation, MLP biases, partial rotary, a rope type other than llama3 /
linear) is a ValueError naming it, so an unsupported checkpoint fails at load time rather than
producing wrong logits. No jax here.
"""

from __future__ import annotations

from collections.abc import Mapping

from jaxserve.config.require import require as _require
from jaxserve.models.model_config import ROPE_TYPES, RopeScaling


def hf_field(d: Mapping, name: str):
  """`d[name]`; ValueError naming it when missing."""
  _require(d.get(name) is not None, name, "missing from the Hugging Face config")
  return d[name]


def common_fields(
  d: Mapping, *, head_dim: int | None = None, rope: Mapping | None = None, tied: bool = False
) -> dict[str, object]:
  """The fields every family reads alike: shapes, eps, RoPE (from `rope`, a flat config dict,
  default `d`), positions, tied embeddings (`tied`: the family's default), attention_bias and
  the special tokens. `head_dim`: the family's default when config.json has none (None: hidden
  size / heads)."""
  num_q_heads = hf_field(d, "num_attention_heads")
  hidden_size = hf_field(d, "hidden_size")
  rope_theta, rope_scaling = hf_rope(d if rope is None else rope)
  return dict(
    vocab_size=hf_field(d, "vocab_size"),
    hidden_size=hidden_size,
    intermediate_size=hf_field(d, "intermediate_size"),
    num_layers=hf_field(d, "num_hidden_layers"),
    num_q_heads=num_q_heads,
    num_kv_heads=d.get("num_key_value_heads") or num_q_heads,
    head_dim=d.get("head_dim") or (hidden_size // num_q_heads if head_dim is None else head_dim),
    rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
    rope_theta=rope_theta,
    rope_scaling=rope_scaling,
    max_position_embeddings=hf_field(d, "max_position_embeddings"),
    tie_word_embeddings=bool(d.get("tie_word_embeddings", tied)),
    attention_bias=bool(d.get("attention_bias", False)),
    bos_token_id=d.get("bos_token_id"),
    eos_token_ids=hf_eos(d.get("eos_token_id")),
  )


def check_silu_mlp(d: Mapping) -> None:
  """The Llama-style MLP: SiLU, no biases."""
  _require(
    d.get("hidden_act", "silu") == "silu",
    "hidden_act",
    f"only silu is supported, got {d.get('hidden_act')!r}",
  )
  check_no_mlp_bias(d)


def check_no_mlp_bias(d: Mapping) -> None:
  """Every family's MLP projections are bias-free."""
  _require(not d.get("mlp_bias", False), "mlp_bias", "MLP biases are not supported")


def hf_rope(d: Mapping) -> tuple[float, RopeScaling | None]:
  """(rope_theta, rope_scaling) of a flat config dict."""
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


def hf_eos(value) -> tuple[int, ...]:
  if value is None:
    return ()
  return tuple(value) if isinstance(value, (list, tuple)) else (value,)
