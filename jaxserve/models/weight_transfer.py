"""Moves checkpoint tensors onto the devices as they are on disk, then converts them there.

Each tensor goes to the device(s) untouched: a zero-copy numpy view of the mmapped file
(safetensors_reader) is handed to the transfer, so the only host-side pass over the bytes is the
copy into the device's staging buffer. HF Linear weights are [out, in] and flax kernels [in, out]
(a quantized kernel stays [out, in]: models/quantized_loading.py): the transpose, a cast to the
model dtype and, for a merged projection (models/fused_projections), the concatenation of its
parts run on the device as one small jitted function per kind (jit specializes it per shape).
When tensor-parallel, the raw tensor is placed with the transposed sharding of its target
(`make_array_from_callback`: each device, on every host, receives only its slice) and transposed
locally into the target sharding, so no device ever holds or receives a whole sharded weight.
A custom conversion (LeafLoad.convert: a projection quantized as it loads) is jitted with its
outputs' target shardings; its raw parts are placed with the first output's sharding where they
have its rank and the sharded dimensions divide (a kernel [out, in] as stored), else replicated
(a checkpoint's scales, tiny), and XLA's partitioner runs the conversion on the shards (a
per-row maximum over a split `in` axis is one all-reduce).

Device memory layout (`TransferOptions.layout`). A raw tensor freed after its conversion leaves
a hole between the converted weights; streamed one tensor at a time ("streaming"), the holes are
memory the KV pool cannot use (device_memory.LOADER_SLACK_SHARE; measured: docs/DECISIONS.md).
The "packed" layout leaves none: (1) a placeholder of the converted weights' bytes plus
PACK_MARGIN is allocated, (2) every raw tensor is put after it, (3) the placeholder is freed and
every leaf converted, in order, into that hole, (4) the raw tensors are freed. XLA's GPU allocator
is best-fit (the hole is the smallest free block that fits each leaf) and splits a block only
when what would be left is at least the request or at least 128 MiB (else it hands over the whole
block): the margin keeps every leaf's leftover at least that large, so each leaf is split off the
hole's front (in whatever order the leaves are allocated), and what is left of the hole (the
margin) lies against the raw tensors and joins them, and the free tail, in one block once they are
freed. It needs the raw and the converted weights on the device at once (about twice the
weights), and the free block after the raw tensors must stay larger than the hole (else best-fit
would pick that block), so "auto" packs on GPUs whose free memory exceeds the raw weights plus
twice the converted ones (per device: tensor-parallel leaves count their shards, and every device
of the mesh gets its own placeholder), and streams otherwise: on several hosts (each would decide
alone) and on TPUs, whose allocator this reasoning does not describe. `packed_fits` is that rule;
device_memory.loader_slack charges each layout its own slack.

Overlap: a thread pool (`TransferOptions.num_threads`) puts (and, streaming, converts and waits
for) each tensor while the main thread keeps at most `window_bytes` of tensors in flight (this
bounds the host's staging copies and, streaming, the device's raw buffers); a single opener
thread maps the next file (MAP_POPULATE: it is faulted in from the page cache or read from disk)
while the current one is being transferred. Tensors are visited file by file in on-disk order, so
reads are sequential.
"""

from __future__ import annotations

import collections
import concurrent.futures as futures
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxserve.memory_stats import free_bytes
from jaxserve.models.safetensors_reader import MappedFile, SafetensorsHeader, TensorInfo

ParamPath = tuple[str, ...]
# The target sharding of a params leaf from its path and final (flax) shape.
ShardingFn = Callable[[ParamPath, tuple[int, ...]], jax.sharding.Sharding]
Converter = Callable[..., jax.Array]  # the raw part(s) -> the leaf


@dataclass(frozen=True)
class TensorLoad:
  """One checkpoint tensor for a params leaf (or for one part of a merged leaf)."""

  path: ParamPath
  header: SafetensorsHeader
  info: TensorInfo
  transpose: bool  # HF [out, in] -> flax [in, out]

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(reversed(self.info.shape)) if self.transpose else self.info.shape


@dataclass(frozen=True)
class LeafOut:
  """One array a custom conversion makes: where it goes in the params tree, its shape, dtype."""

  path: ParamPath
  shape: tuple[int, ...]
  dtype: np.dtype


@dataclass(frozen=True)
class LeafLoad:
  """One params leaf: one checkpoint tensor, or the parts of a merged projection, concatenated
  along the output axis (HF's axis 0: the last once transposed) after each is converted.
  `convert` replaces that conversion (the raw parts in, on the device: e.g. a projection
  quantized as it loads) and makes `outputs` (one array, or a tuple of them in that order), each
  placed with its own target sharding when loading sharded."""

  path: ParamPath
  parts: tuple[TensorLoad, ...]
  convert: Converter | None = None
  outputs: tuple[LeafOut, ...] = ()

  @property
  def transpose(self) -> bool:
    return self.parts[0].transpose

  @property
  def shape(self) -> tuple[int, ...]:
    first = self.parts[0].info.shape
    stored = (sum(part.info.shape[0] for part in self.parts),) + tuple(first[1:])
    return tuple(reversed(stored)) if self.transpose else stored

  @property
  def raw_bytes(self) -> int:
    return sum(part.info.nbytes for part in self.parts)


LAYOUTS = ("auto", "packed", "streaming")


@dataclass(frozen=True)
class TransferOptions:
  num_threads: int = 4
  window_bytes: int = 512 << 20  # tensor bytes in flight at once (host staging, raw device copies)
  layout: str = "auto"  # "packed" | "streaming" | "auto" (module docstring)

  def __post_init__(self):
    if self.layout not in LAYOUTS:
      raise ValueError(f"layout: must be one of {LAYOUTS}, got {self.layout!r}")


@dataclass(frozen=True)
class TransferStats:
  num_bytes: int  # checkpoint bytes read
  seconds: float
  packed: bool = False  # the packed layout (no holes between the weights)

  @property
  def gb_per_s(self) -> float:
    return self.num_bytes / 1e9 / max(self.seconds, 1e-9)

  def describe(self) -> str:
    layout = ", packed" if self.packed else ""
    return (
      f"{self.num_bytes / 1e9:.1f} GB in {self.seconds:.1f} s ({self.gb_per_s:.2f} GB/s{layout})"
    )


@dataclass(frozen=True)
class _Job:
  leaf: LeafLoad
  target: jax.sharding.Sharding | None  # None: the default device, as jax.device_put(x)
  convert: Converter | None  # None: the raw tensor is the leaf
  host_copy: bool  # a CPU device would alias the view (the file's pages) rather than copy it
  out_itemsize: int  # bytes per element of the converted leaf
  # a custom conversion's outputs' shardings (None: the default device); `target` is the first
  out_targets: tuple[jax.sharding.Sharding, ...] | None = None

  def part_sharding(self, part: TensorLoad) -> jax.sharding.Sharding | None:
    """Where a raw part goes (None: the default device)."""
    if self.target is None:
      return None
    if self.leaf.convert is not None:
      return custom_raw_sharding(self.target, len(self.leaf.outputs[0].shape), part.info.shape)
    return raw_sharding(self.target, part.transpose)

  def out_device_bytes(self) -> int:
    """The converted leaf's bytes on each of its devices."""
    if self.leaf.outputs:
      targets = self.out_targets or (None,) * len(self.leaf.outputs)
      return sum(
        math.prod(out.shape if target is None else target.shard_shape(out.shape))
        * out.dtype.itemsize
        for out, target in zip(self.leaf.outputs, targets)
      )
    shape = self.leaf.shape if self.target is None else self.target.shard_shape(self.leaf.shape)
    return math.prod(shape) * self.out_itemsize

  def raw_device_bytes(self) -> list[int]:
    """Each raw part's bytes on each of the leaf's devices."""
    return [
      math.prod(
        part.info.shape
        if self.target is None
        else self.part_sharding(part).shard_shape(part.info.shape)
      )
      * part.info.dtype.itemsize
      for part in self.leaf.parts
    ]


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


def transfer_tensors(
  leaves: Sequence[LeafLoad],
  dtype: np.dtype,
  sharding_for: ShardingFn | None = None,
  options: TransferOptions = TransferOptions(),
) -> tuple[dict[ParamPath, jax.Array], TransferStats]:
  """Every leaf on its device(s) in `dtype`, flax layout; with the bytes moved and time."""
  start = time.perf_counter()
  dtype = np.dtype(dtype)
  jobs = _jobs(sorted(leaves, key=_disk_order(leaves)), dtype, sharding_for)
  mesh = _one_mesh(jobs)
  packed = _use_packed(jobs, mesh, options.layout)
  read_ahead = _ReadAhead([part.header for job in jobs for part in job.leaf.parts])
  pool = futures.ThreadPoolExecutor(options.num_threads, thread_name_prefix="weights-put")
  try:
    if packed:
      results = _run_packed(
        jobs, mesh if isinstance(mesh, Mesh) else None, pool, read_ahead, options.window_bytes
      )
    else:
      results = _run_streaming(jobs, pool, read_ahead, options.window_bytes)
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
    read_ahead.close()
  num_bytes = sum(job.leaf.raw_bytes for job in jobs)
  return _spread(jobs, results), TransferStats(num_bytes, time.perf_counter() - start, packed)


def _spread(jobs: Sequence[_Job], results: dict[ParamPath, object]) -> dict[ParamPath, jax.Array]:
  """Each custom conversion's outputs under their own paths."""
  out = {}
  for job in jobs:
    made = results[job.leaf.path]
    if job.leaf.outputs:
      made = made if isinstance(made, tuple) else (made,)
      out.update({leaf.path: array for leaf, array in zip(job.leaf.outputs, made)})
    else:
      out[job.leaf.path] = made
  return out


def _use_packed(jobs: Sequence[_Job], mesh: Mesh | None | bool, layout: str) -> bool:
  """Whether to pack (`mesh`: _one_mesh(jobs))."""
  if layout == "packed" and mesh is False:
    raise ValueError(
      "layout: 'packed' needs every leaf on the default device or every leaf on one mesh"
    )
  if layout != "auto":
    return layout == "packed"
  if mesh is False or jax.process_count() > 1:  # every host must decide alike: stream
    return False
  devices = [jax.devices()[0]] if mesh is None else list(mesh.devices.flat)
  raw = sum(_aligned(nbytes) for job in jobs for nbytes in job.raw_device_bytes())
  out = sum(_aligned(job.out_device_bytes()) for job in jobs)
  return packed_fits(devices[0].platform, raw, out, _free_device_bytes(devices))


def _one_mesh(jobs: Sequence[_Job]) -> Mesh | None | bool:
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


def _aligned(num_bytes: int) -> int:
  return -(-num_bytes // ALLOC_ALIGN) * ALLOC_ALIGN


class _ReadAhead:
  """Maps the files in order on one thread, one file ahead of the one being transferred."""

  def __init__(self, headers: Sequence[SafetensorsHeader]):
    self._headers = {header.path: header for header in headers}
    self._order = list(self._headers)
    self._opened: dict[Path, futures.Future] = {}
    self._opener = futures.ThreadPoolExecutor(1, thread_name_prefix="weights-open")

  def mapped(self, path: Path) -> futures.Future:
    """A future MappedFile of `path`; also starts mapping the file after it."""
    index = self._order.index(path)
    for ahead in self._order[index : index + 2]:
      if ahead not in self._opened:
        self._opened[ahead] = self._opener.submit(MappedFile.open, self._headers[ahead])
    return self._opened[path]

  def close(self) -> None:
    self._opener.shutdown(wait=True, cancel_futures=True)


def _windowed(
  jobs: Sequence[_Job],
  pool: futures.ThreadPoolExecutor,
  read_ahead: _ReadAhead,
  window_bytes: int,
  task: Callable,
) -> list:
  """task(job, mapped futures) for every job on the pool, in order, waiting for the oldest while
  window_bytes are in flight; the results in job order."""
  results: list = []
  pending: collections.deque[tuple[_Job, futures.Future]] = collections.deque()
  in_flight = 0
  for job in jobs:
    while pending and in_flight + job.leaf.raw_bytes > window_bytes:
      done, future = pending.popleft()
      results.append(future.result())
      in_flight -= done.leaf.raw_bytes
    mapped = [read_ahead.mapped(part.header.path) for part in job.leaf.parts]
    pending.append((job, pool.submit(task, job, mapped)))
    in_flight += job.leaf.raw_bytes
  results.extend(future.result() for _, future in pending)
  return results


def _run_streaming(
  jobs: Sequence[_Job], pool: futures.ThreadPoolExecutor, read_ahead: _ReadAhead, window_bytes: int
) -> dict[ParamPath, jax.Array]:
  """Each leaf put, converted and waited for on the pool; its raw tensors freed right after."""

  def put_and_convert(job: _Job, mapped: list[futures.Future]) -> jax.Array:
    raws = _put(job, mapped)
    out = raws[0] if job.convert is None else job.convert(*raws)
    return jax.block_until_ready(out)

  outs = _windowed(jobs, pool, read_ahead, window_bytes, put_and_convert)
  return {job.leaf.path: out for job, out in zip(jobs, outs)}


def _run_packed(
  jobs: Sequence[_Job],
  mesh: Mesh | None,
  pool: futures.ThreadPoolExecutor,
  read_ahead: _ReadAhead,
  window_bytes: int,
) -> dict[ParamPath, jax.Array]:
  """The packed layout (module docstring): placeholder, raw tensors, converted leaves into the
  placeholder's hole, raw tensors freed; on the default device (mesh None) or on every device
  of the leaves' mesh alike."""
  per_device = sum(_aligned(job.out_device_bytes()) for job in jobs) + PACK_MARGIN
  placeholder = _reserve(per_device, mesh)
  raws = _windowed(
    jobs,
    pool,
    read_ahead,
    window_bytes,
    lambda job, mapped: [jax.block_until_ready(raw) for raw in _put(job, mapped)],
  )
  for block in placeholder:
    block.delete()
  copies: dict = {}  # a leaf stored as it is on disk still gets a new buffer, in the hole
  outs = {}
  for job, raw in zip(jobs, raws):
    convert = job.convert
    if convert is None:
      if job.target not in copies:
        copies[job.target] = _jit(lambda x: jnp.copy(x), job.target)
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


def _disk_order(leaves: Sequence[LeafLoad]) -> Callable[[LeafLoad], tuple[int, int]]:
  first_seen = {
    path: i
    for i, path in enumerate(
      dict.fromkeys(part.header.path for leaf in leaves for part in leaf.parts)
    )
  }
  return lambda leaf: (first_seen[leaf.parts[0].header.path], leaf.parts[0].info.begin)


def _jobs(
  leaves: Sequence[LeafLoad], dtype: np.dtype, sharding_for: ShardingFn | None
) -> list[_Job]:
  """Pairs each leaf with its target sharding and converter; converters are built here, once per
  kind, before any thread runs (jit specializes each per shape on first call)."""
  converters: dict[object, Converter | None] = {}
  jobs = []
  for leaf in leaves:
    if leaf.convert is not None:
      jobs.append(_custom_job(leaf, dtype, sharding_for, converters))
      continue
    target = sharding_for(leaf.path, leaf.shape) if sharding_for is not None else None
    cast = any(part.info.dtype != dtype for part in leaf.parts)
    if (
      len({part.info.dtype for part in leaf.parts}) > 1
      or len({part.transpose for part in leaf.parts}) > 1
    ):
      raise ValueError(f"{leaf.path}: merged parts differ in dtype or layout")
    key = (leaf.transpose, cast, len(leaf.parts), target)
    if key not in converters:
      converters[key] = _converter(leaf.transpose, cast, len(leaf.parts), dtype, target)
    devices = target.device_set if target is not None else {jax.devices()[0]}
    on_cpu = any(device.platform == "cpu" for device in devices)
    jobs.append(
      _Job(leaf, target, converters[key], on_cpu and converters[key] is None, dtype.itemsize)
    )
  return jobs


def _custom_job(
  leaf: LeafLoad,
  dtype: np.dtype,
  sharding_for: ShardingFn | None,
  converters: dict[object, Converter | None],
) -> _Job:
  """A custom conversion's job: jitted once per conversion and output shardings."""
  targets = None
  if sharding_for is not None:
    targets = tuple(sharding_for(out.path, out.shape) for out in leaf.outputs)
  key = (leaf.convert, targets)
  if key not in converters:
    out_shardings = None if targets is None else targets if len(targets) > 1 else targets[0]
    converters[key] = (
      jax.jit(leaf.convert)
      if out_shardings is None
      else jax.jit(leaf.convert, out_shardings=out_shardings)
    )
  if targets is None:
    return _Job(leaf, None, converters[key], False, dtype.itemsize)
  on_cpu = any(device.platform == "cpu" for device in targets[0].device_set)
  return _Job(leaf, targets[0], converters[key], on_cpu, dtype.itemsize, targets)


def custom_raw_sharding(
  target: jax.sharding.Sharding, out_rank: int, shape: tuple[int, ...]
) -> jax.sharding.Sharding:
  """Where a custom conversion's raw part of `shape` goes: with its first output's `target`
  when it has that output's rank and `target` splits its dimensions evenly, else replicated."""
  if not isinstance(target, NamedSharding):
    return target
  spec = tuple(target.spec) + (None,) * (len(shape) - len(target.spec))
  if len(shape) == out_rank and all(
    axis is None or shape[i] % _axis_size(target.mesh, axis) == 0 for i, axis in enumerate(spec)
  ):
    return target
  return NamedSharding(target.mesh, PartitionSpec())


def _axis_size(mesh: Mesh, axis) -> int:
  names = axis if isinstance(axis, tuple) else (axis,)
  return math.prod(mesh.shape[name] for name in names)


def _converter(
  transpose: bool, cast: bool, num_parts: int, dtype: np.dtype, target: jax.sharding.Sharding | None
) -> Converter | None:
  if not (transpose or cast or num_parts > 1):
    return None

  def convert(*raws: jax.Array) -> jax.Array:
    parts = [raw.T if transpose else raw for raw in raws]  # [in, out] from [out, in]
    out = parts[0] if num_parts == 1 else jnp.concatenate(parts, axis=-1 if transpose else 0)
    return out.astype(dtype)

  return _jit(convert, target)


def _jit(fn: Callable, target: jax.sharding.Sharding | None) -> Callable:
  return jax.jit(fn, out_shardings=target) if target is not None else jax.jit(fn)


def raw_sharding(target: jax.sharding.Sharding, transpose: bool) -> jax.sharding.Sharding:
  """Where the untransposed tensor goes so that transposing it is local to each device."""
  if not transpose or not isinstance(target, NamedSharding):
    return target
  spec = tuple(target.spec) + (None,) * (2 - len(target.spec))
  return NamedSharding(target.mesh, PartitionSpec(*reversed(spec)))


def _put(job: _Job, mapped: list[futures.Future]) -> list[jax.Array]:
  """The leaf's raw tensors on its device(s) (runs in the pool; not waited for)."""
  raws = []
  for part, mapped_file in zip(job.leaf.parts, mapped):
    view = mapped_file.result().view(part.info)  # [*hf_shape], zero-copy over the mmap

    def piece(index, view=view) -> np.ndarray:
      return np.array(view[index]) if job.host_copy else view[index]

    if job.target is None:
      raws.append(jax.device_put(piece(...)))
    else:  # each addressable device receives only its slice
      raws.append(jax.make_array_from_callback(view.shape, job.part_sharding(part), piece))
  return raws
