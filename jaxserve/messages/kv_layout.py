"""How a model's layers share the KV pool's pages: the KV layout. Pure Python, no jax.

Layers form KV-cache groups of equal size m (the slots). The pool holds m pairs of K/V arrays,
each [kv heads, N pages, page size, head dim]; layer l reads and writes slot j(l) of its group
g(l) (`KVLayout.places`). Page id n means page n in all m slot arrays, and it belongs to one group
of one request (or is shared within that group through the prefix cache), so a page costs
2 * m * kv heads * page size * head dim * itemsize bytes whatever the group.

Group 0 keeps every position (window None): the layers that attend over the whole context, or
every layer when the model has one kind of layer (Llama, Mistral: one group, m = the number of
layers, today's layout). Every other group holds sliding-window layers of one window: their
queries read only the last `window` positions, so a request keeps only the pages that a future
query can still see. Each group has its own block table per request, all of equal length and
positional (entry i covers positions [i * page_size, (i + 1) * page_size)); a sliding group's
entries wholly before the window hold the null page. The model side builds the layout from its
config (models/kv_layout.py); the host reads the windows, the device the places.
"""

from __future__ import annotations

from dataclasses import dataclass


def _ceil_div(a: int, b: int) -> int:
  return -(-a // b)


@dataclass(frozen=True)
class KVGroupSpec:
  """One KV-cache group: its layers in slot order and the window its pages follow."""

  window: int | None  # None: every position is kept (group 0 only)
  layers: tuple[int, ...]  # layer indices; layers[j] uses slot j (fewer than m: padded)


@dataclass(frozen=True)
class KVLayout:
  """The model's KV groups over one pool of `page_size`-token pages (module docstring)."""

  page_size: int
  groups: tuple[KVGroupSpec, ...]

  def __post_init__(self) -> None:
    if not isinstance(self.page_size, int) or self.page_size < 1:
      raise ValueError(f"page_size: must be a positive integer, got {self.page_size!r}")
    if not self.groups or self.groups[0].window is not None:
      raise ValueError("groups: group 0 keeps every position (window None)")
    if not self.groups[0].layers:
      raise ValueError("groups: group 0 has no layers")
    for spec in self.groups[1:]:
      if not isinstance(spec.window, int) or spec.window < 1:
        raise ValueError(f"groups: a sliding group needs a positive window, got {spec.window!r}")
      if not 0 < len(spec.layers) <= self.num_slots:
        raise ValueError(f"groups: a group holds 1 to {self.num_slots} layers, got {spec.layers}")
    layers = sorted(layer for spec in self.groups for layer in spec.layers)
    if layers != list(range(len(layers))):
      raise ValueError(f"groups: every layer in exactly one group, got {self.groups}")

  @classmethod
  def single(cls, page_size: int, num_layers: int) -> KVLayout:
    """One group of every layer, each its own slot, nothing freed (one kind of layer)."""
    return cls(page_size, (KVGroupSpec(None, tuple(range(num_layers))),))

  @property
  def num_groups(self) -> int:
    return len(self.groups)

  @property
  def num_slots(self) -> int:
    """m: the K/V array pairs of the pool, each page id indexing all of them."""
    return len(self.groups[0].layers)

  @property
  def num_layers(self) -> int:
    return sum(len(spec.layers) for spec in self.groups)

  @property
  def windows(self) -> tuple[int, ...]:
    """The sliding groups' windows, group 1 first (empty with one group)."""
    return tuple(spec.window for spec in self.groups[1:])

  @property
  def places(self) -> tuple[tuple[int, int], ...]:
    """(group, slot) of each layer, layer 0 first."""
    return layer_places(self.groups)

  def pages_held(self, num_tokens: int) -> int:
    """Pages a sequence of num_tokens cached tokens holds between steps: every page of group 0
    and, per sliding group, those its next query can still see."""
    full = _ceil_div(num_tokens, self.page_size)
    return full + sum(
      min(full, _ceil_div(window - 1, self.page_size) + 1) for window in self.windows
    )

  def max_pages(self, num_tokens: int, chunk: int) -> int:
    """The most pages a request of num_tokens tokens (prompt + max_tokens) holds at once when a
    step computes at most `chunk` of its tokens: a sliding group allocates the pages of a whole
    chunk and of the window before its first query."""
    full = _ceil_div(num_tokens, self.page_size)
    return full + sum(
      min(full, _ceil_div(window - 1 + chunk, self.page_size) + 1) for window in self.windows
    )


def layer_places(groups: tuple[KVGroupSpec, ...]) -> tuple[tuple[int, int], ...]:
  """(group, slot) of each layer of `groups`, layer 0 first (the device side's view: it needs no
  page size)."""
  places = {layer: (g, j) for g, spec in enumerate(groups) for j, layer in enumerate(spec.layers)}
  return tuple(places[layer] for layer in range(len(places)))
