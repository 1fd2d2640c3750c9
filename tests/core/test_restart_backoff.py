"""The API server restart back-off (core/restart_backoff.py): 0.5 s doubling to 30 s for
consecutive deaths, back to 0.5 s after a process that served a minute; and how a death is
described in the supervisor's log line (core/api_processes.py)."""

from __future__ import annotations

from jaxserve.core.api_processes import describe_exit
from jaxserve.core.info import api_identity
from jaxserve.core.restart_backoff import RestartBackoff


def test_consecutive_deaths_double_the_wait_up_to_the_cap():
  backoff = RestartBackoff()
  delays = [backoff.next_delay(uptime_s=1.0) for _ in range(10)]
  assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]
  assert backoff.restarts == 10


def test_a_process_that_served_a_minute_starts_the_count_again():
  backoff = RestartBackoff()
  assert [backoff.next_delay(1.0) for _ in range(3)] == [0.5, 1.0, 2.0]
  assert backoff.next_delay(uptime_s=60.0) == 0.5
  assert backoff.next_delay(uptime_s=0.1) == 1.0


def test_deaths_are_described_by_exit_code_or_signal():
  assert describe_exit(-9) == "killed by SIGKILL"
  assert describe_exit(-15) == "killed by SIGTERM"
  assert describe_exit(1) == "exited with code 1"
  assert describe_exit(0) == "exited with code 0"


def test_each_restart_has_its_own_client_identity():
  assert [api_identity(0, g) for g in range(3)] == ["api-0", "api-0.1", "api-0.2"]
