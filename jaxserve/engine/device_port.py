"""What the engine needs from the device side, as protocols: the engine loop depends on these,
not on the device package, so engine/ imports no jax and a runner in another process (or a fake
in a test) can stand behind them.

A StepRunner turns a ScheduledBatch into a dispatched step and, later, its StepOutput: prepare
pads the batch (tokens still in flight taken from the step `previous` dispatched), dispatch
enqueues it and returns an opaque handle, fetch waits for the results. device/model_runner.py's
ModelRunner is the implementation. A ProgramStatus says which buckets' programs are compiled:
the engine pads each step to the smallest ready bucket that holds it and passes it to prepare.
A batch with grammar-constrained rows (batch.sampling.bitmask_rows) is dispatched without its
sampler, which dispatch_sample enqueues once the engine has filled the rows' TokenBitmask and
attached it to the batch (ScheduledBatch.with_bitmask).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from ..messages.buckets import Bucket
from ..messages.program_readiness import ProgramReadiness
from ..messages.scheduled_batch import ScheduledBatch
from ..messages.step_output import StepOutput


class BucketShape(Protocol):
  @property
  def num_seqs(self) -> int: ...

  @property
  def num_tokens(self) -> int: ...


class PreparedStep(Protocol):
  """A batch padded to its bucket (the runner's step inputs)."""

  @property
  def bucket(self) -> BucketShape: ...


Prepared = TypeVar("Prepared", bound=PreparedStep)
Handle = TypeVar("Handle")


class StepRunner(Protocol[Prepared, Handle]):
  @property
  def supports_async(self) -> bool:
    """Whether a step may feed tokens from the step dispatched before it (async scheduling)."""

  def prepare(
    self, batch: ScheduledBatch, previous: Handle | None = None, bucket: Bucket | None = None
  ) -> Prepared:
    """The batch padded to `bucket` (the host's pick; None: the smallest that holds it)."""

  def dispatch(self, inputs: Prepared, batch: ScheduledBatch) -> Handle: ...

  def dispatch_sample(self, handle: Handle, batch: ScheduledBatch) -> Handle:
    """The sampler of a step dispatched without it; `batch` carries its TokenBitmask."""

  def fetch(self, handle: Handle) -> StepOutput: ...

  def sleep(self, level: int) -> None:
    """Frees the device memory of sleep `level` (engine/sleep_mode.py): weights to the host,
    KV pool deleted; no step is in flight."""

  def wake_up(self, tag: str) -> None:
    """Puts back the part `tag` names ("weights", "kv_cache")."""

  def close(self) -> None:
    """Releases the device side (a multi-host job's other hosts)."""


class ProgramStatus(Protocol):
  """Which buckets the device side has compiled (device/program_compiler.py)."""

  def readiness(self) -> ProgramReadiness: ...

  def watch_load(self, busy: Callable[[], bool]) -> None:
    """`busy()` says whether the engine has requests to serve (read from another thread): work
    that would slow them (writing compiled programs to the store) waits for it to be False."""

  def close(self) -> None:
    """Stops any compilation still running."""


class CompileCounter(Protocol):
  @property
  def num_compilations(self) -> int: ...


class MemoryGauge(Protocol):
  """The device memory the engine holds (device/memory_gauge.py; 0 where unknown)."""

  @property
  def bytes_in_use(self) -> int: ...
