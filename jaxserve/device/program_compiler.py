"""Compiling the step programs while serving (config keys `warmup`, `compile_threads`).

The programs and their compile order are device/program_groups.py's (the largest bucket, then
decode buckets smallest first, then the rest by size).

ProgramCompiler compiles in the caller's thread first (compile_first) the largest bucket's group
and, with more than one compile thread, the smallest decode bucket's beside it, so one stream and
small batches decode in their own bucket from the first request: their programs are lowered one by
one (tracing holds the GIL), then compiled side by side on threads. The other groups compile with
`compile_threads` threads (compile_rest; with `background`, on a compile thread while the engine
serves, start): one thread lowers the programs in group order, at most `threads` ahead of the
compilers, and `threads` daemon threads compile them (XLA's compilation releases the GIL), so the
groups finish in about their order and the engine keeps stepping meanwhile. In the background the
compile threads run at a lower CPU priority and the interpreter's GIL switch interval is short
(device/compile_threads.py), so the engine loop, which waits on the device several times a step,
gets the GIL back from the lowering thread within that. Each program is lowered on padding inputs
with the runner's own params and KV pages as abstract arguments (device/program_lowering.py: no
compile thread touches the buffers the engine donates) and compiled ahead of time, and the
executable is installed in the runner (ModelRunner.install), which calls it directly, so the compile
ledger counts each program once. With a ProgramStore (device/program_store.py) a program the store
holds is not lowered: a compile thread reads it back and installs it (in compile order, side by side
like compilations); the programs compiled are written to the store once all are compiled, and in the
background only while the engine has no request to serve (watch_load; one program at a time, once
the engine has been idle a while; device/program_saves.py): serializing an executable holds the GIL
for about a tenth of a second, which would stall the engine's steps. A program XLA's persistent
cache gave back (a cache hit, told by JAX's monitoring event in the compiling thread) is not
written: an executable read back from a cache is not serialized again. Each time a group's programs
are all compiled, a new ProgramReadiness (messages/program_readiness.py) is published; the host pads
each step to the smallest ready bucket that holds it (engine/engine_core.py), which therefore never
waits for a compilation. A program that fails to compile raises ProgramCompileError naming it
(start-up fails with its name; in the background the buckets compiled so far keep serving and the
error is logged).

close() (the engine's close, at shutdown) stops the compile threads at their next program and waits
at most CLOSE_WAIT_S: a stop signal during background compilation exits within that, not after
the programs being compiled (seconds for a large bucket). The threads are daemons; one still
inside XLA's compiler crashes the interpreter's finalization (SIGSEGV), so a process that closed
an engine while `compilation_abandoned()` ends with `exit_now` (no finalization) instead
(device/compile_threads.py).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable

import jax

from jaxserve.device.compile_ledger import CACHE_HIT_EVENT
from jaxserve.device.compile_threads import (
  CLOSE_WAIT_S,
  COMPILE_THREAD_NAME,
  SERVING_SWITCH_INTERVAL_S,
  lower_priority,
)
from jaxserve.device.lowering import abstract, dummy_inputs
from jaxserve.device.model_runner import ModelRunner
from jaxserve.device.program_groups import Program, program_groups
from jaxserve.device.program_lowering import ProgramLowering
from jaxserve.device.program_saves import PendingSaves
from jaxserve.device.program_store import ProgramStore
from jaxserve.messages.buckets import Bucket
from jaxserve.messages.program_readiness import ProgramReadiness
from jaxserve.messages.scheduled_batch import ScheduledBatch

logger = logging.getLogger(__name__)


class ProgramCompileError(RuntimeError):
  """A step program that XLA failed to compile (or to lower); the message names it."""

  def __init__(self, program: Program, cause: BaseException):
    super().__init__(f"compiling the {program.describe()} failed: {type(cause).__name__}: {cause}")
    self.program = program


class ProgramCompiler:
  """Compiles a runner's step programs group by group on `threads` compile threads and publishes
  which buckets are ready. lower: the program's lowering (default: the runner's programs on
  padding inputs; tests pass one that fails)."""

  def __init__(
    self,
    runner: ModelRunner,
    threads: int = 1,
    lower: Callable[[Program], jax.stages.Lowered] | None = None,
    store: ProgramStore | None = None,
  ):
    if threads < 1:
      raise ValueError(f"compile_threads: must be >= 1, got {threads}")
    self.runner = runner
    self.threads = threads
    self.groups = program_groups(runner.buckets, runner.burst_steps > 1)
    self.num_total = sum(len(g.programs) for g in self.groups)
    self._lowering = ProgramLowering(runner)
    self._lower = lower or self._lowering.lower
    self._install = lower is None  # an injected lowering (tests) is never run by the runner
    self.store = store if self._install else None
    self._unsaved: PendingSaves | None = None if self.store is None else PendingSaves(self.store)
    self._thread_state = threading.local()  # per compile thread: was its compile a cache hit
    self._lock = threading.Lock()  # the counts below and the published readiness
    self._left = [len(g.programs) for g in self.groups]  # per group: programs not compiled yet
    self._steps: frozenset[Bucket] = frozenset()
    self._bursts: frozenset[Bucket] = frozenset()
    self._num_compiled = 0
    self._next_group = 0
    self._readiness = ProgramReadiness(frozenset(), frozenset(), 0, self.num_total)
    self._stop = threading.Event()
    self._compiled = threading.Event()  # the background compilation ended (done or failed)
    self._busy: Callable[[], bool] = lambda: False
    self._thread: threading.Thread | None = None
    self.started_at = time.perf_counter()
    self.finished_after_s: float | None = None  # seconds from construction to the last program
    self.error: BaseException | None = None
    self.lowering_s = 0.0  # seconds spent tracing and lowering (one thread, holding the GIL)
    self.num_loaded = 0  # programs read from the store, neither lowered nor compiled

  def readiness(self) -> ProgramReadiness:
    """The latest published readiness (an immutable snapshot: read without a lock)."""
    return self._readiness

  @property
  def num_unsaved(self) -> int:
    """Programs compiled and not written to the store yet."""
    return 0 if self._unsaved is None else len(self._unsaved)

  def watch_load(self, busy: Callable[[], bool]) -> None:
    """Background saves to the store wait until `busy()` has been False IDLE_BEFORE_SAVE_S."""
    self._busy = busy

  def num_first_groups(self) -> int:
    """The groups compile_first compiles: the largest bucket's, and the smallest decode
    bucket's beside it when there is more than one compile thread."""
    return min(len(self.groups), 2 if self.threads > 1 else 1)

  def compile_first(self) -> float:
    """Compiles the first groups here, all side by side, then runs one step of the largest bucket
    and one burst (so whatever else a step compiles, e.g. its eager constants, is compiled too);
    returns the seconds it took."""
    start = time.perf_counter()
    first = self.num_first_groups()
    width = sum(len(g.programs) for g in self.groups[:first])
    self._compile_groups(range(first), max(1, width))
    runner = self.runner
    runner.execute(dummy_inputs(runner, runner.buckets.largest()))
    if runner.burst_steps > 1:
      runner.execute(
        dummy_inputs(runner, runner.buckets.decode_buckets()[-1]),
        ScheduledBatch(num_steps=runner.burst_steps),
      )
    return time.perf_counter() - start

  def compile_rest(self, on_program: Callable[[int], object] | None = None) -> None:
    """Compiles every group not compiled yet on `threads` threads, here (stops early when close()
    is called); `on_program(1)` after each program (a progress bar's update)."""
    self._compile_groups(range(self._next_group, len(self.groups)), self.threads, on_program)
    self.save_compiled()

  def start(self) -> ProgramCompiler:
    """Compiles the remaining groups on a daemon thread."""
    self._thread = threading.Thread(target=self._run, name=COMPILE_THREAD_NAME, daemon=True)
    self._thread.start()
    return self

  def wait(self, timeout: float | None = None) -> bool:
    """Waits for the background compilation (not for the writes to the store after it, which
    wait for the engine's idle moments); True once every program is compiled."""
    if self._thread is not None:
      self._compiled.wait(timeout)
    if self.error is not None:
      raise RuntimeError("background compilation failed") from self.error
    return self._readiness.complete

  def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
    """Stops the compile threads at their next program; waits for them at most `wait_s`."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(wait_s)
      if self._thread.is_alive():
        logger.info("background compilation stopped mid-program (left to the process's exit)")

  def _run(self) -> None:
    start = time.perf_counter()
    lower_priority()
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(SERVING_SWITCH_INTERVAL_S)
    try:
      self._compile_groups(range(self._next_group, len(self.groups)), self.threads, background=True)
      if self._readiness.complete:
        logger.info(
          "background compilation: all %d programs compiled in %.1f s on %d threads (%.1f s of "
          "it lowering them), %.1f s after the engine's start (%d buckets ready)",
          self.num_total,
          time.perf_counter() - start,
          self.threads,
          self.lowering_s,
          self.finished_after_s or 0.0,
          len(self._steps),
        )
    except BaseException as err:  # logged; the buckets compiled so far keep serving
      self.error = err
      logger.error("background compilation stopped: %s", err)
      return
    finally:
      sys.setswitchinterval(switch_interval)
      self._compiled.set()
    self._save_when_idle()

  def _compile_groups(
    self,
    groups: range,
    threads: int,
    on_program: Callable[[int], object] | None = None,
    background: bool = False,
  ) -> None:
    """Lowers the groups' programs in order on this thread, at most `threads` ahead of the
    `threads` compiling them (at a lower CPU priority when `background`: the engine serves
    meanwhile); once the compilers stop, raises the ProgramCompileError of the earliest program
    in compile order that failed."""
    work: queue.Queue = queue.Queue(maxsize=threads)
    errors: list[tuple[int, ProgramCompileError]] = []  # (position in compile order, error)

    def compile_loop() -> None:
      if background:
        lower_priority()
      while (item := work.get()) is not None:
        position, index, program, lowered, signature = item
        if self._stop.is_set() or errors:
          continue  # close() or a failure: the rest is not compiled
        try:
          compiled = self._stored(program, signature) if lowered is None else None
          if compiled is None:
            self._thread_state.cache_hit = False
            compiled = (lowered or self._lower(program)).compile()
            if self.store is not None and not self._thread_state.cache_hit:
              self._unsaved.add(repr(program.key), signature, compiled)
        except Exception as err:  # reported with the program's name
          errors.append((position, ProgramCompileError(program, err)))
          continue
        if self._install:
          self.runner.install(program.key, compiled)
        self._program_done(index)
        if on_program is not None:
          on_program(1)

    compilers = [
      threading.Thread(target=compile_loop, name=f"{COMPILE_THREAD_NAME}-{i}", daemon=True)
      for i in range(threads)
    ]
    jax.monitoring.register_event_listener(self._on_jax_event)
    for thread in compilers:
      thread.start()
    try:
      self._lower_in_order(groups, work, errors, on_program)
    finally:
      for _ in compilers:
        work.put(None)
      for thread in compilers:
        thread.join()
      jax.monitoring.unregister_event_listener(self._on_jax_event)
    if errors:
      raise min(errors, key=lambda e: e[0])[1]

  def _lower_in_order(
    self,
    groups: range,
    work: queue.Queue,
    errors: list,
    on_program: Callable[[int], object] | None = None,
  ) -> None:
    """Puts (position, group index, program, lowered, its abstract arguments when there is a
    store) on `work` in compile order until the end, close() or a failure; a program the store
    holds is installed here instead."""
    position = 0
    for index in groups:
      for program in self.groups[index].programs:
        if self._stop.is_set() or errors:
          return
        signature = None if self.store is None else abstract(self._lowering.arguments(program)[1])
        lowered = None  # a stored program: read back (and installed) by a compile thread
        if signature is None or not self.store.holds(repr(program.key), signature):
          try:
            begin = time.perf_counter()
            lowered = self._lower(program)
            self.lowering_s += time.perf_counter() - begin
          except Exception as err:  # reported with the program's name
            errors.append((position, ProgramCompileError(program, err)))
            return
        work.put((position, index, program, lowered, signature))
        position += 1
      self._next_group = index + 1

  def _program_done(self, index: int) -> None:
    """Counts a compiled program; publishes its group's buckets once the group is complete."""
    with self._lock:
      self._num_compiled += 1
      self._left[index] -= 1
      if self._left[index] == 0:
        group = self.groups[index]
        self._steps, self._bursts = self._steps | group.steps, self._bursts | group.bursts
      if self._num_compiled == self.num_total:
        self.finished_after_s = time.perf_counter() - self.started_at
      self._readiness = ProgramReadiness(
        self._steps, self._bursts, self._num_compiled, self.num_total, self.finished_after_s
      )

  def _on_jax_event(self, event: str, **kwargs) -> None:
    """Notes, for the compiling thread, that its compilation was a hit of XLA's cache."""
    if event == CACHE_HIT_EVENT:
      self._thread_state.cache_hit = True

  def _stored(self, program: Program, signature: object) -> jax.stages.Compiled | None:
    """`program` read back from the store, or None (then it is lowered and compiled)."""
    compiled = self.store.load(repr(program.key), signature)
    if compiled is not None:
      with self._lock:
        self.num_loaded += 1
    return compiled

  def save_compiled(self) -> None:
    """Writes the programs compiled so far to the store (before serving: a full warmup)."""
    if self._unsaved is not None:
      self._unsaved.save_all()

  def _save_when_idle(self) -> None:
    """In the background: the compiled programs are written while the engine is idle."""
    if self._unsaved is not None:  # the watcher as it is at each poll: watch_load may come later
      self._unsaved.save_when_idle(lambda: self._busy(), self._stop)
