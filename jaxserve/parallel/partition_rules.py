"""The partition rules: how every param and the KV pages are laid out over the `model` axis.

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

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.parallel.mesh import MODEL_AXIS

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
)
VOCAB_PARAMS = r"^(embed_tokens/embedding|lm_head/kernel)$"
KV_PAGES_SPEC = P(MODEL_AXIS, None, None, None)  # [num_kv_heads, num_pages, page_size, head_dim]


def param_spec(
  path: ParamPath, shape: tuple[int, ...], mesh_size: int, shard_vocab: bool = True
) -> P:
  """The PartitionSpec of the param at `path`; ValueError if no rule matches it."""
  name = "/".join(path)
  if not shard_vocab and re.search(VOCAB_PARAMS, name):
    return P()
  for pattern, spec in PARAM_RULES:
    if re.search(pattern, name):
      return _divisible(spec, shape, mesh_size)
  raise ValueError(f"params: no partition rule matches {name!r} (shape {shape})")


def _divisible(spec: P, shape: tuple[int, ...], mesh_size: int) -> P:
  if len(spec) > len(shape):
    raise ValueError(f"partition rule {spec} has more axes than the param shape {shape}")
  axes = [
    axis if axis is None or shape[i] % mesh_size == 0 else None for i, axis in enumerate(spec)
  ]
  return P(*axes)


def param_shardings(abstract_params: dict, mesh: Mesh, shard_vocab: bool = True) -> dict:
  """A NamedSharding for every leaf of a params tree (arrays or ShapeDtypeStructs)."""
  size = mesh.shape[MODEL_AXIS]

  def leaf(key_path, x) -> NamedSharding:
    path = tuple(str(getattr(k, "key", k)) for k in key_path)
    return NamedSharding(mesh, param_spec(path, tuple(x.shape), size, shard_vocab))

  return jax.tree_util.tree_map_with_path(leaf, abstract_params)


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
