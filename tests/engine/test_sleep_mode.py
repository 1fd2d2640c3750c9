"""engine/sleep_mode.py's state machine and refusals, host only (no device: put_back is a list)."""

from __future__ import annotations

import pytest

from jaxserve.engine.sleep_mode import SleepState


def test_sleep_wake_by_tags_and_the_no_ops():
  state, woken = SleepState(enabled=True), []
  state.wake(None, woken.append)  # awake: nothing to put back
  assert woken == [] and not state.is_sleeping
  assert state.going_to_sleep(1, "abort")
  state.asleep()
  assert state.is_sleeping and not state.going_to_sleep(1, "abort")  # asleep: nothing to free
  state.wake(["kv_cache"], woken.append)
  assert woken == ["kv_cache"] and state.is_sleeping  # the weights are still away
  state.wake(["kv_cache", "weights"], woken.append)
  assert woken == ["kv_cache", "weights"] and not state.is_sleeping


@pytest.mark.parametrize(
  ("call", "field"),
  [
    (lambda s: s.going_to_sleep(2, "abort"), "level"),
    (lambda s: s.going_to_sleep(True, "abort"), "level"),
    (lambda s: s.going_to_sleep("1", "abort"), "level"),
    (lambda s: s.going_to_sleep(1, "wait"), "mode"),
    (lambda s: s.wake(["weights", "optimizer"], print), "tags"),
  ],
)
def test_refusals_name_their_field(call, field):
  state = SleepState(enabled=True)
  with pytest.raises(ValueError, match=f"^{field}: "):
    call(state)
  assert not state.is_sleeping


def test_a_disabled_engine_refuses_naming_the_flag():
  state = SleepState(enabled=False)
  with pytest.raises(ValueError, match="^enable_sleep_mode: "):
    state.going_to_sleep(1, "abort")
  with pytest.raises(ValueError, match="^enable_sleep_mode: "):
    state.wake(None, print)
