"""The tp-invariant projections of models/invariant_dense.py, run shard by shard.

With tp_invariant_reductions the model's projections go through a DenseBackend. Sharded, each
one is a shard_map over MODEL_AXIS whose body is the unsharded code applied to the device's
shard with the groups that shard owns (REDUCTION_GROUPS / tp, at least 1):

  column: x replicated [T, K], kernel [K, N/tp]      -> y [T, N/tp] (column-sharded, no collective)
  row:    x [T, K/tp], kernel [K/tp, N]              -> float32 partial [T, N], psum over the
                                                        devices, rounded once to the param dtype

so every GEMM a device runs has the shape and layout of one group of the unsharded model. The
shard_map (instead of XLA's SPMD partitioner) keeps the per-device GEMMs exactly those shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxserve.models.invariant_dense import (
  DenseBackend,
  MatmulFn,
  column_groups,
  row_group_partials,
)
from jaxserve.parallel.partition_rules import MODEL_AXIS

REPLICATED = P()
COLUMNS = P(None, MODEL_AXIS)  # [T, N] or [K, N] sharded on the last axis
ROWS = P(MODEL_AXIS, None)  # [K, N] sharded on the first axis


def shard_dense_backend(
  mesh: Mesh, num_groups: int, matmul: MatmulFn | None = None
) -> DenseBackend:
  """The DenseBackend of a model whose projections are sharded by the partition rules; with
  `matmul` (batch_invariant) every GEMM runs through it, the logits' (replicated vocabulary
  weights) included."""
  size = mesh.shape[MODEL_AXIS]
  local_groups = max(1, num_groups // size)

  def column(x: jax.Array, kernel: jax.Array) -> jax.Array:
    local = jax.shard_map(
      lambda x, w: column_groups(x, w, local_groups, matmul),
      mesh=mesh,
      in_specs=(REPLICATED, COLUMNS),
      out_specs=COLUMNS,
      check_vma=False,
    )
    return local(x, kernel)

  def row(x: jax.Array, kernel: jax.Array) -> jax.Array:
    def body(x, w):
      return jax.lax.psum(row_group_partials(x, w, local_groups, matmul), MODEL_AXIS)

    local = jax.shard_map(
      body, mesh=mesh, in_specs=(COLUMNS, ROWS), out_specs=REPLICATED, check_vma=False
    )
    return local(x, kernel).astype(kernel.dtype)

  logits = None
  if matmul is not None:
    logits = lambda x, weight, vocab_major: matmul(
      x.astype(weight.dtype), weight, jnp.float32, w_transposed=vocab_major
    )
  return DenseBackend(f"grouped x{local_groups} per shard, {size} shards", column, row, logits)
