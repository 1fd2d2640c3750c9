"""Admission: `server.max_waiting_requests` counts HTTP requests that have not started yet.

A generation request (one HTTP call, whatever its `n` or number of prompts) takes one place when
it is admitted and gives it back once every one of its choices has produced a token, finished or
been aborted, or its add failed. Past the limit a new request gets 429; a burst of fewer
requests than the limit is never refused, as the count can never exceed the requests in flight.

Why not the engine's waiting queue: the old check added the engine's published waiting count
(engine requests, i.e. choices) to the places reserved by handlers between admission and the
engine's acknowledgement. A request the engine had just added was in both until its handler ran
again on the busy event loop, so a burst of 1000 single-choice requests against a limit of 1024
counted several hundred twice and some got 429; and a request with n=4 counted four times.

One WaitingRequests belongs to the AsyncEngine, so every app on that engine shares the count.
With the engine core in its own process the core applies the same rule for every API server
process at once (core/loop.py): a Place then only carries the limit to it.
"""
from __future__ import annotations

import threading


class WaitingRequests:
  """The number of admitted requests that have not started, under a lock (apps on several event
  loops may share it)."""

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._count = 0

  @property
  def count(self) -> int:
    return self._count

  def try_admit(self, limit: int) -> Place | None:
    """A place for one more request, or None when `limit` requests are already waiting."""
    with self._lock:
      if self._count >= limit:
        return None
      self._count += 1
    return Place(self, limit)

  def _release(self) -> None:
    with self._lock:
      self._count -= 1


class Place:
  """One admitted request's place among the waiting; release() gives it back (once). With no
  owner it is a place the engine core process counts, and `limit` travels with the add."""

  def __init__(self, owner: WaitingRequests | None, limit: int):
    self._owner: WaitingRequests | None = owner
    self.limit = limit

  @property
  def held(self) -> bool:
    return self._owner is not None

  def release(self) -> None:
    owner, self._owner = self._owner, None
    if owner is not None:
      owner._release()
