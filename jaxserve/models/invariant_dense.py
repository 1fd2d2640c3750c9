"""Projections whose bits do not depend on the tensor-parallel degree (tp_invariant_reductions).

A GEMM library picks its algorithm by shape, so the columns of `x @ W` may differ in the last
bit from the same columns of `x @ W[:, :N/2]`, and a contraction over K summed as two halves
rounds differently from one over all of K. Under tensor parallelism each device runs exactly
such halves. This module makes the unsharded model run them too:

  column projection (q/k/v, gate/up; kernel [K, N]): `num_groups` GEMMs x @ W[:, group], each
      [T, K] x [K, N/num_groups], concatenated;
  row projection (o_proj, down_proj; kernel [K, N]): `num_groups` GEMMs x[:, group] @ W[group, :]
      with float32 partials [T, N], added in float32 and rounded once to the param dtype.

With num_groups equal to the tensor-parallel degree every GEMM has the shape and operand layout
that one device's shard has (parallel/sharded_dense.py runs the per-device part of the same
functions under shard_map with the groups that device owns), and the float32 partials meet in
one addition a + b on one device or in the all-reduce on two, which is commutative.

Every GEMM's operands and result pass through `lax.optimization_barrier`: XLA would otherwise
merge GEMMs that share an operand (the q/k/v projections of one input, the groups of one
projection) into one wider GEMM, or fold a following addition into the GEMM's epilogue, and the
merged shapes differ between the unsharded and the sharded program. A column projection's
concatenated groups pass through one too, so what reads them reads a plain array, as on a
device of the mesh.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import linen as nn

DenseFn = Callable[[jax.Array, jax.Array], jax.Array]
LogitsFn = Callable[[jax.Array, jax.Array, bool], jax.Array]
REDUCTION_GROUPS = 2  # the tensor-parallel degree whose GEMMs the unsharded model reproduces


@dataclass(frozen=True)
class DenseBackend:
  """column(x [T, K], kernel [K, N]) -> [T, N] and row(x [T, K], kernel [K, N]) -> [T, N], both
  in the kernel's dtype; logits(x [S, H], weight, vocab_major) -> float32 [S, V], weight
  [H, V] or, vocab_major (a tied embedding), [V, H] (None: one jnp.dot, float32 out)."""

  name: str
  column: DenseFn
  row: DenseFn
  logits: LogitsFn | None = None


def _group_slices(size: int, num_groups: int, what: str) -> list[slice]:
  if size % num_groups != 0:
    raise ValueError(f"{what}: {size} is not divisible into {num_groups} groups")
  width = size // num_groups
  return [slice(g * width, (g + 1) * width) for g in range(num_groups)]


MatmulFn = Callable[..., jax.Array]  # (x [T, K], w, out_dtype, w_transposed=False) -> [T, N]


def _dot(x: jax.Array, kernel: jax.Array, out_dtype: jnp.dtype) -> jax.Array:
  return jnp.dot(x, kernel, preferred_element_type=out_dtype)


def _gemm(
  x: jax.Array, kernel: jax.Array, out_dtype: jnp.dtype, matmul: MatmulFn | None = None
) -> jax.Array:
  x, kernel = jax.lax.optimization_barrier((x, kernel))
  y = (matmul or _dot)(x, kernel, out_dtype)
  return jax.lax.optimization_barrier(y)


def column_groups(
  x: jax.Array, kernel: jax.Array, num_groups: int, matmul: MatmulFn | None = None
) -> jax.Array:
  """x [T, K] @ kernel [K, N] as num_groups GEMMs over column groups -> [T, N] (kernel dtype).
  matmul(x, w, out_dtype) runs each GEMM (default: one jnp.dot; batch_invariant: fixed tiles)."""
  x = x.astype(kernel.dtype)
  parts = [
    _gemm(x, kernel[:, cols], kernel.dtype, matmul)  # [T, N/G] each
    for cols in _group_slices(kernel.shape[1], num_groups, "column projection")
  ]
  if len(parts) == 1:
    return parts[0]
  # materialized, as one device's shard is: XLA would otherwise fuse the concatenation into the
  # consumer, and a reduction reading a concatenation (Qwen3's q/k norms over head_dim) may sum
  # in another order than one reading a plain array
  return jax.lax.optimization_barrier(jnp.concatenate(parts, axis=-1))  # [T, N]


def row_group_partials(
  x: jax.Array, kernel: jax.Array, num_groups: int, matmul: MatmulFn | None = None
) -> jax.Array:
  """x [T, K] @ kernel [K, N] as num_groups GEMMs over row groups -> float32 [T, N], the
  float32 partials added in group order."""
  x = x.astype(kernel.dtype)
  total = None
  for rows in _group_slices(kernel.shape[0], num_groups, "row projection"):
    partial = _gemm(x[:, rows], kernel[rows], jnp.float32, matmul)  # [T, N] float32
    total = partial if total is None else total + partial
  return total


def grouped_dense_backend(num_groups: int, matmul: MatmulFn | None = None) -> DenseBackend:
  """The unsharded backend: every projection in num_groups groups on one device; with `matmul`
  (batch_invariant) every GEMM, the logits' too, runs through it."""
  return DenseBackend(
    f"grouped x{num_groups}",
    column=lambda x, kernel: column_groups(x, kernel, num_groups, matmul),
    row=lambda x, kernel: row_group_partials(x, kernel, num_groups, matmul).astype(kernel.dtype),
    logits=None
    if matmul is None
    else lambda x, weight, vocab_major: matmul(
      x.astype(weight.dtype), weight, jnp.float32, w_transposed=vocab_major
    ),
  )


class InvariantDense(nn.Module):
  """A Dense (kernel [in, out], optional bias [out]; the params of nn.Dense) computed by
  `backend.column` or `backend.row` (`kind`)."""

  features: int
  dtype: jnp.dtype
  kind: str
  backend: DenseBackend
  use_bias: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.kind not in ("column", "row"):
      raise ValueError(f"{self.name}: kind must be 'column' or 'row', got {self.kind!r}")
    kernel = self.param(
      "kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features), self.dtype
    )
    project = self.backend.column if self.kind == "column" else self.backend.row
    y = project(x.reshape(-1, x.shape[-1]), kernel).reshape(*x.shape[:-1], self.features)
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,), self.dtype)
    return y
