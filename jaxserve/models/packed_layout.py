"""The packed device-memory layout of the weight transfer (models/weight_transfer.py;
`TransferOptions.layout`).

A raw tensor freed after its conversion leaves a hole between the converted weights; streamed one
tensor at a time ("streaming"), the holes are memory the KV pool cannot use
(device_memory.LOADER_SLACK_SHARE; measured: docs/DECISIONS.md). The "packed" layout leaves
none: (1) a placeholder of the converted weights' bytes plus PACK_MARGIN is allocated, (2) every
raw tensor is put after it, (3) the placeholder is freed and every leaf converted, in order, into
that hole, (4) the raw tensors are freed. XLA's GPU allocator is best-fit (the hole is the
smallest free block that fits each leaf) and splits a block only when what would be left is at
least the request or at least 128 MiB (else it hands over the whole block): the margin keeps
every leaf's leftover at least that large, so each leaf is split off the hole's front (in
whatever order the leaves are allocated), and what is left of the hole (the margin) lies against
the raw tensors and joins them, and the free tail, in one block once they are freed. It needs
the raw and the converted weights on the device at once (about twice the weights), and the free
block after the raw tensors must stay larger than the hole (else best-fit would pick that
block), so "auto" packs on GPUs whose free memory exceeds the raw weights plus twice the
converted ones (per device: tensor-parallel leaves count their shards, and every device of the
mesh gets its own placeholder), and streams otherwise: on several hosts (each would decide
alone) and on TPUs, whose allocator this reasoning does not describe. `packed_fits` is that rule;
device_memory.loader_slack charges each layout its own slack.
"""

from __future__ import annotations

import concurrent.futures as futures
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxserve.memory_stats import free_bytes
from jaxserve.models.leaf_load import ParamPath
from jaxserve.models.transfer_jobs import TransferJob, jit_to, put_raw

# a job's raw tensors on its device(s) from the job and its files' mapping futures
RawTask = Callable[[TransferJob, list[futures.Future]], list[jax.Array]]

ALLOC_ALIGN = 256  # the GPU allocator rounds every buffer up to this many bytes
SPLIT_THRESHOLD = 128 << 20  # the allocator splits a free block if the rest is at least this
PACK_MARGIN = SPLIT_THRESHOLD + (4 << 20)  # placeholder bytes beyond the leaves' (rounded) sizes
PLACEHOLDER_BLOCK = 1 << 30


def packed_fits(platform: str, raw_bytes: int, out_bytes: int, free_bytes: int | None) -> bool:
  """Whether "auto" packs: on a GPU (the layout follows how XLA's GPU allocator places buffers;
  other platforms' allocators differ) with memory statistics (free_bytes not None) where the
  placeholder and the raw tensors fit and the free block after them stays larger than the
  placeholder's hole, so best-fit picks the hole for every leaf. All bytes per device."""
  if platform != "gpu" or free_bytes is None:
    return False
  hole = out_bytes + PACK_MARGIN
  return raw_bytes + 2 * hole < free_bytes


def use_packed(jobs: Sequence[TransferJob], mesh: Mesh | None | bool, layout: str) -> bool:
  """Whether to pack (`mesh`: one_mesh(jobs))."""
  if layout == "packed" and mesh is False:
    raise ValueError(
      "layout: 'packed' needs every leaf on the default device or every leaf on one mesh"
    )
  if layout != "auto":
    return layout == "packed"
  if mesh is False or jax.process_count() > 1:  # every host must decide alike: stream
    return False
  devices = [jax.devices()[0]] if mesh is None else list(mesh.devices.flat)
  raw = sum(aligned(nbytes) for job in jobs for nbytes in job.raw_device_bytes())
  out = sum(aligned(job.out_device_bytes()) for job in jobs)
  return packed_fits(devices[0].platform, raw, out, _free_device_bytes(devices))


def one_mesh(jobs: Sequence[TransferJob]) -> Mesh | None | bool:
  """None when every leaf goes to the default device, the mesh when every leaf is a
  NamedSharding over one mesh, else False (a layout the packed path does not handle)."""
  targets = {job.target for job in jobs}
  if targets == {None}:
    return None
  meshes = {target.mesh for target in targets if isinstance(target, NamedSharding)}
  if len(meshes) != 1 or not all(isinstance(target, NamedSharding) for target in targets):
    return False
  return meshes.pop()


def _free_device_bytes(devices: Sequence[jax.Device]) -> int | None:
  """The least free memory among `devices` (None when one reports no statistics)."""
  free = [free_bytes(device) for device in devices]
  return None if None in free else min(free)


def aligned(num_bytes: int) -> int:
  return -(-num_bytes // ALLOC_ALIGN) * ALLOC_ALIGN


def run_packed(
  jobs: Sequence[TransferJob],
  mesh: Mesh | None,
  put_all: Callable[[RawTask], list[list[jax.Array]]],
) -> dict[ParamPath, jax.Array]:
  """The packed layout (module docstring): placeholder, raw tensors, converted leaves into the
  placeholder's hole, raw tensors freed; on the default device (mesh None) or on every device
  of the leaves' mesh alike. put_all(task): task(job, its mapped files) run for every job, the
  results in job order (weight_transfer's windowed pool)."""
  per_device = sum(aligned(job.out_device_bytes()) for job in jobs) + PACK_MARGIN
  placeholder = _reserve(per_device, mesh)
  raws = put_all(lambda job, mapped: [jax.block_until_ready(raw) for raw in put_raw(job, mapped)])
  for block in placeholder:
    block.delete()
  copies: dict = {}  # a leaf stored as it is on disk still gets a new buffer, in the hole
  outs = {}
  for job, raw in zip(jobs, raws):
    convert = job.convert
    if convert is None:
      if job.target not in copies:
        copies[job.target] = jit_to(lambda x: jnp.copy(x), job.target)
      convert = copies[job.target]
    outs[job.leaf.path] = convert(*raw)
  jax.block_until_ready(list(outs.values()))
  for raw in raws:
    for array in raw:
      array.delete()
  return outs


def _reserve(bytes_per_device: int, mesh: Mesh | None) -> list[jax.Array]:
  """bytes_per_device on the default device (mesh None) or on every device of `mesh`, in blocks
  of at most PLACEHOLDER_BLOCK per device, allocated one after another (contiguous in a fresh
  arena)."""
  sizes = [PLACEHOLDER_BLOCK] * (bytes_per_device // PLACEHOLDER_BLOCK)
  sizes += [bytes_per_device % PLACEHOLDER_BLOCK] if bytes_per_device % PLACEHOLDER_BLOCK else []
  if mesh is None:
    zeros = jax.jit(lambda size: jnp.zeros((size,), jnp.uint8), static_argnums=0)
  else:  # one flat axis split over every device of the mesh
    sharding = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
    zeros = jax.jit(
      lambda size: jnp.zeros((size * mesh.devices.size,), jnp.uint8),
      static_argnums=0,
      out_shardings=sharding,
    )
  return [jax.block_until_ready(zeros(size)) for size in sizes]
