"""x [M, K] @ w [K, N] on GPUs through one Pallas (Triton) kernel with fixed tiles, so that every
row's result is bitwise the same whatever M is (batch_invariant).

A GEMM library picks its algorithm, tile shape and split-K from the shape, so a row of x @ w
may round differently in a 256-row step than in an 8-row one. Here the tiling is static: program
(i, j) computes rows [i * block_m, (i + 1) * block_m) x columns [j * block_n, (j + 1) * block_n)
by walking K in block_k slices in increasing order, accumulating in float32, and rounds once to
the output dtype. A row's arithmetic is the same instructions on the same values in the same
order for any M: only the grid's length changes. Rows past M are masked loads and stores.

Grid: (cdiv(M, block_m), N / block_n), row blocks on the fastest axis, so programs launched
together read the same weight tile (L2 reuse when M spans several row blocks).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.triton_params import triton_compiler_params

DEFAULT_BLOCKS = (64, 128, 64)  # block_m, block_n, block_k


def _matmul_kernel(
  x_ref,
  w_ref,
  o_ref,
  *,
  num_rows: int,
  block_m: int,
  block_n: int,
  block_k: int,
  w_transposed: bool,
):
  row_block, col_block = pl.program_id(0), pl.program_id(1)
  rows = row_block * block_m + jnp.arange(block_m, dtype=jnp.int32)  # [BM]
  row_mask = (rows < num_rows)[:, None]  # [BM, 1]
  rows = jnp.where(rows < num_rows, rows, num_rows)[:, None]  # [BM, 1], out of bounds if masked
  cols = pl.ds(col_block * block_n, block_n)
  lanes = jnp.arange(block_k, dtype=jnp.int32)[None, :]  # [1, BK]

  def fold(k, acc):
    x = plgpu.load(
      x_ref.at[rows, k * block_k + lanes],
      mask=jnp.broadcast_to(row_mask, (block_m, block_k)),
      other=0,
    )  # [BM, BK]
    if w_transposed:
      w = w_ref[cols, pl.ds(k * block_k, block_k)]  # [BN, BK]
      dims = (((1,), (1,)), ((), ()))
    else:
      w = w_ref[pl.ds(k * block_k, block_k), cols]  # [BK, BN]
      dims = (((1,), (0,)), ((), ()))
    return acc + jax.lax.dot_general(x, w, dims, preferred_element_type=jnp.float32)  # [BM, BN]

  acc = jax.lax.fori_loop(
    0, x_ref.shape[1] // block_k, fold, jnp.zeros((block_m, block_n), jnp.float32)
  )
  out_cols = col_block * block_n + jnp.arange(block_n, dtype=jnp.int32)[None, :]  # [1, BN]
  plgpu.store(
    o_ref.at[rows, out_cols],
    acc.astype(o_ref.dtype),
    mask=jnp.broadcast_to(row_mask, (block_m, block_n)),
  )


@functools.partial(
  jax.jit,
  static_argnames=("out_dtype", "blocks", "w_transposed", "num_warps", "num_stages", "interpret"),
)
def _matmul(x, w, *, out_dtype, blocks, w_transposed, num_warps, num_stages, interpret):
  num_rows, num_cols = x.shape[0], w.shape[0 if w_transposed else 1]
  block_m, block_n, block_k = blocks
  kernel = functools.partial(
    _matmul_kernel,
    num_rows=num_rows,
    block_m=block_m,
    block_n=block_n,
    block_k=block_k,
    w_transposed=w_transposed,
  )
  return pl.pallas_call(
    kernel,
    grid=(pl.cdiv(num_rows, block_m), num_cols // block_n),
    in_specs=[pl.no_block_spec, pl.no_block_spec],
    out_specs=pl.no_block_spec,
    out_shape=jax.ShapeDtypeStruct((num_rows, num_cols), out_dtype),
    compiler_params=triton_compiler_params(num_warps, num_stages),
    interpret=interpret,
    name="fixed_tile_matmul",
  )(x, w)


def fixed_tile_matmul(
  x: jax.Array,
  w: jax.Array,
  out_dtype: jnp.dtype | None = None,
  *,
  w_transposed: bool = False,
  blocks: tuple[int, int, int] = DEFAULT_BLOCKS,
  num_warps: int = 4,
  num_stages: int = 3,
  interpret: bool = False,
) -> jax.Array:
  """x [M, K] @ w [K, N] -> [M, N] in out_dtype (default w's), float32 accumulation; with
  w_transposed, w is [N, K] (x @ w.T without a transposed copy: a tied embedding). blocks =
  (block_m, block_n, block_k), powers of two >= 16 with N % block_n == 0 and K % block_k == 0."""
  w_kn = w.shape[::-1] if w_transposed and w.ndim == 2 else w.shape
  if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w_kn[0]:
    layout = "N, K" if w_transposed else "K, N"
    raise ValueError(
      f"fixed_tile_matmul: expected x [M, K] and w [{layout}], got {x.shape} and {w.shape}"
    )
  if x.dtype != w.dtype:
    raise ValueError(f"fixed_tile_matmul: x and w must share a dtype, got {x.dtype} and {w.dtype}")
  if len(blocks) != 3 or any(b < 16 or b & (b - 1) for b in blocks):
    raise ValueError(f"fixed_tile_matmul: blocks: expected three powers of two >= 16, got {blocks}")
  block_m, block_n, block_k = blocks
  if w_kn[1] % block_n or w_kn[0] % block_k:
    raise ValueError(
      f"fixed_tile_matmul: w {w.shape}: K must be a multiple of block_k "
      f"{block_k} and N of block_n {block_n}"
    )
  out_dtype = jnp.dtype(w.dtype if out_dtype is None else out_dtype)
  if x.shape[0] == 0:
    return jnp.zeros((0, w_kn[1]), out_dtype)
  return _matmul(
    x,
    w,
    out_dtype=out_dtype,
    blocks=tuple(blocks),
    w_transposed=w_transposed,
    num_warps=num_warps,
    num_stages=num_stages,
    interpret=interpret,
  )
