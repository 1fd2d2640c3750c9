"""What the engine reports about a request after each step (host side, plain data)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field


class FinishReason(str, enum.Enum):
  """Why a request's output ended, the OpenAI API's finish_reason. A str: a member compares
  equal to its value and prints, formats and serializes (JSON, msgpack) as it."""

  STOP = "stop"  # a stop token (eos, stop_token_ids) or a stop string
  LENGTH = "length"  # max_tokens or the model's context is reached
  ABORT = "abort"  # cancelled (the client left, or an abort)
  ERROR = "error"  # the engine failed the request
  GRAMMAR_ERROR = "grammar_error"  # the grammar reached a dead end (structured outputs)
  TOOL_CALLS = "tool_calls"  # a chat choice that called tools (the API server's)

  def __str__(self) -> str:
    return self.value


@dataclass(frozen=True)
class TokenLogprob:
  """A token's logprob plus the top-N alternatives at that position (id -> logprob)."""

  token_id: int
  logprob: float
  top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RequestMetrics:
  arrival_time: float
  first_scheduled_time: float | None
  first_token_time: float | None
  last_token_time: float | None
  finished_time: float | None
  num_preemptions: int


@dataclass(frozen=True)
class RequestOutput:
  """One request's state after a step. new_* hold this step's delta (for streaming), the rest is
  cumulative. prompt_logprobs[0] is None (the first token has no context)."""

  request_id: str
  prompt_token_ids: tuple[int, ...]
  token_ids: tuple[int, ...]
  text: str
  new_token_ids: tuple[int, ...]
  new_text: str
  finished: bool
  finish_reason: FinishReason | None = None
  stop_reason: str | int | None = None  # the stop string or stop token id that matched
  logprobs: tuple[TokenLogprob, ...] | None = None
  new_logprobs: tuple[TokenLogprob, ...] | None = None
  prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
  metrics: RequestMetrics | None = None
  error: str | None = None
  extra: dict = field(default_factory=dict)


def merge_outputs(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
  """Two consecutive outputs of a request as one: `later`'s cumulative state with the deltas of
  both (server.stream_interval's merged chunks, and a slow reader's waiting outputs,
  core/streams.py)."""
  new_logprobs = later.new_logprobs
  if earlier.new_logprobs is not None and new_logprobs is not None:
    new_logprobs = earlier.new_logprobs + new_logprobs
  return dataclasses.replace(
    later,
    new_token_ids=earlier.new_token_ids + later.new_token_ids,
    new_text=earlier.new_text + later.new_text,
    new_logprobs=new_logprobs,
  )


@dataclass(frozen=True)
class Completion:
  """One of the n completions of a prompt (offline API)."""

  index: int
  text: str
  token_ids: tuple[int, ...]
  finish_reason: FinishReason | None
  stop_reason: str | int | None = None
  logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class GenerationResult:
  """A prompt and its completions, as LLM.generate returns them."""

  prompt: str | None
  prompt_token_ids: tuple[int, ...]
  outputs: tuple[Completion, ...]
  prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
