"""Builds the scheduler's ScheduledBatch column by column, and reads a request's tokens at the
positions a step feeds: a token sampled by the step still in flight (async scheduling) is not on
the host yet and reads as PLACEHOLDER_TOKEN_ID, which the device replaces with that step's
sampled id. Pure Python, no jax.
"""
from __future__ import annotations

from .request import Request
from ..messages.scheduled_batch import ScheduledBatch

PLACEHOLDER_TOKEN_ID = -1  # a token sampled by the step in flight, fed from the device


class BatchBuilder:
  """The columns of a ScheduledBatch, filled one sequence at a time (after its request's
  num_computed_tokens and placeholders were advanced); build() makes the batch."""

  def __init__(self) -> None:
    self.request_ids: list[str] = []
    self.starts: list[int] = []
    self.query_lens: list[int] = []
    self.sample: list[bool] = []
    self.page_counts: list[int] = []
    self.token_ids: list[int] = []
    self.page_ids: list[int] = []

  def add_decodes(self, decodes: list[tuple[Request, int]]) -> None:
    """One-token sampling sequences: the per-sequence appends of _add, inlined."""
    self.query_lens.extend([1] * len(decodes))
    self.sample.extend([True] * len(decodes))
    request_ids, starts, page_counts = self.request_ids, self.starts, self.page_counts
    token_ids, page_ids = self.token_ids, self.page_ids
    for request, start in decodes:
      request_ids.append(request.request_id)
      starts.append(start)
      page_counts.append(len(request.page_ids))
      page_ids.extend(request.page_ids)
      token_ids.append(_token_at(request, start))

  def add_prefill(self, request: Request, start: int, num_new: int, sample: bool) -> None:
    self._add(request, start, num_new, sample)
    self.token_ids.extend(_token_slice(request, start, start + num_new))

  def _add(self, request: Request, start: int, num_new: int, sample: bool) -> None:
    self.request_ids.append(request.request_id)
    self.starts.append(start)
    self.query_lens.append(num_new)
    self.sample.append(sample)
    self.page_counts.append(len(request.page_ids))
    self.page_ids.extend(request.page_ids)

  def build(self, preempted_ids: list[str], num_steps: int = 1) -> ScheduledBatch:
    return ScheduledBatch.from_columns(self.request_ids, self.starts, self.query_lens,
                                       self.sample, self.page_counts, self.token_ids,
                                       self.page_ids, preempted_ids, num_steps)


def _token_slice(request: Request, start: int, end: int) -> tuple[int, ...]:
  """request.all_token_ids[start:end] without copying the whole sequence; positions past the
  known tokens (a token still in flight) hold PLACEHOLDER_TOKEN_ID."""
  if end - start == 1:
    return (_token_at(request, start),)
  num_prompt = request.num_prompt_tokens
  num_missing = max(0, end - max(start, request.num_tokens))
  if num_missing:
    return _token_slice(request, start, end - num_missing) + (PLACEHOLDER_TOKEN_ID,) * num_missing
  if start >= num_prompt:
    return tuple(request.output_token_ids[start - num_prompt:end - num_prompt])
  return (tuple(request.prompt_token_ids[start:end])
          + tuple(request.output_token_ids[:max(0, end - num_prompt)]))


def _token_at(request: Request, position: int) -> int:
  """request.all_token_ids[position], or PLACEHOLDER_TOKEN_ID for a token still in flight."""
  num_prompt = len(request.prompt_token_ids)
  if position < num_prompt:
    return request.prompt_token_ids[position]
  index = position - num_prompt
  output = request.output_token_ids
  return output[index] if index < len(output) else PLACEHOLDER_TOKEN_ID
