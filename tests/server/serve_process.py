"""A real `jaxserve serve` process for the multi-process tests (tests/server/test_process_faults.py,
test_api_restarts.py, test_data_parallel.py): started with a YAML config on a free port at log
level INFO, its output read on a thread; when the constructor returns, /health answers and every
API server process (`api_servers`) has connected to every engine core (/health answers as soon as
the first one serves; a test counting them, or spreading streams over them, would race the
others' start). kill_all() also SIGKILLs the child processes the test names (the engine cores, the
API server processes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping

from tests.server.server_helpers import free_port, scrape_metrics
from tests.server.test_drain import _wait_until_healthy


class ServeProcess:
  """`jaxserve serve --config CONFIG --port PORT --log-level INFO FLAGS`."""

  def __init__(
    self,
    config_path: str,
    flags: list[str],
    api_servers: int,
    env: Mapping[str, str] | None = None,
  ):
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.process = subprocess.Popen(
      [sys.executable, "-m", "jaxserve.cli", "serve", "--config", config_path]
      + ["--port", str(self.port), "--log-level", "INFO", *flags],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      env=None if env is None else dict(env),
    )
    self.lines: list[str] = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()
    _wait_until_healthy(self.url, self.process)
    self._wait_for_api_servers(api_servers)

  def _wait_for_api_servers(self, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while scrape_metrics(self.url).get("jaxserve_api_servers", 0) < count:
      assert time.monotonic() < deadline, f"fewer than {count} API servers:\n{self.output}"
      time.sleep(0.1)

  def _read(self) -> None:
    for line in self.process.stdout:
      self.lines.append(line)

  @property
  def output(self) -> str:
    return "".join(self.lines)

  def logged_pids(self, pattern: str) -> list[int]:
    """The integers `pattern`'s groups match in the start-up log (AssertionError if absent)."""
    match = re.search(pattern, self.output)
    assert match, self.output
    return [int(group) for group in match.groups()]

  def wait(self, timeout: float = 60) -> int:
    code = self.process.wait(timeout)
    self._reader.join(10)
    return code

  def kill_all(self, pids: Iterable[int]) -> None:
    """SIGKILL to the server, if still running, and to each of `pids` still alive."""
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait(10)
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
