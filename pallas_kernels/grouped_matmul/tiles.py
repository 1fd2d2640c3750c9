"""The grouped matmul's tiling (gpu.py): the tile sizes and their defaults, the map from the
groups' runs of rows to row tiles, and `Routing`, a MoE step's rows sorted by expert with that
map (routing.py's kernel builds it, reference.py by an argsort).

Row tiles. Group g owns the group_sizes[g] rows after those of groups < g (the rows are sorted by
group); the rows past sum(group_sizes) form one more run, the tail, group G. Each run is cut into
tiles of block_m consecutive rows (its last tile partial), numbered run after run. A run of n
rows takes ceil(n / block_m) <= (n + block_m - 1) / block_m tiles and at most min(G + 1, M) runs
are non-empty, so

  num_tiles(M, G, block_m) = (M + min(G + 1, M) * (block_m - 1)) // block_m

tiles always suffice, a static count (8 for M = 8 rows among 128 groups, 1150 for M = 65536 and
block_m 64). `tile_map` gives each tile its group, first row and row count as int32[num_tiles]
arrays (a few small XLA ops on group_sizes); the tiles past the last run get 0 rows and do
nothing. Group sizes are clamped so that no run reaches past row M.

Defaults (`default_tiling`): the numbers are data, tiles_table.json beside this module
(`TileRow`: a row per tile height block_m and gated or not); the rules are here. block_m follows
the expected rows per group (2 M / G rounded up to a power of two): the table's smallest block_m
that holds it, else its tallest; so decode steps (a few rows per expert) take 16-row tiles, the
tensor cores' smallest, and prefill 64-row ones. Blocks of N and K are the row's, halved until
they divide N and K. A row with split_k splits K (num_splits, a power of two up to 8) until
about two waves of an H100's 132 SMs have work (TARGET_PROGRAMS, counting min(M, G) live tiles).
On an H200 no row splits: one token of Qwen3-30B-A3B (8 rows, 8 experts) ran its FFN in 38 us
unsplit against 93-100 us split 4 ways (the down product reloads the partials), and 8-64 tokens
likewise (docs/PERFORMANCE.md; investigations/bench_grouped_matmul.py --ffn-tilings).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.tuning_table import load_table

TARGET_PROGRAMS = 264  # two waves of an H100's 132 SMs
MAX_SPLITS = 8
MIN_BLOCK = 16  # tl.dot's smallest M, N and K
MAX_INDEX = 2**31  # the kernel addresses its arrays with int32 offsets
SMEM_BYTES = 232448  # shared memory a Hopper (sm_90) program may take: 227 KiB


@dataclass(frozen=True)
class Tiling:
  """block_m rows x block_n columns per program, K walked block_k at a time (powers of two >= 16)
  and split into num_splits runs (float32 partials added afterwards); num_warps and num_stages
  are Triton's."""

  block_m: int = 16
  block_n: int = 64
  block_k: int = 128
  num_splits: int = 1
  num_warps: int = 4
  num_stages: int = 4


@dataclass(frozen=True)
class TileRow:
  """One row of tiles_table.json: the default tiles of block_m-row tiles, gated (two weights a
  program) or not."""

  block_m: int
  gated: bool
  block_n: int
  block_k: int
  split_k: bool
  num_warps: int
  num_stages: int

  def check(self) -> None:
    if any(b < MIN_BLOCK or b & (b - 1) for b in (self.block_m, self.block_n, self.block_k)):
      raise ValueError(f"block_m, block_n and block_k must be powers of two >= {MIN_BLOCK}")
    if self.num_warps < 1 or self.num_stages < 1:
      raise ValueError("num_warps and num_stages must be >= 1")


@functools.cache
def tile_table() -> dict[tuple[int, bool], TileRow]:
  """tiles_table.json's rows by (block_m, gated) (`index_table`)."""
  rows = load_table(__package__, "tiles_table.json", TileRow)
  return index_table(rows, f"{__package__}/tiles_table.json")


def index_table(rows: tuple[TileRow, ...], where: str) -> dict[tuple[int, bool], TileRow]:
  """The rows by (block_m, gated); ValueError naming `where` and the row when one is repeated,
  or the missing row when a block_m lacks its gated or plain one."""
  table: dict[tuple[int, bool], TileRow] = {}
  for index, row in enumerate(rows):
    if (row.block_m, row.gated) in table:
      raise ValueError(f"{where}: row {index} {row}: a second row for its block_m and gated")
    table[row.block_m, row.gated] = row
  if not table:
    raise ValueError(f"{where}: no rows")
  for block_m, gated in sorted(table):
    if (block_m, not gated) not in table:
      raise ValueError(f"{where}: no row for block_m {block_m}, gated {str(not gated).lower()}")
  return table


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


def _largest_pow2_divisor(n: int, cap: int) -> int:
  block = cap
  while block > MIN_BLOCK and n % block:
    block //= 2
  return block


def default_block_m(m: int, num_groups: int) -> int:
  """The default row tile for M rows over G groups (module docstring), whatever K and N: the
  smallest of the table's tile heights that holds twice the rows a group expects (the largest
  when none does). The routing kernel (routing.py) maps the rows to tiles of this size for both
  of a MoE's products."""
  per_group = max(1, -(-2 * m // max(num_groups, 1)))
  heights = sorted({block_m for block_m, _ in tile_table()})
  wanted = pl.next_power_of_2(per_group)
  return next((h for h in heights if h >= wanted), heights[-1])


def default_tiling(m: int, k: int, n: int, num_groups: int, gated: bool = False) -> Tiling:
  """The tiling for M rows over G groups of [K, N] weights (module docstring); K and N multiples
  of 16. gated: two weights per program (the fused SwiGLU)."""
  block_m = default_block_m(m, num_groups)
  row = tile_table()[block_m, gated]
  block_n = _largest_pow2_divisor(n, row.block_n)
  block_k = _largest_pow2_divisor(k, row.block_k)
  splits = 1
  if row.split_k:
    programs = min(m, num_groups) * (n // block_n)
    while (
      programs * splits < TARGET_PROGRAMS
      and splits < MAX_SPLITS
      and k % (block_k * splits * 2) == 0
    ):
      splits *= 2
  return Tiling(
    block_m, block_n, block_k, splits, num_warps=row.num_warps, num_stages=row.num_stages
  )


def fit_stages(tiling: Tiling, stage_bytes: int) -> Tiling:
  """The tiling with num_stages lowered until Triton's pipelined loads fit in shared memory:
  its loop keeps num_stages - 1 of each iteration's loads (stage_bytes: the rows' and the
  weights' slices) in flight, so num_stages - 1 <= SMEM_BYTES // stage_bytes (at least 1
  stage). A down product that loads a split gate/up product's float32 partials (four splits of
  two [16, 128] slices beside its [128, 64] weights) would otherwise ask for 240 KiB."""
  stages = max(1, min(tiling.num_stages, 1 + SMEM_BYTES // max(stage_bytes, 1)))
  return tiling if stages == tiling.num_stages else dataclasses.replace(tiling, num_stages=stages)


def supports(m: int, k: int, n: int, num_groups: int) -> bool:
  """Whether the kernel takes these sizes: K and N positive multiples of 16 and every array
  addressable with int32 offsets."""
  return (
    k > 0
    and n > 0
    and k % MIN_BLOCK == 0
    and n % MIN_BLOCK == 0
    and num_groups * k * n < MAX_INDEX
    and m * max(k, n) < MAX_INDEX
  )


def check_tiling(tiling: Tiling, k: int, n: int, name: str) -> None:
  """ValueError unless the blocks are powers of two >= 16 dividing N and K (K by
  block_k * num_splits)."""
  blocks = (tiling.block_m, tiling.block_n, tiling.block_k)
  if any(b < MIN_BLOCK or b & (b - 1) for b in blocks) or tiling.num_splits < 1:
    raise ValueError(f"{name}: tiling: blocks must be powers of two >= 16, got {tiling}")
  if n % tiling.block_n or k % (tiling.block_k * tiling.num_splits):
    raise ValueError(
      f"{name}: tiling: N {n} must be a multiple of block_n and K {k} of "
      f"block_k * num_splits, got {tiling}"
    )


def num_tiles(num_rows: int, num_groups: int, block_m: int) -> int:
  """Row tiles enough for any group sizes (module docstring)."""
  return (num_rows + min(num_groups + 1, num_rows) * (block_m - 1)) // block_m


def tile_map(
  group_sizes: jax.Array, num_rows: int, block_m: int, tiles: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """group_sizes int[G] -> (tile_group, tile_start, tile_rows), each int32[tiles]: tile i holds
  tile_rows[i] rows from tile_start[i] on, all of group tile_group[i] (G: the tail past the
  groups); unused tiles hold 0 rows."""
  num_groups = group_sizes.shape[0]
  ends = jnp.minimum(jnp.cumsum(jnp.maximum(group_sizes.astype(jnp.int32), 0)), num_rows)  # [G]
  ends = jnp.concatenate([ends, jnp.full((1,), num_rows, jnp.int32)])  # [G + 1], the tail last
  starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])  # [G + 1]
  run_tiles = (ends - starts + block_m - 1) // block_m  # [G + 1]
  tile_ends = jnp.cumsum(run_tiles)  # [G + 1]
  index = jnp.arange(tiles, dtype=jnp.int32)  # [tiles]
  group = jnp.sum(tile_ends[None, :] <= index[:, None], axis=1, dtype=jnp.int32)  # [tiles]
  live = index < tile_ends[-1]  # [tiles]
  group = jnp.minimum(group, num_groups)  # [tiles] in 0..G
  start = starts[group] + (index - (tile_ends - run_tiles)[group]) * block_m  # [tiles]
  count = jnp.minimum(block_m, ends[group] - start)  # [tiles]
  return (
    group,
    jnp.where(live, start, 0).astype(jnp.int32),
    jnp.where(live, count, 0).astype(jnp.int32),
  )
