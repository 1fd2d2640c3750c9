"""What a request must satisfy to be admitted: the one definition of each admission rule.
Pure Python, no jax.

A prompt's ids are checked where its request record is built (engine/core_io.new_core_requests,
in the API server or the offline LLMEngine: once, before anything detokenizes them);
EngineCore.add_request applies the rules that need the core to every request, in whichever
process the core runs (in LLMEngine for the offline API and the single-process server, in the
engine core process of `jaxserve serve`); the server calls check_length to refuse a long prompt
before it tokenizes it in full (server/prompt_length.py), and the scheduler calls check_length to
keep its own invariant (no request outgrows the context) without restating the rule.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from jaxserve.api.sampling_params import SamplingParams


class ContextLengthError(ValueError):
  """The prompt plus max_tokens do not fit max_model_len (OpenAI's context_length_exceeded)."""


def check_priority(priority: object, policy: str) -> None:
  """A request's priority: an integer, other than 0 only under scheduler.policy "priority" (as
  vLLM refuses it under fcfs, where it would be silently ignored)."""
  if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
    raise ValueError(f"priority: must be an integer, got {priority!r}")
  if priority != 0 and policy != "priority":
    raise ValueError(
      f"priority: {priority} needs priority scheduling (--scheduling-policy priority); this "
      f"server schedules {policy}"
    )


def check_token_ids(ids: Sequence[int], vocab_size: int, name: str = "prompt") -> tuple[int, ...]:
  """ids as a tuple of ints (`ids` itself if it is one), each in [0, vocab_size); ValueError
  naming `name` otherwise."""
  ids = ids if type(ids) is tuple else tuple(ids)
  if not ids or (set(map(type, ids)) == {int} and 0 <= min(ids) and max(ids) < vocab_size):
    return ids  # the common case, checked in C loops (no Python code per token)
  for token_id in ids:
    if (
      isinstance(token_id, bool)
      or not isinstance(token_id, numbers.Integral)
      or not (0 <= token_id < vocab_size)
    ):
      raise ValueError(f"{name}: token id {token_id!r} is out of range [0, {vocab_size})")
  return tuple(int(t) for t in ids)


def check_length(
  num_prompt_tokens: int, max_tokens: int, max_model_len: int, at_least: bool = False
) -> None:
  """The prompt plus max_tokens must fit max_model_len. at_least: num_prompt_tokens is a lower
  bound on the prompt's tokens (the API server's check before it tokenizes a long prompt,
  server/prompt_length.py), and the message says so."""
  total = num_prompt_tokens + max_tokens
  if total > max_model_len:
    raise ContextLengthError(
      f"prompt: {'at least ' if at_least else ''}{num_prompt_tokens} prompt tokens + max_tokens "
      f"{max_tokens} = {total} exceeds max_model_len {max_model_len}"
    )


def check_multi_host_sampling(params: SamplingParams) -> None:
  """On a multi-host job a step's inputs reach the other hosts as host data and constant device
  arrays only (parallel/step_codec.py), so a request's own device arrays (the penalty history,
  the logit bias) cannot travel: ValueError naming the field that needs them."""
  if params.logit_bias:
    raise ValueError("logit_bias: not supported on a multi-host job")
  for name, neutral in (
    ("repetition_penalty", 1.0),
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
  ):
    if getattr(params, name) != neutral:
      raise ValueError(f"{name}: not supported on a multi-host job")
