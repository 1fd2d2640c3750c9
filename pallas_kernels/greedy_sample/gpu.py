"""Greedy sampling reduction for GPUs: one Pallas (Triton) kernel reads each row of the float32
logits once and returns its argmax (banned ids masked) and its log-normalizer.

A decode step of 512 sequences over a 128k vocabulary has 263 MB of float32 logits. XLA
computes jnp.argmax and jax.nn.logsumexp as separate reductions (three reads of the logits); a
variadic reduction that carries all four partials (max, sum, best score, its id) runs its
combiner, two exps included, for every element (docs/DECISIONS.md, "Greedy sampling in one
Pallas kernel"). Here program r walks row r in blocks of
`block_vocab` entries: per block one max, one masked max for the argmax, and one exp per
element against the running max (the online softmax's rescaling happens once per block).

Grid: (S, P). Program (r, p): running (max, sum of exp(x - max), best score, best id) over the
p-th of P consecutive runs of row r's blocks (P = num_splits: more loads in flight per row); a
small XLA epilogue merges the P partial states. Banned ids (at most B per row) are compared
against the block's vocabulary ids, so the masked scores are never stored. Ties go to the
first index, as jnp.argmax; a row whose scores are all -inf gives index 0. NaN logits are not
treated specially (jnp.argmax would pick them).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.triton_params import triton_compiler_params

NEG_INF = float("-inf")


def _greedy_kernel(
  logits_ref,
  banned_ref,
  max_ref,
  sum_ref,
  best_ref,
  id_ref,
  *,
  vocab_size: int,
  block_vocab: int,
  blocks_per_split: int,
  num_banned: int,
):
  row, split = pl.program_id(0), pl.program_id(1)
  banned = [banned_ref[row, j] for j in range(num_banned)]
  lanes = jnp.arange(block_vocab, dtype=jnp.int32)  # [BV]
  first_block = split * blocks_per_split
  num_blocks = jnp.clip(pl.cdiv(vocab_size, block_vocab) - first_block, 0, blocks_per_split)

  def fold_block(i, carry):
    row_max, row_sum, best_score, best_id = carry
    start = (first_block + i) * block_vocab
    vocab_ids = start + lanes  # [BV]
    x = plgpu.load(
      logits_ref.at[row, pl.ds(start, block_vocab)], mask=vocab_ids < vocab_size, other=NEG_INF
    ).astype(jnp.float32)  # [BV]
    new_max = jnp.maximum(row_max, jnp.max(x))
    safe_max = jnp.where(new_max == NEG_INF, 0.0, new_max)
    row_sum = row_sum * jnp.exp(row_max - safe_max) + jnp.sum(jnp.exp(x - safe_max))
    scores = x
    for banned_id in banned:
      scores = jnp.where(vocab_ids == banned_id, NEG_INF, scores)
    block_best = jnp.max(scores)
    block_id = jnp.min(jnp.where(scores == block_best, vocab_ids, vocab_size))
    better = block_best > best_score  # earlier blocks win ties
    return (
      new_max,
      row_sum,
      jnp.where(better, block_best, best_score),
      jnp.where(better, block_id, best_id),
    )

  init = (jnp.float32(NEG_INF), jnp.float32(0.0), jnp.float32(NEG_INF), jnp.int32(vocab_size))
  row_max, row_sum, best_score, best_id = jax.lax.fori_loop(0, num_blocks, fold_block, init)
  max_ref[row, split] = row_max
  sum_ref[row, split] = row_sum
  best_ref[row, split] = best_score
  id_ref[row, split] = best_id


def _merge_splits(row_max, row_sum, best_score, best_id, vocab_size: int):
  """[S, P] partial states of consecutive vocabulary ranges -> (ids [S], logsumexp [S]). The P
  sums are added in split order, one elementwise addition each, so a row's bits do not depend
  on the number of rows (an XLA reduction picks its order from the shape)."""
  total_max = jnp.max(row_max, axis=1, keepdims=True)  # [S, 1]
  safe_max = jnp.where(total_max == NEG_INF, 0.0, total_max)
  scaled = row_sum * jnp.exp(row_max - safe_max)  # [S, P]
  total_sum = functools.reduce(jnp.add, [scaled[:, p] for p in range(scaled.shape[1])])  # [S]
  best = jnp.max(best_score, axis=1, keepdims=True)  # [S, 1]
  ids = jnp.min(jnp.where(best_score == best, best_id, vocab_size), axis=1)  # [S]
  return jnp.where(ids < vocab_size, ids, 0), total_max[:, 0] + jnp.log(total_sum)


@functools.partial(
  jax.jit, static_argnames=("block_vocab", "num_splits", "num_warps", "num_stages", "interpret")
)
def _greedy_sample(
  logits,
  banned_ids,
  *,
  block_vocab: int,
  num_splits: int,
  num_warps: int,
  num_stages: int,
  interpret: bool,
):
  num_rows, vocab_size = logits.shape
  num_splits = min(num_splits, pl.cdiv(vocab_size, block_vocab))
  blocks_per_split = pl.cdiv(pl.cdiv(vocab_size, block_vocab), num_splits)
  kernel = functools.partial(
    _greedy_kernel,
    vocab_size=vocab_size,
    block_vocab=block_vocab,
    blocks_per_split=blocks_per_split,
    num_banned=banned_ids.shape[1],
  )
  partial_shape = (num_rows, num_splits)
  partials = pl.pallas_call(
    kernel,
    grid=(num_rows, num_splits),
    in_specs=[pl.no_block_spec, pl.no_block_spec],
    out_specs=[pl.no_block_spec] * 4,
    out_shape=[jax.ShapeDtypeStruct(partial_shape, jnp.float32)] * 3
    + [jax.ShapeDtypeStruct(partial_shape, jnp.int32)],
    compiler_params=triton_compiler_params(num_warps, num_stages),
    interpret=interpret,
    name="greedy_sample",
  )(logits, banned_ids)
  return _merge_splits(*partials, vocab_size)


def greedy_sample(
  logits: jax.Array,  # f32[S, V] (or bf16)
  banned_ids: jax.Array,  # int32[S, B], -1 padded
  *,
  block_vocab: int = 2048,
  num_splits: int = 8,
  num_warps: int = 4,
  num_stages: int = 2,
  interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """Returns (token_ids int32[S]: argmax of each row with its banned ids at -inf, first index on
  ties; log_normalizer f32[S]: logsumexp of the unmasked row). block_vocab is the number of
  vocabulary entries a program folds per loop step (a power of two >= 16); num_splits the number
  of programs that share a row (consecutive vocabulary ranges, merged by a small XLA epilogue);
  num_warps and num_stages Triton's. The defaults are tuned for 512 rows of a 128k vocabulary
  on an H100 (docs/DECISIONS.md, "Greedy sampling in one Pallas kernel")."""
  if logits.ndim != 2 or logits.shape[0] < 1 or logits.shape[1] < 1:
    raise ValueError(f"greedy_sample: logits: expected [S, V] with S, V >= 1, got {logits.shape}")
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(f"greedy_sample: logits: expected a float dtype, got {logits.dtype}")
  if banned_ids.ndim != 2 or banned_ids.shape[0] != logits.shape[0]:
    raise ValueError(
      f"greedy_sample: banned_ids: expected [{logits.shape[0]}, B], got {banned_ids.shape}"
    )
  if banned_ids.dtype != jnp.int32:
    raise ValueError(f"greedy_sample: banned_ids: expected int32, got {banned_ids.dtype}")
  if block_vocab < 16 or block_vocab & (block_vocab - 1):
    raise ValueError(f"greedy_sample: block_vocab: must be a power of two >= 16, got {block_vocab}")
  for name, value in (
    ("num_splits", num_splits),
    ("num_warps", num_warps),
    ("num_stages", num_stages),
  ):
    if value < 1:
      raise ValueError(f"greedy_sample: {name}: must be >= 1, got {value}")
  return _greedy_sample(
    logits,
    banned_ids,
    block_vocab=block_vocab,
    num_splits=num_splits,
    num_warps=num_warps,
    num_stages=num_stages,
    interpret=interpret,
  )
