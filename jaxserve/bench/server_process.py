"""One `jaxserve serve` subprocess for a benchmark (bench_server_startup, serve_vs_offline).

It starts the server on 127.0.0.1 with the given engine flags, its output in a log file; waits
for /health 200 (and optionally for every API server process, or every step program to be
compiled, from /metrics); sends a completion; has every process of it print its threads' stacks
to the log (a stuck run's evidence); and stops it with SIGTERM (the drain), killing it if the
drain does not end.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

import httpx

from jaxserve.bench.process_cpu import server_pids


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class ServerProcess:
  """`jaxserve serve MODEL FLAGS...` on 127.0.0.1:port (a free port unless given)."""

  def __init__(self, model: str, flags: list[str], log_path: Path, port: int | None = None):
    self.port = port or free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.log_path = log_path
    self.model = ""  # the served model name, once healthy
    self.start = time.monotonic()
    self.log = open(log_path, "w")
    self.process = subprocess.Popen(
      [
        sys.executable,
        "-m",
        "jaxserve.cli",
        "serve",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(self.port),
        *flags,
      ],
      stdout=self.log,
      stderr=subprocess.STDOUT,
    )

  def since_start(self) -> float:
    return time.monotonic() - self.start

  def wait_healthy(self, timeout: float) -> float:
    """Seconds from the start to /health 200; raises if the server exits or times out."""
    while self.since_start() < timeout:
      if self.process.poll() is not None:
        raise RuntimeError(f"server exited ({self.process.returncode}):\n{self.tail()}")
      try:
        if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
          ready = self.since_start()
          self.model = httpx.get(f"{self.url}/v1/models").json()["data"][0]["id"]
          return ready
      except httpx.HTTPError:
        pass
      time.sleep(0.1)
    raise RuntimeError(f"no /health 200 within {timeout} s:\n{self.tail()}")

  def metrics(self) -> dict[str, float]:
    text = httpx.get(f"{self.url}/metrics", timeout=10.0).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+) ([-\d.e+]+)$", text, re.M)}

  def wait_compiled(self, timeout: float) -> float:
    """Seconds from the start until /metrics reports every step program compiled."""
    while self.since_start() < timeout:
      values = self.metrics()
      if values.get("jaxserve_step_programs_compiled", -1) >= values.get(
        "jaxserve_step_programs_total", 0
      ):
        return self.since_start()
      time.sleep(0.5)
    raise RuntimeError(f"step programs not all compiled within {timeout} s")

  def wait_api_servers(self, count: int, timeout: float) -> float:
    """Seconds from the start until `count` HTTP server processes serve (/health answers as
    soon as the first does; a load sent before the others start would stay on the first ones'
    connections)."""
    while self.since_start() < timeout:
      if self.metrics().get("jaxserve_api_servers", 0) >= count:
        return self.since_start()
      time.sleep(0.2)
    raise RuntimeError(
      f"fewer than {count} API server processes within {timeout} s:\n{self.tail()}"
    )

  def complete(self, body: dict) -> tuple[str, float]:
    """The completion's text and its seconds."""
    start = time.monotonic()
    response = httpx.post(
      f"{self.url}/v1/completions", json={"model": self.model, **body}, timeout=600.0
    )
    response.raise_for_status()
    return response.json()["choices"][0]["text"], time.monotonic() - start

  def tail(self, lines: int = 30) -> str:
    self.log.flush()
    return "\n".join(self.log_path.read_text().splitlines()[-lines:])

  def dump_stacks(self) -> None:
    """Every server process prints its threads' stacks to the log (dump_stacks)."""
    dump_stacks(self.process.pid, self.log)

  def stop(self, timeout: float = 120.0) -> int:
    """SIGTERM (drain), then kill if it has not exited within `timeout`; the exit status."""
    self.process.send_signal(signal.SIGTERM)
    try:
      code = self.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.process.kill()
      code = self.process.wait(10)
    self.log.close()
    return code


def dump_stacks(supervisor: int, log: TextIO, gap_s: float = 0.5) -> None:
  """The supervisor and each process it serves with print their threads' stacks (SIGUSR1:
  runtime/log_setup.py) to their stderr, `log`, one process at a time, `gap_s` apart and each after
  a line naming its pid, so the dumps of different processes do not interleave."""
  for pid in server_pids(supervisor):
    log.write(f"--- stacks of server process {pid} (SIGUSR1) ---\n")
    log.flush()
    try:
      os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
      continue
    time.sleep(gap_s)
