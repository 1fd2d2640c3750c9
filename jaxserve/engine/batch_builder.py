"""Builds the scheduler's ScheduledBatch column by column: every column the step needs, so the
device side never reads a Request. Pure Python, no jax.

A request's tokens at the positions a step feeds: a token sampled by the step still in flight
(async scheduling) is not on the host yet and reads as PLACEHOLDER_TOKEN_ID, which the device
replaces with that step's sampled id. Its sampling columns: the request's fixed sampling row, the
tokens it has generated so far, and, for the few requests whose sampling needs more
(Request.plain_sampling is False), a SamplingExtras: eos and stop_token_ids banned while the
token sampled is one of the first min_tokens (vLLM's min_tokens: at least that many before a stop),
the penalty history, its logit bias, whether it wants top-N logprobs, and the next prompt token
of every fed position when it asks for prompt logprobs.
"""

from __future__ import annotations

from ..messages.scheduled_batch import (
  PLACEHOLDER_TOKEN_ID,
  BatchSampling,
  SamplingExtras,
  ScheduledBatch,
)
from .request import Request

__all__ = ["BatchBuilder", "PLACEHOLDER_TOKEN_ID"]


class BatchBuilder:
  """The columns of a ScheduledBatch, filled one sequence at a time (after its request's
  num_computed_tokens and placeholders were advanced); build() makes the batch. num_kv_groups:
  the block tables each sequence has (engine/kv_groups.py)."""

  def __init__(self, num_kv_groups: int = 1) -> None:
    self.request_ids: list[str] = []
    self.starts: list[int] = []
    self.query_lens: list[int] = []
    self.sample: list[bool] = []
    self.page_counts: list[int] = []
    self.token_ids: list[int] = []
    self.page_ids: list[int] = []
    self.window_page_ids: tuple[list[int], ...] = tuple([] for _ in range(num_kv_groups - 1))
    self.sampling_rows: list[bytes] = []
    self.sample_index: list[int] = []
    self.extras: list[SamplingExtras] = []
    self.bitmask_rows: list[int] = []

  def add_decodes(self, decodes: list[tuple[Request, int]]) -> None:
    """One-token sampling sequences: the per-sequence appends of _add, inlined."""
    self.query_lens.extend([1] * len(decodes))
    self.sample.extend([True] * len(decodes))
    request_ids, starts, page_counts = self.request_ids, self.starts, self.page_counts
    token_ids, page_ids = self.token_ids, self.page_ids
    rows, sample_index = self.sampling_rows, self.sample_index
    for request, start in decodes:
      if request.constrained:
        self.bitmask_rows.append(len(request_ids))
      if not request.plain_sampling:
        self._add_extras(request, start, 1)
      request_ids.append(request.request_id)
      starts.append(start)
      page_counts.append(len(request.page_ids))
      page_ids.extend(request.page_ids)
      token_ids.append(_token_at(request, start))
      rows.append(request.sampling_row_bytes)
      sample_index.append(request.num_generated)
    if self.window_page_ids:
      for request, _ in decodes:
        self._add_window_pages(request)

  def add_prefill(self, request: Request, start: int, num_new: int, sample: bool) -> None:
    if sample and request.constrained:
      self.bitmask_rows.append(len(self.request_ids))
    if not request.plain_sampling:
      self._add_extras(request, start, num_new)
    self.request_ids.append(request.request_id)
    self.starts.append(start)
    self.query_lens.append(num_new)
    self.sample.append(sample)
    self.page_counts.append(len(request.page_ids))
    self.page_ids.extend(request.page_ids)
    self._add_window_pages(request)
    self.token_ids.extend(_token_slice(request, start, start + num_new))
    self.sampling_rows.append(request.sampling_row_bytes)
    self.sample_index.append(request.num_generated)

  def _add_window_pages(self, request: Request) -> None:
    for column, table in zip(self.window_page_ids, request.window_page_ids, strict=True):
      column.extend(table)

  def _add_extras(self, request: Request, start: int, num_new: int) -> None:
    """The SamplingExtras of the sequence about to be added (row = sequences so far)."""
    params = request.sampling_params
    banned: tuple[int, ...] = ()
    # num_generated counts the token this step samples (its placeholder is already added): it is
    # output token number num_generated, banned from stopping while that is <= min_tokens
    if params.min_tokens and request.num_generated <= params.min_tokens:
      banned = (() if params.ignore_eos else request.eos_token_ids) + params.stop_token_ids
    prompt_ids = output_ids = targets = None
    if params.uses_penalties:
      prompt_ids, output_ids = tuple(request.prompt_token_ids), tuple(request.output_token_ids)
    if params.prompt_logprobs is not None:
      targets = tuple(request.prompt_token_ids[start + 1 : start + 1 + num_new])
      targets += (-1,) * (num_new - len(targets))
    self.extras.append(
      SamplingExtras(
        len(self.request_ids),
        banned,
        prompt_ids,
        output_ids,
        params.logprobs is not None and params.logprobs > 0,
        targets,
        params.logit_bias,
      )
    )

  def build(self, preempted_ids: list[str], num_steps: int = 1) -> ScheduledBatch:
    sampling = BatchSampling(
      b"".join(self.sampling_rows),
      tuple(self.sample_index),
      tuple(self.extras),
      tuple(self.bitmask_rows),
    )
    return ScheduledBatch(
      tuple(self.request_ids),
      tuple(self.starts),
      tuple(self.query_lens),
      tuple(self.sample),
      tuple(self.page_counts),
      tuple(self.token_ids),
      tuple(self.page_ids),
      tuple(preempted_ids),
      num_steps,
      sampling,
      tuple(tuple(column) for column in self.window_page_ids),
    )


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
    return tuple(request.output_token_ids[start - num_prompt : end - num_prompt])
  return tuple(request.prompt_token_ids[start:end]) + tuple(
    request.output_token_ids[: max(0, end - num_prompt)]
  )


def _token_at(request: Request, position: int) -> int:
  """request.all_token_ids[position], or PLACEHOLDER_TOKEN_ID for a token still in flight."""
  num_prompt = len(request.prompt_token_ids)
  if position < num_prompt:
    return request.prompt_token_ids[position]
  index = position - num_prompt
  output = request.output_token_ids
  return output[index] if index < len(output) else PLACEHOLDER_TOKEN_ID
