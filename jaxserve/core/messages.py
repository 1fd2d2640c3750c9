"""The engine core's messages, both directions: THE schema shared by the engine core (its
process, or its thread in one-process serving) and its clients (the API servers). EngineCore's
own request and output structs (engine/core_io.py) travel inside them.

Everything here is a typed msgspec Struct (or a dataclass msgspec encodes field by field) and
travels as msgpack. msgspec encodes and decodes straight between typed Structs and msgpack in C,
checking the types on the way in (docs/DECISIONS.md, "msgspec Structs for the core's messages").
Structs are `array_like` (fields by position, no key strings on the wire) and `gc=False` (they
hold no cycles).

Into the core: Hello, AddRequests (one HTTP call's requests, with the admission limit the core
applies to the group), AbortRequests, ClientGone, and the sleep-mode calls Sleep, WakeUp and
IsSleeping (each answered by one ControlDone carrying its `call` number). Out of the core, one
StepOutputs per loop iteration and client: that step's EngineCoreOutputs of the client's
requests (token ids, logprobs, finish reasons, no text), the answers to the adds it applied, and
the EngineStats snapshot; CoreFailed, the last message of a core whose engine raised; and
ControlDone.
"""

from __future__ import annotations

import msgspec

from jaxserve.engine.core_io import EngineCoreOutput, EngineCoreRequest
from jaxserve.engine.engine_stats import EngineStats


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


class Sleep(msgspec.Struct, tag=True, array_like=True, gc=False):
  """EngineCore.sleep(level, mode) (engine/sleep_mode.py); `call` numbers the answer."""

  call: int
  level: int
  mode: str


class WakeUp(msgspec.Struct, tag=True, array_like=True, gc=False):
  call: int
  tags: list[str] | None


class IsSleeping(msgspec.Struct, tag=True, array_like=True, gc=False):
  call: int


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
  num_api_servers: int  # clients (API server processes) connected to the core


class CoreFailed(msgspec.Struct, tag=True, array_like=True, gc=False):
  error: str


class ControlDone(msgspec.Struct, tag=True, array_like=True, gc=False):
  """The answer to a Sleep, WakeUp or IsSleeping: error, the ValueError that refused it (naming
  the field); is_sleeping, the engine's state once the call was applied."""

  call: int
  error: str | None = None
  is_sleeping: bool = False


ControlCall = Sleep | WakeUp | IsSleeping
ToCore = AddRequests | AbortRequests | Hello | ClientGone | Sleep | WakeUp | IsSleeping
FromCore = StepOutputs | CoreFailed | ControlDone
