"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3; Qwen3-MoE, Mixtral) over the paged KV
cache, in Flax linen.

The model consumes one ragged step: the tokens of every scheduled sequence concatenated into
`token_ids[T]` with their absolute `positions[T]`. Each layer projects q/k/v, applies RoPE and
hands q plus the new k/v to the attention backend, which scatters k/v into the pages of the
layer's KV slot at its group's `slot_mapping` and attends over the paged cache its group's block
tables describe (models/kv_layout.LayerKV: these models have one group, a slot per layer).
Layers are a Python loop (no scan), so under jit with donated pages every layer's scatter is an
in-place update of its slot's buffers. The model holds no sharding rules and no state besides
`params`.

Numerics follow Hugging Face: matmuls in the param dtype; RMSNorm statistics in float32 with the
weight applied after casting back; attention softmax in float32 (inside the backend); logits in
float32. Family switches: q/k/v bias (Qwen2), per-head q/k RMSNorm before RoPE (Qwen3), sliding
window (Mistral; each layer attends over its own `ModelConfig.layer_window`), tied embeddings.
`Attention` and `MLP` also make Gemma's block (models/gemma.py): on `config.gemma` the MLP's
activation is tanh GELU and the q/k norms are Gemma's (models/norms.py); the attention scale and
score soft cap always come from the config (`sm_scale`, `attn_logit_softcapping`). With
`num_experts` every layer's MLP is the routed experts of models/moe.py (its params under
layers_{i}/mlp are listed there), computed by the injected `experts` function (None: unsharded
grouped matmuls; parallel/sharded_experts.py on a mesh).

`tp_invariant_reductions` makes the bfloat16 forward bitwise independent of the tensor-parallel
degree: every projection goes through a DenseBackend (models/invariant_dense.py) that computes it
as REDUCTION_GROUPS column groups (q/k/v, gate/up) or row groups with float32 partials summed once
(o_proj, down_proj), the very GEMMs each device runs at tp = REDUCTION_GROUPS. The unsharded model
uses `grouped_dense_backend`; the sharded engine injects parallel/sharded_dense.py's, as it
injects a sharded attention backend. Two more conditions are met outside the model: the
vocabulary-sized weights are replicated (parallel/partition_rules.py) and the step is compiled
without excess precision or shape-dependent GEMM autotuning (device/step_programs.py). At tp
larger than REDUCTION_GROUPS each group is split again and its partials are summed by the
all-reduce in the collective's own order: close, not bitwise.

`batch_invariant` makes each token's bits independent of the step's other rows: the injected
DenseBackend (models/batch_invariant_dense.py) runs every GEMM, the logits' included, through
one fixed tiling, and RMSNorm sums its squares in a fixed order (pallas_kernels/fixed_order.py); the
attention backend and the compile options come from outside the model as for tp invariance.

With `quantization` (models/quantized_dense.py) every q/k/v/o and MLP kernel below is stored in
8 bits beside a float32 `scale` [out] (one per output channel) and runs the scheme's GEMM
(jaxserve/quantization/matmul.py); embeddings, norms, biases and lm_head keep the dtype.

Params (the flax `params` collection), with H hidden, D head_dim, Q/KV head counts, I intermediate:
  embed_tokens/embedding [V, H]
  layers_{i}/input_layernorm/scale [H]          layers_{i}/post_attention_layernorm/scale [H]
  layers_{i}/self_attn/{q,k,v}_proj/kernel [H, Q*D | KV*D | KV*D]   (+ bias, when attention_bias)
  layers_{i}/self_attn/o_proj/kernel [Q*D, H]
  layers_{i}/self_attn/{q,k}_norm/scale [D]     (when qk_norm)
  layers_{i}/mlp/{gate,up}_proj/kernel [H, I]   layers_{i}/mlp/down_proj/kernel [I, H]
  norm/scale [H]
  lm_head/kernel [H, V]                         (absent when tie_word_embeddings)
With `fused_projections` (one device; models/fused_projections.py) q/k/v are one
layers_{i}/self_attn/qkv_proj/kernel [H, (Q + 2*KV)*D] and gate/up one
layers_{i}/mlp/gate_up_proj/kernel [H, 2*I], each split after its GEMM.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxserve.attention import AttentionBackend, AttentionMetadata
from jaxserve.attention.metadata import KVPages
from jaxserve.models.invariant_dense import (
  REDUCTION_GROUPS,
  DenseBackend,
  InvariantDense,
  grouped_dense_backend,
)
from jaxserve.models.kv_layout import LayerKV
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.moe import ExpertsFn, SparseMoeBlock
from jaxserve.models.norms import RMSNorm, rms_norm
from jaxserve.models.quantized_dense import QuantizedDense
from jaxserve.models.rope import apply_rope, inverse_frequencies, rope_cos_sin
from jaxserve.quantization.scheme import scheme_for

__all__ = ["Attention", "DecoderLayer", "LMHead", "LlamaForCausalLM", "MLP", "RMSNorm"]


def projection(
  config: ModelConfig,
  dense: DenseBackend | None,
  features: int,
  kind: str,
  name: str,
  use_bias: bool = False,
) -> nn.Module:
  """A Dense; a QuantizedDense when config.quantization names a scheme; or with
  config.tp_invariant_reductions or an injected `dense` (batch_invariant) an InvariantDense of
  `kind` ("column": q/k/v, gate/up; "row": o_proj, down_proj) computed by `dense` (default:
  grouped, unsharded)."""
  dtype = jnp.dtype(config.dtype)
  scheme = scheme_for(config.quantization)
  if scheme is not None:
    if dense is not None:
      raise ValueError(f"quantization: {scheme.name} does not run with a DenseBackend")
    return QuantizedDense(features, dtype, scheme, use_bias, config.quantized_gemm, name=name)
  if config.tp_invariant_reductions or dense is not None:
    backend = dense if dense is not None else grouped_dense_backend(REDUCTION_GROUPS)
    return InvariantDense(features, dtype, kind, backend, use_bias, name=name)
  return nn.Dense(features, use_bias=use_bias, dtype=dtype, param_dtype=dtype, name=name)


class Attention(nn.Module):
  """q/k/v projections, q/k norms (qk_norm), RoPE by the given cos/sin, paged attention over
  `window` (None: the whole context) with the config's scale and score soft cap, o_proj."""

  config: ModelConfig
  attention: AttentionBackend
  dense: DenseBackend | None = None
  window: int | None = None

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    slot_mapping: jax.Array,
    metadata: AttentionMetadata,
  ):
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    num_tokens = x.shape[0]

    def proj(name: str, num_heads: int) -> jax.Array:
      y = projection(
        cfg, self.dense, num_heads * cfg.head_dim, "column", name, use_bias=cfg.attention_bias
      )(x)
      return y.reshape(num_tokens, num_heads, cfg.head_dim)  # [T, heads, D]

    if cfg.fused_projections:  # one GEMM, split: heads [Q | K | V]
      qkv = proj("qkv_proj", cfg.num_q_heads + 2 * cfg.num_kv_heads)  # [T, Q + 2K, D]
      q, k, v = jnp.split(qkv, [cfg.num_q_heads, cfg.num_q_heads + cfg.num_kv_heads], axis=1)
    else:
      q = proj("q_proj", cfg.num_q_heads)
      k = proj("k_proj", cfg.num_kv_heads)
      v = proj("v_proj", cfg.num_kv_heads)
    if cfg.qk_norm:
      q = rms_norm(cfg, "q_norm")(q)
      k = rms_norm(cfg, "k_norm")(k)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    out, k_pages, v_pages = self.attention(
      q,
      k,
      v,
      k_pages,
      v_pages,
      slot_mapping,
      metadata,
      sm_scale=cfg.sm_scale,
      sliding_window=self.window,
      soft_cap=cfg.attn_logit_softcapping,
    )  # out [T, Q, D]
    out = out.reshape(num_tokens, cfg.num_q_heads * cfg.head_dim).astype(dtype)
    out = projection(cfg, self.dense, cfg.hidden_size, "row", "o_proj")(out)  # [T, H]
    return out, k_pages, v_pages


class MLP(nn.Module):
  config: ModelConfig
  dense: DenseBackend | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.config
    if cfg.fused_projections:
      gate_up = projection(cfg, self.dense, 2 * cfg.intermediate_size, "column", "gate_up_proj")(
        x
      )  # [T, 2I]
      gate, up = jnp.split(gate_up, 2, axis=1)  # [T, I] each
    else:
      gate = projection(cfg, self.dense, cfg.intermediate_size, "column", "gate_proj")(x)
      up = projection(cfg, self.dense, cfg.intermediate_size, "column", "up_proj")(x)
    down = projection(cfg, self.dense, cfg.hidden_size, "row", "down_proj")
    act = functools.partial(nn.gelu, approximate=True) if cfg.gemma else nn.silu
    return down(act(gate) * up)  # [T, H]


class DecoderLayer(nn.Module):
  """Pre-norm attention over `window` (None: the whole context) and MLP, each residual."""

  config: ModelConfig
  attention: AttentionBackend
  dense: DenseBackend | None = None
  experts: ExpertsFn | None = None
  window: int | None = None

  @nn.compact
  def __call__(self, x, cos, sin, k_pages, v_pages, slot_mapping, metadata):
    cfg = self.config
    h = rms_norm(cfg, "input_layernorm")(x)
    h, k_pages, v_pages = Attention(cfg, self.attention, self.dense, self.window, name="self_attn")(
      h, cos, sin, k_pages, v_pages, slot_mapping, metadata
    )
    x = x + h
    h = rms_norm(cfg, "post_attention_layernorm")(x)
    if cfg.num_experts:
      x = x + SparseMoeBlock(cfg, self.experts, name="mlp")(h)
    else:
      x = x + MLP(cfg, self.dense, name="mlp")(h)
    return x, k_pages, v_pages


def logits_gemm(
  dense: DenseBackend | None, hidden: jax.Array, weight: jax.Array, vocab_major: bool = False
) -> jax.Array:
  """hidden [N, H] @ weight [H, V] (vocab_major: weight [V, H], a tied embedding) -> float32
  [N, V]: `dense.logits` when it has one."""
  if dense is not None and dense.logits is not None:
    return dense.logits(hidden, weight, vocab_major)
  return jnp.dot(hidden, weight.T if vocab_major else weight, preferred_element_type=jnp.float32)


class LMHead(nn.Module):
  """Untied output projection; logits accumulate and stay in float32."""

  vocab_size: int
  dtype: jnp.dtype
  dense: DenseBackend | None = None

  @nn.compact
  def __call__(self, hidden: jax.Array) -> jax.Array:
    kernel = self.param(
      "kernel", nn.initializers.lecun_normal(), (hidden.shape[-1], self.vocab_size), self.dtype
    )
    return logits_gemm(self.dense, hidden, kernel)


def token_embedding(cfg: ModelConfig) -> nn.Embed:
  """The input embedding [vocab_size, hidden_size] both decoders build as `embed_tokens`."""
  dtype = jnp.dtype(cfg.dtype)
  return nn.Embed(
    cfg.vocab_size,
    cfg.hidden_size,
    dtype=dtype,
    param_dtype=dtype,
    embedding_init=nn.initializers.normal(0.02),
  )


def output_logits(
  cfg: ModelConfig,
  dense: DenseBackend | None,
  hidden: jax.Array,  # [N, H], after the final norm
  embed_tokens: nn.Embed,
  lm_head: LMHead | None,
) -> jax.Array:
  """float32[N, vocab_size]: the tied embedding's transpose, or the untied lm_head."""
  if cfg.tie_word_embeddings:
    return logits_gemm(dense, hidden, embed_tokens.embedding, vocab_major=True)  # [V, H] weight
  return lm_head(hidden)


class LlamaForCausalLM(nn.Module):
  """Decoder over one ragged batch. `__call__` returns the final-norm hidden states and the new
  KV pages; `compute_logits` maps selected hidden states to float32 logits. `dense` computes the
  projections of a tp_invariant_reductions model (None: grouped on one device) or of a
  batch_invariant one (models/batch_invariant_dense.py), and its logits when it has them;
  `experts` computes a MoE model's experts (None: unsharded, models/moe.py)."""

  config: ModelConfig
  attention: AttentionBackend
  dense: DenseBackend | None = None
  experts: ExpertsFn | None = None

  def setup(self) -> None:
    cfg = self.config
    if cfg.gemma:
      raise ValueError(f"architecture: {cfg.architecture} runs models/gemma.py's GemmaForCausalLM")
    self.embed_tokens = token_embedding(cfg)
    self.layers = [
      DecoderLayer(cfg, self.attention, self.dense, self.experts, cfg.layer_window(i))
      for i in range(cfg.num_layers)  # layers_{i}
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
    x = self.embed_tokens(token_ids)  # [T, H]
    cos, sin = rope_cos_sin(positions, inverse_frequencies(cfg), x.dtype)  # [T, D] each
    for i, layer in enumerate(self.layers):
      k_pages, v_pages, slots, layer_metadata = kv.layer(i)
      x, k_pages, v_pages = layer(x, cos, sin, k_pages, v_pages, slots, layer_metadata)
      kv.update(i, k_pages, v_pages)
    hidden = self.norm(x)
    if self.is_initializing():
      self.compute_logits(hidden[:1])  # so that `init` creates lm_head too
    return hidden, kv.pages()

  def compute_logits(self, hidden: jax.Array) -> jax.Array:
    """hidden [N, H] (after the final norm) -> float32[N, vocab_size]."""
    lm_head = None if self.config.tie_word_embeddings else self.lm_head
    return output_logits(self.config, self.dense, hidden, self.embed_tokens, lm_head)
