"""A batch's sampling parameters as the sampler's fixed-shape inputs (host numpy, device side).

build_sampling_inputs() reads the batch's sampling rows (messages/sampling_row.py) by column name
into one array per parameter [S] (padding slots sample greedily), and its per-row extras into the
penalty histories [S, max_model_len], banned ids, logit bias and token bitmask.

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

import jax
import numpy as np

from jaxserve.api.sampling_params import MAX_LOGIT_BIAS
from jaxserve.messages.sampling_row import GREEDY_ROW, SAMPLING_ROW_WIDTH, SamplingColumn
from jaxserve.messages.scheduled_batch import BatchSampling, TokenBitmask

NUM_BANNED_IDS = 8  # eos + stop_token_ids masked while min_tokens is not reached
_GREEDY_COLUMN = np.frombuffer(GREEDY_ROW, np.float64)[:, None]  # a padding slot's sampling row


def register_leaves(cls):
  """Registers a frozen dataclass of arrays as a pytree whose every field is a leaf."""
  jax.tree_util.register_dataclass(
    cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[]
  )
  return cls


@register_leaves
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


def build_sampling_inputs(
  sampling: BatchSampling,
  num_seqs: int,
  num_slots: int,
  history_len: int,
  bitmask_words: int,
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
    prompt_history = np.full((num_slots, history_len), -1, np.int32)  # [S, H]
    output_history = np.full((num_slots, history_len), -1, np.int32)  # [S, H]
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
    else jax.device_put(np.full((num_slots, bitmask_words), -1, np.int32))
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
