"""Row sums whose order of additions is fixed by the row length alone (batch_invariant).

XLA lowers a reduction with a strategy it picks from the whole shape: the same row of an RMSNorm
sums in one order among 8 rows and in another among 64 on the CPU (on GPUs the emitter's tiling
also follows the shape). `fixed_order_sum` writes the sum as elementwise additions of the
two halves of the row, halving until one value is left: each addition is one IEEE operation on
two fixed elements, and XLA does not reassociate floating-point additions, so every row's result
is the same whatever the number of rows. The row is zero padded to a power of two first (adding
zero is exact). An optimization barrier at `lanes` partial sums keeps XLA from fusing the whole
tree into one thread per row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LANES = 128


def fixed_order_sum(x: jax.Array, lanes: int = LANES) -> jax.Array:
  """x [..., W] -> [...]: the sum over the last axis by pairwise halving (fixed order)."""
  width = x.shape[-1]
  padded = 1 << max(0, (width - 1).bit_length())
  if padded != width:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, padded - width)])  # [..., 2^k]
  while x.shape[-1] > 1:
    if x.shape[-1] == lanes:
      x = jax.lax.optimization_barrier(x)
    half = x.shape[-1] // 2
    x = x[..., :half] + x[..., half:]
  return x[..., 0]
