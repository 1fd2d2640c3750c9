"""The partition rules: how every param and the KV pages are laid out over the mesh's `model` and
`expert` axes (parallel/mesh.py).

This is the one module that knows the sharding; the model code has none. Rules match a param's
path (joined with "/") and give a PartitionSpec for its array (flax kernels are [in, out]):

  q/k/v_proj kernel [H, heads*D], bias [heads*D]  column-sharded: each device owns whole heads
  o_proj kernel [Q*D, H]                          row-sharded (XLA inserts the all-reduce)
  gate/up_proj kernel [H, I]                      column-sharded
  down_proj kernel [I, H]                         row-sharded (all-reduce after it)
  embed_tokens/embedding [V, H]                   vocab-sharded: the lookup is a masked local
  lm_head kernel [H, V]                           gather plus an all-reduce; logits come out
                                                  vocab-sharded and the sampler's reductions
                                                  over the vocabulary gather them
  norms, q_norm/k_norm scales                     replicated (tiny)

A mixture of experts' MLP (models/moe.py) shards its stacked experts over both axes: whole
experts over `expert`, each expert's intermediate dimension over `model` (the SwiGLU is
column- then row-sharded, as in a dense MLP); its router is replicated:

  mlp/gate/kernel [H, E]                          replicated
  mlp/experts/gate_proj, up_proj [E, H, I]        (expert, -, model)
  mlp/experts/down_proj [E, I, H]                 (expert, model, -)

parallel/sharded_experts.py computes them device by device and sums the partials.

A quantized projection (models/quantized_dense.py) stores its kernel [out, in], the transpose of
a float one, beside a float32 `scale` [out], one per output channel; what makes a projection
quantized is that context (its module holds a `scale` leaf), never the kernel's shape or dtype.
Its rules shard the same channels as the float ones, on the other axis, and the scales follow
their channels:

  q/k/v_proj, gate/up_proj kernel [out, in]        axis 0 (out); scale [out] and bias sharded
  o_proj, down_proj kernel [out, in]               axis 1 (in); scale [out] replicated (their
                                                   out channels are not split)

Merged projections (qkv_proj, gate_up_proj) have no rule: sharded models keep HF's separate
projections (models/fused_projections.py says why).

A dimension the rule shards but the mesh size does not divide (an odd vocabulary, say) is
replicated instead, so every model loads; heads must divide (mesh.check_tensor_parallel).
With `shard_vocab=False` (models with tp_invariant_reductions) the two vocabulary-sized weights
are replicated: every device computes the whole logits as the unsharded model does, so the
vocabulary reductions after them (log-softmax, argmax) run in the unsharded order, without
collectives, at the price of one more copy of those weights per device.
KV pages [num_kv_heads, num_pages, page_size, head_dim] are sharded on the kv-head axis, matching
the k/v projections, so a device's attention reads only its own pages. Step inputs and step
outputs are replicated.
"""

from __future__ import annotations

import re
from typing import Mapping

from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.parallel.mesh import EXPERT_AXIS, MODEL_AXIS

ParamPath = tuple[str, ...]

PARAM_RULES: tuple[tuple[str, P], ...] = (
  (r"self_attn/(q|k|v)_proj/kernel$", P(None, MODEL_AXIS)),
  (r"self_attn/(q|k|v)_proj/bias$", P(MODEL_AXIS)),
  (r"self_attn/o_proj/kernel$", P(MODEL_AXIS, None)),
  (r"mlp/(gate|up)_proj/kernel$", P(None, MODEL_AXIS)),
  (r"mlp/down_proj/kernel$", P(MODEL_AXIS, None)),
  (r"^embed_tokens/embedding$", P(MODEL_AXIS, None)),
  (r"^lm_head/kernel$", P(None, MODEL_AXIS)),
  (r"(layernorm|norm)/scale$", P()),
  (r"mlp/gate/kernel$", P()),
  (r"mlp/experts/(gate|up)_proj$", P(EXPERT_AXIS, None, MODEL_AXIS)),
  (r"mlp/experts/down_proj$", P(EXPERT_AXIS, MODEL_AXIS, None)),
)
# A quantized projection's leaves (the projection holds a `scale`): checked before PARAM_RULES.
QUANTIZED_RULES: tuple[tuple[str, P], ...] = (
  (r"self_attn/(q|k|v)_proj/kernel$", P(MODEL_AXIS, None)),
  (r"self_attn/(q|k|v)_proj/(scale|bias)$", P(MODEL_AXIS)),
  (r"self_attn/o_proj/kernel$", P(None, MODEL_AXIS)),
  (r"self_attn/o_proj/(scale|bias)$", P()),
  (r"mlp/(gate|up)_proj/kernel$", P(MODEL_AXIS, None)),
  (r"mlp/(gate|up)_proj/(scale|bias)$", P(MODEL_AXIS)),
  (r"mlp/down_proj/kernel$", P(None, MODEL_AXIS)),
  (r"mlp/down_proj/(scale|bias)$", P()),
)
VOCAB_PARAMS = r"^(embed_tokens/embedding|lm_head/kernel)$"
KV_PAGES_SPEC = P(MODEL_AXIS, None, None, None)  # [num_kv_heads, num_pages, page_size, head_dim]


def param_spec(
  path: ParamPath,
  shape: tuple[int, ...],
  mesh_size: int,
  shard_vocab: bool = True,
  quantized: bool = False,
  expert_size: int | None = None,
) -> P:
  """The PartitionSpec of the param at `path` over a model axis of `mesh_size` devices and an
  expert axis of `expert_size` (None: the mesh has none, so nothing is split by expert);
  `quantized`: it belongs to a quantized projection (one holding a `scale`:
  is_quantized_projection). ValueError if no rule matches it."""
  name = "/".join(path)
  if not shard_vocab and re.search(VOCAB_PARAMS, name):
    return P()
  rules = (QUANTIZED_RULES if quantized else ()) + PARAM_RULES
  for pattern, spec in rules:
    if re.search(pattern, name):
      sizes = {MODEL_AXIS: mesh_size, EXPERT_AXIS: expert_size}
      return _divisible(spec, shape, sizes)
  raise ValueError(f"params: no partition rule matches {name!r} (shape {shape})")


def _divisible(spec: P, shape: tuple[int, ...], sizes: Mapping[str, int | None]) -> P:
  """`spec` with every axis that the mesh lacks or that does not divide its dimension dropped."""
  if len(spec) > len(shape):
    raise ValueError(f"partition rule {spec} has more axes than the param shape {shape}")
  axes = [
    axis if axis is None or (sizes[axis] and shape[i] % sizes[axis] == 0) else None
    for i, axis in enumerate(spec)
  ]
  return P(*axes)


def is_quantized_projection(leaves: Mapping[str, object], name: str) -> bool:
  """Whether the module `name` holding `leaves` is a quantized projection: a *_proj with a
  `scale` leaf (a float projection has kernel and bias only; norms' scales are not *_proj)."""
  return name.endswith("_proj") and "scale" in leaves


def param_shardings(abstract_params: dict, mesh: Mesh, shard_vocab: bool = True) -> dict:
  """A NamedSharding for every leaf of a params tree (arrays or ShapeDtypeStructs); a leaf of a
  quantized projection gets the quantized rules (is_quantized_projection, from its siblings)."""
  size, expert_size = mesh.shape[MODEL_AXIS], mesh.shape.get(EXPERT_AXIS)

  def walk(tree: Mapping, path: ParamPath) -> dict:
    out = {}
    for key, value in tree.items():
      if isinstance(value, Mapping):
        out[key] = walk(value, path + (str(key),))
        continue
      quantized = bool(path) and is_quantized_projection(tree, path[-1])
      spec = param_spec(
        path + (str(key),), tuple(value.shape), size, shard_vocab, quantized, expert_size
      )
      out[key] = NamedSharding(mesh, spec)
    return out if isinstance(tree, dict) else type(tree)(out)

  return walk(abstract_params, ())


def kv_pages_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, KV_PAGES_SPEC)


def logits_sharding(params: dict, mesh: Mesh) -> NamedSharding:
  """The logits' layout [S, V]: vocab-sharded when the output projection is (lm_head kernel
  [H, V], or the tied embedding [V, H]), else replicated."""
  if "lm_head" in params:
    vocab_axis = params["lm_head"]["kernel"].sharding.spec[1:2]
  else:
    vocab_axis = params["embed_tokens"]["embedding"].sharding.spec[:1]
  axis = vocab_axis[0] if vocab_axis else None
  return NamedSharding(mesh, P(None, axis))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
