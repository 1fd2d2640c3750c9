"""Packs a step's many small host arrays into one int32 and one float32 buffer.

Dispatching a jitted call costs a host-to-device transfer per argument; a step has some twenty
small arrays. PackedStepInputs carries them as two buffers plus a static layout (part of the
pytree's metadata, so each bucket still compiles once), and unpack() slices them back on device.
Leaves that are already device arrays (the cached empty penalty history) pass through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class LeafSpec:
  kind: str  # "int" | "float" | "device"
  dtype: str
  shape: tuple[int, ...]
  offset: int  # into the int or float buffer; index into device_leaves for "device"


@dataclass(frozen=True)
class PackedLayout:
  treedef: jax.tree_util.PyTreeDef
  leaves: tuple[LeafSpec, ...]


@dataclass(frozen=True)
class PackedStepInputs:
  layout: PackedLayout
  ints: np.ndarray  # i32[num_int_values]
  floats: np.ndarray  # f32[num_float_values]
  device_leaves: tuple[jax.Array, ...]


jax.tree_util.register_dataclass(
  PackedStepInputs, data_fields=["ints", "floats", "device_leaves"], meta_fields=["layout"]
)


_KINDS = {
  np.dtype(np.int32): ("int", "int32"),
  np.dtype(np.uint32): ("int", "uint32"),
  np.dtype(np.bool_): ("int", "bool"),
  np.dtype(np.float32): ("float", "float32"),
}


def pack(tree) -> PackedStepInputs:
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  specs, ints, floats, device_leaves = [], [], [], []
  offsets = {"int": 0, "float": 0}
  for leaf in leaves:
    if isinstance(leaf, jax.Array):
      specs.append(LeafSpec("device", str(leaf.dtype), tuple(leaf.shape), len(device_leaves)))
      device_leaves.append(leaf)
      continue
    leaf = np.asarray(leaf)
    if leaf.dtype not in _KINDS:
      raise ValueError(f"step inputs: unsupported leaf dtype {leaf.dtype}")
    kind, dtype = _KINDS[leaf.dtype]
    flat = leaf.reshape(-1)
    if dtype == "uint32":
      flat = flat.view(np.int32)
    elif dtype == "bool":
      flat = flat.astype(np.int32)
    specs.append(LeafSpec(kind, dtype, leaf.shape, offsets[kind]))
    (ints if kind == "int" else floats).append(flat)
    offsets[kind] += flat.size
  return PackedStepInputs(
    PackedLayout(treedef, tuple(specs)),
    np.concatenate(ints) if ints else np.zeros(0, np.int32),
    np.concatenate(floats) if floats else np.zeros(0, np.float32),
    tuple(device_leaves),
  )


def unpack(packed: PackedStepInputs):
  """Inside jit: rebuilds the original pytree from the buffers."""
  leaves = []
  for spec in packed.layout.leaves:
    if spec.kind == "device":
      leaves.append(packed.device_leaves[spec.offset])
      continue
    size = int(np.prod(spec.shape, dtype=np.int64))
    source = packed.ints if spec.kind == "int" else packed.floats
    flat = jax.lax.slice_in_dim(source, spec.offset, spec.offset + size)
    if spec.dtype == "uint32":
      flat = jax.lax.bitcast_convert_type(flat, jnp.uint32)
    elif spec.dtype == "bool":
      flat = flat != 0
    leaves.append(flat.reshape(spec.shape))
  return jax.tree_util.tree_unflatten(packed.layout.treedef, leaves)
