"""A model's KV layout (messages/kv_layout.py) from its config: which layers share which pages.

A model with both kinds of layer (Gemma 2, Gemma 3: `ModelConfig.layer_window` None for global
layers, the sliding window for the others) gets m = the number of global layers slots: group 0
holds the global layers, and the sliding layers are cut, in order, into ceil(sliding / m) groups
of m (the last padded when m does not divide them), each following the window. Gemma-3-12B
(8 global, 40 sliding layers): 6 groups of 8; Gemma-3-27B (10 / 52): 7 groups of 10, 8 slots
padded; Gemma 2 (alternating): 2 groups. A model with one kind of layer (Llama; Mistral, whose
every layer slides) gets one group of all its layers, nothing freed: the layout the engine has
always had. The decoders (models/llama.py, models/gemma.py) read their layers' places from here,
the KV pool its slot count and the scheduler the windows, so all agree by construction.
"""

from __future__ import annotations

from jaxserve.messages.kv_layout import KVGroupSpec, KVLayout
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
