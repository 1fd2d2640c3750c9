"""The waiting queue's order: THE scheduling policy (config key scheduler.policy, vLLM's
`--scheduling-policy`). Pure Python, no jax.

A RequestQueue holds the waiting requests; the scheduler (engine/scheduler.py) adds arrivals with
`add`, puts a preempted request back with `add_preempted`, and waiting_admission.py admits from
`peek` / `pop` and places each admitted request in the running list with `insert_running`. The
scheduler schedules the running list in its order and, when the pool runs out, preempts its
last request; so the running list's order is the policy's too. Two policies, as vLLM's:

- "fcfs": arrival order; a preempted request goes back to the front (it was admitted before
  every waiting one); the running list is in admission order, so the most recently admitted
  request is preempted first.
- "priority": by (request.priority, arrival_time), lower values first (vLLM's `priority` field:
  0 by default, negative is more urgent), in the waiting queue and the running list alike: the
  most urgent request is admitted first, gets its pages first and is preempted last; a preempted
  request goes back in that order. Arrival order breaks ties, so equal priorities behave as
  fcfs.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterator
from typing import Protocol

from ..config.scheduler import SCHEDULING_POLICIES
from .request import Request


class RequestQueue(Protocol):
  def add(self, request: Request) -> None: ...
  def add_preempted(self, request: Request) -> None: ...
  def peek(self) -> Request: ...
  def pop(self) -> Request: ...
  def remove(self, request: Request) -> None: ...
  def insert_running(self, running: list[Request], request: Request) -> None: ...
  def __len__(self) -> int: ...
  def __iter__(self) -> Iterator[Request]: ...


class FcfsQueue:
  """Arrival order (module docstring)."""

  def __init__(self) -> None:
    self._requests: collections.deque[Request] = collections.deque()

  def add(self, request: Request) -> None:
    self._requests.append(request)

  def add_preempted(self, request: Request) -> None:
    self._requests.appendleft(request)

  def peek(self) -> Request:
    return self._requests[0]

  def pop(self) -> Request:
    return self._requests.popleft()

  def remove(self, request: Request) -> None:
    self._requests.remove(request)

  def insert_running(self, running: list[Request], request: Request) -> None:
    running.append(request)

  def __len__(self) -> int:
    return len(self._requests)

  def __iter__(self) -> Iterator[Request]:
    return iter(self._requests)


def _rank(request: Request) -> tuple[int, float]:
  return (request.priority, request.arrival_time)


class PriorityQueue:
  """By (priority, arrival_time), lower first (module docstring); a sorted list, so peek is O(1)
  and an insertion a binary search (waiting queues are hundreds of requests, not millions)."""

  def __init__(self) -> None:
    self._requests: list[Request] = []

  def add(self, request: Request) -> None:
    bisect.insort_right(self._requests, request, key=_rank)

  def add_preempted(self, request: Request) -> None:
    self.add(request)

  def peek(self) -> Request:
    return self._requests[0]

  def pop(self) -> Request:
    return self._requests.pop(0)

  def remove(self, request: Request) -> None:
    self._requests.remove(request)

  def insert_running(self, running: list[Request], request: Request) -> None:
    bisect.insort_right(running, request, key=_rank)

  def __len__(self) -> int:
    return len(self._requests)

  def __iter__(self) -> Iterator[Request]:
    return iter(self._requests)


def request_queue(policy: str) -> RequestQueue:
  """The waiting queue of `policy` (one of config/scheduler.py's SCHEDULING_POLICIES)."""
  if policy == "fcfs":
    return FcfsQueue()
  if policy == "priority":
    return PriorityQueue()
  raise ValueError(f"scheduler.policy: must be one of {SCHEDULING_POLICIES}, got {policy!r}")
