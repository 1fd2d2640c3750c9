"""Applying allowed-token bitmasks to logits on device (structured outputs).

`bitmask` is int32[S, ceil(V / 32)]: token t of row s is allowed iff bit t % 32 of
bitmask[s, t // 32] is set, the layout llguidance fills on the host (jaxserve/structured).
Disallowed logits become -inf; a row of all ones (-1) leaves its sequence unconstrained, so one
compiled step serves any mix of constrained and unconstrained sequences. The expansion of the bits
and the select are elementwise, so XLA fuses them into one pass over the logits (the bitmask itself
is V / 8 bytes a row, 1/32 of the float32 logits it masks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

BITS_PER_WORD = 32


def bitmask_words(vocab_size: int) -> int:
  """Words in one bitmask row: ceil(vocab_size / 32)."""
  return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def _check_shapes(logits: jax.Array, bitmask: jax.Array) -> None:
  if logits.ndim != 2 or bitmask.ndim != 2:
    raise ValueError(
      f"logits, bitmask: must be 2-D [S, V] and [S, W], got {logits.shape} and {bitmask.shape}"
    )
  if bitmask.dtype != jnp.int32:
    raise ValueError(f"bitmask: must be int32, got {bitmask.dtype}")
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(f"logits: must be floating point, got {logits.dtype}")
  num_rows, vocab_size = logits.shape
  expected = (num_rows, bitmask_words(vocab_size))
  if bitmask.shape != expected:
    raise ValueError(
      f"bitmask: expected shape {expected} for logits {logits.shape}, got {bitmask.shape}"
    )


def allowed_tokens(bitmask: jax.Array, vocab_size: int) -> jax.Array:
  """bool[S, V]: the bits of `bitmask` (int32[S, ceil(V / 32)]) as one flag per token."""
  shifts = jnp.arange(BITS_PER_WORD, dtype=jnp.int32)
  bits = (bitmask[:, :, None] >> shifts) & 1  # [S, W, 32]; & 1 drops the sign fill
  return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].astype(jnp.bool_)


def apply_token_bitmask(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
  """logits f32[S, V] with disallowed tokens set to -inf (shapes checked: ValueError)."""
  _check_shapes(logits, bitmask)
  allowed = allowed_tokens(bitmask, logits.shape[1])
  return jnp.where(allowed, logits, jnp.array(-jnp.inf, logits.dtype))
