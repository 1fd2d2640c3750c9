"""bench/process_cpu.py on real processes: children named by start order, CPU per process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from jaxserve.bench.process_cpu import CpuMeter, children, server_processes

# A stand-in supervisor: starts an idle "core", a busy "api-0" and an idle "api-1", in that
# order, prints their pids and waits for them.
SUPERVISOR = """
import subprocess, sys, time
busy = "import time\\nend = time.monotonic() + 3\\nwhile time.monotonic() < end: pass"
idle = "import time; time.sleep(3)"
children = []
for code in (idle, busy, idle):
  children.append(subprocess.Popen([sys.executable, "-c", code]))
  time.sleep(0.05)
print(*(c.pid for c in children), flush=True)
for c in children:
  c.wait()
"""


def test_roles_follow_start_order_and_cpu_is_per_process():
  supervisor = subprocess.Popen(
    [sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True
  )
  try:
    core, busy, idle = map(int, supervisor.stdout.readline().split())
    assert children(supervisor.pid) == [core, busy, idle]
    roles = server_processes(supervisor.pid, api_servers=2)
    assert roles == {"supervisor": supervisor.pid, "core": core, "api-0": busy, "api-1": idle}
    assert server_processes(supervisor.pid, api_servers=0) == {"supervisor": supervisor.pid}
    meter = CpuMeter(supervisor.pid, api_servers=2)
    meter.start()
    start = time.monotonic()
    time.sleep(0.8)
    cores = meter.stop(time.monotonic() - start)
  finally:
    for pid in children(supervisor.pid):
      os.kill(pid, signal.SIGKILL)
    supervisor.kill()
    supervisor.wait()
  # the busy loop: about one core, or what is left of one when the test workers load every core
  # (0.11 in a fresh-machine run); the sleeping processes: nothing
  idle = max(cores["core"], cores["api-1"], cores["supervisor"])
  assert cores["api-0"] > 0.02 and cores["api-0"] > 10 * idle, cores
