"""The attention contract's data: the paged KV cache (KVPages) and the metadata of one ragged
step (an explicit pytree argument, never module state). Shared by the model (models/layers/),
the KV pool (device/kv_cache.py) and every kernel variant.

The pool is two stacked arrays, K and V, each with a leading slot dimension, rather than a pair
per slot: a step program then takes 2 donated buffers whatever the layer count, and the host's
dispatch cost grows with the donated buffers (docs/DECISIONS.md, "The KV pool as stacked
arrays"). K and V stay two arrays, not one [2, num_slots, ...]: every kernel reads and writes
them as two refs already, and one array would only move the K/V choice into each index."""

from __future__ import annotations

import dataclasses

import jax

KVPages = tuple[jax.Array, jax.Array]  # the stacked pool (k_pool, v_pool), each
# [num_slots, num_kv_heads, num_pages, page_size, head_dim]; layers share slots by KV group
# (messages/kv_layout.py: one slot per layer with one group), and a layer's backend reads and
# writes its slot, a traced kv_slot int32[1]


@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
  """Where each sequence's queries and cached K/V are. S sequence slots, padded.

  Semantics (positions, padding, sliding window) are those of
  pallas_kernels/ragged_paged_attention/reference.py. The model receives every KV group's
  block tables, int32[G, S, pages_per_seq] (messages/kv_layout.py; G = 1 for one kind of
  layer), and hands each layer's backend its own group's, int32[S, pages_per_seq]
  (models/kv_layout.LayerKV).
  """

  block_tables: jax.Array  # int32[S, pages_per_seq] at a backend; int32[G, S, ...] at the model
  seq_lens: jax.Array  # int32[S]: tokens in the cache after this step; 0 for padding
  query_start_loc: jax.Array  # int32[S + 1]: cumulative query tokens; padding repeats the total
  num_seqs: jax.Array  # int32[1]: live sequences; slots past it are padding


jax.tree_util.register_dataclass(
  AttentionMetadata,
  data_fields=[f.name for f in dataclasses.fields(AttentionMetadata)],
  meta_fields=[],
)
