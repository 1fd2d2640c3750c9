"""Moves checkpoint tensors onto the devices as they are on disk, then converts them there.

Each tensor goes to the device(s) untouched: a zero-copy numpy view of the mmapped file
(safetensors_reader) is handed to the transfer, so the only host-side pass over the bytes is the
copy into the device's staging buffer. HF Linear weights are [out, in] and flax kernels [in, out]:
the transpose, and a cast to the model dtype, run on the device as one small jitted function per
(transpose, cast, sharding) kind (jit specializes it per shape). When tensor-parallel, the raw
tensor is placed with the transposed sharding of its target (`make_array_from_callback`: each
device, on every host, receives only its slice) and transposed locally into the target sharding,
so no device ever holds or receives a whole sharded weight.

Overlap: a thread pool (`TransferOptions.num_threads`) runs put + convert + wait per tensor while
the main thread keeps at most `window_bytes` of tensors in flight (this bounds the host's staging
copies and the device's raw buffers); a single opener thread maps the next file
(MAP_POPULATE: it is faulted in from the page cache or read from disk) while the current one is
being transferred. Tensors are visited file by file in on-disk order, so reads are sequential.
"""
from __future__ import annotations

import collections
import concurrent.futures as futures
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxserve.models.safetensors_reader import MappedFile, SafetensorsHeader, TensorInfo

ParamPath = tuple[str, ...]
# The target sharding of a params leaf from its path and final (flax) shape.
ShardingFn = Callable[[ParamPath, tuple[int, ...]], jax.sharding.Sharding]
Converter = Callable[[jax.Array], jax.Array]


@dataclass(frozen=True)
class TensorLoad:
  """One params leaf to fill from one checkpoint tensor."""
  path: ParamPath
  header: SafetensorsHeader
  info: TensorInfo
  transpose: bool  # HF [out, in] -> flax [in, out]

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(reversed(self.info.shape)) if self.transpose else self.info.shape


@dataclass(frozen=True)
class TransferOptions:
  num_threads: int = 4
  window_bytes: int = 512 << 20  # tensor bytes in flight at once (host staging, raw device copies)


@dataclass(frozen=True)
class TransferStats:
  num_bytes: int  # checkpoint bytes read
  seconds: float

  @property
  def gb_per_s(self) -> float:
    return self.num_bytes / 1e9 / max(self.seconds, 1e-9)

  def describe(self) -> str:
    return f"{self.num_bytes / 1e9:.1f} GB in {self.seconds:.1f} s ({self.gb_per_s:.2f} GB/s)"


@dataclass(frozen=True)
class _Job:
  load: TensorLoad
  target: jax.sharding.Sharding | None  # None: the default device, as jax.device_put(x)
  convert: Converter | None
  host_copy: bool  # a CPU device would alias the view (the file's pages) rather than copy it


def transfer_tensors(loads: Sequence[TensorLoad], dtype: np.dtype,
                     sharding_for: ShardingFn | None = None,
                     options: TransferOptions = TransferOptions(),
                     ) -> tuple[dict[ParamPath, jax.Array], TransferStats]:
  """Every load's tensor on its device(s) in `dtype`, flax layout; with the bytes moved and time."""
  start = time.perf_counter()
  jobs = _jobs(sorted(loads, key=_disk_order(loads)), np.dtype(dtype), sharding_for)
  read_ahead = _ReadAhead([job.load.header for job in jobs])
  pool = futures.ThreadPoolExecutor(options.num_threads, thread_name_prefix="weights-put")
  try:
    results = _run_windowed(jobs, pool, read_ahead, options.window_bytes)
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
    read_ahead.close()
  num_bytes = sum(job.load.info.nbytes for job in jobs)
  return results, TransferStats(num_bytes, time.perf_counter() - start)


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
    for ahead in self._order[index:index + 2]:
      if ahead not in self._opened:
        self._opened[ahead] = self._opener.submit(MappedFile.open, self._headers[ahead])
    return self._opened[path]

  def close(self) -> None:
    self._opener.shutdown(wait=True, cancel_futures=True)


def _run_windowed(jobs: Sequence[_Job], pool: futures.ThreadPoolExecutor, read_ahead: _ReadAhead,
                  window_bytes: int) -> dict[ParamPath, jax.Array]:
  """Submits the jobs in order, waiting for the oldest while window_bytes are in flight."""
  results: dict[ParamPath, jax.Array] = {}
  pending: collections.deque[tuple[_Job, futures.Future]] = collections.deque()
  in_flight = 0
  for job in jobs:
    while pending and in_flight + job.load.info.nbytes > window_bytes:
      done, future = pending.popleft()
      results[done.load.path] = future.result()
      in_flight -= done.load.info.nbytes
    pending.append((job, pool.submit(_run, job, read_ahead.mapped(job.load.header.path))))
    in_flight += job.load.info.nbytes
  for done, future in pending:
    results[done.load.path] = future.result()
  return results


def _disk_order(loads: Sequence[TensorLoad]) -> Callable[[TensorLoad], tuple[int, int]]:
  first_seen = {path: i for i, path in
                enumerate(dict.fromkeys(load.header.path for load in loads))}
  return lambda load: (first_seen[load.header.path], load.info.begin)


def _jobs(loads: Sequence[TensorLoad], dtype: np.dtype,
          sharding_for: ShardingFn | None) -> list[_Job]:
  """Pairs each load with its target sharding and converter; converters are built here, once per
  kind, before any thread runs (jit specializes each per shape on first call)."""
  converters: dict[tuple, Converter | None] = {}
  jobs = []
  for load in loads:
    target = sharding_for(load.path, load.shape) if sharding_for is not None else None
    key = (load.transpose, load.info.dtype != dtype, target)
    if key not in converters:
      converters[key] = _converter(load.transpose, load.info.dtype != dtype, dtype, target)
    devices = target.device_set if target is not None else {jax.devices()[0]}
    on_cpu = any(device.platform == "cpu" for device in devices)
    jobs.append(_Job(load, target, converters[key], on_cpu and converters[key] is None))
  return jobs


def _converter(transpose: bool, cast: bool, dtype: np.dtype,
               target: jax.sharding.Sharding | None) -> Converter | None:
  if not transpose and not cast:
    return None

  def convert(raw: jax.Array) -> jax.Array:
    out = raw.T if transpose else raw  # [in, out] from [out, in]
    return out.astype(dtype)

  return jax.jit(convert, out_shardings=target) if target is not None else jax.jit(convert)


def raw_sharding(target: jax.sharding.Sharding, transpose: bool) -> jax.sharding.Sharding:
  """Where the untransposed tensor goes so that transposing it is local to each device."""
  if not transpose or not isinstance(target, NamedSharding):
    return target
  spec = tuple(target.spec) + (None,) * (2 - len(target.spec))
  return NamedSharding(target.mesh, PartitionSpec(*reversed(spec)))


def _run(job: _Job, mapped: futures.Future) -> jax.Array:
  """Puts one raw tensor, converts it on the device and waits for both (runs in the pool)."""
  view = mapped.result().view(job.load.info)  # [*hf_shape], zero-copy over the mmap

  def piece(index) -> np.ndarray:
    return np.array(view[index]) if job.host_copy else view[index]

  if job.target is None:
    raw = jax.device_put(piece(...))
  else:  # each addressable device receives only its slice
    raw = jax.make_array_from_callback(view.shape, raw_sharding(job.target, job.load.transpose),
                                       piece)
  out = raw if job.convert is None else job.convert(raw)
  return out.block_until_ready()
