"""The supervisor's children ignore SIGINT from their first instruction; the supervisor alone
acts on a Ctrl-C.

A terminal's Ctrl-C sends SIGINT to every process of its foreground process group: the
supervisor, the engine core process(es) and the API server processes alike. The supervisor
(core/supervisor.py) drives the stop: SIGTERM drains each API server once, a second Ctrl-C sends
them END_NOW_SIGNAL (their running responses end at once, with an error event and `[DONE]`), and
the cores stop once the API servers have gone. A child acting on its own copy would race it: an
API server that saw the terminal's SIGINT after the supervisor's SIGTERM took it for uvicorn's
second Ctrl-C and cut its streams with tracebacks.

start_ignoring_sigint starts a child with SIGINT ignored: an ignored signal stays ignored across
exec, and Python installs its KeyboardInterrupt handler only where SIGINT has its default action,
so a Ctrl-C while the child still imports (before its target runs) cannot interrupt it either.
Meanwhile the calling thread blocks SIGINT, so a Ctrl-C in those milliseconds waits, pending
(Linux keeps a blocked signal pending even while its action is to ignore it), and reaches the
supervisor's handler once the child has started. The children's targets set SIG_IGN again (a
child started from a thread other than the main one, where signal handlers cannot be changed,
inherits the default action).

END_NOW_SIGNAL: the supervisor's word to an API server process that its drain must end now
(server/uvicorn_runner.py acts on it); SIGUSR1 is taken (runtime/log_setup.py: thread stacks).
"""

from __future__ import annotations

import multiprocessing.process
import signal
import threading

END_NOW_SIGNAL = signal.SIGUSR2


def start_ignoring_sigint(process: multiprocessing.process.BaseProcess) -> None:
  """process.start(), the child starting with SIGINT ignored (see the module docstring)."""
  if threading.current_thread() is not threading.main_thread():
    process.start()
    return
  mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
      process.start()
    finally:
      signal.signal(signal.SIGINT, previous)
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
