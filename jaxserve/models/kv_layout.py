"""A model's KV layout (messages/kv_layout.py) from its config: which layers share which pages.

A model with both kinds of layer (Gemma 2, Gemma 3: `ModelConfig.layer_window` None for global
layers, the sliding window for the others) gets m = the number of global layers slots: group 0
holds the global layers, and the sliding layers are cut, in order, into ceil(sliding / m) groups
of m (the last padded when m does not divide them), each following the window. Gemma-3-12B
(8 global, 40 sliding layers): 6 groups of 8; Gemma-3-27B (10 / 52): 7 groups of 10, 8 slots
padded; Gemma 2 (alternating): 2 groups. A model with one kind of layer (Llama; Mistral, whose
every layer slides) gets one group of all its layers, nothing freed: the layout the engine has
always had. The decoder stack (models/layers/decoder.py) reads its layers' places from here
(`LayerKV`), the KV pool its slot count (the stacked arrays' leading dimension) and the scheduler
the windows, so all agree by construction.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxserve.attention.metadata import AttentionMetadata, KVPages
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
  """The pool's slots (m): the leading dimension of its stacked K and V arrays."""
  return len(kv_groups(config)[0].layers)


class LayerKV:
  """One step's view of the stacked KV pool for the decoder's layers: layer l reads and writes
  slot j(l) of the pool's m slots with its group g(l)'s block tables and slot mapping (a
  one-group model: slot l, the tables as given). The slot goes to the layer as a traced
  int32[1] array, so equal layers of different slots share one program.

  kv_pages: (k_pool, v_pool), each [m, KV, num_pages, page_size, D]; slot_mapping int32[G, T];
  metadata.block_tables int32[G, S, pages_per_seq] (AttentionMetadata's model-level form).
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
    k_pool, v_pool = kv_pages
    if k_pool.ndim != 5 or k_pool.shape[0] != num_slots or v_pool.shape != k_pool.shape:
      raise ValueError(
        f"kv_pages: expected (k_pool, v_pool) of {num_slots} slots each ({config.num_layers} "
        f"layers in {num_groups} KV groups), got shapes {k_pool.shape} and {v_pool.shape}"
      )
    tables = metadata.block_tables
    if tables.ndim != 3 or tables.shape[0] != num_groups or slot_mapping.ndim != 2:
      raise ValueError(
        f"block_tables, slot_mapping: expected [{num_groups}, S, pages] and "
        f"[{num_groups}, T], got {tables.shape} and {slot_mapping.shape}"
      )
    self._places = layer_places(groups)
    self.pool: KVPages = (k_pool, v_pool)
    self._slot_mapping = [slot_mapping[g] for g in range(num_groups)]  # [T] each
    self._metadata = [
      dataclasses.replace(metadata, block_tables=tables[g]) for g in range(num_groups)
    ]  # block_tables [S, pages] each

  def layer(self, layer: int) -> tuple[jax.Array, jax.Array, AttentionMetadata]:
    """(kv_slot int32[1], slot_mapping [T], metadata) of `layer`."""
    group, slot = self._places[layer]
    kv_slot = jnp.full((1,), slot, jnp.int32)
    return kv_slot, self._slot_mapping[group], self._metadata[group]

  def update(self, k_pool: jax.Array, v_pool: jax.Array) -> None:
    """Stores the pool a layer returned (the next layer reads and writes it)."""
    self.pool = (k_pool, v_pool)

  def pages(self) -> KVPages:
    return self.pool
