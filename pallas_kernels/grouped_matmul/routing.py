"""The routing of a mixture of experts' assignments to the grouped matmul's row tiles, as one
Pallas (Triton) program on GPUs: a counting sort by expert instead of XLA's sort, with the tile
map of tiles.py in the same kernel.

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

The kernel is one program (grid (1,)) that walks the assignments in chunks of BLOCK twice:

  1. a histogram: each chunk's one-hot [BLOCK, EP] of local expert ids, summed (EP: E rounded up
     to a power of two); its cumulative sum gives each expert's first sorted row;
  2. the placement: an assignment's row is its expert's first row, plus its expert's count in
     the earlier chunks (carried), plus its rank among its chunk's assignments of that expert
     (an exclusive cumulative sum of the one-hot down the chunk); non-local ones go after all
     local ones the same way. A scatter store of a into order[row]: every row is written once.

Then the tile map, in chunks of tiles: each tile's group is the number of groups whose tiles end
at or before it. Work is O(M * EP) on one SM: a few microseconds for a decode step, tens for an
8192-token prefill, against milliseconds of expert weights. Sizes are static per (T, K, E,
block_m); int32 throughout.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.grouped_matmul.tiles import MIN_BLOCK, num_tiles
from pallas_kernels.ragged_paged_attention.gpu_write import triton_compiler_params

BLOCK = 128  # assignments per chunk
TILE_BLOCK = 64  # tiles per chunk of the tile map
MAX_EXPERTS = 1024


@functools.partial(
  jax.tree_util.register_dataclass,
  data_fields=["order", "group_sizes", "tile_group", "tile_start", "tile_rows"],
  meta_fields=["block_m"],
)
@dataclass(frozen=True)
class Routing:
  """The sorted rows of M assignments over E local experts and their row tiles of block_m rows
  (module docstring); a pytree whose block_m is static."""

  order: jax.Array  # int32[M]
  group_sizes: jax.Array  # int32[E]
  tile_group: jax.Array  # int32[num_tiles]
  tile_start: jax.Array  # int32[num_tiles]
  tile_rows: jax.Array  # int32[num_tiles]
  block_m: int

  @property
  def tile_args(self) -> tuple[jax.Array, jax.Array, jax.Array]:
    return self.tile_group, self.tile_start, self.tile_rows

  def arrays(self) -> tuple[jax.Array, ...]:
    """order, group_sizes and the tile map, in that order."""
    return (self.order, self.group_sizes, *self.tile_args)


def _exclusive(hits: jax.Array) -> jax.Array:
  """int32 [B, ...] -> the sum of the rows before each row (down axis 0)."""
  return jnp.cumsum(hits, axis=0) - hits


def _kernel(
  ids_ref,
  first_ref,
  order_ref,
  sizes_ref,
  group_ref,
  start_ref,
  rows_ref,
  *,
  num_local: int,
  experts_pad: int,
  block_m: int,
):
  m, tiles = ids_ref.shape[0], group_ref.shape[0]
  first = first_ref[0]
  lanes = jnp.arange(BLOCK, dtype=jnp.int32)  # [B]
  experts = jnp.arange(experts_pad, dtype=jnp.int32)  # [EP]

  def chunk(c):
    a = c * BLOCK + lanes  # [B] assignments
    valid = a < m
    local_id = plgpu.load(ids_ref.at[jnp.where(valid, a, 0)], mask=valid, other=0) - first
    local = valid & (local_id >= 0) & (local_id < num_local)  # [B]
    hits = ((local_id[:, None] == experts[None, :]) & local[:, None]).astype(jnp.int32)
    return a, valid, local, hits  # hits [B, EP]

  chunks = pl.cdiv(m, BLOCK)
  sizes = jax.lax.fori_loop(
    0, chunks, lambda c, acc: acc + jnp.sum(chunk(c)[3], axis=0), jnp.zeros_like(experts)
  )  # [EP]
  ends = jnp.cumsum(sizes)  # [EP]
  starts = ends - sizes  # [EP] each expert's first sorted row
  num_in = jnp.sum(sizes)  # local assignments

  def place(c, carry):
    seen, seen_out = carry  # [EP] per expert, scalar non-local, in the chunks before c
    a, valid, local, hits = chunk(c)
    rank = jnp.sum(hits * (_exclusive(hits) + (starts + seen)[None, :]), axis=1)  # [B]
    out = (valid & ~local).astype(jnp.int32)  # [B]
    row = jnp.where(local, rank, num_in + seen_out + _exclusive(out))  # [B]
    plgpu.store(order_ref.at[jnp.where(valid, row, m)], a, mask=valid)
    return seen + jnp.sum(hits, axis=0), seen_out + jnp.sum(out)

  jax.lax.fori_loop(0, chunks, place, (jnp.zeros_like(experts), jnp.int32(0)))
  is_expert = experts < num_local  # [EP]
  plgpu.store(sizes_ref.at[jnp.where(is_expert, experts, num_local)], sizes, mask=is_expert)

  run_tiles = (sizes + block_m - 1) // block_m  # [EP], 0 past the local experts
  tile_ends = jnp.cumsum(run_tiles)  # [EP]
  local_tiles = jnp.sum(run_tiles)
  tail_tiles = (m - num_in + block_m - 1) // block_m
  tile_lanes = jnp.arange(TILE_BLOCK, dtype=jnp.int32)  # [TB]

  def tile_chunk(c, carry):
    index = c * TILE_BLOCK + tile_lanes  # [TB]
    done = (tile_ends[None, :] <= index[:, None]) & is_expert[None, :]  # [TB, EP]
    group = jnp.sum(done.astype(jnp.int32), axis=1)  # [TB] in 0..E
    pick = (experts[None, :] == group[:, None]).astype(jnp.int32)  # [TB, EP] one-hot
    first_tile = jnp.sum(pick * (tile_ends - run_tiles)[None, :], axis=1)  # [TB]
    start = jnp.where(
      group < num_local,
      jnp.sum(pick * starts[None, :], axis=1) + (index - first_tile) * block_m,
      num_in + (index - local_tiles) * block_m,
    )  # [TB]
    end = jnp.where(group < num_local, jnp.sum(pick * ends[None, :], axis=1), m)  # [TB]
    live = index < local_tiles + tail_tiles
    valid = index < tiles
    at = jnp.where(valid, index, tiles)
    plgpu.store(group_ref.at[at], group, mask=valid)
    plgpu.store(start_ref.at[at], jnp.where(live, start, 0), mask=valid)
    plgpu.store(rows_ref.at[at], jnp.where(live, jnp.minimum(block_m, end - start), 0), mask=valid)
    return carry

  jax.lax.fori_loop(0, pl.cdiv(tiles, TILE_BLOCK), tile_chunk, 0)


@functools.partial(jax.jit, static_argnames=("num_local", "block_m", "interpret"))
def _route(flat_ids, first, *, num_local: int, block_m: int, interpret: bool) -> Routing:
  m = flat_ids.shape[0]
  tiles = num_tiles(m, num_local, block_m)
  kernel = functools.partial(
    _kernel,
    num_local=num_local,
    experts_pad=max(MIN_BLOCK, pl.next_power_of_2(num_local)),
    block_m=block_m,
  )
  int32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
  outs = pl.pallas_call(
    kernel,
    grid=(1,),
    in_specs=[pl.no_block_spec] * 2,
    out_specs=[pl.no_block_spec] * 5,
    out_shape=[int32((m,)), int32((num_local,))] + [int32((tiles,))] * 3,
    compiler_params=triton_compiler_params(4, 1),
    interpret=interpret,
    name="moe_routing",
  )(flat_ids, first)
  return Routing(*outs, block_m=block_m)


def route_assignments(
  expert_ids: jax.Array,  # int[T, K]: each token's experts (global ids)
  num_local: int,  # E: the experts this device holds
  block_m: int,  # the grouped matmuls' row tile (tiles.Tiling.block_m)
  first_expert: jax.Array | int = 0,  # the first local expert's global id
  *,
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
  return _route(flat, first, num_local=num_local, block_m=block_m, interpret=interpret)
