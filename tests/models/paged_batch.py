"""Builds one ragged step's model inputs by hand, independent of the engine's step builder.

Semantics are those of pallas_kernels/ragged_paged_attention/reference.py: sequences' tokens are
concatenated (decodes first by convention), `seq_lens` counts cached tokens after the step, padding
tokens write into the null page 0 and padding sequence slots have seq_len 0.

KV groups (messages/kv_layout.py): the model takes block tables [G, S, pages] and slot mappings
[G, T]. `build_step(..., num_groups=G, group_stride=N)` gives group g the chunk's pages shifted
by g * N (disjoint pages in a pool of G * N), every page kept: the model computes as with one
table per layer, whatever its layout. `model_kv` is the pool and the groups of a config.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from jaxserve.attention import AttentionMetadata


@dataclass(frozen=True)
class Chunk:
  """`token_ids` of one sequence whose first token sits at position `start` (tokens cached
  before)."""

  token_ids: list[int]
  start: int
  pages: list[int]  # the sequence's block table


@dataclass(frozen=True)
class StepArrays:
  token_ids: jnp.ndarray  # int32[T]
  positions: jnp.ndarray  # int32[T]
  slot_mapping: jnp.ndarray  # int32[G, T]
  metadata: AttentionMetadata
  offsets: list[int]  # where each chunk's tokens start in the step


def build_step(
  chunks: list[Chunk],
  *,
  page_size: int,
  num_tokens: int,
  num_seq_slots: int,
  pages_per_seq: int,
  num_groups: int = 1,
  group_stride: int = 0,
) -> StepArrays:
  token_ids = np.zeros(num_tokens, np.int32)
  positions = np.zeros(num_tokens, np.int32)
  slots = np.zeros(num_tokens, np.int32)  # padding -> null page 0
  block_tables = np.zeros((num_seq_slots, pages_per_seq), np.int32)
  seq_lens = np.zeros(num_seq_slots, np.int32)
  query_start_loc = np.zeros(num_seq_slots + 1, np.int32)
  offsets, cursor = [], 0
  for i, chunk in enumerate(chunks):
    n = len(chunk.token_ids)
    pos = np.arange(chunk.start, chunk.start + n)
    page_table = np.asarray(chunk.pages, np.int32)
    token_ids[cursor : cursor + n] = chunk.token_ids
    positions[cursor : cursor + n] = pos
    slots[cursor : cursor + n] = page_table[pos // page_size] * page_size + pos % page_size
    block_tables[i, : len(chunk.pages)] = page_table
    seq_lens[i] = chunk.start + n
    offsets.append(cursor)
    cursor += n
    query_start_loc[i + 1] = cursor
  query_start_loc[len(chunks) + 1 :] = cursor
  assert cursor <= num_tokens
  shifts = np.arange(num_groups, dtype=np.int32) * group_stride  # [G]
  tables = np.where(block_tables > 0, block_tables + shifts[:, None, None], 0)  # [G, S, pages]
  live = np.arange(num_tokens) < cursor  # [T]: padding tokens stay on the null page
  group_slots = np.where(live, slots + shifts[:, None] * page_size, 0)  # [G, T]
  metadata = AttentionMetadata(
    jnp.asarray(tables),
    jnp.asarray(seq_lens),
    jnp.asarray(query_start_loc),
    jnp.asarray([len(chunks)], jnp.int32),
  )
  return StepArrays(
    jnp.asarray(token_ids), jnp.asarray(positions), jnp.asarray(group_slots), metadata, offsets
  )


def empty_kv_pages(
  num_layers: int,
  num_kv_heads: int,
  num_pages: int,
  page_size: int,
  head_dim: int,
  dtype=jnp.float32,
):
  """The zero pool of num_layers slots in one group: ((k_pool, v_pool),)."""
  zeros = jnp.zeros((num_layers, num_kv_heads, num_pages, page_size, head_dim), dtype)
  return ((zeros, zeros),)


def model_kv(config, num_pages: int, page_size: int, dtype=jnp.float32):
  """(empty KV pool of `config`'s layout with num_pages pages per KV group, the group count):
  pass `num_groups` and `group_stride=num_pages` to build_step."""
  from jaxserve.models.kv_layout import kv_groups

  groups = kv_groups(config)
  kv = empty_kv_pages(
    len(groups[0].layers),
    config.num_kv_heads,
    num_pages * len(groups),
    page_size,
    config.head_dim,
    dtype,
  )
  return kv, len(groups)


def init_param_shapes(config) -> dict:
  """The params tree `causal_lm(config).init` makes, as ShapeDtypeStructs (no compute): one
  two-token step over one page of four."""
  import jax

  from jaxserve.attention import get_attention_backend
  from jaxserve.models import causal_lm

  model = causal_lm(config, get_attention_backend("reference"))
  kv, num_groups = model_kv(config, 2, 4)
  step = build_step(
    [Chunk([1, 2], 0, [1])],
    page_size=4,
    num_tokens=4,
    num_seq_slots=1,
    pages_per_seq=1,
    num_groups=num_groups,
    group_stride=2,
  )
  return jax.eval_shape(
    lambda: model.init(
      jax.random.key(0), step.token_ids, step.positions, kv, step.slot_mapping, step.metadata
    )
  )["params"]
