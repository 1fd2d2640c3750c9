"""The sampler's greedy pick and log-normalizer with XLA ops whose bits do not depend on the
number of rows (batch_invariant, where the Pallas GPU kernel does not run).

The argmax is exact in any order (the first index wins ties, as jnp.argmax). The log-normalizer
max + log(sum(exp(x - max))) takes its max exactly too, and its sum in the fixed pairwise order
of pallas_kernels/fixed_order.py: XLA's reduction may add a row's terms in an order that follows the
number of rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.device.sampler import mask_banned
from pallas_kernels.fixed_order import fixed_order_sum


def fixed_order_greedy(logits: jax.Array, banned_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
  """logits f32[S, V], banned_ids i32[S, B] -> (argmax with the banned ids masked i32[S],
  logsumexp of the unmasked logits f32[S]) (a GreedyFn)."""
  token_ids = jnp.argmax(mask_banned(logits, banned_ids), axis=-1).astype(jnp.int32)
  row_max = jnp.max(logits, axis=-1)  # [S]
  safe_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  total = fixed_order_sum(jnp.exp(logits - safe_max[:, None]))  # [S]
  return token_ids, safe_max + jnp.log(total)
