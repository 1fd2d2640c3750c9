"""Attention that runs per shard: the backend's kernels wrapped in shard_map over the kv heads.

The matmuls around attention are left to XLA's SPMD partitioner, but a Pallas kernel cannot be
partitioned by XLA, so `shard_attention_backend` returns an AttentionBackend whose write_kv and
attend are shard_mapped over MODEL_AXIS: each device sees its own kv heads' part of a pool group
[slots_per_group, num_kv_heads/tp, num_pages, page_size, D], its q heads [T, num_q_heads/tp, D] (the
query groups of those kv heads, since both projections are column-sharded by head) and the
replicated kv_slot and metadata. No collective runs inside; o_proj's row-sharded matmul reduces the
heads afterwards. The model receives this backend from parallel/placement.py and stays free of
sharding. Each shard runs the backend's own kernel on its heads, so the wrapped backend keeps its
capabilities.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxserve.attention.backends import AttentionBackend
from jaxserve.parallel.partition_rules import KV_PAGES_SPEC, MODEL_AXIS

HEADS_SPEC = P(None, MODEL_AXIS, None)  # [T, heads, D]
REPLICATED = P()


def shard_attention_backend(backend: AttentionBackend, mesh: Mesh) -> AttentionBackend:
  """`backend` with its kernels applied shard by shard over the mesh's kv-head axis."""

  def write_kv(k_pool, v_pool, kv_slot, new_k, new_v, slot_mapping):
    local = jax.shard_map(
      backend.write_kv,
      mesh=mesh,
      in_specs=(KV_PAGES_SPEC, KV_PAGES_SPEC, REPLICATED, HEADS_SPEC, HEADS_SPEC, REPLICATED),
      out_specs=(KV_PAGES_SPEC, KV_PAGES_SPEC),
      check_vma=False,
    )
    return local(k_pool, v_pool, kv_slot, new_k, new_v, slot_mapping)

  def attend(q, k_pool, v_pool, kv_slot, block_tables, seq_lens, query_start_loc, num_seqs, **kw):
    local = jax.shard_map(
      functools.partial(backend.attend, **kw),
      mesh=mesh,
      in_specs=(HEADS_SPEC, KV_PAGES_SPEC, KV_PAGES_SPEC) + (REPLICATED,) * 5,
      out_specs=HEADS_SPEC,
      check_vma=False,
    )
    return local(q, k_pool, v_pool, kv_slot, block_tables, seq_lens, query_start_loc, num_seqs)

  size = mesh.shape[MODEL_AXIS]
  return backend.replace(
    name=f"{backend.name} (shard_map over {size} kv-head shards)", attend=attend, write_kv=write_kv
  )
