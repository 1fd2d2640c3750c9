"""`kill -USR1` on a process that configured jaxserve's logging (every process of `jaxserve
serve`: log_setup.configure_logging) prints every thread's Python stack to its stderr, and the
process goes on."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import os, signal, threading, time
from jaxserve.runtime.log_setup import configure_logging
configure_logging("INFO")
threading.Thread(target=time.sleep, args=(5,), name="sleeper", daemon=True).start()
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.2)
print("still serving")
"""


def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on():
  result = subprocess.run(
    [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120
  )
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "still serving"
  assert "Current thread" in result.stderr  # faulthandler's dump of the signalled thread
  assert "Thread 0x" in result.stderr.replace("Current thread", "")  # and the sleeping one
  assert "in <module>" in result.stderr
