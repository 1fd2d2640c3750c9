"""The routing of a mixture of experts' assignments to the grouped matmul's row tiles, as Pallas
(Triton) kernels on GPUs: a counting sort by expert instead of XLA's sort, with the tile map of
tiles.py in the same kernel.

A step's T tokens each go to K experts: expert_ids int32[T, K], M = T*K assignments, flat index
a = t*K + k. A device holds num_local experts from global id first_expert on (expert
parallelism); the others' assignments are "non-local". `route_assignments` returns a `Routing`:

  order       int32[M]   sorted row r's assignment: the local ones by expert, then the non-local
                         ones; stable (by a) within each run, so the result is deterministic
  group_sizes int32[E]   each local expert's assignments (E = num_local)
  tile_group, tile_start, tile_rows  int32[num_tiles(M, E, block_m)]: tiles.tile_map of
                         group_sizes (the non-local run is its tail, group E)

exactly what reference.route_assignments_reference computes with jnp.argsort, bincount and
tiles.tile_map. The grouped matmuls read each row from token order[r] // K (gpu.py's gathered
rows) and write it to assignment order[r] (its scattered store), so no permuted copy of the
tokens and no inverse permutation exist.

The assignments are walked in chunks of BLOCK (fewer assignments: one chunk of M rounded up to a
power of two, at least 16, so one token's 8 assignments make a [16, EP] one-hot, not [128, EP]):

  1. a histogram: each chunk's one-hot [BLOCK, EP] of local expert ids, summed (EP: E rounded up
     to a power of two); its cumulative sum gives each expert's first sorted row;
  2. the placement: an assignment's row is its expert's first row, plus its expert's count in
     the earlier chunks, plus its rank among its chunk's assignments of that expert (an
     exclusive cumulative sum of the one-hot down the chunk); non-local ones go after all local
     ones the same way. A scatter store of a into order[row]: every row is written once;
  3. the tile map, in chunks of TILE_BLOCK tiles (or fewer, likewise): a tile's group is the
     number of groups whose tiles end at or before it.

Up to SERIAL_CHUNKS chunks (a decode step: 1024 assignments) one program (grid (1,)) does all
three, chunk after chunk: one launch. Past that, two kernels: `moe_routing_counts`, a program
per chunk storing its histogram [C, EP]; then `moe_routing`, a program per chunk (or tile chunk)
that adds up the histograms (all for the group sizes, the earlier chunks' for its offsets), places
its chunk and maps its tile chunk. Work is O(M * EP) in all, O(C^2 * EP) for the offsets. Sizes
are static per (T, K, E, block_m); int32 throughout.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.grouped_matmul.tiles import MIN_BLOCK, Routing, num_tiles
from pallas_kernels.triton_params import triton_compiler_params

BLOCK = 128  # assignments per chunk
TILE_BLOCK = 64  # tiles per chunk of the tile map
COUNT_BLOCK = 16  # chunks' counts added at a time
SERIAL_CHUNKS = 8  # up to this many chunks (1024 assignments) one program routes them all
NUM_WARPS = 8  # a chunk's one-hot [BLOCK, EP] is 64 int32 a thread at E = 128
MAX_EXPERTS = 1024


def _exclusive(hits: jax.Array) -> jax.Array:
  """int32 [B, ...] -> the sum of the rows before each row (down axis 0)."""
  return jnp.cumsum(hits, axis=0) - hits


@dataclass(frozen=True)
class _Sizes:
  """Static sizes of one routing: M assignments, E local experts (EP padded), block_m."""

  num_local: int
  experts_pad: int
  block_m: int
  block: int  # assignments a chunk: BLOCK, or M rounded up to a power of two when smaller
  tile_block: int  # tiles a chunk of the tile map: TILE_BLOCK, or fewer likewise

  def experts(self) -> jax.Array:
    return jnp.arange(self.experts_pad, dtype=jnp.int32)  # [EP]


def _chunk(ids_ref, first, c, sizes: _Sizes):
  """Chunk c's assignments a [B], valid [B], local [B] and one-hot local experts hits [B, EP]."""
  m, experts = ids_ref.shape[0], sizes.experts()
  a = c * sizes.block + jnp.arange(sizes.block, dtype=jnp.int32)  # [B]
  valid = a < m
  local_id = plgpu.load(ids_ref.at[jnp.where(valid, a, 0)], mask=valid, other=0) - first
  local = valid & (local_id >= 0) & (local_id < sizes.num_local)  # [B]
  hits = ((local_id[:, None] == experts[None, :]) & local[:, None]).astype(jnp.int32)
  return a, valid, local, hits


def _place(order_ref, chunk, base, out_base) -> None:
  """Stores chunk's assignments at their sorted rows: expert e's from base[e] on, the non-local
  ones from out_base on, each in assignment order."""
  a, valid, local, hits = chunk
  m = order_ref.shape[0]
  rank = jnp.sum(hits * (_exclusive(hits) + base[None, :]), axis=1)  # [B]
  out = (valid & ~local).astype(jnp.int32)  # [B]
  row = jnp.where(local, rank, out_base + _exclusive(out))  # [B]
  plgpu.store(order_ref.at[jnp.where(valid, row, m)], a, mask=valid)


def _tiles(c, counts, m: int, sizes: _Sizes, group_ref, start_ref, rows_ref) -> None:
  """Tile chunk c of tiles.tile_map over the group sizes counts [EP] (0 past E)."""
  experts, block_m, tiles = sizes.experts(), sizes.block_m, group_ref.shape[0]
  ends = jnp.cumsum(counts)  # [EP]
  starts = ends - counts  # [EP]
  num_in = jnp.sum(counts)
  run_tiles = (counts + block_m - 1) // block_m  # [EP]
  tile_ends = jnp.cumsum(run_tiles)  # [EP]
  local_tiles = jnp.sum(run_tiles)
  tail_tiles = (m - num_in + block_m - 1) // block_m
  index = c * sizes.tile_block + jnp.arange(sizes.tile_block, dtype=jnp.int32)  # [TB]
  done = (tile_ends[None, :] <= index[:, None]) & (experts < sizes.num_local)[None, :]
  group = jnp.sum(done.astype(jnp.int32), axis=1)  # [TB] in 0..E
  pick = (experts[None, :] == group[:, None]).astype(jnp.int32)  # [TB, EP] one-hot
  first_tile = jnp.sum(pick * (tile_ends - run_tiles)[None, :], axis=1)  # [TB]
  local = group < sizes.num_local
  start = jnp.where(
    local,
    jnp.sum(pick * starts[None, :], axis=1) + (index - first_tile) * block_m,
    num_in + (index - local_tiles) * block_m,
  )  # [TB]
  end = jnp.where(local, jnp.sum(pick * ends[None, :], axis=1), m)  # [TB]
  live = index < local_tiles + tail_tiles
  valid = index < tiles
  at = jnp.where(valid, index, tiles)
  plgpu.store(group_ref.at[at], group, mask=valid)
  plgpu.store(start_ref.at[at], jnp.where(live, start, 0), mask=valid)
  plgpu.store(rows_ref.at[at], jnp.where(live, jnp.minimum(block_m, end - start), 0), mask=valid)


def _store_sizes(sizes_ref, counts, sizes: _Sizes) -> None:
  experts = sizes.experts()
  is_expert = experts < sizes.num_local
  plgpu.store(sizes_ref.at[jnp.where(is_expert, experts, sizes.num_local)], counts, mask=is_expert)


def _serial_kernel(ids_ref, first_ref, order_ref, sizes_ref, *tile_refs, sizes: _Sizes):
  """One program: the histogram, the placement and the tile map, chunk after chunk."""
  m, first = ids_ref.shape[0], first_ref[0]
  chunks = pl.cdiv(m, sizes.block)
  zeros = jnp.zeros((sizes.experts_pad,), jnp.int32)
  counts = jax.lax.fori_loop(
    0, chunks, lambda c, acc: acc + jnp.sum(_chunk(ids_ref, first, c, sizes)[3], axis=0), zeros
  )  # [EP]
  starts = jnp.cumsum(counts) - counts  # [EP] each expert's first sorted row
  num_in = jnp.sum(counts)

  def place(c, seen):  # seen [EP]: each expert's assignments in the chunks before c
    chunk = _chunk(ids_ref, first, c, sizes)
    _place(order_ref, chunk, starts + seen, num_in + c * sizes.block - jnp.sum(seen))
    return seen + jnp.sum(chunk[3], axis=0)

  jax.lax.fori_loop(0, chunks, place, zeros)
  _store_sizes(sizes_ref, counts, sizes)

  def tile_chunk(c, carry):
    _tiles(c, counts, m, sizes, *tile_refs)
    return carry

  jax.lax.fori_loop(0, pl.cdiv(tile_refs[0].shape[0], sizes.tile_block), tile_chunk, 0)


def _count_kernel(ids_ref, first_ref, counts_ref, *, sizes: _Sizes):
  """Program c: chunk c's histogram of local experts -> counts [C, EP] row c."""
  c = pl.program_id(0)
  hits = _chunk(ids_ref, first_ref[0], c, sizes)[3]
  counts_ref[c, :] = jnp.sum(hits, axis=0)


def _place_kernel(ids_ref, first_ref, counts_ref, order_ref, sizes_ref, *tile_refs, sizes: _Sizes):
  """Program p: the group sizes and its chunk's offsets from the counts (every chunk's, added in
  blocks of COUNT_BLOCK rows), then chunk p's placement and tile chunk p."""
  m, p = ids_ref.shape[0], pl.program_id(0)
  chunks = counts_ref.shape[0]
  experts = sizes.experts()
  lanes = jnp.arange(COUNT_BLOCK, dtype=jnp.int32)  # [CB]

  def add(i, carry):
    total, before = carry
    row = i * COUNT_BLOCK + lanes  # [CB]
    block = plgpu.load(
      counts_ref.at[jnp.where(row < chunks, row, 0)[:, None], experts[None, :]],
      mask=(row < chunks)[:, None],
      other=0,
    )  # [CB, EP]
    return total + jnp.sum(block, axis=0), before + jnp.sum(
      jnp.where((row < p)[:, None], block, 0), axis=0
    )

  zeros = jnp.zeros((sizes.experts_pad,), jnp.int32)
  counts, before = jax.lax.fori_loop(0, pl.cdiv(chunks, COUNT_BLOCK), add, (zeros, zeros))
  starts = jnp.cumsum(counts) - counts  # [EP]

  @pl.when(p < chunks)
  def _():
    chunk = _chunk(ids_ref, first_ref[0], p, sizes)
    _place(order_ref, chunk, starts + before, jnp.sum(counts) + p * sizes.block - jnp.sum(before))

  @pl.when(p == 0)
  def _():
    _store_sizes(sizes_ref, counts, sizes)

  @pl.when(p < pl.cdiv(tile_refs[0].shape[0], sizes.tile_block))
  def _():
    _tiles(p, counts, m, sizes, *tile_refs)


@functools.partial(
  jax.jit, static_argnames=("num_local", "block_m", "max_serial_chunks", "interpret")
)
def _route(flat_ids, first, *, num_local, block_m, max_serial_chunks, interpret) -> Routing:
  m = flat_ids.shape[0]
  tiles = num_tiles(m, num_local, block_m)
  sizes = _Sizes(
    num_local,
    max(MIN_BLOCK, pl.next_power_of_2(num_local)),
    block_m,
    min(BLOCK, max(MIN_BLOCK, pl.next_power_of_2(m))),
    min(TILE_BLOCK, max(MIN_BLOCK, pl.next_power_of_2(tiles))),
  )
  int32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
  out_shape = [int32((m,)), int32((num_local,))] + [int32((tiles,))] * 3
  call = functools.partial(
    pl.pallas_call,
    out_specs=[pl.no_block_spec] * 5,
    out_shape=out_shape,
    compiler_params=triton_compiler_params(NUM_WARPS, 1),
    interpret=interpret,
    name="moe_routing",
  )
  chunks = pl.cdiv(m, sizes.block)
  if chunks <= max_serial_chunks:
    kernel = functools.partial(_serial_kernel, sizes=sizes)
    outs = call(kernel, grid=(1,), in_specs=[pl.no_block_spec] * 2)(flat_ids, first)
    return Routing(*outs, block_m=block_m)
  counts = pl.pallas_call(
    functools.partial(_count_kernel, sizes=sizes),
    grid=(chunks,),
    in_specs=[pl.no_block_spec] * 2,
    out_specs=pl.no_block_spec,
    out_shape=int32((chunks, sizes.experts_pad)),
    compiler_params=triton_compiler_params(NUM_WARPS, 1),
    interpret=interpret,
    name="moe_routing_counts",
  )(flat_ids, first)  # [C, EP]
  kernel = functools.partial(_place_kernel, sizes=sizes)
  grid = (max(chunks, pl.cdiv(tiles, sizes.tile_block)),)
  outs = call(kernel, grid=grid, in_specs=[pl.no_block_spec] * 3)(flat_ids, first, counts)
  return Routing(*outs, block_m=block_m)


def route_assignments(
  expert_ids: jax.Array,  # int[T, K]: each token's experts (global ids)
  num_local: int,  # E: the experts this device holds
  block_m: int,  # the grouped matmuls' row tile (tiles.Tiling.block_m)
  first_expert: jax.Array | int = 0,  # the first local expert's global id
  *,
  max_serial_chunks: int = SERIAL_CHUNKS,  # more chunks of BLOCK: the two-kernel form
  interpret: bool = False,
) -> Routing:
  """-> the Routing of the T*K assignments (module docstring): order, group sizes and the row
  tiles of block_m rows."""
  if expert_ids.ndim != 2 or not jnp.issubdtype(expert_ids.dtype, jnp.integer):
    raise ValueError(
      f"route_assignments: expert_ids: expected int[T, K], got "
      f"{expert_ids.dtype}{list(expert_ids.shape)}"
    )
  if not 1 <= num_local <= MAX_EXPERTS:
    raise ValueError(f"route_assignments: num_local: expected 1..{MAX_EXPERTS}, got {num_local}")
  if block_m < MIN_BLOCK or block_m & (block_m - 1):
    raise ValueError(f"route_assignments: block_m: expected a power of two >= 16, got {block_m}")
  if jnp.ndim(first_expert) != 0:
    raise ValueError(f"route_assignments: first_expert: expected a scalar, got {first_expert}")
  flat = expert_ids.reshape(-1).astype(jnp.int32)  # [M]
  if flat.shape[0] == 0:
    empty = jnp.zeros((0,), jnp.int32)
    return Routing(empty, jnp.zeros((num_local,), jnp.int32), empty, empty, empty, block_m)
  first = jnp.reshape(jnp.asarray(first_expert, jnp.int32), (1,))
  return _route(
    flat,
    first,
    num_local=num_local,
    block_m=block_m,
    max_serial_chunks=max_serial_chunks,
    interpret=interpret,
  )
