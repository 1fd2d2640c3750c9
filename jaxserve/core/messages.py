"""The engine core's messages, both directions: THE schema shared by the engine core process and
its clients (the API server processes), and the token-level outputs of EngineCore.step(), which
the in-process LLMEngine hands to its OutputProcessor unchanged.

Everything here is a typed msgspec Struct (or a dataclass msgspec encodes field by field) and
travels as msgpack. Why msgspec: it encodes and decodes straight between typed Structs and
msgpack in C, checking the types on the way in, several times faster than msgpack-python plus a
conversion to dataclasses, and a Struct is cheaper to build than a dataclass even when it never
leaves the process. Structs are `array_like` (fields by position, no key strings on the wire)
and `gc=False` (they hold no cycles).

Into the core: Hello, AddRequests (one HTTP call's requests, with the admission limit the core
applies to the group), AbortRequests and ClientGone. Out of the core, one StepOutputs per loop
iteration and client: that step's EngineCoreOutputs of the client's requests (token ids,
logprobs, finish reasons, no text), the answers to the adds it applied, and the EngineStats
snapshot; and CoreFailed, the last message of a core whose engine raised.
"""
from __future__ import annotations

import msgspec

from jaxserve.engine.engine_stats import EngineStats
from jaxserve.outputs import FinishReason, TokenLogprob
from jaxserve.sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, frozen=True, array_like=True, gc=False):
  """One tokenized request. stream=False: the caller wants the final output only."""
  request_id: str
  prompt_token_ids: list[int]
  params: SamplingParams
  arrival_time: float
  stream: bool = True


class EngineCoreOutput(msgspec.Struct, array_like=True, gc=False):
  """A request's tokens from one step (a burst's several, or, for a request that streams
  nothing, all of them at the end). finish_reason: STOP (a stop token, then the last of
  new_token_ids and stop_reason its id, None for eos), LENGTH, ABORT, ERROR or GRAMMAR_ERROR;
  stop strings are the output processor's. prompt_logprobs come once, with the request's first
  output."""
  request_id: str
  new_token_ids: list[int]
  new_logprobs: list[TokenLogprob] | None
  finish_reason: FinishReason | None
  stop_reason: int | None
  prompt_logprobs: list[TokenLogprob | None] | None
  first_scheduled_time: float | None
  first_token_time: float | None
  last_token_time: float | None
  finished_time: float | None
  num_preemptions: int
  error: str | None = None


# -- client -> core ------------------------------------------------------------------------------
class AddRequests(msgspec.Struct, tag=True, array_like=True, gc=False):
  """The requests of one HTTP call, added all or none. The group takes one of max_waiting places
  until each of its requests has produced an output (the admission rule, counted by the core for
  every client: core/loop.py)."""
  group: int
  requests: list[EngineCoreRequest]
  max_waiting: int


class AbortRequests(msgspec.Struct, tag=True, array_like=True, gc=False):
  """stopped: the requests ended on the front end (a stop string), not a cancel."""
  request_ids: list[str]
  stopped: bool = False


class Hello(msgspec.Struct, tag=True, array_like=True, gc=False):
  """A client's first message: the core registers it and answers with its stats."""


class ClientGone(msgspec.Struct, tag=True, array_like=True, gc=False):
  """A client is gone (its own goodbye, or the supervisor's word that its process died): the
  core aborts every request the client owned."""
  identity: str


# -- core -> client ------------------------------------------------------------------------------
class AddResult(msgspec.Struct, array_like=True, gc=False):
  """error: why the group was refused (a ValueError naming the field; context_length: it was
  the ContextLengthError); queue_full: refused because max_waiting groups are waiting."""
  group: int
  error: str | None = None
  context_length: bool = False
  queue_full: bool = False


class StepOutputs(msgspec.Struct, tag=True, array_like=True, gc=False):
  outputs: list[EngineCoreOutput]
  added: list[AddResult]
  stats: EngineStats
  num_http_waiting: int
  num_api_servers: int   # clients (API server processes) connected to the core


class CoreFailed(msgspec.Struct, tag=True, array_like=True, gc=False):
  error: str


ToCore = AddRequests | AbortRequests | Hello | ClientGone
FromCore = StepOutputs | CoreFailed
