"""bench/server_process.dump_stacks on real processes: a stand-in supervisor and two children,
each with jaxserve's logging (a SIGUSR1 stack dump) and stderr in one log file, print their
stacks one process at a time, each dump after the line naming its pid."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from jaxserve.bench.process_cpu import server_pids
from jaxserve.bench.server_process import dump_stacks

SERVING = """
import time
from jaxserve.runtime.log_setup import configure_logging
configure_logging("INFO")
print("ready", flush=True)
time.sleep(30)
"""
SUPERVISOR = f"""
import subprocess, sys, time
from jaxserve.runtime.log_setup import configure_logging
configure_logging("INFO")
children = [subprocess.Popen([sys.executable, "-c", {SERVING!r}]) for _ in range(2)]
time.sleep(30)
"""


def test_each_process_dumps_its_stacks_after_its_own_line(tmp_path):
  log_path = tmp_path / "serve.log"
  with open(log_path, "w") as log:
    supervisor = subprocess.Popen(
      [sys.executable, "-c", SUPERVISOR], stdout=log, stderr=subprocess.STDOUT
    )
    try:
      deadline = time.monotonic() + 60
      while log_path.read_text().count("ready") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
      dump_stacks(supervisor.pid, log, gap_s=0.3)
      time.sleep(0.3)
    finally:
      for pid in server_pids(supervisor.pid):
        os.kill(pid, signal.SIGKILL)
      supervisor.wait()
  parts = re.split(r"--- stacks of server process (\d+) \(SIGUSR1\) ---\n", log_path.read_text())
  pids = [int(p) for p in parts[1::2]]
  dumps = parts[2::2]
  assert pids[0] == supervisor.pid and len(set(pids)) == 3
  for dump in dumps:  # one process's dump each: its signalled thread once, in one piece
    assert dump.count("Current thread") == 1, dump
    assert "time.sleep" in dump or "in <module>" in dump
