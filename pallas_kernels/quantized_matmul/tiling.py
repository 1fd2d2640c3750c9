"""The quantized matmul kernel's tiling (gpu.py): the tile sizes, the default rule, and their
validation. The swept numbers (the largest block_n and block_k tried, warps, stages, for plain
and quantized activations) are data, tiling_table.json beside this module (`TileRow`); the rules
are here. The output's columns come in blocks of block_n and K in num_splits equal runs; one
(column block, split) pair is a unit of work, walked along K in block_k slices. With programs 0
the grid has a program per unit. With programs P > 0 the grid has min(P, units) programs and
program p folds units p, p + P, p + 2P, ... in one loop (a persistent kernel: a program's loads
run on from one unit into the next instead of each unit starting its own pipeline); the units
and their arithmetic are the same, so the two give the same values.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax.numpy as jnp

from pallas_kernels.tuning_table import load_table

BLOCK_M = 16  # rows per program: all of x (M <= MAX_ROWS), the tensor cores' smallest tile
MAX_ROWS = BLOCK_M
X_GROUP = 128  # quantize_x: values of K per activation scale
WEIGHT_DTYPES = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))
TARGET_PROGRAMS = 264  # two waves of an H100's 132 SMs: enough loads in flight
MAX_SPLITS = 8


@dataclass(frozen=True)
class Tiling:
  """block_n output columns and block_k of K per loop step (powers of two >= 16), K split into
  num_splits runs; num_warps and num_stages are Triton's. A unit of work is one block of
  columns and one split; `programs` says how units meet programs (the module docstring)."""

  block_n: int = 32
  block_k: int = 256
  num_splits: int = 1
  num_warps: int = 4
  num_stages: int = 3
  fp8_bits: bool = False  # float8_e4m3fn weights: convert by bit operations (gpu.py's docstring)
  programs: int = 0  # 0: a program per unit (a grid); P > 0: P persistent programs (the docstring)


@dataclass(frozen=True)
class TileRow:
  """One row of tiling_table.json: the default tiles for plain (quantize_x false) or quantized
  (true) activations."""

  quantize_x: bool
  block_n: int
  block_k: int
  num_warps: int
  num_stages: int

  def check(self) -> None:
    if any(b < 16 or b & (b - 1) for b in (self.block_n, self.block_k)):
      raise ValueError("block_n and block_k must be powers of two >= 16")
    if self.quantize_x and self.block_k != X_GROUP:
      raise ValueError(f"quantize_x needs block_k {X_GROUP}")
    if self.num_warps < 1 or self.num_stages < 1:
      raise ValueError("num_warps and num_stages must be >= 1")


@functools.cache
def tile_table() -> dict[bool, TileRow]:
  """tiling_table.json's rows by quantize_x (`index_table`)."""
  rows = load_table(__package__, "tiling_table.json", TileRow)
  return index_table(rows, f"{__package__}/tiling_table.json")


def index_table(rows: tuple[TileRow, ...], where: str) -> dict[bool, TileRow]:
  """The rows by quantize_x; ValueError naming `where` and the row when one is repeated, or the
  missing quantize_x."""
  table: dict[bool, TileRow] = {}
  for index, row in enumerate(rows):
    if row.quantize_x in table:
      raise ValueError(f"{where}: row {index} {row}: a second row for quantize_x {row.quantize_x}")
    table[row.quantize_x] = row
  for quantize_x in (False, True):
    if quantize_x not in table:
      raise ValueError(f"{where}: no row for quantize_x {str(quantize_x).lower()}")
  return table


def _largest_pow2_divisor(n: int, cap: int) -> int:
  block = cap
  while block > 16 and n % block:
    block //= 2
  return block


def default_tiling(
  n: int,
  k: int,
  block_n: int | None = None,
  block_k: int | None = None,
  *,
  quantize_x: bool = False,
) -> Tiling:
  """The tiling for a [N, K] weight: the largest block_n / block_k (up to the given, else the
  table's row for quantize_x) dividing N / K, and the fewest splits (a power of two, at most
  MAX_SPLITS) that give TARGET_PROGRAMS programs. A weight wide enough to need no split walks K
  in halved blocks (block_k / 2, at least 16). quantize_x: blocks of K are X_GROUP (the table's
  row; a given block_k is ignored). The rule and the table follow the tiling sweeps on an H100
  and an H200: docs/DECISIONS.md, "The 8-bit decode kernel's tiling"."""
  row = tile_table()[quantize_x]
  block_n = _largest_pow2_divisor(n, block_n or row.block_n)
  block_k = _largest_pow2_divisor(k, row.block_k if quantize_x else block_k or row.block_k)
  if n // block_n >= TARGET_PROGRAMS and block_k > 16 and not quantize_x:
    block_k //= 2
  splits = 1
  while (
    (n // block_n) * splits < TARGET_PROGRAMS
    and splits < MAX_SPLITS
    and k % (block_k * splits * 2) == 0
  ):
    splits *= 2
  return Tiling(block_n, block_k, splits, num_warps=row.num_warps, num_stages=row.num_stages)


def supports(m: int, n: int, k: int, quantize_x: bool = False) -> bool:
  """Whether the kernel takes these sizes: 1 <= M <= MAX_ROWS, N and K multiples of 16 (K of
  X_GROUP with quantize_x)."""
  k_unit = X_GROUP if quantize_x else 16
  return 1 <= m <= MAX_ROWS and n % 16 == 0 and k % k_unit == 0 and n > 0 and k > 0


def check_tiling(tiling: Tiling, w_shape: tuple[int, ...], quantize_x: bool) -> None:
  blocks = (tiling.block_n, tiling.block_k)
  if any(b < 16 or b & (b - 1) for b in blocks) or tiling.num_splits < 1:
    raise ValueError(f"quantized_matmul: tiling: blocks must be powers of two >= 16, got {tiling}")
  if w_shape[0] % tiling.block_n or w_shape[1] % (tiling.block_k * tiling.num_splits):
    raise ValueError(
      f"quantized_matmul: tiling: N {w_shape[0]} must be a multiple of block_n and K "
      f"{w_shape[1]} of block_k * num_splits, got {tiling}"
    )
  if tiling.programs < 0:
    raise ValueError(f"quantized_matmul: tiling: programs must be >= 0, got {tiling.programs}")
  if quantize_x and tiling.block_k != X_GROUP:
    raise ValueError(
      f"quantized_matmul: tiling: quantize_x needs block_k {X_GROUP}, got {tiling.block_k}"
    )
