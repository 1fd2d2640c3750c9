"""What investigations/bench_kernels.py compares our GPU attention kernel with: JAX's bundled Pallas
GPU paged_attention (decode only) in the ragged signature, and the XLA reference, checked on a
memory-bounded sub-batch and timed only where its gathered K / V fit (reference_bytes)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from investigations.kernel_timing import Batch, Shape


def sub_batch_args(batch: Batch, num_seqs: int) -> tuple[jax.Array, ...]:
  """Arguments of the first `num_seqs` sequences: a memory-bounded reference for the rows of
  those sequences in the full batch's output (sequences attend independently)."""
  qsl = np.asarray(batch.query_start_loc)
  num_tokens = int(qsl[num_seqs])
  return (
    batch.q[:num_tokens],
    batch.k_pool,
    batch.v_pool,
    batch.kv_slot,
    batch.block_tables[0][:num_seqs],
    batch.seq_lens[:num_seqs],
    batch.query_start_loc[: num_seqs + 1],
    jnp.asarray([num_seqs], jnp.int32),
  )


def reference_bytes(num_tokens: int, batch: Batch) -> int:
  _, num_kv_heads, _, page_size, head_dim = batch.k_pool.shape
  max_len = batch.block_tables[0].shape[1] * page_size
  return 2 * num_kv_heads * num_tokens * max_len * head_dim * (batch.k_pool.dtype.itemsize + 4)


def bundled_paged_attention(
  shape: Shape, sm_scale: float, k_splits: int, pages_per_compute_block: int, interpret: bool
):
  """JAX's bundled Pallas GPU paged_attention (decode only) in the ragged signature."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention

  def attend(q, k_pool, v_pool, kv_slot, block_tables, seq_lens, query_start_loc, num_seqs):
    del query_start_loc, num_seqs  # one query token per sequence
    q_scaled = (q.astype(jnp.float32) * sm_scale).astype(q.dtype)  # it applies no scale
    return paged_attention(
      q_scaled,
      k_pool[kv_slot[0]],  # [KVH, num_pages, page_size, D]
      v_pool[kv_slot[0]],
      block_tables,
      seq_lens,
      k_splits=k_splits,
      pages_per_compute_block=pages_per_compute_block,
      interpret=interpret,
    )

  return attend
