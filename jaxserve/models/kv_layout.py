"""A model's KV layout (messages/kv_layout.py) from its config: which layers share which pages.

A model with both kinds of layer (Gemma 2, Gemma 3: `ModelConfig.layer_window` None for global
layers, the sliding window for the others) gets m = the number of global layers slots: group 0
holds the global layers, and the sliding layers are cut, in order, into ceil(sliding / m) groups
of m (the last padded when m does not divide them), each following the window. Gemma-3-12B
(8 global, 40 sliding layers): 6 groups of 8; Gemma-3-27B (10 / 52): 7 groups of 10, 8 slots
padded; Gemma 2 (alternating): 2 groups. A model with one kind of layer (Llama; Mistral, whose
every layer slides) gets one group of all its layers, nothing freed: the layout the engine has
always had. The decoder stack (models/layers/decoder.py) reads its layers' places from here
(`LayerKV`), the KV pool its slot count and the scheduler the windows, so all agree by
construction.
"""

from __future__ import annotations

import dataclasses

import jax

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
  """The pool's K/V array pairs (m)."""
  return len(kv_groups(config)[0].layers)


class LayerKV:
  """One step's view of the KV pool for the decoder's layers: layer l reads and writes slot
  j(l) of the pool's m pairs with its group g(l)'s block tables and slot mapping, and hands
  them to the unchanged attention backend (a one-group model: slot l, the tables as given).

  kv_pages: m (k, v) pairs, each [KV, num_pages, page_size, D]; slot_mapping int32[G, T];
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
    if len(kv_pages) != num_slots:
      raise ValueError(
        f"kv_pages: expected {num_slots} (k, v) slot pairs ({config.num_layers} layers in "
        f"{num_groups} KV groups), got {len(kv_pages)}"
      )
    tables = metadata.block_tables
    if tables.ndim != 3 or tables.shape[0] != num_groups or slot_mapping.ndim != 2:
      raise ValueError(
        f"block_tables, slot_mapping: expected [{num_groups}, S, pages] and "
        f"[{num_groups}, T], got {tables.shape} and {slot_mapping.shape}"
      )
    self._places = layer_places(groups)
    self._pages = list(kv_pages)
    self._slot_mapping = [slot_mapping[g] for g in range(num_groups)]  # [T] each
    self._metadata = [
      dataclasses.replace(metadata, block_tables=tables[g]) for g in range(num_groups)
    ]  # block_tables [S, pages] each

  def layer(self, layer: int) -> tuple[jax.Array, jax.Array, jax.Array, AttentionMetadata]:
    """(k_pages, v_pages, slot_mapping [T], metadata) of `layer`."""
    group, slot = self._places[layer]
    k_pages, v_pages = self._pages[slot]
    return k_pages, v_pages, self._slot_mapping[group], self._metadata[group]

  def update(self, layer: int, k_pages: jax.Array, v_pages: jax.Array) -> None:
    """Stores the pages `layer` wrote (the next layer of its slot reads them)."""
    self._pages[self._places[layer][1]] = (k_pages, v_pages)

  def pages(self) -> KVPages:
    return tuple(self._pages)
