"""How long the supervisor waits before it restarts an API server process that died.

The first restart waits INITIAL_DELAY_S, each further one twice as long as the one before, up to
MAX_DELAY_S: a process that dies at once, again and again (a bad file, a port it cannot use), is
retried ever more slowly instead of in a tight loop, while a single crash costs half a second.
A process that served HEALTHY_AFTER_S or longer before it died starts the count again: the
crashes were not consecutive.
"""

from __future__ import annotations

from dataclasses import dataclass

INITIAL_DELAY_S = 0.5
MAX_DELAY_S = 30.0
HEALTHY_AFTER_S = 60.0


@dataclass
class RestartBackoff:
  """One API server slot's back-off: next_delay() after each death."""

  initial_s: float = INITIAL_DELAY_S
  max_s: float = MAX_DELAY_S
  healthy_after_s: float = HEALTHY_AFTER_S
  _next_s: float | None = None
  restarts: int = 0

  def next_delay(self, uptime_s: float) -> float:
    """The wait before restarting a process that died after `uptime_s` seconds of life."""
    if self._next_s is None or uptime_s >= self.healthy_after_s:
      self._next_s = self.initial_s
    delay = self._next_s
    self._next_s = min(self.max_s, delay * 2)
    self.restarts += 1
    return delay
