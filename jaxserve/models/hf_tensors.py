"""The Hugging Face tensor names of the shared layers, composed into a family's conversion table
(`decoder_specs`): for every flax leaf, the HF tensor name, its HF shape and whether it is a
transposed Linear weight (models/tensor_spec.py). Each family's module calls `decoder_specs` with
its choices: the norms after attention (Gemma's four), the MLP's tensors (dense, or a mixture of
experts' with the family's `ExpertNames`, models/expert_weights.py). models/weights.py asks the
config's family for the table.

Layer i's order (the loader's and the random checkpoints' order): input_layernorm, q/k/v/o_proj,
q/k/v biases (attention_bias), q/k norms (qk_norm), the norms after attention, the MLP; then
the final norm and lm_head (absent when tied).
"""

from __future__ import annotations

from collections.abc import Callable

from jaxserve.models.model_config import ModelConfig
from jaxserve.models.tensor_spec import TensorSpec

MLPSpecs = Callable[[ModelConfig, int], list[TensorSpec]]
POST_ATTENTION = ("post_attention_layernorm",)


def linear(layer: int, module: str, name: str, out_dim: int, in_dim: int) -> TensorSpec:
  """A Linear [out, in] of layer `layer` -> kernel [in, out]."""
  return TensorSpec(
    (f"layers_{layer}", module, name, "kernel"),
    f"model.layers.{layer}.{module}.{name}.weight",
    (out_dim, in_dim),
    True,
  )


def _vector(path: tuple[str, ...], hf_name: str, dim: int) -> TensorSpec:
  return TensorSpec(path, hf_name, (dim,), False)


def attention_specs(c: ModelConfig, i: int) -> list[TensorSpec]:
  """Layer i's q/k/v/o projections, their biases and q/k norms (models/layers/attention.py)."""
  hf, fx = f"model.layers.{i}", f"layers_{i}"
  q_dim, kv_dim = c.num_q_heads * c.head_dim, c.num_kv_heads * c.head_dim
  specs = [
    linear(i, "self_attn", "q_proj", q_dim, c.hidden_size),
    linear(i, "self_attn", "k_proj", kv_dim, c.hidden_size),
    linear(i, "self_attn", "v_proj", kv_dim, c.hidden_size),
    linear(i, "self_attn", "o_proj", c.hidden_size, q_dim),
  ]
  if c.attention_bias:
    specs += [
      _vector((fx, "self_attn", name, "bias"), f"{hf}.self_attn.{name}.bias", dim)
      for name, dim in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim))
    ]
  if c.qk_norm:
    specs += [
      _vector((fx, "self_attn", name, "scale"), f"{hf}.self_attn.{name}.weight", c.head_dim)
      for name in ("q_norm", "k_norm")
    ]
  return specs


def dense_mlp_specs(c: ModelConfig, i: int) -> list[TensorSpec]:
  """Layer i's gate/up/down projections (models/layers/mlp.py)."""
  return [
    linear(i, "mlp", "gate_proj", c.intermediate_size, c.hidden_size),
    linear(i, "mlp", "up_proj", c.intermediate_size, c.hidden_size),
    linear(i, "mlp", "down_proj", c.hidden_size, c.intermediate_size),
  ]


def decoder_specs(
  c: ModelConfig, norms: tuple[str, ...] = POST_ATTENTION, mlp: MLPSpecs = dense_mlp_specs
) -> list[TensorSpec]:
  """Every params leaf of a decoder whose layers hold `norms` after attention and `mlp`'s
  tensors (module docstring)."""
  specs = [
    TensorSpec(
      ("embed_tokens", "embedding"),
      "model.embed_tokens.weight",
      (c.vocab_size, c.hidden_size),
      False,
    )
  ]
  for i in range(c.num_layers):
    hf, fx = f"model.layers.{i}", f"layers_{i}"
    specs.append(
      _vector((fx, "input_layernorm", "scale"), f"{hf}.input_layernorm.weight", c.hidden_size)
    )
    specs += attention_specs(c, i)
    specs += [_vector((fx, norm, "scale"), f"{hf}.{norm}.weight", c.hidden_size) for norm in norms]
    specs += mlp(c, i)
  specs.append(TensorSpec(("norm", "scale"), "model.norm.weight", (c.hidden_size,), False))
  if not c.tie_word_embeddings:
    specs.append(
      TensorSpec(("lm_head", "kernel"), "lm_head.weight", (c.vocab_size, c.hidden_size), True)
    )
  return specs
