"""Compiling the step programs while serving (config key `warmup`).

A step's programs are the forward of its (sequences, tokens) bucket, the sampler of its sequence
count in every SamplerMode, prompt logprobs of its token count and, with decode bursts, the burst
program of a decode bucket in the greedy and random modes (device/step_fns.py). program_groups
lists them bucket by bucket, in the order they are worth compiling:

1. the largest bucket, which every step fits (padded to it), with the bursts of the largest
   decode bucket: once these are compiled the engine can serve every request;
2. the decode buckets (as many tokens as sequences), smallest first: most steps of a serving
   engine are decodes, and a small decode step padded to the largest bucket is the costliest
   padding there is;
3. every other bucket, by tokens then sequences (a step's cost follows its tokens).

ProgramCompiler compiles group 1 in the caller's thread (compile_first; its programs lowered one by
one, then compiled side by side on threads) and, with `background`, the others on one compile thread
(start): XLA's compilation releases the GIL, so the engine keeps stepping meanwhile. Each program is
lowered on padding inputs with the runner's own params and KV pages as abstract arguments (so the
compile thread never touches the buffers the engine donates) and compiled ahead of time; jit's
compilation cache then serves the engine's calls, so the compile ledger counts each program once.
Each time a bucket's group is compiled, a new ProgramReadiness (messages/program_readiness.py) is
published; the host pads each step to the smallest ready bucket that holds it
(engine/engine_core.py), which therefore never waits for a compilation.

close() (the engine's close, at shutdown) stops the compile thread at the next program and waits
for it at most CLOSE_WAIT_S: a stop signal during background compilation exits within that, not
after the program being compiled (seconds for a large bucket). The thread is a daemon; one still
inside XLA's compiler crashes the interpreter's finalization (SIGSEGV), so a process that closed
an engine while `compilation_abandoned()` ends with `exit_now` (no finalization) instead.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxserve.device.lowering import abstract, dummy_inputs
from jaxserve.device.model_runner import ModelRunner, packed_model_inputs
from jaxserve.device.packing import pack
from jaxserve.device.sampler import SamplerMode
from jaxserve.messages.buckets import Bucket, BucketSet
from jaxserve.messages.program_readiness import ProgramReadiness
from jaxserve.messages.scheduled_batch import ScheduledBatch

logger = logging.getLogger(__name__)

BURST_MODES = (SamplerMode(), SamplerMode(random=True))
CLOSE_WAIT_S = 0.5
COMPILE_THREAD_NAME = "jaxserve-compile"


def compilation_abandoned() -> bool:
  """Whether a closed compiler's thread is still inside XLA's compiler."""
  return any(t.name == COMPILE_THREAD_NAME and t.is_alive() for t in threading.enumerate())


def exit_now(status: int) -> None:
  """Flushes the logs and standard streams, then exits without the interpreter's finalization."""
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


@dataclass(frozen=True)
class Program:
  """One compiled program: kind "forward" (per bucket), "sample" (per sequence count and mode),
  "prompt" (per token count) or "burst" (per decode bucket and mode); `bucket` is the one it is
  lowered on."""

  kind: str
  bucket: Bucket
  mode: SamplerMode = SamplerMode()

  @property
  def key(self) -> tuple:
    """What the compiled program depends on (the sampler: sequences; prompt logprobs: tokens)."""
    if self.kind == "sample":
      return (self.kind, self.bucket.num_seqs, self.mode)
    if self.kind == "prompt":
      return (self.kind, self.bucket.num_tokens)
    return (self.kind, self.bucket, self.mode)


@dataclass(frozen=True)
class ProgramGroup:
  """Programs that, compiled, make `steps` ready for single steps and `bursts` for bursts."""

  programs: tuple[Program, ...]
  steps: frozenset[Bucket]
  bursts: frozenset[Bucket] = frozenset()


def step_programs(bucket: Bucket) -> list[Program]:
  return (
    [Program("forward", bucket)]
    + [Program("sample", bucket, m) for m in SamplerMode.all()]
    + [Program("prompt", bucket)]
  )


def burst_programs(bucket: Bucket) -> list[Program]:
  return [Program("burst", bucket, mode) for mode in BURST_MODES]


def program_groups(buckets: BucketSet, bursts: bool) -> list[ProgramGroup]:
  """Every bucket's programs, in compile order (module docstring); a program shared with an
  earlier group (a sampler, prompt logprobs) is listed once, in the first."""
  largest, decodes = buckets.largest(), buckets.decode_buckets()
  first_bursts = [decodes[-1]] if bursts else []
  groups = [
    ProgramGroup(
      tuple(step_programs(largest) + (burst_programs(decodes[-1]) if bursts else [])),
      frozenset({largest}),
      frozenset(first_bursts),
    )
  ]
  rest = sorted(set(buckets.all()) - {largest}, key=lambda b: (b.num_tokens, b.num_seqs))
  for bucket in [b for b in decodes if b != largest] + [b for b in rest if b not in decodes]:
    burst = bursts and bucket in decodes
    groups.append(
      ProgramGroup(
        tuple(step_programs(bucket) + (burst_programs(bucket) if burst else [])),
        frozenset({bucket}),
        frozenset({bucket} if burst else ()),
      )
    )
  if bursts and largest in decodes and largest != decodes[-1]:
    groups.append(ProgramGroup(tuple(burst_programs(largest)), frozenset(), frozenset({largest})))
  seen: set[tuple] = set()
  unique = []
  for group in groups:
    programs = tuple(p for p in group.programs if p.key not in seen)
    seen.update(p.key for p in programs)
    unique.append(ProgramGroup(programs, group.steps, group.bursts))
  return unique


class ProgramCompiler:
  """Compiles a runner's step programs group by group and publishes which buckets are ready."""

  def __init__(self, runner: ModelRunner):
    self.runner = runner
    self.groups = program_groups(runner.buckets, runner.burst_steps > 1)
    self.num_total = sum(len(g.programs) for g in self.groups)
    self._params = abstract(runner.params)
    self._kv_pages = abstract(runner.kv_pages)
    self._hidden: dict[int, jax.ShapeDtypeStruct] = {}  # tokens -> the forward's hidden [T, H]
    self._steps: frozenset[Bucket] = frozenset()
    self._bursts: frozenset[Bucket] = frozenset()
    self._num_compiled = 0
    self._next_group = 0
    self._readiness = ProgramReadiness(frozenset(), frozenset(), 0, self.num_total)
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self.error: BaseException | None = None

  def readiness(self) -> ProgramReadiness:
    """The latest published readiness (an immutable snapshot: read without a lock)."""
    return self._readiness

  def compile_first(self) -> float:
    """Compiles the largest bucket's programs here, then runs one step of it and one burst (so
    whatever else a step compiles, e.g. its eager constants, is compiled too); returns the
    seconds it took."""
    start = time.perf_counter()
    self._compile_group(self.groups[0], parallel=True)
    runner = self.runner
    runner.execute(dummy_inputs(runner, runner.buckets.largest()))
    if runner.burst_steps > 1:
      runner.execute(
        dummy_inputs(runner, runner.buckets.decode_buckets()[-1]),
        ScheduledBatch(num_steps=runner.burst_steps),
      )
    return time.perf_counter() - start

  def compile_rest(self, on_group: Callable[[int], object] | None = None) -> None:
    """Compiles every group not compiled yet, here (stops early when close() is called);
    `on_group(n)` after each group of n programs (a progress bar's update)."""
    while self._next_group < len(self.groups) and not self._stop.is_set():
      group = self.groups[self._next_group]
      self._compile_group(group)
      if on_group is not None:
        on_group(len(group.programs))

  def start(self) -> "ProgramCompiler":
    """Compiles the remaining groups on a daemon thread."""
    self._thread = threading.Thread(target=self._run, name=COMPILE_THREAD_NAME, daemon=True)
    self._thread.start()
    return self

  def wait(self, timeout: float | None = None) -> bool:
    """Waits for the compile thread; True once every program is compiled."""
    if self._thread is not None:
      self._thread.join(timeout)
    if self.error is not None:
      raise RuntimeError("background compilation failed") from self.error
    return self._readiness.complete

  def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
    """Stops the compile thread at its next program; waits for it at most `wait_s`."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(wait_s)
      if self._thread.is_alive():
        logger.info("background compilation stopped mid-program (left to the process's exit)")

  def _run(self) -> None:
    start = time.perf_counter()
    try:
      self.compile_rest()
    except BaseException as err:  # logged; the buckets compiled so far keep serving
      self.error = err
      logger.exception("background compilation stopped")
      return
    if self._readiness.complete:
      logger.info(
        "background compilation: all %d programs compiled in %.1f s (%d buckets ready)",
        self.num_total,
        time.perf_counter() - start,
        len(self._steps),
      )

  def _compile_group(self, group: ProgramGroup, parallel: bool = False) -> None:
    """Lowers the group's programs one by one (tracing holds the GIL) and compiles them, each
    after its lowering or, with `parallel`, all at once on threads (XLA's compilation releases
    the GIL: the small samplers compile beside the forward)."""
    if parallel:
      lowered = [self._lower(program) for program in group.programs]
      with ThreadPoolExecutor(len(lowered) or 1, thread_name_prefix="jaxserve-warmup") as pool:
        list(pool.map(lambda program: program.compile(), lowered))
    else:
      for program in group.programs:
        if self._stop.is_set():
          return  # close(): the group is not published
        self._lower(program).compile()
    self._num_compiled += len(group.programs)
    self._next_group += 1
    self._steps, self._bursts = self._steps | group.steps, self._bursts | group.bursts
    self._readiness = ProgramReadiness(
      self._steps, self._bursts, self._num_compiled, self.num_total
    )

  def _lower(self, program: Program) -> jax.stages.Lowered:
    runner, programs = self.runner, self.runner.programs
    inputs = dummy_inputs(runner, program.bucket, program.mode, program.kind == "prompt")
    if program.kind == "forward":
      lowered = programs.forward.lower(self._params, self._kv_pages, packed_model_inputs(inputs))
      self._hidden[program.bucket.num_tokens] = lowered.out_info[2]
    elif program.kind == "sample":
      logits = jax.ShapeDtypeStruct(
        (program.bucket.num_seqs, runner.model.config.vocab_size), jnp.float32
      )
      lowered = programs.sample.lower(
        logits, pack(inputs.sampling), inputs.prev_sampled_ids, program.mode
      )
    elif program.kind == "prompt":
      hidden = self._hidden[program.bucket.num_tokens]
      lowered = programs.prompt_logprobs.lower(
        self._params, jax.ShapeDtypeStruct(hidden.shape, hidden.dtype), inputs.prompt_target_ids
      )
    else:
      lowered = programs.burst.lower(
        self._params,
        self._kv_pages,
        packed_model_inputs(inputs),
        pack(inputs.sampling),
        program.mode,
      )
    return lowered
