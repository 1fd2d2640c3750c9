"""The one place a scheduled batch becomes fixed-shape step inputs (host numpy, device side).

build_step_inputs() pads a ScheduledBatch to its bucket (S sequence slots, T token slots) and
returns numpy arrays only, from the batch's columns alone (no Request: the batch is the whole
host-to-device message); the jitted step never sees a Python list or a shape that is not a
bucket. Padding tokens write into the null page 0 and padding sequences have no queries.

A decode token the previous step sampled but the host has not read yet (async scheduling: the
scheduler's PLACEHOLDER_TOKEN_ID) is fed on device: prev_token_rows names the row of the
previous step's sampled ids (`PreviousSamples`, a device array) that the step substitutes.

The sampler's inputs (SamplingInputs: the rows' parameters, penalty histories, banned ids, the
token bitmask and the logit bias) are built by device/sampling_inputs.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import jax
import numpy as np

from jaxserve.attention.metadata import AttentionMetadata
from jaxserve.device.sampling_inputs import SamplingInputs, build_sampling_inputs, register_leaves
from jaxserve.device.token_bitmask import bitmask_words
from jaxserve.messages.buckets import Bucket
from jaxserve.messages.scheduled_batch import PLACEHOLDER_TOKEN_ID, ScheduledBatch


@dataclass(frozen=True)
class PreviousSamples:
  """The sampled ids of the step before, still on the device, and whose they are."""

  sampled_ids: jax.Array  # i32[max_seq_slots] (padded; the runner's zeros when none)
  rows: Mapping[str, int]  # request id -> row in sampled_ids


@register_leaves
@dataclass(frozen=True)
class StepInputs:
  token_ids: np.ndarray  # i32[T]; a token fed from prev_sampled_ids holds 0
  prev_token_rows: np.ndarray  # i32[T]: row of prev_sampled_ids to feed, -1 = token_ids
  prev_sampled_ids: jax.Array  # i32[max_seq_slots], device: the previous step's samples
  positions: np.ndarray  # i32[T]
  slot_mapping: np.ndarray  # i32[G, T]: per KV group page_id * page_size + offset; padding -> 0
  prompt_target_ids: np.ndarray  # i32[T]: next prompt token per position, -1 where none
  logits_indices: np.ndarray  # i32[S]: index of each sequence's last token in token_ids
  metadata: AttentionMetadata
  sampling: SamplingInputs

  @property
  def bucket(self) -> Bucket:
    return Bucket(self.logits_indices.shape[0], self.token_ids.shape[0])


@dataclass(frozen=True)
class StepShape:
  """Static sizes shared by every bucket."""

  page_size: int
  pages_per_seq: int
  history_len: int  # max_model_len: width of the penalty history when penalties are on
  vocab_size: int  # the model's logits width (the token bitmask has ceil(vocab / 32) words)
  num_kv_groups: int = 1  # block tables per sequence (messages/kv_layout.py)

  @property
  def bitmask_words(self) -> int:
    return bitmask_words(self.vocab_size)


def build_step_inputs(
  batch: ScheduledBatch,
  bucket: Bucket,
  shape: StepShape,
  previous: PreviousSamples,
  empty_history: Callable[[int], np.ndarray] | None = None,
  all_allowed: Callable[[int], jax.Array] | None = None,
  no_logit_bias: Callable[[int], tuple[jax.Array, jax.Array]] | None = None,
) -> StepInputs:
  """Pads `batch` to `bucket`. empty_history(S) supplies the [S, H] all -1 history used when no
  request penalizes, all_allowed(S) the [S, W] all-ones token bitmask, no_logit_bias(S) the
  [S, MAX_LOGIT_BIAS] ids and biases of no bias (the runner passes cached device arrays, so
  nothing is transferred; default: new arrays).
  Placeholder tokens are taken from `previous`. Vectorized over sequences: each of the batch's
  columns becomes one array; only the sparse sampling extras are visited one by one."""
  num_slots, num_token_slots = bucket.num_seqs, bucket.num_tokens
  num_seqs = batch.num_seqs
  q_lens = np.array(batch.query_lens, np.int32).reshape(num_seqs)  # [S live]
  starts = np.array(batch.start_positions, np.int32).reshape(num_seqs)  # [S live]
  num_live = batch.num_tokens
  query_start_loc = np.full(num_slots + 1, num_live, np.int32)  # [S + 1]
  query_start_loc[0] = 0
  np.cumsum(q_lens, out=query_start_loc[1 : num_seqs + 1])
  seq_of_token = np.repeat(np.arange(num_seqs, dtype=np.int32), q_lens)  # [live T]
  live_positions = (
    np.arange(num_live, dtype=np.int32) - query_start_loc[seq_of_token] + starts[seq_of_token]
  )  # [live T]

  block_tables = _block_tables(batch, num_slots, shape)  # [G, S, pages_per_seq]

  token_ids = np.zeros(num_token_slots, np.int32)  # [T]
  token_ids[:num_live] = batch.token_ids
  prev_token_rows = _previous_rows(
    token_ids[:num_live], seq_of_token, batch.request_ids, previous, num_token_slots
  )
  positions = np.zeros(num_token_slots, np.int32)  # [T]
  positions[:num_live] = live_positions
  slot_mapping = np.zeros((shape.num_kv_groups, num_token_slots), np.int32)  # [G, T]
  page_of_token = block_tables[:, seq_of_token, live_positions // shape.page_size]  # [G, live T]
  slot_mapping[:, :num_live] = page_of_token * shape.page_size + live_positions % shape.page_size
  seq_lens = np.zeros(num_slots, np.int32)  # [S]
  seq_lens[:num_seqs] = starts + q_lens
  logits_indices = np.zeros(num_slots, np.int32)  # [S]
  logits_indices[:num_seqs] = query_start_loc[1 : num_seqs + 1] - 1

  prompt_targets = np.full(num_token_slots, -1, np.int32)  # [T]
  for extras in batch.sampling.extras:
    if extras.prompt_targets is not None:
      prompt_targets[query_start_loc[extras.row] : query_start_loc[extras.row + 1]] = (
        extras.prompt_targets
      )
  metadata = AttentionMetadata(
    block_tables=block_tables,
    seq_lens=seq_lens,
    query_start_loc=query_start_loc,
    num_seqs=np.array([num_seqs], np.int32),
  )
  return StepInputs(
    token_ids=token_ids,
    prev_token_rows=prev_token_rows,
    prev_sampled_ids=previous.sampled_ids,
    positions=positions,
    slot_mapping=slot_mapping,
    prompt_target_ids=prompt_targets,
    logits_indices=logits_indices,
    metadata=metadata,
    sampling=build_sampling_inputs(
      batch.sampling,
      num_seqs,
      num_slots,
      shape.history_len,
      shape.bitmask_words,
      empty_history,
      all_allowed,
      no_logit_bias,
    ),
  )


def _block_tables(batch: ScheduledBatch, num_slots: int, shape: StepShape) -> np.ndarray:
  """Every KV group's block tables int32[G, S, pages_per_seq] from the batch's page columns
  (all laid out by page_counts), zero (the null page) past each table and in padding slots."""
  num_groups = shape.num_kv_groups
  if batch.num_seqs and batch.num_kv_groups != num_groups:
    raise ValueError(
      f"batch: {batch.num_kv_groups} KV groups of block tables, the step expects {num_groups}"
    )
  num_seqs = batch.num_seqs
  page_counts = np.array(batch.page_counts, np.int32).reshape(num_seqs)
  num_pages = int(page_counts.sum())
  page_rows = np.repeat(np.arange(num_seqs), page_counts)  # [pages]
  page_cols = np.arange(num_pages) - np.repeat(np.cumsum(page_counts) - page_counts, page_counts)
  tables = np.zeros((num_groups, num_slots, shape.pages_per_seq), np.int32)  # [G, S, pages]
  columns = (batch.page_ids, *batch.window_page_ids) if num_seqs else ()
  for group, column in enumerate(columns):
    tables[group, page_rows, page_cols] = np.array(column, np.int32).reshape(num_pages)
  return tables


def _previous_rows(
  live_token_ids: np.ndarray,
  seq_of_token: np.ndarray,
  request_ids: tuple[str, ...],
  previous: PreviousSamples,
  num_token_slots: int,
) -> np.ndarray:
  """-1 everywhere but at placeholder tokens, which get their row in previous.sampled_ids (and
  are zeroed in live_token_ids, in place)."""
  rows = np.full(num_token_slots, -1, np.int32)  # [T]
  slots = np.flatnonzero(live_token_ids == PLACEHOLDER_TOKEN_ID)
  slot_request_ids = map(request_ids.__getitem__, seq_of_token[slots].tolist())
  try:
    rows[slots] = list(map(previous.rows.__getitem__, slot_request_ids))
  except KeyError as error:
    raise ValueError(
      f"step inputs: request {error.args[0]!r} feeds a token in flight but did "
      f"not sample in the previous step"
    ) from None
  live_token_ids[slots] = 0
  return rows
