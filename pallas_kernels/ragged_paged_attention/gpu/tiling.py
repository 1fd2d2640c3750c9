"""Tile sizes of the GPU ragged paged-attention kernel: how they follow the batch shape and the
GPU, and their validation. The kernel itself is in attention.py.

The measured numbers are data: tiling_table.json beside this module holds, for each class of
shape (decode-only or not, Hopper-sized shared memory or not, 8-bit pages or not, head_dim up to
128 or wider), the rows a program aims for, block_kv, num_warps and num_stages (`TileRow`). The
rules stay here: block_q = max(1, rows // next_pow2(group)); the KV split (flash decoding) only
for decode-only shapes with fewer than 2 programs per core, in up to MAX_KV_SPLITS parts of at
least 4 KV tiles each; what a tiling must satisfy (`validate_tiling`).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import jax
from jax.experimental import pallas as pl

from pallas_kernels.tuning_table import load_table

MIN_DOT_ROWS = 16  # tl.dot needs M, N, K >= 16
MAX_ROWS = 128
MAX_KV_SPLITS = 16
DEFAULT_NUM_CORES = 132  # streaming multiprocessors of an H100 SXM


@dataclass(frozen=True)
class Tiling:
  """Static tile sizes: block_q query tokens x padded_group q heads rows, block_kv KV tokens."""

  block_q: int
  block_kv: int
  group: int
  padded_group: int
  num_warps: int
  num_stages: int
  num_kv_splits: int = 1

  @property
  def rows(self) -> int:
    return self.block_q * self.padded_group


@dataclass(frozen=True)
class TileRow:
  """One row of tiling_table.json: the default tiles of the shapes it matches (decode_only:
  T <= S; large_smem: Hopper-sized shared memory; eight_bit_pages: 1-byte K/V; head_dim up to
  max_head_dim, None for any larger)."""

  decode_only: bool
  large_smem: bool
  eight_bit_pages: bool
  max_head_dim: int | None
  rows: int
  block_kv: int
  num_warps: int
  num_stages: int

  def key(self) -> tuple[bool, bool, bool]:
    return (self.decode_only, self.large_smem, self.eight_bit_pages)

  def check(self) -> None:
    if not (_is_power_of_two(self.rows) and MIN_DOT_ROWS <= self.rows <= MAX_ROWS):
      raise ValueError(f"rows must be a power of two in [{MIN_DOT_ROWS}, {MAX_ROWS}]")
    if not _is_power_of_two(self.block_kv) or self.block_kv < MIN_DOT_ROWS:
      raise ValueError(f"block_kv must be a power of two >= {MIN_DOT_ROWS}")
    if self.num_warps < 1 or self.num_stages < 1:
      raise ValueError("num_warps and num_stages must be >= 1")
    if self.max_head_dim is not None and self.max_head_dim < 1:
      raise ValueError("max_head_dim must be >= 1 or null")


@functools.cache
def tile_table() -> tuple[TileRow, ...]:
  """tiling_table.json's rows (checked by `check_table`)."""
  rows = load_table(__package__, "tiling_table.json", TileRow)
  check_table(rows, f"{__package__}/tiling_table.json")
  return rows


def check_table(rows: tuple[TileRow, ...], where: str) -> None:
  """ValueError naming `where` and the row when a class of shapes has two rows for one
  max_head_dim, or naming the class when it has no row for the widest heads (null)."""
  seen = set()
  for index, row in enumerate(rows):
    if (row.key(), row.max_head_dim) in seen:
      raise ValueError(f"{where}: row {index} {row}: a second row for its shapes")
    seen.add((row.key(), row.max_head_dim))
  for key in itertools.product((False, True), repeat=3):
    if (key, None) not in seen:
      decode_only, large_smem, eight_bit_pages = key
      raise ValueError(
        f"{where}: no row for decode_only={decode_only}, large_smem={large_smem}, "
        f"eight_bit_pages={eight_bit_pages}, max_head_dim=null"
      )


def tile_row(decode_only: bool, large_smem: bool, eight_bit_pages: bool, head_dim: int) -> TileRow:
  """The table's row for this shape: among the rows of its class, the smallest max_head_dim
  that holds head_dim (null: any)."""
  fits = [
    row
    for row in tile_table()
    if row.key() == (decode_only, large_smem, eight_bit_pages)
    and (row.max_head_dim is None or head_dim <= row.max_head_dim)
  ]
  return min(fits, key=lambda row: (row.max_head_dim is None, row.max_head_dim or 0))


def _is_power_of_two(value: int) -> bool:
  return value >= 1 and not value & (value - 1)


def choose_tiling(
  num_tokens: int,
  num_seq_slots: int,
  num_q_heads: int,
  num_kv_heads: int,
  head_dim: int,
  *,
  max_kv_len: int,
  page_itemsize: int = 2,
  num_cores: int = DEFAULT_NUM_CORES,
  large_smem: bool = True,
  block_q: int | None = None,
  block_kv: int | None = None,
  num_warps: int | None = None,
  num_stages: int | None = None,
  num_kv_splits: int | None = None,
) -> Tiling:
  """Defaults: the tiling_table.json row of the shape's class (`tile_row`) gives the rows a
  program aims for, block_kv, num_warps and num_stages (docs/DECISIONS.md, "The GPU attention
  kernel's decode tiles"); block_q = max(1, rows // padded_group); KV split in up to
  MAX_KV_SPLITS parts (flash decoding) only for decode-only shapes (T <= S) with fewer than 2
  programs per core. Each keyword given overrides its default."""
  group = num_q_heads // num_kv_heads
  padded_group = pl.next_power_of_2(group)
  decode_only = num_tokens <= num_seq_slots
  row = tile_row(decode_only, large_smem, page_itemsize == 1, head_dim)
  if block_q is None:
    block_q = max(1, row.rows // padded_group)
  if block_kv is None:
    block_kv = row.block_kv
  if num_kv_splits is None:
    num_kv_splits = 1
    num_programs = num_seq_slots * num_kv_heads
    if decode_only and num_programs < 2 * num_cores:
      num_kv_splits = max(
        1,
        min(
          MAX_KV_SPLITS, pl.cdiv(2 * num_cores, num_programs), pl.cdiv(max_kv_len, block_kv) // 4
        ),
      )
  tiling = Tiling(
    block_q=block_q,
    block_kv=block_kv,
    group=group,
    padded_group=padded_group,
    num_warps=row.num_warps if num_warps is None else num_warps,
    num_stages=row.num_stages if num_stages is None else num_stages,
    num_kv_splits=num_kv_splits,
  )
  validate_tiling(tiling)
  return tiling


def validate_tiling(tiling: Tiling) -> None:
  if not _is_power_of_two(tiling.block_q):
    raise ValueError(
      f"ragged_paged_attention: block_q: must be a power of two, got {tiling.block_q}"
    )
  if not MIN_DOT_ROWS <= tiling.rows <= max(MAX_ROWS, tiling.padded_group):
    raise ValueError(
      f"ragged_paged_attention: block_q: block_q * padded q heads per kv head = "
      f"{tiling.block_q} * {tiling.padded_group} must lie in "
      f"[{MIN_DOT_ROWS}, {MAX_ROWS}]"
    )
  if not _is_power_of_two(tiling.block_kv) or tiling.block_kv < MIN_DOT_ROWS:
    raise ValueError(
      f"ragged_paged_attention: block_kv: must be a power of two >= "
      f"{MIN_DOT_ROWS}, got {tiling.block_kv}"
    )
  if tiling.num_kv_splits < 1:
    raise ValueError(
      f"ragged_paged_attention: num_kv_splits: must be >= 1, got {tiling.num_kv_splits}"
    )
  if tiling.num_warps < 1 or tiling.num_stages < 1:
    raise ValueError(
      f"ragged_paged_attention: num_warps/num_stages must be >= 1, got "
      f"{tiling.num_warps}/{tiling.num_stages}"
    )


def has_large_smem() -> bool:
  """Hopper and newer (compute capability >= 9) hold 3 stages of 128-token K and V tiles."""
  capability = getattr(jax.devices()[0], "compute_capability", None)
  try:
    return capability is not None and float(capability) >= 9.0
  except ValueError:
    return False


def num_cores() -> int:
  device = jax.devices()[0]
  return getattr(device, "core_count", None) or DEFAULT_NUM_CORES
