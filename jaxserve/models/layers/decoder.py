"""The decoder stack every family shares, over the paged KV cache, and the choices a family makes
in it (`DecoderBlocks`).

`CausalLM` consumes one ragged step: the tokens of every scheduled sequence concatenated into
`token_ids[T]` with their absolute `positions[T]`; `__call__(token_ids, positions, kv_pages,
slot_mapping, metadata) -> (hidden, kv_pages)` (kv_pages: the pool's groups of stacked
(k_pool, v_pool), attention/metadata.py) returns the final-norm hidden states and the new
pages, `compute_logits(hidden) -> float32 logits`, so the step programs (device/step_fns.py) run
every family alike. The stack: the embedding (times the family's `scale_embedding`, if any), one
RoPE table per kind of layer (layer i rotates by `ModelConfig.uses_local_rope(i)`: the sliding
layers' local base when the config has one), the family's `layer` per layer over its own window
(`ModelConfig.layer_window`) and KV slot (models/kv_layout.LayerKV), the final norm; logits from
the tied embedding or lm_head, soft-capped when `final_logit_softcapping` is set. The model holds
no sharding rules and no state besides `params`.

One program a layer: outside `init`, each distinct layer module (equal layers: the same window
and blocks) is one jitted function of (its params, the step's arrays) that every such layer
calls, so a step program traces and lowers one layer, not `num_layers`. The pool is equal groups
of stacked slots (attention/metadata.py KVPages); a layer gets its slot's group pair, chosen here
statically (models/kv_layout.LayerKV), and its index in the group as a traced int32[1], not a
Python int baked into the program: equal layers of different slots and groups stay one program,
and the layer returns the group's new pair. XLA inlines the calls, so the compiled step runs the
unrolled one's kernels in the same scratch memory (under jit with the donated pool every layer's
KV write is an in-place update of its slot in its group's buffers). Where
XLA may skip a bfloat16 rounding between ops it fuses (excess precision, on unless a step option
turns it off), it can fuse across the inlined boundaries differently from the unrolled module. The
layers stay a Python loop over their own params (no scan over stacked weights or pages).

A family's decoder is a `CausalLM` whose class constant `blocks` holds its choices: the norm
(models/layers/norms.py), the MLP's activation and kind (dense `MLP`, or the routed experts of
models/layers/moe.py, computed by the injected `experts`: None for unsharded grouped matmuls,
parallel/sharded_experts.py's on a mesh), the layer module (`DecoderLayer`, the pre-norm block;
Gemma's has four norms) and the embedding scale. A mixture of experts' layer that the config
makes dense (`ModelConfig.is_moe_layer`) gets the dense `MLP` with the family's activation
instead (`DecoderBlocks.of_layer`), so its dense and sparse layers are two programs. Nothing here
reads which family a config is.

Numerics follow Hugging Face: matmuls in the param dtype; norm statistics in float32; attention
softmax in float32 (inside the backend); logits in float32.

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
one fixed tiling, and the norms sum their squares in a fixed order (pallas_kernels/fixed_order.py);
the attention backend and the compile options come from outside the model as for tp invariance.

With `quantization` (models/quantized_dense.py) every q/k/v/o and MLP kernel is stored in 8 bits
beside a float32 `scale` [out] and runs the scheme's GEMM; embeddings, norms, biases and lm_head
keep the dtype.

Params (the flax `params` collection), H hidden, V vocabulary:
  embed_tokens/embedding [V, H]    norm/scale [H]    lm_head/kernel [H, V] (absent when tied)
  layers_{i}/self_attn/...  (models/layers/attention.py)    layers_{i}/mlp/...  (layers/mlp.py,
  layers/moe.py)    layers_{i}/{input,post_attention}_layernorm/scale [H] (DecoderLayer)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxserve.attention import AttentionBackend, AttentionMetadata
from jaxserve.attention.metadata import KVPages
from jaxserve.models.invariant_dense import DenseBackend
from jaxserve.models.kv_layout import LayerKV
from jaxserve.models.layers.attention import Attention
from jaxserve.models.layers.mlp import MLP, Activation
from jaxserve.models.layers.moe import ExpertsFn, SparseMoeBlock
from jaxserve.models.layers.norms import Norm, norm_layer
from jaxserve.models.layers.rope import inverse_frequencies, local_inverse_frequencies, rope_cos_sin
from jaxserve.models.model_config import ModelConfig

# (config, blocks, dense, experts) -> the layer's MLP module, named "mlp"
MLPFactory = Callable[..., nn.Module]


def dense_mlp(
  cfg: ModelConfig, blocks: DecoderBlocks, dense: DenseBackend | None, experts: ExpertsFn | None
) -> nn.Module:
  """The gated MLP (models/layers/mlp.py) with the family's activation."""
  return MLP(cfg, blocks.activation, dense, name="mlp")


def sparse_moe_mlp(
  cfg: ModelConfig, blocks: DecoderBlocks, dense: DenseBackend | None, experts: ExpertsFn | None
) -> nn.Module:
  """The routed experts (models/layers/moe.py), computed by `experts`."""
  return SparseMoeBlock(cfg, experts, name="mlp")


@dataclass(frozen=True)
class DecoderBlocks:
  """A family's choices in the shared stack (module docstring)."""

  norm: Norm
  activation: Activation
  mlp: MLPFactory
  layer: type[nn.Module]  # (config, attention, blocks, dense, experts, window) -> x, k, v pools
  scale_embedding: Callable[[jax.Array, int], jax.Array] | None = None  # (x, hidden_size)

  def of_layer(self, cfg: ModelConfig, layer: int) -> DecoderBlocks:
    """The blocks of layer `layer`: these, with the dense MLP where a mixture of experts' config
    makes the layer dense."""
    if cfg.num_experts and not cfg.is_moe_layer(layer):
      return dataclasses.replace(self, mlp=dense_mlp)
    return self


class DecoderLayer(nn.Module):
  """Pre-norm attention over `window` (None: the whole context) and MLP, each residual."""

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
    x = x + h
    h = norm_layer(blocks.norm, cfg, "post_attention_layernorm")(x)
    x = x + blocks.mlp(cfg, blocks, self.dense, self.experts)(h)
    return x, k_pool, v_pool


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
  """The input embedding [vocab_size, hidden_size], `embed_tokens`."""
  dtype = jnp.dtype(cfg.dtype)
  return nn.Embed(
    cfg.vocab_size,
    cfg.hidden_size,
    dtype=dtype,
    param_dtype=dtype,
    embedding_init=nn.initializers.normal(0.02),
  )


def soft_cap(logits: jax.Array, cap: float | None) -> jax.Array:
  """cap * tanh(logits / cap), or logits when cap is None."""
  return logits if cap is None else cap * jnp.tanh(logits / cap)


def decoder_layer(layer: nn.Module, params, *args) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`layer` (unbound) over its params: (x, cos, sin, k_pool, v_pool, kv_slot, slots, metadata) ->
  (x, k_pool, v_pool)."""
  return layer.apply({"params": params}, *args)


class CausalLM(nn.Module):
  """The shared decoder over one ragged batch (module docstring); a family's subclass sets
  `blocks`. `dense` computes the projections of a tp_invariant_reductions model (None: grouped
  on one device) or of a batch_invariant one (models/batch_invariant_dense.py), and its logits
  when it has them; `experts` computes a mixture of experts' experts (None: unsharded)."""

  blocks: ClassVar[DecoderBlocks]
  config: ModelConfig
  attention: AttentionBackend
  dense: DenseBackend | None = None
  experts: ExpertsFn | None = None

  def setup(self) -> None:
    cfg, blocks = self.config, self.blocks
    self.embed_tokens = token_embedding(cfg)
    self.layers = [
      blocks.layer(
        cfg, self.attention, blocks.of_layer(cfg, i), self.dense, self.experts, cfg.layer_window(i)
      )
      for i in range(cfg.num_layers)  # layers_{i}
    ]
    self.norm = norm_layer(blocks.norm, cfg)
    if not cfg.tie_word_embeddings:
      self.lm_head = LMHead(cfg.vocab_size, jnp.dtype(cfg.dtype), self.dense)

  def __call__(
    self,
    token_ids: jax.Array,  # int32[T]
    positions: jax.Array,  # int32[T]
    kv_pages: KVPages,  # groups of (k_pool, v_pool), each [slots_per_group, KV, pages, ps, D]
    slot_mapping: jax.Array,  # int32[G, T]
    metadata: AttentionMetadata,  # block_tables int32[G, S, pages_per_seq]
  ) -> tuple[jax.Array, KVPages]:
    cfg = self.config
    kv = LayerKV(cfg, kv_pages, slot_mapping, metadata)
    x = self.embed_tokens(token_ids)  # [T, H]
    if self.blocks.scale_embedding is not None:
      x = self.blocks.scale_embedding(x, cfg.hidden_size)
    ropes = {False: rope_cos_sin(positions, inverse_frequencies(cfg), x.dtype)}  # [T, D] each
    if cfg.rope_local_base_freq is not None:
      ropes[True] = rope_cos_sin(positions, local_inverse_frequencies(cfg), x.dtype)
    for i, layer in enumerate(self._layer_fns()):
      cos, sin = ropes[cfg.uses_local_rope(i)]
      x, k_pool, v_pool = layer(x, cos, sin, *kv.layer(i))
      kv.update(i, k_pool, v_pool)
    hidden = self.norm(x)
    if self.is_initializing():
      self.compute_logits(hidden[:1])  # so that `init` creates lm_head too
    return hidden, kv.pages()

  def _layer_fns(self) -> list[Callable[..., tuple[jax.Array, jax.Array, jax.Array]]]:
    """Each layer as a function of the step's arrays (module docstring, "one program a layer"):
    the bound layers while `init` creates their params, else one jitted function per distinct
    layer module, called with its layer's params."""
    if self.is_initializing():
      return list(self.layers)
    params = self.variables["params"]
    programs: dict[nn.Module, Callable[..., tuple[jax.Array, jax.Array, jax.Array]]] = {}
    fns = []
    for i, layer in enumerate(self.layers):
      template = layer.clone(parent=None, name=None)  # equal for equal layers (window, blocks)
      if template not in programs:
        programs[template] = jax.jit(decoder_layer, static_argnums=0)
      fns.append(functools.partial(programs[template], template, params[f"layers_{i}"]))
    return fns

  def compute_logits(self, hidden: jax.Array) -> jax.Array:
    """hidden [N, H] (after the final norm) -> float32[N, vocab_size], soft-capped when the
    config says so."""
    cfg = self.config
    if cfg.tie_word_embeddings:  # [V, H] weight
      logits = logits_gemm(self.dense, hidden, self.embed_tokens.embedding, vocab_major=True)
    else:
      logits = self.lm_head(hidden)
    return soft_cap(logits, cfg.final_logit_softcapping)  # f32[N, V]
