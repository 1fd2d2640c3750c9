"""Pure-jnp reference of the top-k router (transformers' Qwen3-MoE / Mixtral routing): the
float32 softmax of logits [T, E], its K largest probabilities and their experts (lax.top_k:
ties to the lower expert id), renormalized to sum to one when `renormalize`."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def top_k_route_reference(
  logits: jax.Array, top_k: int, renormalize: bool
) -> tuple[jax.Array, jax.Array]:
  """logits [T, E] -> (weights float32[T, K], expert_ids int32[T, K])."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)  # [T, E]
  weights, expert_ids = jax.lax.top_k(probs, top_k)  # [T, K] each
  if renormalize:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, expert_ids.astype(jnp.int32)
