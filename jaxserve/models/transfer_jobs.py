"""A params leaf's transfer job (models/weight_transfer.py runs them): where its raw checkpoint
tensors go and the jitted conversion that makes the leaf from them on the device.

HF Linear weights are [out, in] and flax kernels [in, out] (a quantized kernel stays [out, in]:
models/quantized_loading.py): the transpose, a cast to the model dtype and, for a merged
projection (models/fused_projections), the concatenation of its parts run on the device as one
small jitted function per kind, built once by build_jobs before any thread runs (jit
specializes it per shape). When tensor-parallel, the raw tensor is placed with the transposed
sharding of its target (raw_sharding; `make_array_from_callback`: each device, on every host,
receives only its slice) and transposed locally into the target sharding, so no device ever
holds or receives a whole sharded weight. A custom conversion (LeafLoad.convert) is jitted with
its outputs' target shardings; its raw parts are placed with the first output's sharding where
they have its rank and the sharded dimensions divide (a kernel [out, in] as stored), else
replicated (a checkpoint's scales, tiny: custom_raw_sharding), and XLA's partitioner runs the
conversion on the shards (a per-row maximum over a split `in` axis is one all-reduce). A target
of None is the default device, uncommitted, as jax.device_put(x) places it.
"""

from __future__ import annotations

import concurrent.futures as futures
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxserve.models.leaf_load import Converter, LeafLoad, ShardingFn, TensorLoad


@dataclass(frozen=True)
class TransferJob:
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
        for out, target in zip(self.leaf.outputs, targets, strict=True)
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


def disk_order(leaves: Sequence[LeafLoad]) -> Callable[[LeafLoad], tuple[int, int]]:
  first_seen = {
    path: i
    for i, path in enumerate(
      dict.fromkeys(part.header.path for leaf in leaves for part in leaf.parts)
    )
  }
  return lambda leaf: (first_seen[leaf.parts[0].header.path], leaf.parts[0].info.begin)


def build_jobs(
  leaves: Sequence[LeafLoad], dtype: np.dtype, sharding_for: ShardingFn | None
) -> list[TransferJob]:
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
      TransferJob(leaf, target, converters[key], on_cpu and converters[key] is None, dtype.itemsize)
    )
  return jobs


def _custom_job(
  leaf: LeafLoad,
  dtype: np.dtype,
  sharding_for: ShardingFn | None,
  converters: dict[object, Converter | None],
) -> TransferJob:
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
    return TransferJob(leaf, None, converters[key], False, dtype.itemsize)
  on_cpu = any(device.platform == "cpu" for device in targets[0].device_set)
  return TransferJob(leaf, targets[0], converters[key], on_cpu, dtype.itemsize, targets)


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
  return jit_to(float_converter(transpose, num_parts, dtype), target)


@functools.cache
def float_converter(transpose: bool, num_parts: int, dtype: np.dtype) -> Converter:
  """A float leaf's default conversion (not jitted): each part transposed to [in, out] when
  `transpose`, the parts concatenated along out, the result cast to `dtype`."""

  def convert(*raws: jax.Array) -> jax.Array:
    parts = [raw.T if transpose else raw for raw in raws]  # [in, out] from [out, in]
    out = parts[0] if num_parts == 1 else jnp.concatenate(parts, axis=-1 if transpose else 0)
    return out.astype(dtype)

  return convert


def jit_to(fn: Callable, target: jax.sharding.Sharding | None) -> Callable:
  return jax.jit(fn, out_shardings=target) if target is not None else jax.jit(fn)


def raw_sharding(target: jax.sharding.Sharding, transpose: bool) -> jax.sharding.Sharding:
  """Where the untransposed tensor goes so that transposing it is local to each device."""
  if not transpose or not isinstance(target, NamedSharding):
    return target
  spec = tuple(target.spec) + (None,) * (2 - len(target.spec))
  return NamedSharding(target.mesh, PartitionSpec(*reversed(spec)))


def put_raw(job: TransferJob, mapped: list[futures.Future]) -> list[jax.Array]:
  """The leaf's raw tensors on its device(s) (runs in the pool; not waited for)."""
  raws = []
  for part, mapped_file in zip(job.leaf.parts, mapped, strict=True):
    view = mapped_file.result().view(part.info)  # [*hf_shape], zero-copy over the mmap

    def piece(index, view=view) -> np.ndarray:
      return np.array(view[index]) if job.host_copy else view[index]

    if job.target is None:
      raws.append(jax.device_put(piece(...)))
    else:  # each addressable device receives only its slice
      raws.append(jax.make_array_from_callback(view.shape, job.part_sharding(part), piece))
  return raws
