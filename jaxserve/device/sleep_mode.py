"""Sleep mode on the device side: the weights moved to host memory and back, the KV pool freed
and re-created (the host side's rules and state machine are engine/sleep_mode.py's).

Level 1 (vLLM's): `offload(params)` copies every array leaf of the weights to host memory (numpy,
one transfer a leaf, all started before the first is waited for), remembers its sharding and
deletes the device array, so its device memory is released even if something else still holds a
reference to it; `restore(host)` puts each leaf back on the device with the sharding it had
(`jax.device_put` onto the same Sharding object), so every step program, compiled for those
shapes, dtypes and shardings, runs again without compiling. `release(tree)` deletes the KV pool's
arrays; the pool comes back from the KVPoolMaker that built it (device/kv_cache.py: the same
jitted program, zero-filled pages), since the host side resets its allocator and prefix cache
(no page holds anything worth keeping). A leaf that is not a jax.Array (a Python number) stays
as it is.

Freed means freed to the JAX client: its bytes in use drop, and other JAX work in the process
can use them. On a GPU the client pre-allocates its arena (device/client_memory.py) and keeps it,
so the driver (nvidia-smi, another process) sees no change; giving the memory to another process
would need XLA_PYTHON_CLIENT_ALLOCATOR=platform, which allocates every step's buffers from the
driver.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np


@dataclass(frozen=True)
class HostLeaf:
  """One weight array in host memory and where it lived: `sharding` None for an uncommitted
  array (it goes back to the default device, uncommitted, as it was)."""

  value: np.ndarray
  sharding: jax.sharding.Sharding | None


@dataclass(frozen=True)
class HostTree:
  """A pytree of weights held on the host while the engine sleeps."""

  treedef: jax.tree_util.PyTreeDef
  leaves: tuple[HostLeaf | object, ...]  # HostLeaf for each device array, else the leaf itself


def offload(tree) -> HostTree:
  """The tree's arrays copied to host memory; the device arrays are deleted. An array that
  sits at several leaves is copied once and comes back as one array."""
  leaves, treedef = jax.tree.flatten(tree)
  arrays = list({id(x): x for x in leaves if isinstance(x, jax.Array)}.values())
  for array in arrays:
    array.copy_to_host_async()
  host = {
    id(array): HostLeaf(value, array.sharding if array.committed else None)
    for array, value in zip(arrays, jax.device_get(arrays), strict=True)
  }
  release(arrays)
  return HostTree(treedef, tuple(host.get(id(leaf), leaf) for leaf in leaves))


def restore(host: HostTree):
  """The tree back on the device, each array with the sharding it had."""
  placed: dict[int, jax.Array] = {}

  def put(leaf):
    if not isinstance(leaf, HostLeaf):
      return leaf
    if id(leaf) not in placed:
      placed[id(leaf)] = jax.device_put(leaf.value, leaf.sharding)
    return placed[id(leaf)]

  leaves = [put(leaf) for leaf in host.leaves]
  return jax.block_until_ready(jax.tree.unflatten(host.treedef, leaves))


def release(tree) -> None:
  """Deletes every device array of `tree` (its memory returns to the device at once)."""
  for leaf in jax.tree.leaves(tree):
    if isinstance(leaf, jax.Array) and not leaf.is_deleted():
      leaf.delete()
