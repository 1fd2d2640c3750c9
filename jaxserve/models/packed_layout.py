"""The packed device-memory layout of the weight transfer (models/weight_transfer.py;
`TransferOptions.layout`).

A raw tensor freed after its conversion leaves a hole between the converted weights; streamed one
tensor at a time ("streaming"), the holes are memory the KV pool cannot use
(device_memory.LOADER_SLACK_SHARE; measured: docs/DECISIONS.md). The "packed" layout leaves
none. The jobs (in disk order) are split into groups, and for each group in turn: (1) a
placeholder of the group's converted bytes plus PACK_MARGIN is allocated, (2) the group's raw
tensors are put after it, (3) the placeholder is freed and each of the group's leaves converted,
in order and each waited for (its scratch, if XLA gives it any, is freed before the next leaf is
allocated), into that hole, (4) the group's raw tensors are freed. XLA's GPU allocator is best-fit
(the hole is the smallest free block that fits each leaf) and splits a block only when what
would be left is at least the request or at least 128 MiB (else it hands over the whole block):
the margin keeps every leaf's leftover at least that large, so each leaf is split off the hole's
front (in whatever order the leaves are allocated), and what is left of the hole (the margin)
lies against the raw tensors and joins them, and the free tail, in one block once they are
freed. The next group's placeholder is split off the front of that block: right after the
previous group's last leaf, so the groups' leaves lie end to end and the load leaves no hole,
whatever the number of groups. The only transient is the current group's raw tensors and
margin, all in the free block after the weights once the group is done.

The groups (`pack_groups`, the rule): a group needs its raw tensors and its hole on the device
beside the earlier groups' leaves, and the free block after its raw tensors must stay larger
than the hole (else best-fit would pick that block): placed + raw + 2 x hole < free, all bytes
per device (tensor-parallel leaves count their shards, and every device of the mesh gets its
own placeholder). Each group takes jobs while that holds (and, with `TransferOptions.group_bytes`,
while its converted bytes stay within that bound): one group when everything fits at once, as
many as the free memory needs otherwise (a MoE's weights at over a third of the device). "auto"
packs on GPUs of one host with memory statistics where every job fits a group of its own, and
streams otherwise: on several hosts (each would decide alone), on TPUs (whose allocator this
reasoning does not describe) and when a single leaf does not fit. device_memory.loader_slack
charges each layout its own slack.
"""

from __future__ import annotations

import concurrent.futures as futures
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxserve.models.leaf_load import ParamPath
from jaxserve.models.transfer_jobs import TransferJob, jit_to, put_raw
from jaxserve.runtime.memory_stats import free_bytes

# a job's raw tensors on its device(s) from the job and its files' mapping futures
RawTask = Callable[[TransferJob, list[futures.Future]], list[jax.Array]]
# put_all(jobs, task): task(job, its mapped files) for every job, the results in job order
PutAll = Callable[[Sequence[TransferJob], RawTask], list[list[jax.Array]]]

ALLOC_ALIGN = 256  # the GPU allocator rounds every buffer up to this many bytes
SPLIT_THRESHOLD = 128 << 20  # the allocator splits a free block if the rest is at least this
PACK_MARGIN = SPLIT_THRESHOLD + (4 << 20)  # placeholder bytes beyond the leaves' (rounded) sizes
PLACEHOLDER_BLOCK = 1 << 30


def packed_fits(placed_bytes: int, raw_bytes: int, out_bytes: int, free_bytes: int) -> bool:
  """Whether a group of `raw_bytes` raw tensors and `out_bytes` converted ones packs after
  `placed_bytes` of earlier groups' leaves, `free_bytes` being free before the load: its
  placeholder and raw tensors fit and the free block after them stays larger than the hole, so
  best-fit picks the hole for every leaf. All bytes per device."""
  return placed_bytes + raw_bytes + 2 * (out_bytes + PACK_MARGIN) < free_bytes


def pack_groups(
  raw_bytes: Sequence[int],
  out_bytes: Sequence[int],
  free_bytes: int | None,
  group_bytes: int | None = None,
) -> tuple[int, ...] | None:
  """How many jobs (in order) each group of the packed layout holds, each group as large as
  packed_fits allows (no bound where free_bytes is None) and, with group_bytes, at most that
  many converted bytes unless one job alone is larger; None when a job does not fit alone.
  raw_bytes / out_bytes: each job's (aligned) bytes per device."""
  groups: list[int] = []
  placed = raw = out = count = 0

  def fits(raw: int, out: int) -> bool:
    return free_bytes is None or packed_fits(placed, raw, out, free_bytes)

  for job_raw, job_out in zip(raw_bytes, out_bytes, strict=True):
    bounded = group_bytes is not None and out + job_out > group_bytes
    if count and (bounded or not fits(raw + job_raw, out + job_out)):
      groups.append(count)  # the group is closed: its leaves are placed
      placed, raw, out, count = placed + out, 0, 0, 0
    if not fits(raw + job_raw, out + job_out):
      return None
    raw, out, count = raw + job_raw, out + job_out, count + 1
  return tuple(groups + [count] if count else groups)


def plan_packing(
  jobs: Sequence[TransferJob], mesh: Mesh | None | bool, layout: str, group_bytes: int | None
) -> tuple[int, ...] | None:
  """The packed layout's groups for `layout` (layout_groups), or None to stream (`mesh`:
  one_mesh(jobs))."""
  if layout == "packed" and mesh is False:
    raise ValueError(
      "layout: 'packed' needs every leaf on the default device or every leaf on one mesh"
    )
  if layout == "streaming" or (layout == "auto" and (mesh is False or jax.process_count() > 1)):
    return None  # every host must decide alike: stream
  devices = [jax.devices()[0]] if mesh is None else list(mesh.devices.flat)
  raw = [sum(aligned(nbytes) for nbytes in job.raw_device_bytes()) for job in jobs]
  out = [aligned(job.out_device_bytes()) for job in jobs]
  return layout_groups(
    layout, devices[0].platform, raw, out, _free_device_bytes(devices), group_bytes
  )


def layout_groups(
  layout: str,
  platform: str,
  raw_bytes: Sequence[int],
  out_bytes: Sequence[int],
  free_bytes: int | None,
  group_bytes: int | None = None,
) -> tuple[int, ...] | None:
  """The rule (module docstring): "auto" packs (pack_groups) on a GPU with memory statistics
  (free_bytes not None) where every job fits a group, else streams (None); "packed" packs
  wherever it can be placed (free memory bounds its groups where it is known) and is a
  ValueError where a job does not fit. Bytes per device, each job's aligned."""
  if layout == "auto" and (platform != "gpu" or free_bytes is None):
    return None  # another allocator, or no statistics to plan with
  groups = pack_groups(raw_bytes, out_bytes, free_bytes, group_bytes)
  if groups is None and layout == "packed":
    raise ValueError(
      f"layout: 'packed' does not fit: a leaf's raw tensors and twice its converted bytes "
      f"exceed what is free beside the weights ({free_bytes / 2**30:.2f} GiB free per device)"
    )
  return groups


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
  jobs: Sequence[TransferJob], groups: Sequence[int], mesh: Mesh | None, put_all: PutAll
) -> dict[ParamPath, jax.Array]:
  """The packed layout (module docstring), group after group (`groups`: plan_packing's job
  counts); on the default device (mesh None) or on every device of the leaves' mesh alike."""
  outs: dict[ParamPath, jax.Array] = {}
  copies: dict = {}  # a leaf stored as it is on disk still gets a new buffer, in the hole
  start = 0
  for count in groups:
    outs.update(_pack_group(jobs[start : start + count], mesh, put_all, copies))
    start += count
  return outs


def _pack_group(
  jobs: Sequence[TransferJob], mesh: Mesh | None, put_all: PutAll, copies: dict
) -> dict[ParamPath, jax.Array]:
  """Placeholder, raw tensors, converted leaves into the placeholder's hole, raw tensors freed."""
  per_device = sum(aligned(job.out_device_bytes()) for job in jobs) + PACK_MARGIN
  placeholder = _reserve(per_device, mesh)
  raws = put_all(
    jobs, lambda job, mapped: [jax.block_until_ready(raw) for raw in put_raw(job, mapped)]
  )
  for block in placeholder:
    block.delete()
  outs = {}
  for job, raw in zip(jobs, raws, strict=True):
    convert = job.convert
    if convert is None:
      if job.target not in copies:
        copies[job.target] = jit_to(lambda x: jnp.copy(x), job.target)
      convert = copies[job.target]
    # one at a time: a conversion's scratch is freed before the next leaf is allocated, so it
    # leaves no hole between them
    outs[job.leaf.path] = jax.block_until_ready(convert(*raw))
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
