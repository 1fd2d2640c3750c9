"""The attention contract's data: the paged KV cache (KVPages) and the metadata of one ragged
step (an explicit pytree argument, never module state). Shared by the model (models/layers/),
the KV pool (device/kv_cache.py) and every kernel variant.

The pool is stacked arrays with a leading slot dimension rather than a pair per slot: groups of
slots, one (k_pool, v_pool) pair a group, all groups the same shape (device/kv_cache.py picks the
group size: every slot in one group on GPUs whose kernels take int64 offsets, the largest divisor
of the slot count under 2**31 elements an array elsewhere). A step program then takes 2 donated
buffers a group, not 2 a layer, and the host's dispatch cost grows with the donated buffers
(docs/DECISIONS.md, "The KV pool as stacked arrays"). A backend sees one group's pair and the
layer's slot in it; which group a layer's is, the model decides outside the backend
(models/kv_layout.LayerKV). K and V stay two arrays, not one [2, slots, ...]: every kernel reads
and writes them as two refs already, and one array would only move the K/V choice into each
index."""

from __future__ import annotations

import dataclasses

import jax

KVSlotGroup = tuple[jax.Array, jax.Array]  # (k_pool, v_pool) of one group of slots, each
# [slots_per_group, num_kv_heads, num_pages, page_size, head_dim]; a layer's backend reads and
# writes its slot in it, a traced kv_slot int32[1]
KVPages = tuple[KVSlotGroup, ...]  # the pool: num_groups equal groups; slot j of the model's KV
# layout (messages/kv_layout.py: one slot per layer with one KV group of layers) is index
# j % slots_per_group of group j // slots_per_group


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
