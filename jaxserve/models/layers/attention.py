"""The attention block every family shares, and the projection every GEMM of a layer goes
through.

`Attention`: q/k/v projections (with biases when `ModelConfig.attention_bias`: Qwen2), per-head
q/k norms before RoPE when `ModelConfig.qk_norm` (Qwen3, Qwen3-MoE, Gemma 3; the family's norm,
`norm`), RoPE by the cos/sin the decoder computed for the layer, the attention backend over the
layer's `window` (None: the whole context) with the config's scale and score soft cap
(`sm_scale`, `attn_logit_softcapping`), o_proj. The backend scatters the new k/v into the pages of
the layer's slot kv_slot of its group of the pool's stacked slots at the slot mapping and attends
over that slot (attention/backends.py).

`projection` picks each GEMM's implementation from the config, never from the family: a Dense; a
QuantizedDense when `quantization` names a scheme (models/quantized_dense.py); with
`tp_invariant_reductions` or an injected `dense` (batch_invariant) an InvariantDense of `kind`
("column": q/k/v, gate/up; "row": o_proj, down_proj) computed by `dense` (default: grouped,
unsharded; models/invariant_dense.py).

Params under the block (H hidden, D head_dim, Q/KV head counts):
  {q,k,v}_proj/kernel [H, Q*D | KV*D | KV*D]   (+ bias, when attention_bias)
  o_proj/kernel [Q*D, H]                       {q,k}_norm/scale [D] (when qk_norm)
With `fused_projections` (one device; models/fused_projections.py) q/k/v are one
qkv_proj/kernel [H, (Q + 2*KV)*D], split after its GEMM.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxserve.attention import AttentionBackend, AttentionMetadata
from jaxserve.models.invariant_dense import (
  REDUCTION_GROUPS,
  DenseBackend,
  InvariantDense,
  grouped_dense_backend,
)
from jaxserve.models.layers.norms import Norm, norm_layer
from jaxserve.models.layers.rope import apply_rope
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.quantized_dense import QuantizedDense
from jaxserve.quantization.scheme import scheme_for


def projection(
  config: ModelConfig,
  dense: DenseBackend | None,
  features: int,
  kind: str,
  name: str,
  use_bias: bool = False,
) -> nn.Module:
  """The GEMM of one projection (module docstring)."""
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
  """q/k/v projections, q/k norms (qk_norm, by `norm`), RoPE by the given cos/sin, paged
  attention over `window` (None: the whole context) with the config's scale and score soft cap,
  o_proj."""

  config: ModelConfig
  attention: AttentionBackend
  norm: Norm
  dense: DenseBackend | None = None
  window: int | None = None

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    k_pool: jax.Array,  # [slots_per_group, KV, num_pages, page_size, D]: its group's
    v_pool: jax.Array,  # [slots_per_group, KV, num_pages, page_size, D]
    kv_slot: jax.Array,  # int32[1]: this layer's slot in the group
    slot_mapping: jax.Array,  # int32[T]
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
      q = norm_layer(self.norm, cfg, "q_norm")(q)
      k = norm_layer(self.norm, cfg, "k_norm")(k)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    out, k_pool, v_pool = self.attention(
      q,
      k,
      v,
      k_pool,
      v_pool,
      kv_slot,
      slot_mapping,
      metadata,
      sm_scale=cfg.sm_scale,
      sliding_window=self.window,
      soft_cap=cfg.attn_logit_softcapping,
    )  # out [T, Q, D]
    out = out.reshape(num_tokens, cfg.num_q_heads * cfg.head_dim).astype(dtype)
    out = projection(cfg, self.dense, cfg.hidden_size, "row", "o_proj")(out)  # [T, H]
    return out, k_pool, v_pool
