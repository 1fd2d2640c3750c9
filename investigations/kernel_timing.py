"""How the kernel benchmark times a paged-attention implementation on the default device.

A `Batch` is a random ragged batch over one KV pool with `num_rotations` disjoint page sets, so
consecutive calls read pages that are not in L2. `time_per_call` times a jitted loop of calls
(`harness="loop"`: a fori_loop whose body also slices the page table and reduces the output) or
one program of independent calls and nothing else (`harness="unrolled"`: each call its own query
array and its own ordering of the pages, every output returned, so XLA can neither drop calls
nor share work between them), or the difference between two such programs of n and 3n calls
(`harness="marginal"`: what one more call costs, without the program's fixed dispatch and
synchronization); `device_us_per_call` traces that unrolled program and returns the
kernels' own device time per call; `copy_bandwidth` measures the HBM copy ceiling. Used by
investigations/bench_kernels.py.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from investigations.device_trace import capture_trace, summarize_trace, total_device_us
from jaxserve.bench.timing import median_seconds, seconds_per_call
from pallas_kernels.ragged_paged_attention.kv_quant import quantize_kv


@dataclass(frozen=True)
class Shape:
  num_q_heads: int = 32
  num_kv_heads: int = 8
  head_dim: int = 128
  page_size: int = 16
  dtype: str = "bfloat16"
  kv_dtype: str = ""  # the pages' dtype: "" for dtype's, or an 8-bit one (kv_quant.py, scale 1)

  @property
  def pages_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.kv_dtype or self.dtype)


@dataclass
class Batch:
  """A ragged batch with `num_rotations` disjoint page sets over one KV pool."""

  name: str
  q: jax.Array
  k_pool: jax.Array  # [1, KVH, num_pages, page_size, D]: a stacked pool of one slot
  v_pool: jax.Array
  kv_slot: jax.Array  # int32[1]: 0
  block_tables: list[jax.Array]
  seq_lens: jax.Array
  query_start_loc: jax.Array
  num_seqs: jax.Array
  is_decode: bool

  def args(self, rotation: int = 0) -> tuple[jax.Array, ...]:
    return (
      self.q,
      self.k_pool,
      self.v_pool,
      self.kv_slot,
      self.block_tables[rotation],
      self.seq_lens,
      self.query_start_loc,
      self.num_seqs,
    )

  @property
  def kv_bytes(self) -> int:
    _, num_kv_heads, _, _, head_dim = self.k_pool.shape
    return (
      int(np.sum(np.asarray(self.seq_lens)))
      * num_kv_heads
      * head_dim
      * 2
      * self.k_pool.dtype.itemsize
    )


def make_batch(
  name: str, shape: Shape, q_lens: list[int], seq_lens: list[int], *, seed: int, num_rotations: int
) -> Batch:
  """Random q and pages on device; each rotation gets its own shuffled, disjoint pages."""
  rng = np.random.default_rng(seed)
  pages_per_seq = max(-(-s // shape.page_size) for s in seq_lens)
  pages_per_rotation = len(seq_lens) * pages_per_seq
  num_pages = 1 + pages_per_rotation * num_rotations
  page_ids = rng.permutation(np.arange(1, num_pages, dtype=np.int32))
  tables = [
    jnp.asarray(
      page_ids[r * pages_per_rotation : (r + 1) * pages_per_rotation].reshape(
        len(seq_lens), pages_per_seq
      )
    )
    for r in range(num_rotations)
  ]
  dtype = jnp.dtype(shape.dtype)
  key_q, key_k, key_v = jax.random.split(jax.random.key(seed), 3)
  kv_shape = (1, shape.num_kv_heads, num_pages, shape.page_size, shape.head_dim)
  return Batch(
    name=name,
    q=jax.random.normal(key_q, (sum(q_lens), shape.num_q_heads, shape.head_dim), dtype),
    k_pool=quantize_kv(jax.random.normal(key_k, kv_shape, dtype), shape.pages_dtype, 1.0),
    v_pool=quantize_kv(jax.random.normal(key_v, kv_shape, dtype), shape.pages_dtype, 1.0),
    kv_slot=jnp.zeros((1,), jnp.int32),
    block_tables=tables,
    seq_lens=jnp.asarray(seq_lens, jnp.int32),
    query_start_loc=jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32),
    num_seqs=jnp.asarray([len(q_lens)], jnp.int32),
    is_decode=all(q_len == 1 for q_len in q_lens),
  )


def time_per_call(fn, batch: Batch, *, inner: int, reps: int, harness: str = "loop") -> float:
  """Median seconds per call of fn(*batch.args(r)) over a jitted program rotating page sets."""
  if harness == "unrolled":
    return _time_unrolled(fn, batch, inner=inner, reps=reps)
  if harness == "marginal":
    return _time_marginal(fn, batch, inner=inner, reps=reps)
  tables = jnp.stack(batch.block_tables)  # [R, S, pages_per_seq]
  num_rotations = len(batch.block_tables)

  @jax.jit
  def loop(q, k_pool, v_pool, kv_slot, tables, seq_lens, query_start_loc, num_seqs):
    def body(i, total):
      table = tables[i % num_rotations]
      out = fn(q, k_pool, v_pool, kv_slot, table, seq_lens, query_start_loc, num_seqs)
      return total + jnp.sum(out.astype(jnp.float32))

    return jax.lax.fori_loop(0, inner, body, jnp.float32(0))

  args = (
    batch.q,
    batch.k_pool,
    batch.v_pool,
    batch.kv_slot,
    tables,
    batch.seq_lens,
    batch.query_start_loc,
    batch.num_seqs,
  )
  loop(*args).block_until_ready()
  samples = []
  for _ in range(reps):
    start = time.perf_counter()
    loop(*args).block_until_ready()
    samples.append((time.perf_counter() - start) / inner)
  return statistics.median(samples)


def unrolled_program(fn, batch: Batch, inner: int):
  """(program, args): one jitted program of `inner` independent calls. Call i gets its own
  query array and its own block table: the pages of rotation i % R in a fresh order, so no
  two calls share a gather XLA could compute once (the XLA reference gathers pages before
  attending) and consecutive calls still read disjoint pages. Every call's output is a program
  output, so none is dropped, and an optimization barrier orders the calls (XLA may neither run
  two at once nor hold two calls' intermediates: an XLA reference's gathers stay one at a time).
  No other op runs in the program."""
  keys = jax.random.split(jax.random.key(inner), inner)
  queries = tuple(jax.random.normal(k, batch.q.shape, batch.q.dtype) for k in keys)
  rng = np.random.default_rng(inner)
  tables = []
  for i in range(inner):
    table = np.asarray(batch.block_tables[i % len(batch.block_tables)])
    if i >= len(batch.block_tables):
      table = rng.permutation(table.reshape(-1)).reshape(table.shape)
    tables.append(jnp.asarray(table))

  @jax.jit
  def program(queries, k_pool, v_pool, kv_slot, tables, seq_lens, query_start_loc, num_seqs):
    outputs = []
    for q, table in zip(queries, tables, strict=True):
      if outputs:  # call i starts after call i - 1 (no overlap, one call's memory at a time)
        _, q = jax.lax.optimization_barrier((outputs[-1], q))
      outputs.append(fn(q, k_pool, v_pool, kv_slot, table, seq_lens, query_start_loc, num_seqs))
    return tuple(outputs)

  return program, (
    queries,
    batch.k_pool,
    batch.v_pool,
    batch.kv_slot,
    tuple(tables),
    batch.seq_lens,
    batch.query_start_loc,
    batch.num_seqs,
  )


def _program_seconds(fn, batch: Batch, *, inner: int, reps: int) -> float:
  """Median seconds of one unrolled program of `inner` calls, dispatch and sync included."""
  program, args = unrolled_program(fn, batch, inner)
  return median_seconds(program, *args, reps=reps)


def _time_unrolled(fn, batch: Batch, *, inner: int, reps: int) -> float:
  return _program_seconds(fn, batch, inner=inner, reps=reps) / inner


def _time_marginal(fn, batch: Batch, *, inner: int, reps: int) -> float:
  """Seconds each extra call adds to an unrolled program: (t(3n) - t(n)) / 2n. What a call
  costs back to back with other kernels (its kernels and the gaps between them), without the
  program's fixed dispatch, launch and synchronization time, which an engine step pays once
  for all its layers."""
  short = _program_seconds(fn, batch, inner=inner, reps=reps)
  long = _program_seconds(fn, batch, inner=3 * inner, reps=reps)
  return max(long - short, 0.0) / (2 * inner)


def device_us_per_call(fn, batch: Batch, *, inner: int, reps: int = 2) -> float:
  """Device time per call, from a profiler trace of the unrolled program (its kernels only,
  launch gaps excluded): what the kernels themselves take, whatever the harness adds."""
  program, args = unrolled_program(fn, batch, inner)
  jax.block_until_ready(program(*args))
  logdir = capture_trace(lambda: program(*args), reps=reps)
  return total_device_us(summarize_trace(logdir)) / (reps * inner)


def read_bandwidth(num_bytes: int, *, inner: int, reps: int) -> float:
  """Bytes/s read by a large reduction (a row-wise max of a bf16 array): the ceiling of a kernel
  that only reads, such as decode attention over the KV cache."""
  x = jax.random.normal(jax.random.key(1), (num_bytes // 2 // 4096, 4096), jnp.bfloat16)
  reduce = jax.jit(lambda x: jnp.max(x, axis=1))
  return x.size * x.dtype.itemsize / seconds_per_call(reduce, x, inner=inner, reps=reps)


def copy_bandwidth(num_bytes: int, *, inner: int, reps: int) -> float:
  """Bytes/s (read + written) of a large device-to-device copy: the better of an in-place
  update loop and an out-of-place elementwise copy into a fresh buffer."""
  x = jax.random.normal(jax.random.key(0), (num_bytes // 2,), jnp.bfloat16)

  @jax.jit
  def loop(x):
    return jax.lax.fori_loop(0, inner, lambda i, y: y + jnp.bfloat16(1), x)

  copy = jax.jit(lambda x: x + jnp.bfloat16(1))
  loop(x).block_until_ready()
  copy(x).block_until_ready()
  in_place, out_of_place = [], []
  for _ in range(reps):
    start = time.perf_counter()
    loop(x).block_until_ready()
    in_place.append((time.perf_counter() - start) / inner)
    start = time.perf_counter()
    for _ in range(inner):
      y = copy(x)
    y.block_until_ready()
    out_of_place.append((time.perf_counter() - start) / inner)
  best = min(statistics.median(in_place), statistics.median(out_of_place))
  return 2 * x.size * x.dtype.itemsize / best
