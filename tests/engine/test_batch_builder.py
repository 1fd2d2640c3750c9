"""The ScheduledBatch is the whole host-to-device message: the batch builder fills every column
the step needs from the requests (sampling rows, tokens generated so far, and the sparse extras:
banned ids, penalty history, prompt-logprob targets, top-N logprobs), and the message survives a
round trip through pickle (it is plain data, ready to cross a process boundary)."""

from __future__ import annotations

import dataclasses
import pickle
from array import array

import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.engine.batch_builder import BatchBuilder
from jaxserve.engine.request import Request
from jaxserve.messages.sampling_row import (
  GREEDY_ROW,
  SAMPLING_ROW_WIDTH,
  SamplingColumn,
  sampling_row,
)
from jaxserve.messages.scheduled_batch import (
  PLACEHOLDER_TOKEN_ID,
  BatchSampling,
  SamplingExtras,
  ScheduledBatch,
  ScheduledSeq,
)


def _request(request_id: str, prompt: list[int], **params) -> Request:
  return Request(
    request_id,
    prompt,
    SamplingParams(max_tokens=8, **params),
    seed=7,
    eos_token_ids=(2,),
    page_ids=[1, 2],
  )


def _batch() -> tuple[ScheduledBatch, list[Request]]:
  plain = _request("plain", [5, 6, 7], temperature=0.5, top_k=3)
  plain.output_token_ids = [9]
  plain.num_output_placeholders = 1
  banned = _request("banned", [5, 6], min_tokens=4, stop_token_ids=(3,))
  penalized = _request("pen", [4, 4], repetition_penalty=1.5, logprobs=2)
  penalized.output_token_ids = [8]
  scored = _request("scored", [10, 11, 12, 13], prompt_logprobs=1)
  builder = BatchBuilder()
  builder.add_decodes([(plain, 4), (banned, 1), (penalized, 2)])
  builder.add_prefill(scored, 1, 3, True)
  return builder.build([]), [plain, banned, penalized, scored]


def test_the_batch_carries_every_column_the_step_needs():
  batch, requests = _batch()
  assert batch.token_ids == (PLACEHOLDER_TOKEN_ID, 6, 8, 11, 12, 13)
  sampling = batch.sampling
  rows = array("d", sampling.rows).tolist()
  assert len(rows) == SAMPLING_ROW_WIDTH * batch.num_seqs
  assert sampling.rows == b"".join(r.sampling_row_bytes for r in requests)
  plain = rows[:SAMPLING_ROW_WIDTH]
  assert plain[SamplingColumn.TEMPERATURE] == 0.5 and plain[SamplingColumn.TOP_K] == 3
  assert plain[SamplingColumn.SEED] == 7 and plain[SamplingColumn.TOP_P] == 1.0
  assert sampling.sample_index == tuple(r.num_generated for r in requests) == (2, 0, 1, 0)
  assert sampling.extras == (
    SamplingExtras(1, banned_ids=(2, 3)),
    SamplingExtras(2, penalty_prompt_ids=(4, 4), penalty_output_ids=(8,), top_logprobs=True),
    SamplingExtras(3, prompt_targets=(12, 13, -1)),
  )


def test_the_batch_is_plain_data():
  batch, _ = _batch()
  copy = pickle.loads(pickle.dumps(batch))
  assert copy == batch and copy.sampling == batch.sampling
  assert batch.seqs and pickle.loads(pickle.dumps(batch)).seqs == batch.seqs  # view cached
  assert copy.token_ids == batch.token_ids and copy.page_ids == batch.page_ids


def test_a_batch_built_from_seqs_samples_greedily():
  batch = ScheduledBatch()
  assert batch.sampling == BatchSampling(b"", ())
  greedy = array("d", BatchSampling.greedy(1).rows).tolist()
  assert greedy[SamplingColumn.TEMPERATURE] == 0.0 and greedy[SamplingColumn.TOP_P] == 1.0
  assert greedy[SamplingColumn.REPETITION_PENALTY] == 1.0 and greedy[SamplingColumn.TOP_K] == 0
  seq = ScheduledSeq("a", (5, 6), 0, (1,), True)
  assert ScheduledBatch.of([seq, seq]).sampling.rows == GREEDY_ROW * 2


def test_a_sampling_row_is_its_values_by_name():
  row = array(
    "d",
    sampling_row(
      temperature=0.5,
      top_p=0.9,
      min_p=0.1,
      repetition_penalty=1.2,
      presence_penalty=0.3,
      frequency_penalty=0.4,
      top_k=-1,
      seed=(5 << 32) | 3,
    ),
  ).tolist()
  assert dict(zip(SamplingColumn, row, strict=True)) == {
    SamplingColumn.TEMPERATURE: 0.5,
    SamplingColumn.TOP_P: 0.9,
    SamplingColumn.MIN_P: 0.1,
    SamplingColumn.REPETITION_PENALTY: 1.2,
    SamplingColumn.PRESENCE_PENALTY: 0.3,
    SamplingColumn.FREQUENCY_PENALTY: 0.4,
    SamplingColumn.TOP_K: -1,
    SamplingColumn.SEED: 5 ^ 3,
  }  # the seed folded to 32 bits


def test_a_batch_is_frozen_and_its_per_sequence_view_round_trips():
  batch, _ = _batch()
  with pytest.raises(dataclasses.FrozenInstanceError):
    batch.num_steps = 2
  rebuilt = ScheduledBatch.of(
    batch.seqs, batch.preempted_request_ids, batch.num_steps, batch.sampling
  )
  assert rebuilt == batch and rebuilt.token_ids == batch.token_ids
  assert rebuilt.page_ids == batch.page_ids and rebuilt.sampling is batch.sampling


@pytest.mark.parametrize("min_tokens", [1, 3])
def test_min_tokens_bans_stops_for_exactly_the_first_min_tokens(min_tokens):
  """vLLM's min_tokens: eos and stop_token_ids are banned while the token being sampled is one
  of the first min_tokens (the step counts it as a placeholder before the batch is built)."""
  banned_at = []
  for num_output in range(min_tokens + 2):
    request = _request("r", [5, 6], min_tokens=min_tokens, stop_token_ids=(3,))
    request.output_token_ids = [9] * num_output
    request.num_output_placeholders = 1  # the token this step samples: number num_output + 1
    builder = BatchBuilder()
    builder.add_decodes([(request, 1 + num_output)])
    (extras,) = builder.build([]).sampling.extras
    banned_at.append(extras.banned_ids == (2, 3))
  assert banned_at == [True] * min_tokens + [False, False]
