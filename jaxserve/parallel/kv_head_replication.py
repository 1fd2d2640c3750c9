"""A loaded model's k/v projections repeated head by head, for a mesh with more devices than kv
heads (partition_rules.with_replicated_kv_heads).

A checkpoint with KV kv heads served on tp = KV * r devices runs as a model of tp kv heads in which
head n is the checkpoint's head n // r: every device then holds one whole kv head (the one its
query heads read) and that head's KV pages, the layout vLLM gives such models. This module turns
the params loaded for the checkpoint's config into the params of that config: each layer's
k_proj and v_proj leaves are repeated along their head axis, on the devices, by one jitted
function per leaf shape whose output carries the expanded leaf's partition-rule sharding:

  float kernel [H, KV*D]             -> [H, tp*D]     (head axis 1)
  quantized kernel [KV*D, H]         -> [tp*D, H]     (head axis 0; the projection has a scale)
  bias, scale [KV*D]                 -> [tp*D]

Every other leaf keeps its array (its shape and rule do not depend on the kv heads).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxserve.models.registry import LoadedModel
from jaxserve.parallel.partition_rules import (
  MODEL_AXIS,
  is_quantized_projection,
  kv_head_replicas,
  with_replicated_kv_heads,
)

KV_PROJECTIONS = ("k_proj", "v_proj")


def repeat_heads(x: jax.Array, axis: int, num_heads: int, replicas: int) -> jax.Array:
  """x with its `axis` of num_heads heads [..., num_heads*D, ...] -> [..., num_heads*replicas*D,
  ...], head n of the result being head n // replicas of x."""
  head_dim = x.shape[axis] // num_heads
  heads = x.reshape(x.shape[:axis] + (num_heads, head_dim) + x.shape[axis + 1 :])
  repeated = jnp.repeat(heads, replicas, axis=axis)  # [..., num_heads*replicas, D, ...]
  return repeated.reshape(x.shape[:axis] + (num_heads * replicas * head_dim,) + x.shape[axis + 1 :])


def replicate_kv_heads(loaded: LoadedModel, mesh: Mesh, target_shapes: dict) -> LoadedModel:
  """`loaded` (params of the checkpoint's config) as the model with_replicated_kv_heads runs on
  `mesh`; unchanged when every device holds whole kv heads of its own. `target_shapes`: the
  expanded config's sharded abstract params (parallel/sharded_loading.sharded_param_shapes)."""
  tp = mesh.shape[MODEL_AXIS]
  replicas = kv_head_replicas(loaded.config, tp)
  if replicas == 1:
    return loaded
  num_heads = loaded.config.num_kv_heads
  jitted: dict[tuple[int, jax.sharding.Sharding], Callable[[jax.Array], jax.Array]] = {}

  def repeat(x: jax.Array, axis: int, sharding: jax.sharding.Sharding) -> jax.Array:
    if (axis, sharding) not in jitted:  # one compilation per head axis and output layout
      body = functools.partial(repeat_heads, axis=axis, num_heads=num_heads, replicas=replicas)
      jitted[(axis, sharding)] = jax.jit(body, out_shardings=sharding)
    return jitted[(axis, sharding)](x)

  params = dict(loaded.params)
  for layer in range(loaded.config.num_layers):
    name = f"layers_{layer}"
    attention = dict(params[name]["self_attn"])
    for projection in KV_PROJECTIONS:
      leaves = attention[projection]
      kernel_axis = 0 if is_quantized_projection(leaves, projection) else 1
      targets = target_shapes[name]["self_attn"][projection]
      attention[projection] = {
        leaf: repeat(value, kernel_axis if leaf == "kernel" else 0, targets[leaf].sharding)
        for leaf, value in leaves.items()
      }
    params[name] = {**params[name], "self_attn": attention}
  config = with_replicated_kv_heads(loaded.config, tp)
  return LoadedModel(config, params, loaded.source, loaded.packed)
