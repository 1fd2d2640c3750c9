"""Projections whose per-row bits do not depend on the number of rows (batch_invariant).

A GEMM library picks its algorithm (tile shape, split-K) from the shape, and the row count of a
step's GEMMs is its token bucket, so the same token's hidden state rounds differently alone (an
8-token bucket) than inside a crowd (a 2048-token bucket); cuBLAS's own choice does too (a
split-K for a long contraction). Two ways to fix the tiling ("auto": the kernel on GPUs, row
tiles elsewhere):

  row_tiles   the rows are padded to a multiple of `tile_rows` and the GEMM runs tile by tile in
              a loop (lax.map), every tile an XLA dot of the one shape [tile_rows, K] x [K, N]:
              the library sees a single shape and picks a single algorithm. Each tile's operands
              and result pass through lax.optimization_barrier so XLA merges no tiles back.
  pallas      the fixed-tile Pallas kernel (pallas_kernels/fixed_tile_matmul): the grid grows
              with the rows, each output tile's arithmetic does not (interpret mode off a GPU).
              It reads each weight tile once for all row blocks, where row tiles run one after
              the other, each rereading the weight.

docs/DECISIONS.md, "Batch invariance: fixed-tile Pallas GEMMs on GPUs", has the measurements.

`batch_invariant_backend(base)` wraps the column and row functions of a DenseBackend (the
unsharded one's plain GEMMs, or tp_invariant_reductions' grouped ones) so each of their GEMMs
runs through one of them, and adds the logits GEMM (float32 out).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxserve.models.invariant_dense import DenseBackend
from pallas_kernels.fixed_tile_matmul.gpu import fixed_tile_matmul

GEMMS = ("auto", "row_tiles", "pallas")
DEFAULT_TILE_ROWS = 128
# The fixed-tile kernel's tiling on GPUs (docs/DECISIONS.md, "Batch invariance: fixed-tile Pallas
# GEMMs on GPUs").
PALLAS_TILES = {"blocks": (128, 128, 64), "num_warps": 8, "num_stages": 3}


def row_tiled_matmul(
  x: jax.Array,
  w: jax.Array,
  out_dtype: jnp.dtype,
  tile_rows: int = DEFAULT_TILE_ROWS,
  w_transposed: bool = False,
) -> jax.Array:
  """x [T, K] @ w [K, N] (w_transposed: w [N, K]) -> [T, N] in out_dtype as ceil(T / tile_rows)
  GEMMs of tile_rows rows."""
  num_rows = x.shape[0]
  num_tiles = -(-num_rows // tile_rows)
  x = jnp.pad(x, ((0, num_tiles * tile_rows - num_rows), (0, 0)))
  tiles = x.reshape(num_tiles, tile_rows, x.shape[1])  # [n, R, K]
  dims = (((1,), (1 if w_transposed else 0,)), ((), ()))

  def one_tile(tile: jax.Array) -> jax.Array:
    tile = jax.lax.optimization_barrier(tile)
    return jax.lax.optimization_barrier(
      jax.lax.dot_general(tile, w, dims, preferred_element_type=out_dtype)
    )  # [R, N]

  out = jax.lax.map(one_tile, tiles)  # [n, R, N]
  return out.reshape(num_tiles * tile_rows, -1)[:num_rows]


def pallas_matmul(
  x: jax.Array, w: jax.Array, out_dtype: jnp.dtype, w_transposed: bool = False, **tiles
) -> jax.Array:
  """x [T, K] @ w [K, N] (w_transposed: w [N, K]) through the fixed-tile Pallas kernel
  (interpret mode off a GPU); tiles: fixed_tile_matmul's blocks, num_warps, num_stages."""
  return fixed_tile_matmul(
    x, w, out_dtype, w_transposed=w_transposed, interpret=jax.default_backend() != "gpu", **tiles
  )


def auto_matmul(
  x: jax.Array,
  w: jax.Array,
  out_dtype: jnp.dtype,
  tile_rows: int = DEFAULT_TILE_ROWS,
  w_transposed: bool = False,
) -> jax.Array:
  """On GPUs the fixed-tile kernel (PALLAS_TILES) where w's shape divides into its blocks, else
  (and off GPUs) row tiles. The choice follows w's shape and the platform, never the rows."""
  _, block_n, block_k = PALLAS_TILES["blocks"]
  k, n = w.shape[::-1] if w_transposed else w.shape
  if jax.default_backend() == "gpu" and n % block_n == 0 and k % block_k == 0:
    return pallas_matmul(x, w, out_dtype, w_transposed, **PALLAS_TILES)
  return row_tiled_matmul(x, w, out_dtype, tile_rows, w_transposed)


def invariant_matmul(gemm: str = "auto", tile_rows: int = DEFAULT_TILE_ROWS):
  """The GEMM (x, w, out_dtype) -> x @ w of `gemm` ("auto", "row_tiles" or "pallas")."""
  if gemm == "auto":
    return functools.partial(auto_matmul, tile_rows=tile_rows)
  if gemm == "row_tiles":
    return functools.partial(row_tiled_matmul, tile_rows=tile_rows)
  if gemm == "pallas":
    return pallas_matmul
  raise ValueError(f"batch_invariant gemm: must be one of {GEMMS}, got {gemm!r}")


def batch_invariant_backend(gemm: str = "auto", tile_rows: int = DEFAULT_TILE_ROWS) -> DenseBackend:
  """The unsharded model's projections, each one GEMM through `gemm`."""
  matmul = invariant_matmul(gemm, tile_rows)
  return DenseBackend(
    f"batch invariant ({gemm})",
    column=lambda x, kernel: matmul(x.astype(kernel.dtype), kernel, kernel.dtype),
    row=lambda x, kernel: matmul(x.astype(kernel.dtype), kernel, kernel.dtype),
    logits=lambda x, weight, vocab_major: matmul(
      x.astype(weight.dtype), weight, jnp.float32, w_transposed=vocab_major
    ),
  )
