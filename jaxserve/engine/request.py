"""A request's life on the host: its tokens, pages and status. Pure Python, no jax."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

from jaxserve.api.outputs import FinishReason
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.messages.sampling_row import sampling_row


class RequestStatus(enum.Enum):
  """Where a request is; a finished status's value is the FinishReason its output reports."""

  WAITING = "waiting"
  RUNNING = "running"
  FINISHED_STOPPED = FinishReason.STOP
  FINISHED_LENGTH = FinishReason.LENGTH
  FINISHED_ABORTED = FinishReason.ABORT
  FINISHED_ERROR = FinishReason.ERROR
  FINISHED_GRAMMAR_ERROR = FinishReason.GRAMMAR_ERROR  # the grammar reached a dead end

  @property
  def finished(self) -> bool:
    return self is not _WAITING and self is not _RUNNING  # identity: no enum hashing


_WAITING, _RUNNING = RequestStatus.WAITING, RequestStatus.RUNNING


@dataclass(eq=False)
class Request:
  """One sequence being generated.

  num_computed_tokens counts tokens whose K/V are in the cache (or scheduled to be written by the
  step in flight). After a preemption it drops to 0 and the prompt plus the tokens generated so
  far are recomputed. num_output_placeholders counts tokens sampled by a step whose result the
  host has not seen yet (the engine runs one step ahead with async scheduling, and a decode
  burst samples several); the next step feeds the last of them straight from the device.
  page_ids and window_page_ids are its block tables in the KV groups (engine/kv_groups.py).
  """

  request_id: str
  prompt_token_ids: tuple[int, ...]  # its record's (engine/core_io.EngineCoreRequest), shared
  sampling_params: SamplingParams
  seed: int
  arrival_time: float = 0.0
  priority: int = 0  # the waiting queue's order under scheduler.policy "priority"
  eos_token_ids: tuple[int, ...] = ()
  output_token_ids: list[int] = field(default_factory=list)
  status: RequestStatus = RequestStatus.WAITING
  page_ids: list[int] = field(default_factory=list)  # KV group 0's block table
  window_page_ids: list[list[int]] = field(default_factory=list)  # groups 1..: null-led tables
  num_computed_tokens: int = 0
  num_preemptions: int = 0
  num_output_placeholders: int = 0

  @property
  def num_prompt_tokens(self) -> int:
    return len(self.prompt_token_ids)

  @property
  def num_tokens(self) -> int:
    return len(self.prompt_token_ids) + len(self.output_token_ids)

  @property
  def num_tokens_with_placeholders(self) -> int:
    """Known tokens plus those sampled on the device but not yet seen by the host."""
    return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_output_placeholders

  @property
  def num_generated(self) -> int:
    """Tokens sampled so far, including one still in flight."""
    return len(self.output_token_ids) + self.num_output_placeholders

  def append_sampled(self, token_id: int) -> None:
    """Replaces the oldest output placeholder by the token the device sampled for it."""
    if self.num_output_placeholders < 1:
      raise ValueError(
        f"request {self.request_id!r}: a sampled token arrived with no placeholder for it"
      )
    self.num_output_placeholders -= 1
    self.output_token_ids.append(token_id)

  @property
  def all_token_ids(self) -> list[int]:
    return [*self.prompt_token_ids, *self.output_token_ids]

  @functools.cached_property
  def max_total_tokens(self) -> int:
    return len(self.prompt_token_ids) + self.sampling_params.max_tokens

  @property
  def finished(self) -> bool:
    return self.status.finished

  @functools.cached_property
  def sampling_row_bytes(self) -> bytes:
    """The request's sampling row (messages/sampling_row.py), built once: the step inputs need
    it every step and it never changes; a batch joins its rows as bytes."""
    p = self.sampling_params
    return sampling_row(
      temperature=p.temperature,
      top_p=p.top_p,
      min_p=p.min_p,
      repetition_penalty=p.repetition_penalty,
      presence_penalty=p.presence_penalty,
      frequency_penalty=p.frequency_penalty,
      top_k=p.top_k,
      seed=self.seed,
    )

  @functools.cached_property
  def plain_sampling(self) -> bool:
    """Whether the sampling row is all the step inputs need: no min_tokens, penalties, logit
    bias, logprobs or prompt logprobs."""
    p = self.sampling_params
    return not (
      p.min_tokens
      or p.uses_penalties
      or p.logit_bias
      or p.logprobs is not None
      or p.prompt_logprobs is not None
    )

  @functools.cached_property
  def constrained(self) -> bool:
    """Whether a grammar constrains the sampled tokens (structured outputs)."""
    return self.sampling_params.structured_outputs is not None

  def can_burst(self) -> bool:
    """Whether several decode steps may run in one dispatch for this request: its sampling
    needs nothing that changes within a burst (penalty history, min_tokens bans, a grammar's
    mask, which the host computes from each sampled token), that a burst's sampler leaves out
    (a logit bias) or that a burst does not return (top-N logprobs)."""
    p = self.sampling_params
    return not (
      p.uses_penalties
      or p.logit_bias
      or (p.logprobs or 0) > 0
      or self.constrained
      or self.num_generated < p.min_tokens
    )
