"""The one place a scheduled batch becomes fixed-shape step inputs.

build_step_inputs() pads a ScheduledBatch to its bucket (S sequence slots, T token slots) and
returns numpy arrays only; the jitted step never sees a Python list or a shape that is not a
bucket. Padding tokens write into the null page 0 and padding sequences have no queries.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping

import jax
import numpy as np

from jaxserve.attention.metadata import AttentionMetadata
from jaxserve.engine.request import Request
from jaxserve.engine.scheduled_batch import ScheduledBatch
from jaxserve.runtime.buckets import Bucket

NUM_BANNED_IDS = 8  # eos + stop_token_ids masked while min_tokens is not reached


def _register(cls):
  jax.tree_util.register_dataclass(
      cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[])
  return cls


@_register
@dataclass(frozen=True)
class SamplingInputs:
  temperature: np.ndarray         # f32[S]; 0 = greedy
  top_k: np.ndarray               # i32[S]; <= 0 disables
  top_p: np.ndarray               # f32[S]
  min_p: np.ndarray               # f32[S]
  seeds: np.ndarray               # u32[S]
  sample_index: np.ndarray        # i32[S]: tokens generated so far (folded into the key)
  repetition_penalty: np.ndarray  # f32[S]
  presence_penalty: np.ndarray    # f32[S]
  frequency_penalty: np.ndarray   # f32[S]
  prompt_history: np.ndarray      # i32[S, H]: prompt ids, -1 padded (H = max_model_len)
  output_history: np.ndarray      # i32[S, H]: generated ids, -1 padded
  banned_ids: np.ndarray          # i32[S, NUM_BANNED_IDS]: ids masked to -inf, -1 padded
  any_random: np.ndarray          # bool[]: some row samples (temperature > 0)
  any_penalty: np.ndarray         # bool[]: some row uses penalties
  want_top_logprobs: np.ndarray   # bool[]: some row asked for top logprobs
  want_prompt_logprobs: np.ndarray  # bool[]: some row asked for prompt logprobs


@_register
@dataclass(frozen=True)
class StepInputs:
  token_ids: np.ndarray           # i32[T]
  positions: np.ndarray           # i32[T]
  slot_mapping: np.ndarray        # i32[T]: page_id * page_size + offset; padding -> page 0
  prompt_target_ids: np.ndarray   # i32[T]: next prompt token per position, -1 where none
  logits_indices: np.ndarray      # i32[S]: index of each sequence's last token in token_ids
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


def build_step_inputs(batch: ScheduledBatch, requests: Mapping[str, Request], bucket: Bucket,
                      shape: StepShape,
                      empty_history: Callable[[int], np.ndarray] | None = None) -> StepInputs:
  """Pads `batch` to `bucket`. empty_history(S) supplies the [S, H] all -1 history used when no
  request penalizes (the runner passes a cached device array, so nothing is transferred)."""
  num_slots, num_token_slots = bucket.num_seqs, bucket.num_tokens
  token_ids = np.zeros(num_token_slots, np.int32)
  positions = np.zeros(num_token_slots, np.int32)
  slot_mapping = np.zeros(num_token_slots, np.int32)
  prompt_targets = np.full(num_token_slots, -1, np.int32)
  block_tables = np.zeros((num_slots, shape.pages_per_seq), np.int32)
  seq_lens = np.zeros(num_slots, np.int32)
  query_start_loc = np.zeros(num_slots + 1, np.int32)
  logits_indices = np.zeros(num_slots, np.int32)
  cursor = 0
  for i, seq in enumerate(batch.seqs):
    n = seq.num_tokens
    span = slice(cursor, cursor + n)
    token_ids[span] = seq.token_ids
    pos = np.arange(seq.start_position, seq.seq_len, dtype=np.int32)
    positions[span] = pos
    pages = np.asarray(seq.page_ids, np.int32)
    slot_mapping[span] = pages[pos // shape.page_size] * shape.page_size + pos % shape.page_size
    block_tables[i, :len(pages)] = pages
    seq_lens[i] = seq.seq_len
    logits_indices[i] = cursor + n - 1
    request = requests[seq.request_id]
    if request.sampling_params.prompt_logprobs is not None:
      _fill_prompt_targets(prompt_targets[span], pos, request)
    cursor += n
    query_start_loc[i + 1] = cursor
  query_start_loc[len(batch.seqs) + 1:] = cursor
  metadata = AttentionMetadata(block_tables=block_tables, seq_lens=seq_lens,
                               query_start_loc=query_start_loc,
                               num_seqs=np.array([len(batch.seqs)], np.int32))
  return StepInputs(token_ids=token_ids, positions=positions, slot_mapping=slot_mapping,
                    prompt_target_ids=prompt_targets, logits_indices=logits_indices,
                    metadata=metadata,
                    sampling=_sampling_inputs(batch, requests, num_slots, shape, empty_history))


def _fill_prompt_targets(out: np.ndarray, positions: np.ndarray, request: Request) -> None:
  prompt = request.prompt_token_ids
  for j, p in enumerate(positions):
    if p + 1 < len(prompt):
      out[j] = prompt[p + 1]


def _sampling_inputs(batch: ScheduledBatch, requests: Mapping[str, Request], num_slots: int,
                     shape: StepShape, empty_history) -> SamplingInputs:
  temperature = np.zeros(num_slots, np.float32)
  top_k = np.zeros(num_slots, np.int32)
  top_p = np.ones(num_slots, np.float32)
  min_p = np.zeros(num_slots, np.float32)
  seeds = np.zeros(num_slots, np.uint32)
  sample_index = np.zeros(num_slots, np.int32)
  rep = np.ones(num_slots, np.float32)
  presence = np.zeros(num_slots, np.float32)
  frequency = np.zeros(num_slots, np.float32)
  banned = np.full((num_slots, NUM_BANNED_IDS), -1, np.int32)
  penalized = []
  want_top = want_prompt = False
  for i, seq in enumerate(batch.seqs):
    request = requests[seq.request_id]
    params = request.sampling_params
    temperature[i], top_k[i], top_p[i], min_p[i] = (params.temperature, params.top_k,
                                                    params.top_p, params.min_p)
    seeds[i] = (request.seed ^ (request.seed >> 32)) & 0xFFFFFFFF
    sample_index[i] = len(request.output_token_ids)
    rep[i], presence[i], frequency[i] = (params.repetition_penalty, params.presence_penalty,
                                         params.frequency_penalty)
    if len(request.output_token_ids) < params.min_tokens:
      ids = (() if params.ignore_eos else request.eos_token_ids) + params.stop_token_ids
      ids = ids[:NUM_BANNED_IDS]
      banned[i, :len(ids)] = ids
    if params.uses_penalties:
      penalized.append((i, request))
    want_top |= params.logprobs is not None and params.logprobs > 0
    want_prompt |= params.prompt_logprobs is not None
  if penalized or empty_history is None:
    prompt_history = np.full((num_slots, shape.history_len), -1, np.int32)
    output_history = np.full((num_slots, shape.history_len), -1, np.int32)
  else:
    prompt_history = output_history = empty_history(num_slots)
  for i, request in penalized:
    prompt_history[i, :request.num_prompt_tokens] = request.prompt_token_ids
    output_history[i, :len(request.output_token_ids)] = request.output_token_ids
  return SamplingInputs(
      temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seeds=seeds,
      sample_index=sample_index, repetition_penalty=rep, presence_penalty=presence,
      frequency_penalty=frequency, prompt_history=prompt_history, output_history=output_history,
      banned_ids=banned, any_random=np.array(bool((temperature[:batch.num_seqs] > 0).any())),
      any_penalty=np.array(bool(penalized)), want_top_logprobs=np.array(want_top),
      want_prompt_logprobs=np.array(want_prompt))
