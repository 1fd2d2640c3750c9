"""Sleep mode's rules, host side: the levels and wake-up tags the engine takes (vLLM's names), and
which parts are asleep. EngineCore (engine/engine_core.py) applies them; the device side moves
the memory (device/sleep_mode.py, through the StepRunner's sleep and wake_up).

* Only an engine built with enable_sleep_mode sleeps: otherwise sleep and wake_up raise a
  ValueError naming `enable_sleep_mode`.
* Level 1 (vLLM's default): the weights go to host memory and the KV pool is freed. Level 2
  (vLLM: weights discarded, reloaded from the checkpoint on wake) is refused, naming `level`:
  reloading means the loading path again, which level 1's host copy spares.
* Sleeping aborts every request the engine holds, running or waiting (vLLM's default mode,
  "abort"; its "wait" and "keep" are refused, naming `mode`): each gets its last output,
  finish_reason "abort", and its pages go back; then the page allocator is reset (no page
  used, none cached: the pool's content is gone) and the device side sleeps.
* While asleep, requests are accepted and wait in the scheduler's queue; no step runs (no
  program touches the freed memory). They start once the engine is awake. This is vLLM's
  behavior (its sleep pauses the scheduler, which queues new requests until wake_up resumes
  it), chosen over a 503 so that no request is lost; the HTTP server answers them after the wake.
* wake_up(tags): "weights", "kv_cache" (vLLM's tags), None for both; the engine is asleep until
  both are back. Sleeping when asleep and waking when awake change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

LEVELS = (1,)
MODES = ("abort",)
TAGS = ("weights", "kv_cache")


def check_enabled(enabled: bool) -> None:
  if not enabled:
    raise ValueError(
      "enable_sleep_mode: sleep mode is off; start the engine with --enable-sleep-mode "
      "(LLM(..., enable_sleep_mode=True))"
    )


def check_level(level: object) -> int:
  """The level as an int, or a ValueError naming `level`."""
  if isinstance(level, bool) or not isinstance(level, int) or level not in LEVELS:
    raise ValueError(
      f"level: sleep level {level!r} is not supported; level 1 moves the weights to host "
      "memory and frees the KV pool (level 2, discarding the weights, is not served)"
    )
  return level


def check_mode(mode: object) -> str:
  if mode not in MODES:
    raise ValueError(
      f"mode: {mode!r} is not supported; sleeping aborts the requests it finds ('abort')"
    )
  return mode


def wake_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
  """The parts to wake in TAGS order (None: all), or a ValueError naming `tags`."""
  if tags is None:
    return TAGS
  unknown = [tag for tag in tags if tag not in TAGS]
  if unknown:
    raise ValueError(f"tags: unknown {unknown}; the tags are {list(TAGS)}")
  return tuple(tag for tag in TAGS if tag in tags)


class SleepState:
  """Which parts are asleep, and the transitions: `going_to_sleep` says whether a sleep must
  free anything (False when asleep already), `wake` runs `put_back(tag)` for each part asleep
  that `tags` names."""

  def __init__(self, enabled: bool):
    self.enabled = enabled
    self._asleep: frozenset[str] = frozenset()

  @property
  def is_sleeping(self) -> bool:
    return bool(self._asleep)

  def going_to_sleep(self, level: object, mode: object) -> bool:
    check_enabled(self.enabled)
    check_level(level)
    check_mode(mode)
    return not self._asleep

  def asleep(self) -> None:
    self._asleep = frozenset(TAGS)

  def wake(self, tags: Sequence[str] | None, put_back: Callable[[str], None]) -> None:
    check_enabled(self.enabled)
    for tag in wake_tags(tags):
      if tag in self._asleep:
        put_back(tag)
        self._asleep -= {tag}
