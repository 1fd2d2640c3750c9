"""A stop signal exits `jaxserve serve` within 2 s while the engine is still starting or while it
compiles in the background (real processes; the exit time is measured from the signal):

* Ctrl-C (SIGINT) while the engine warms up: the supervisor stops the starting core (SIGTERM,
  SIGKILL a second later), the one-process server exits at once; both exit 0;
* SIGTERM once serving while background compilation runs: the compile thread is left to the
  process's exit, so neither the core process nor the one-process server waits for the program
  being compiled, and neither crashes on it (exit 0, not SIGSEGV).

Each server gets its own empty XLA cache so that the compilations it interrupts are real. Their
logs also show the one log format of every process (engine core, API server, uvicorn, supervisor).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.server.server_helpers import free_port

EXIT_S = 2.0
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")
# 15 buckets: background compilation runs well past the first request on 2 cores.
SCHEDULER = {
  "max_num_seqs": 16,
  "max_num_batched_tokens": 64,
  "seq_buckets": [2, 4, 8, 16],
  "token_buckets": [8, 16, 32, 64],
}


def _start(tmp_path, api_server_count: int) -> subprocess.Popen:
  config = {
    "model": "tiny-random",
    "max_model_len": 256,
    "compilation_cache_dir": str(tmp_path / "xla"),
    "cache": {"page_size": 16, "num_pages": 256},
    "scheduler": SCHEDULER,
  }
  path = tmp_path / "server.yaml"
  path.write_text(yaml.safe_dump(config))
  command = [sys.executable, "-m", "jaxserve.cli", "serve", "--config", str(path)]
  command += ["--port", str(free_port()), "--log-level", "INFO"]
  command += ["--api-server-count", str(api_server_count)]
  return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _signal_at(process: subprocess.Popen, marker: str, sig: int) -> tuple[float, str]:
  """Sends `sig` once a log line holds `marker`; (seconds until the exit, the whole output)."""
  lines = []
  try:
    for line in process.stdout:
      lines.append(line)
      if marker in line:
        break
    else:
      raise AssertionError("".join(lines))
    sent = time.monotonic()
    process.send_signal(sig)
    output, _ = process.communicate(timeout=60)
    return time.monotonic() - sent, "".join(lines) + output
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()


@pytest.mark.parametrize("api_server_count", [1, 0])  # supervisor and core; one process
def test_ctrl_c_while_the_engine_warms_up_exits_within_2_s(tmp_path, api_server_count):
  process = _start(tmp_path, api_server_count)
  seconds, output = _signal_at(process, "warmup: 35 programs", signal.SIGINT)
  assert process.returncode == 0, output
  assert "stopped during start-up" in output
  assert seconds < EXIT_S, f"exited {seconds:.2f} s after SIGINT"


@pytest.mark.parametrize("api_server_count", [1, 0])  # supervisor and core; one process
def test_sigterm_during_background_compilation_exits_within_2_s(tmp_path, api_server_count):
  process = _start(tmp_path, api_server_count)
  marker = "Application startup complete"  # serving; the rest compiles in the background
  seconds, output = _signal_at(process, marker, signal.SIGTERM)
  assert "all 35 programs compiled" not in output, "compilation ended before the signal"
  assert process.returncode == 0, output
  assert "Traceback" not in output, output
  assert seconds < EXIT_S, f"exited {seconds:.2f} s after SIGTERM"
  logged = [line for line in output.splitlines() if "jaxserve." in line or "uvicorn" in line]
  assert any("jaxserve.composition.assembly" in line for line in logged)  # the engine core's
  assert any("Application startup complete" in line for line in logged)  # uvicorn's
  assert all(LOG_LINE.match(line) for line in logged), "\n".join(logged)
