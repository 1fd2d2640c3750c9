"""A model's KV layout (messages/kv_layout.py) from its config: which layers share which pages.

A model with both kinds of layer (Gemma 2, Gemma 3: `ModelConfig.layer_window` None for global
layers, the sliding window for the others) gets m = the number of global layers slots: group 0
holds the global layers, and the sliding layers are cut, in order, into ceil(sliding / m) groups
of m (the last padded when m does not divide them), each following the window. Gemma-3-12B
(8 global, 40 sliding layers): 6 groups of 8; Gemma-3-27B (10 / 52): 7 groups of 10, 8 slots
padded; Gemma 2 (alternating): 2 groups. A model with one kind of layer (Llama; Mistral, whose
every layer slides) gets one group of all its layers, nothing freed: the layout the engine has
always had. The decoder stack (models/layers/decoder.py) reads its layers' places from here
(`LayerKV`), the KV pool its slot count m and the scheduler the windows, so all agree by
construction.

The pool stacks the m slots into equal groups of slots, each a (k_pool, v_pool) pair
[slots_per_group, KV, num_pages, page_size, D] (attention/metadata.py KVPages; device/kv_cache.py
chooses the group size). `LayerKV` places slot j at index j % slots_per_group of group
j // slots_per_group, reading slots_per_group from the pool's own shapes: the layer gets its
group's pair (chosen here, statically, outside the layer's program) and its index in the group as
a traced int32[1], so equal layers of any slot share one program.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxserve.attention.metadata import AttentionMetadata, KVPages, KVSlotGroup
from jaxserve.messages.kv_layout import KVGroupSpec, KVLayout, layer_places
from jaxserve.models.model_config import ModelConfig


def kv_groups(config: ModelConfig) -> tuple[KVGroupSpec, ...]:
  """The KV groups of `config`'s layers (module docstring)."""
  windows = [config.layer_window(layer) for layer in range(config.num_layers)]
  full = tuple(layer for layer, window in enumerate(windows) if window is None)
  sliding = [layer for layer, window in enumerate(windows) if window is not None]
  if not full or not sliding:
    return (KVGroupSpec(None, tuple(range(config.num_layers))),)
  size = len(full)
  return (KVGroupSpec(None, full),) + tuple(
    KVGroupSpec(config.sliding_window, tuple(sliding[start : start + size]))
    for start in range(0, len(sliding), size)
  )


def kv_layout(config: ModelConfig, page_size: int) -> KVLayout:
  """The layout the engine's pool, scheduler and step programs share."""
  return KVLayout(page_size, kv_groups(config))


def num_kv_slots(config: ModelConfig) -> int:
  """The pool's slots (m), all its groups together."""
  return len(kv_groups(config)[0].layers)


class LayerKV:
  """One step's view of the KV pool for the decoder's layers: layer l reads and writes slot j(l)
  of the pool's m slots with its KV group g(l)'s block tables and slot mapping (a one-group model:
  slot l, the tables as given). Slot j is index j % c of the pool's group j // c, c the groups'
  leading dimension (module docstring).

  kv_pages: groups of (k_pool, v_pool), each [c, KV, num_pages, page_size, D], c * len(kv_pages)
  = m; slot_mapping int32[G, T]; metadata.block_tables int32[G, S, pages_per_seq]
  (AttentionMetadata's model-level form).
  """

  def __init__(
    self,
    config: ModelConfig,
    kv_pages: KVPages,
    slot_mapping: jax.Array,
    metadata: AttentionMetadata,
  ) -> None:
    groups = kv_groups(config)
    num_slots, num_groups = len(groups[0].layers), len(groups)
    shapes = [(k_pool.shape, v_pool.shape) for k_pool, v_pool in kv_pages]
    group_shape = shapes[0][0] if shapes else ()
    per_group = group_shape[0] if len(group_shape) == 5 else 0
    if per_group * len(shapes) != num_slots or any(s != (group_shape,) * 2 for s in shapes):
      raise ValueError(
        f"kv_pages: expected equal (k_pool, v_pool) groups of 5-D arrays, {num_slots} slots in "
        f"all ({config.num_layers} layers in {num_groups} KV groups), got shapes {shapes}"
      )
    tables = metadata.block_tables
    if tables.ndim != 3 or tables.shape[0] != num_groups or slot_mapping.ndim != 2:
      raise ValueError(
        f"block_tables, slot_mapping: expected [{num_groups}, S, pages] and "
        f"[{num_groups}, T], got {tables.shape} and {slot_mapping.shape}"
      )
    self._places = layer_places(groups)
    self._per_group = per_group
    self._pool: list[KVSlotGroup] = list(kv_pages)
    self._slot_mapping = [slot_mapping[g] for g in range(num_groups)]  # [T] each
    self._metadata = [
      dataclasses.replace(metadata, block_tables=tables[g]) for g in range(num_groups)
    ]  # block_tables [S, pages] each

  def pool_place(self, layer: int) -> tuple[int, int]:
    """(the pool group, the index in it) of `layer`'s slot."""
    return divmod(self._places[layer][1], self._per_group)

  def layer(
    self, layer: int
  ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, AttentionMetadata]:
    """(k_pool, v_pool, kv_slot int32[1], slot_mapping [T], metadata) of `layer`: its pool
    group's arrays and its index in them."""
    kv_group = self._places[layer][0]
    pool_group, index = self.pool_place(layer)
    k_pool, v_pool = self._pool[pool_group]
    kv_slot = jnp.full((1,), index, jnp.int32)
    return k_pool, v_pool, kv_slot, self._slot_mapping[kv_group], self._metadata[kv_group]

  def update(self, layer: int, k_pool: jax.Array, v_pool: jax.Array) -> None:
    """Stores the group arrays `layer` returned (the next layer of that group reads them)."""
    self._pool[self.pool_place(layer)[0]] = (k_pool, v_pool)

  def pages(self) -> KVPages:
    return tuple(self._pool)
