"""Pure-jnp reference of the greedy sampling reduction."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def greedy_sample_reference(
  logits: jax.Array, banned_ids: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """logits f32[S, V], banned_ids i32[S, B] (-1 padded) -> (argmax over the logits with each
  row's banned ids at -inf, i32[S], first index on ties; logsumexp of the unmasked logits,
  f32[S])."""
  vocab_ids = jnp.arange(logits.shape[1], dtype=jnp.int32)  # [V]
  banned = jnp.any(vocab_ids[None, :, None] == banned_ids[:, None, :], axis=-1)  # [S, V]
  scores = jnp.where(banned, -jnp.inf, logits)
  return (
    jnp.argmax(scores, axis=-1).astype(jnp.int32),
    jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1),
  )
