"""Self-healing API server processes, on a real `jaxserve serve` (a supervisor, an engine core
process, two API server processes on one port): an API server process killed with SIGKILL is
restarted on the same listening socket, with one log line naming the signal and the back-off;
`jaxserve_api_servers` returns to 2; the restarted process serves the official `openai` client
alone while the other is down; a second death of the same slot within a minute waits twice as
long; and after all that SIGTERM still drains the server to exit status 0."""

from __future__ import annotations

import os
import re
import signal
import time

import openai

from tests.server.server_helpers import scrape_metrics
from tests.server.test_process_faults import Supervisor

RESTARTED = re.compile(r"restarted API server process (\d+): pid (\d+) \(api-[\d.]+, restart (\d+)")


def _wait_for(predicate, what: str, supervisor: Supervisor, timeout: float = 60) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return
    time.sleep(0.1)
  raise AssertionError(f"timed out waiting for {what}:\n{supervisor.output}")


def _api_servers(supervisor: Supervisor) -> float:
  return scrape_metrics(supervisor.url)["jaxserve_api_servers"]


def _restarts(supervisor: Supervisor) -> dict[tuple[int, int], int]:
  """(slot, restart number) -> the restarted process's pid."""
  return {
    (int(m.group(1)), int(m.group(3))): int(m.group(2))
    for m in RESTARTED.finditer(supervisor.output)
  }


def _complete(url: str, prompt: str) -> str:
  with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
    completion = client.completions.create(
      model="tiny-random", prompt=prompt, max_tokens=5, temperature=0
    )
  assert completion.choices[0].finish_reason == "length"
  return completion.choices[0].text


def _kill_and_wait_for_restart(supervisor: Supervisor, pid: int, slot: int, restart: int) -> int:
  os.kill(pid, signal.SIGKILL)
  _wait_for(lambda: (slot, restart) in _restarts(supervisor), f"restart {restart}", supervisor)
  _wait_for(lambda: _api_servers(supervisor) == 2, "2 API servers", supervisor)
  return _restarts(supervisor)[(slot, restart)]


def test_a_killed_api_process_is_restarted_and_serves_on_the_same_socket(tmp_path):
  supervisor = Supervisor(tmp_path)
  try:
    first, second = supervisor.api_pids
    expected = _complete(supervisor.url, "restart me")
    assert _api_servers(supervisor) == 2

    restarted = _kill_and_wait_for_restart(supervisor, first, 0, 1)
    assert restarted not in (first, second)
    died = re.search(
      rf"API server process 0 \(pid {first}, api-0\) killed by SIGKILL after [\d.]+ s; "
      r"restarting it in 0\.5 s",
      supervisor.output,
    )
    assert died, supervisor.output

    # the other original process dies too: until its successor starts, only the restarted
    # process accepts on the socket, and it serves the openai client
    os.kill(second, signal.SIGKILL)
    assert _complete(supervisor.url, "restart me") == expected
    _wait_for(lambda: (1, 1) in _restarts(supervisor), "slot 1's restart", supervisor)
    _wait_for(lambda: _api_servers(supervisor) == 2, "2 API servers", supervisor)

    # the restarted process of slot 0 dies within a minute: the back-off doubles
    _kill_and_wait_for_restart(supervisor, restarted, 0, 2)
    assert re.search(
      rf"API server process 0 \(pid {restarted}, api-0\.1\) killed by SIGKILL after [\d.]+ s; "
      r"restarting it in 1\.0 s",
      supervisor.output,
    ), supervisor.output
    assert _complete(supervisor.url, "restart me") == expected
    assert scrape_metrics(supervisor.url)["jaxserve_kv_pages_used"] == 0

    supervisor.process.send_signal(signal.SIGTERM)
    code = supervisor.wait()
  finally:
    supervisor.kill()
  assert code == 0, supervisor.output  # the server healed: a clean stop exits 0
  assert "Traceback" not in supervisor.output
