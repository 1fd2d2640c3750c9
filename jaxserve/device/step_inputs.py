"""The one place a scheduled batch becomes fixed-shape step inputs (host numpy, device side).

build_step_inputs() pads a ScheduledBatch to its bucket (S sequence slots, T token slots) and
returns numpy arrays only, from the batch's columns alone (no Request: the batch is the whole
host-to-device message); the jitted step never sees a Python list or a shape that is not a
bucket. Padding tokens write into the null page 0 and padding sequences have no queries. The
sequences' sampling rows (messages/sampling_row.py) are read by column name; padding sequences
sample greedily.

A decode token the previous step sampled but the host has not read yet (async scheduling: the
scheduler's PLACEHOLDER_TOKEN_ID) is fed on device: prev_token_rows names the row of the
previous step's sampled ids (`PreviousSamples`, a device array) that the step substitutes.

The sampler's token bitmask (structured outputs, device/token_bitmask.py) is always a device
array [S, ceil(vocab / 32)]: the runner's cached all-ones constant until a batch's TokenBitmask
replaces it (`with_token_bitmask`), so the packed layout, and the compiled sampler, is the same
for any mix of constrained and unconstrained sequences.

A logit bias (SamplingParams.logit_bias) is a fixed-width pair of arrays [S, MAX_LOGIT_BIAS]:
token ids (-1 padded) and their biases (0 padded); the runner's cached constants (no bias) unless
some row has one, which turns on the sampler's penalties part (any_penalty), where it is added.
So a biased request compiles nothing new: the shapes and the kinds of leaves never change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping

import jax
import numpy as np

from jaxserve.attention.metadata import AttentionMetadata
from jaxserve.device.token_bitmask import bitmask_words
from jaxserve.messages.buckets import Bucket
from jaxserve.messages.sampling_row import GREEDY_ROW, SAMPLING_ROW_WIDTH, SamplingColumn
from jaxserve.messages.scheduled_batch import (
  PLACEHOLDER_TOKEN_ID,
  BatchSampling,
  ScheduledBatch,
  TokenBitmask,
)
from jaxserve.sampling_params import MAX_LOGIT_BIAS

NUM_BANNED_IDS = 8  # eos + stop_token_ids masked while min_tokens is not reached
_GREEDY_COLUMN = np.frombuffer(GREEDY_ROW, np.float64)[:, None]  # a padding slot's sampling row


def _register(cls):
  jax.tree_util.register_dataclass(
    cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[]
  )
  return cls


@_register
@dataclass(frozen=True)
class SamplingInputs:
  temperature: np.ndarray  # f32[S]; 0 = greedy
  top_k: np.ndarray  # i32[S]; <= 0 disables
  top_p: np.ndarray  # f32[S]
  min_p: np.ndarray  # f32[S]
  seeds: np.ndarray  # u32[S]
  sample_index: np.ndarray  # i32[S]: tokens generated so far (folded into the key)
  repetition_penalty: np.ndarray  # f32[S]
  presence_penalty: np.ndarray  # f32[S]
  frequency_penalty: np.ndarray  # f32[S]
  prompt_history: np.ndarray  # i32[S, H]: prompt ids, -1 padded (H = max_model_len)
  output_history: np.ndarray  # i32[S, H]: generated ids, -1 padded
  banned_ids: np.ndarray  # i32[S, NUM_BANNED_IDS]: ids masked to -inf, -1 padded
  bias_ids: np.ndarray  # i32[S, MAX_LOGIT_BIAS]: logit-bias token ids, -1 padded
  bias_values: np.ndarray  # f32[S, MAX_LOGIT_BIAS]: their biases, 0 padded
  bitmask: jax.Array  # i32[S, ceil(V / 32)], device: allowed tokens, -1 = all
  any_random: np.ndarray  # bool[]: some row samples (temperature > 0)
  any_penalty: np.ndarray  # bool[]: some row uses penalties or a logit bias
  want_top_logprobs: np.ndarray  # bool[]: some row asked for top logprobs
  want_prompt_logprobs: np.ndarray  # bool[]: some row asked for prompt logprobs


@dataclass(frozen=True)
class PreviousSamples:
  """The sampled ids of the step before, still on the device, and whose they are."""

  sampled_ids: jax.Array  # i32[max_seq_slots] (padded; the runner's zeros when none)
  rows: Mapping[str, int]  # request id -> row in sampled_ids


@_register
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
    sampling=_sampling_inputs(
      batch.sampling, num_seqs, num_slots, shape, empty_history, all_allowed, no_logit_bias
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


def with_token_bitmask(sampling: SamplingInputs, bitmask: TokenBitmask) -> SamplingInputs:
  """`sampling` whose bitmask is `bitmask` (rows past its own are all ones), on device."""
  num_slots, words = sampling.bitmask.shape
  rows = bitmask.words
  if (
    rows.dtype != np.int32
    or rows.ndim != 2
    or rows.shape[1] != words
    or not 0 < rows.shape[0] <= num_slots
  ):
    raise ValueError(
      f"bitmask: expected int32 [<= {num_slots}, {words}], got {rows.dtype} {rows.shape}"
    )
  if rows.shape[0] < num_slots:
    padded = np.full((num_slots, words), -1, np.int32)  # [S, W]
    padded[: rows.shape[0]] = rows
    rows = padded
  return dataclasses.replace(sampling, bitmask=jax.device_put(rows))


def _sampling_inputs(
  sampling: BatchSampling,
  num_seqs: int,
  num_slots: int,
  shape: StepShape,
  empty_history,
  all_allowed,
  no_logit_bias,
) -> SamplingInputs:
  table = _sampling_table(sampling.rows, num_seqs, num_slots)  # [width, S]
  sample_index = np.zeros(num_slots, np.int32)  # [S]
  sample_index[:num_seqs] = sampling.sample_index
  banned = np.full((num_slots, NUM_BANNED_IDS), -1, np.int32)  # [S, NUM_BANNED_IDS]
  penalized = [e for e in sampling.extras if e.penalty_prompt_ids is not None]
  want_top = want_prompt = False
  for extras in sampling.extras:
    ids = extras.banned_ids[:NUM_BANNED_IDS]
    banned[extras.row, : len(ids)] = ids
    want_top |= extras.top_logprobs
    want_prompt |= extras.prompt_targets is not None
  if penalized or empty_history is None:
    prompt_history = np.full((num_slots, shape.history_len), -1, np.int32)  # [S, H]
    output_history = np.full((num_slots, shape.history_len), -1, np.int32)  # [S, H]
  else:
    prompt_history = output_history = empty_history(num_slots)
  for extras in penalized:
    prompt_history[extras.row, : len(extras.penalty_prompt_ids)] = extras.penalty_prompt_ids
    output_history[extras.row, : len(extras.penalty_output_ids)] = extras.penalty_output_ids
  if penalized and empty_history is not None:  # same kind of leaf as the cached one
    prompt_history, output_history = jax.device_put((prompt_history, output_history))
  bias_ids, bias_values = _logit_bias(sampling, num_slots, no_logit_bias)
  floats = table.astype(np.float32)  # [width, S]: each column contiguous
  temperature = floats[SamplingColumn.TEMPERATURE]
  bitmask = (
    all_allowed(num_slots)
    if all_allowed is not None
    else jax.device_put(np.full((num_slots, shape.bitmask_words), -1, np.int32))
  )
  inputs = SamplingInputs(
    temperature=temperature,
    top_k=table[SamplingColumn.TOP_K].astype(np.int32),
    top_p=floats[SamplingColumn.TOP_P],
    min_p=floats[SamplingColumn.MIN_P],
    seeds=table[SamplingColumn.SEED].astype(np.uint32),
    sample_index=sample_index,
    repetition_penalty=floats[SamplingColumn.REPETITION_PENALTY],
    presence_penalty=floats[SamplingColumn.PRESENCE_PENALTY],
    frequency_penalty=floats[SamplingColumn.FREQUENCY_PENALTY],
    prompt_history=prompt_history,
    output_history=output_history,
    banned_ids=banned,
    bias_ids=bias_ids,
    bias_values=bias_values,
    bitmask=bitmask,
    any_random=np.array(bool((temperature[:num_seqs] > 0).any())),
    any_penalty=np.array(bool(penalized) or any(e.logit_bias for e in sampling.extras)),
    want_top_logprobs=np.array(want_top),
    want_prompt_logprobs=np.array(want_prompt),
  )
  return inputs if sampling.bitmask is None else with_token_bitmask(inputs, sampling.bitmask)


def _logit_bias(
  sampling: BatchSampling, num_slots: int, no_logit_bias
) -> tuple[np.ndarray | jax.Array, np.ndarray | jax.Array]:
  """The batch's logit-bias ids and values [S, MAX_LOGIT_BIAS]: no_logit_bias's constants when
  no row has a bias, else filled host arrays (put on the device, as the cached ones are)."""
  biased = [e for e in sampling.extras if e.logit_bias]
  if not biased and no_logit_bias is not None:
    return no_logit_bias(num_slots)
  ids = np.full((num_slots, MAX_LOGIT_BIAS), -1, np.int32)  # [S, B]
  values = np.zeros((num_slots, MAX_LOGIT_BIAS), np.float32)  # [S, B]
  for extras in biased:
    pairs = extras.logit_bias[:MAX_LOGIT_BIAS]
    ids[extras.row, : len(pairs)] = [token_id for token_id, _ in pairs]
    values[extras.row, : len(pairs)] = [bias for _, bias in pairs]
  if no_logit_bias is not None:  # same kind of leaf as the cached one
    return jax.device_put((ids, values))
  return ids, values


def _sampling_table(rows: bytes, num_seqs: int, num_slots: int) -> np.ndarray:
  """The batch's sampling rows, transposed to float64 [SAMPLING_ROW_WIDTH, S] (one contiguous
  row per SamplingColumn), padding slots greedy. Every value is exact in float64 (the seed
  column converts to uint32 without loss; in float32 it would not)."""
  table = np.empty((SAMPLING_ROW_WIDTH, num_slots), np.float64)  # [width, S]
  table[:, num_seqs:] = _GREEDY_COLUMN
  table[:, :num_seqs] = np.frombuffer(rows, np.float64).reshape(num_seqs, SAMPLING_ROW_WIDTH).T
  return table
