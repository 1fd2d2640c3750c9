"""The ScheduledBatch is the whole host-to-device message: the batch builder fills every column
the step needs from the requests (sampling rows, tokens generated so far, and the sparse extras:
banned ids, penalty history, prompt-logprob targets, top-N logprobs), and the message survives a
round trip through pickle (it is plain data, ready to cross a process boundary)."""
from __future__ import annotations

import pickle
from array import array

from jaxserve.engine.batch_builder import BatchBuilder
from jaxserve.engine.request import Request
from jaxserve.messages.scheduled_batch import (PLACEHOLDER_TOKEN_ID, SAMPLING_ROW_WIDTH,
                                               BatchSampling, SamplingExtras, ScheduledBatch)
from jaxserve.sampling_params import SamplingParams


def _request(request_id: str, prompt: list[int], **params) -> Request:
  return Request(request_id, prompt, SamplingParams(max_tokens=8, **params), seed=7,
                 eos_token_ids=(2,), page_ids=[1, 2])


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
  assert rows[:SAMPLING_ROW_WIDTH] == list(requests[0].sampling_row)
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
  assert copy.token_ids == batch.token_ids and copy.page_ids == batch.page_ids


def test_a_batch_built_from_seqs_samples_greedily():
  batch = ScheduledBatch()
  assert batch.sampling == BatchSampling(b"", ())
  assert array("d", BatchSampling.greedy(1).rows).tolist()[:2] == [0.0, 1.0]  # greedy, top_p 1
