"""Gemma 2 and Gemma 3 (text) decoders over the paged KV cache, as transformers' Gemma2ForCausalLM
and Gemma3ForCausalLM compute them.

The step contract is LlamaForCausalLM's (models/llama.py): one ragged batch of `token_ids[T]` at
`positions[T]`, the KV slots' (k_pages, v_pages), `slot_mapping` and `AttentionMetadata` of
every KV group (models/kv_layout.py: the global layers are group 0, the sliding layers share
their slots in groups whose pages follow the window); `__call__` returns the final-norm hidden
states and the new pages, `compute_logits` float32 logits. The
attention block (`Attention`: projections, q/k norm, RoPE, the backend) and the MLP are llama.py's,
which switch on `config.gemma`: tanh GELU in the MLP, Gemma's RMSNorm for q/k (Gemma 3).

What differs from the Llama block:
* embeddings are multiplied by sqrt(hidden_size) rounded to the model dtype (as HF's
  `embed_scale.to(weight.dtype)`);
* every RMSNorm is Gemma's, (x / rms(x)) * (1 + weight) in float32 (models/norms.py), and the
  layer norms the attention output and the MLP output before each residual add
  (input_layernorm -> attention -> post_attention_layernorm -> + residual;
  pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm -> + residual);
* layer i attends over `config.layer_window(i)` (sliding layers: the last `sliding_window`
  positions; global layers: the whole context) with scale query_pre_attn_scalar ** -0.5 and,
  for Gemma 2, attention scores soft-capped at attn_logit_softcapping inside the backend;
* Gemma 3's sliding layers rotate by rope_local_base_freq, its global layers by rope_theta with
  rope_scaling (models/rope.py); Gemma 2 has one rope;
* final logits are soft-capped, cap * tanh(logits / cap), when final_logit_softcapping is set.

Params (flax `params`), beside llama.py's attention and MLP leaves (q_norm / k_norm for Gemma 3):
  embed_tokens/embedding [V, H]    norm/scale [H]    lm_head/kernel [H, V] (absent when tied)
  layers_{i}/{input,post_attention,pre_feedforward,post_feedforward}_layernorm/scale [H]
Each `scale` holds HF's norm weight as stored (the norm adds the 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxserve.attention import AttentionBackend, AttentionMetadata
from jaxserve.attention.metadata import KVPages
from jaxserve.models.invariant_dense import DenseBackend
from jaxserve.models.kv_layout import LayerKV
from jaxserve.models.llama import MLP, Attention, LMHead, output_logits, token_embedding
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.norms import rms_norm
from jaxserve.models.rope import inverse_frequencies, local_inverse_frequencies, rope_cos_sin


class GemmaDecoderLayer(nn.Module):
  """Attention over `window` (None: the whole context) and MLP, each between two norms."""

  config: ModelConfig
  attention: AttentionBackend
  dense: DenseBackend | None = None
  window: int | None = None

  @nn.compact
  def __call__(self, x, cos, sin, k_pages, v_pages, slot_mapping, metadata):
    cfg = self.config
    h = rms_norm(cfg, "input_layernorm")(x)
    h, k_pages, v_pages = Attention(cfg, self.attention, self.dense, self.window, name="self_attn")(
      h, cos, sin, k_pages, v_pages, slot_mapping, metadata
    )
    x = x + rms_norm(cfg, "post_attention_layernorm")(h)  # [T, H]
    h = MLP(cfg, self.dense, name="mlp")(rms_norm(cfg, "pre_feedforward_layernorm")(x))
    x = x + rms_norm(cfg, "post_feedforward_layernorm")(h)  # [T, H]
    return x, k_pages, v_pages


def scaled_embedding(x: jax.Array, hidden_size: int) -> jax.Array:
  """Embeddings x [T, H] times sqrt(hidden_size), the scale rounded to float32 and then to x's
  dtype as transformers' Gemma embeddings do (bfloat16: 55.4256 becomes 55.5 for H = 3072)."""
  return x * jnp.asarray(np.float32(hidden_size**0.5)).astype(x.dtype)


def soft_cap(logits: jax.Array, cap: float | None) -> jax.Array:
  """cap * tanh(logits / cap), or logits when cap is None."""
  return logits if cap is None else cap * jnp.tanh(logits / cap)


class GemmaForCausalLM(nn.Module):
  """Gemma 2 / Gemma 3 decoder over one ragged batch (module docstring); `dense` as in
  LlamaForCausalLM."""

  config: ModelConfig
  attention: AttentionBackend
  dense: DenseBackend | None = None

  def setup(self) -> None:
    cfg = self.config
    if not cfg.gemma:
      raise ValueError(f"architecture: {cfg.architecture} is not a Gemma architecture")
    self.embed_tokens = token_embedding(cfg)
    self.layers = [
      GemmaDecoderLayer(cfg, self.attention, self.dense, cfg.layer_window(i))  # layers_{i}
      for i in range(cfg.num_layers)
    ]
    self.norm = rms_norm(cfg)
    if not cfg.tie_word_embeddings:
      self.lm_head = LMHead(cfg.vocab_size, jnp.dtype(cfg.dtype), self.dense)

  def __call__(
    self,
    token_ids: jax.Array,  # int32[T]
    positions: jax.Array,  # int32[T]
    kv_pages: KVPages,  # per KV slot (k_pages, v_pages), each [KV, num_pages, page_size, D]
    slot_mapping: jax.Array,  # int32[G, T]
    metadata: AttentionMetadata,  # block_tables int32[G, S, pages_per_seq]
  ) -> tuple[jax.Array, KVPages]:
    cfg = self.config
    kv = LayerKV(cfg, kv_pages, slot_mapping, metadata)
    x = scaled_embedding(self.embed_tokens(token_ids), cfg.hidden_size)  # [T, H]
    ropes = {False: rope_cos_sin(positions, inverse_frequencies(cfg), x.dtype)}  # [T, D] each
    if cfg.rope_local_base_freq is not None:
      ropes[True] = rope_cos_sin(positions, local_inverse_frequencies(cfg), x.dtype)
    for i, layer in enumerate(self.layers):
      cos, sin = ropes[cfg.uses_local_rope(i)]
      k_pages, v_pages, slots, layer_metadata = kv.layer(i)
      x, k_pages, v_pages = layer(x, cos, sin, k_pages, v_pages, slots, layer_metadata)
      kv.update(i, k_pages, v_pages)
    hidden = self.norm(x)
    if self.is_initializing():
      self.compute_logits(hidden[:1])  # so that `init` creates lm_head too
    return hidden, kv.pages()

  def compute_logits(self, hidden: jax.Array) -> jax.Array:
    """hidden [N, H] (after the final norm) -> float32[N, vocab_size], soft-capped."""
    lm_head = None if self.config.tie_word_embeddings else self.lm_head
    logits = output_logits(self.config, self.dense, hidden, self.embed_tokens, lm_head)
    return soft_cap(logits, self.config.final_logit_softcapping)  # f32[N, V]
