"""A real `jaxserve serve` process for the multi-process tests (tests/server/test_process_faults.py,
test_api_restarts.py, test_data_parallel.py): started with a YAML config on a free port at log
level INFO, its output read on a thread, healthy when the constructor returns; kill() also
SIGKILLs the child processes the test names (the engine cores, the API server processes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping

from tests.server.server_helpers import free_port
from tests.server.test_drain import _wait_until_healthy


class ServeProcess:
  """`jaxserve serve --config CONFIG --port PORT --log-level INFO FLAGS`."""

  def __init__(self, config_path: str, flags: list[str], env: Mapping[str, str] | None = None):
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
