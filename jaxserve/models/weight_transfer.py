"""Moves checkpoint tensors onto the devices as they are on disk, then converts them there.

Each tensor goes to the device(s) untouched: a zero-copy numpy view of the mmapped file
(safetensors_reader) is handed to the transfer, so the only host-side pass over the bytes is the
copy into the device's staging buffer. What each params leaf is made of comes in as LeafLoads
(models/leaf_load.py); where its raw tensors go and how they become the leaf is its
TransferJob (models/transfer_jobs.py: the transpose, cast and concatenation on the device, and
the shardings when tensor-parallel). How the converted weights lie in device memory is the
layout (`TransferOptions.layout`): streamed one leaf at a time, or packed with no holes between
them, in as many groups as the free memory needs (models/packed_layout.py, which also holds the
"auto" rule).

Overlap: a thread pool (`TransferOptions.num_threads`) puts (and, streaming, converts and waits
for) each tensor while the main thread keeps at most `window_bytes` of tensors in flight (this
bounds the host's staging copies and, streaming, the device's raw buffers); a single opener
thread maps the next file (MAP_POPULATE: it is faulted in from the page cache or read from disk)
while the current one is being transferred. Tensors are visited file by file in on-disk order, so
reads are sequential; packed, the window drains at the end of each group (its leaves are
converted once all its raw tensors are on the device).
"""

from __future__ import annotations

import collections
import concurrent.futures as futures
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from jaxserve.models.leaf_load import LeafLoad, ParamPath, ShardingFn
from jaxserve.models.packed_layout import one_mesh, plan_packing, run_packed
from jaxserve.models.safetensors_reader import MappedFile, SafetensorsHeader
from jaxserve.models.transfer_jobs import TransferJob, build_jobs, disk_order, put_raw

LAYOUTS = ("auto", "packed", "streaming")


@dataclass(frozen=True)
class TransferOptions:
  num_threads: int = 4
  window_bytes: int = 512 << 20  # tensor bytes in flight at once (host staging, raw device copies)
  layout: str = "auto"  # "packed" | "streaming" | "auto" (module docstring)
  # packed: at most this many converted bytes per device in one group (None: as many as the free
  # memory allows, packed_layout.pack_groups)
  group_bytes: int | None = None

  def __post_init__(self):
    if self.layout not in LAYOUTS:
      raise ValueError(f"layout: must be one of {LAYOUTS}, got {self.layout!r}")
    if self.group_bytes is not None and self.group_bytes < 1:
      raise ValueError(f"group_bytes: must be a positive byte count, got {self.group_bytes}")


@dataclass(frozen=True)
class TransferStats:
  num_bytes: int  # checkpoint bytes read
  seconds: float
  groups: int = 0  # the packed layout's groups (no holes between the weights); 0: streamed

  @property
  def packed(self) -> bool:
    return self.groups > 0

  @property
  def gb_per_s(self) -> float:
    return self.num_bytes / 1e9 / max(self.seconds, 1e-9)

  def describe(self) -> str:
    layout = ""
    if self.packed:
      layout = ", packed" if self.groups == 1 else f", packed in {self.groups} groups"
    return (
      f"{self.num_bytes / 1e9:.1f} GB in {self.seconds:.1f} s ({self.gb_per_s:.2f} GB/s{layout})"
    )


def transfer_tensors(
  leaves: Sequence[LeafLoad],
  dtype: np.dtype,
  sharding_for: ShardingFn | None = None,
  options: TransferOptions = TransferOptions(),
) -> tuple[dict[ParamPath, jax.Array], TransferStats]:
  """Every leaf on its device(s) in `dtype`, flax layout; with the bytes moved and time."""
  start = time.perf_counter()
  dtype = np.dtype(dtype)
  jobs = build_jobs(sorted(leaves, key=disk_order(leaves)), dtype, sharding_for)
  mesh = one_mesh(jobs)
  groups = plan_packing(jobs, mesh, options.layout, options.group_bytes)
  read_ahead = _ReadAhead([part.header for job in jobs for part in job.leaf.parts])
  pool = futures.ThreadPoolExecutor(options.num_threads, thread_name_prefix="weights-put")
  try:
    if groups is not None:
      put_all = functools.partial(_windowed, pool, read_ahead, options.window_bytes)
      results = run_packed(jobs, groups, mesh if isinstance(mesh, Mesh) else None, put_all)
    else:
      results = _run_streaming(jobs, pool, read_ahead, options.window_bytes)
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
    read_ahead.close()
  num_bytes = sum(job.leaf.raw_bytes for job in jobs)
  seconds = time.perf_counter() - start
  return _spread(jobs, results), TransferStats(num_bytes, seconds, len(groups or ()))


def _spread(
  jobs: Sequence[TransferJob], results: dict[ParamPath, object]
) -> dict[ParamPath, jax.Array]:
  """Each custom conversion's outputs under their own paths."""
  out = {}
  for job in jobs:
    made = results[job.leaf.path]
    if job.leaf.outputs:
      made = made if isinstance(made, tuple) else (made,)
      out.update({leaf.path: array for leaf, array in zip(job.leaf.outputs, made, strict=True)})
    else:
      out[job.leaf.path] = made
  return out


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
  pool: futures.ThreadPoolExecutor,
  read_ahead: _ReadAhead,
  window_bytes: int,
  jobs: Sequence[TransferJob],
  task: Callable,
) -> list:
  """task(job, mapped futures) for every job on the pool, in order, waiting for the oldest while
  window_bytes are in flight; the results in job order."""
  results: list = []
  pending: collections.deque[tuple[TransferJob, futures.Future]] = collections.deque()
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
  jobs: Sequence[TransferJob],
  pool: futures.ThreadPoolExecutor,
  read_ahead: _ReadAhead,
  window_bytes: int,
) -> dict[ParamPath, jax.Array]:
  """Each leaf put, converted and waited for on the pool; its raw tensors freed right after."""

  def put_and_convert(job: TransferJob, mapped: list[futures.Future]) -> jax.Array:
    raws = put_raw(job, mapped)
    out = raws[0] if job.convert is None else job.convert(*raws)
    return jax.block_until_ready(out)

  outs = _windowed(pool, read_ahead, window_bytes, jobs, put_and_convert)
  return {job.leaf.path: out for job, out in zip(jobs, outs, strict=True)}
