"""The compile threads' process-level helpers (device/program_compiler.py runs the threads): how
many compile by default, the lower CPU priority and GIL switch interval of compiling while the
engine serves, and the exit of a process whose compile threads are still inside XLA's compiler
(a daemon thread there crashes the interpreter's finalization, so such a process exits without
it)."""

from __future__ import annotations

import logging
import os
import sys
import threading

CLOSE_WAIT_S = 0.5
COMPILE_THREAD_NAME = "jaxserve-compile"
MAX_AUTO_THREADS = 4
BACKGROUND_NICE = 10  # the compile threads' nice value while the engine serves
# The interpreter's GIL switch interval while compiling in the background (Python's default is
# 5 ms): the lowering thread holds the GIL nearly all the time, and each time the engine loop
# waits (for the device, a socket) it gets the GIL back only when the lowering thread is made to
# drop it, after this interval: at 5 ms a step's few waits cost tens of milliseconds.
SERVING_SWITCH_INTERVAL_S = 0.00005


def compilation_abandoned() -> bool:
  """Whether a closed compiler's threads are still inside XLA's compiler."""
  return any(t.name.startswith(COMPILE_THREAD_NAME) and t.is_alive() for t in threading.enumerate())


def default_compile_threads() -> int:
  """A quarter of the host's cores, 1 to MAX_AUTO_THREADS: one thread lowers the programs, so
  more compilers than it feeds only take cores (and the GPU's autotuning) from the requests served
  meanwhile (docs/DECISIONS.md, "Compile threads and the GIL switch interval"); a host of fewer
  than 8 cores compiles on one."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return max(1, min(MAX_AUTO_THREADS, (cores or 1) // 4))


def lower_priority() -> None:
  """Gives the calling thread (and the threads it starts, e.g. XLA's) a lower CPU priority
  (Linux: a thread's nice value), so that compiling in the background leaves the engine loop and
  the API processes the cores they need; a no-op where threads have no priority of their own."""
  try:
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
  except (AttributeError, OSError):
    pass


def exit_now(status: int) -> None:
  """Flushes the logs and standard streams, then exits without the interpreter's finalization."""
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)
