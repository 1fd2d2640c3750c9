"""What the engine needs from the device side, as protocols: the engine loop depends on these,
not on the device package, so engine/ imports no jax and a runner in another process (or a fake
in a test) can stand behind them.

A StepRunner turns a ScheduledBatch into a dispatched step and, later, its StepOutput: prepare
pads the batch (tokens still in flight taken from the step `previous` dispatched), dispatch
enqueues it and returns an opaque handle, fetch waits for the results. A batch with
grammar-constrained rows (batch.sampling.bitmask_rows) is dispatched without its sampler, which
dispatch_sample enqueues once the engine has filled the rows' TokenBitmask and attached it to
the batch (ScheduledBatch.with_bitmask).
device/model_runner.py's ModelRunner is the implementation.
"""
from __future__ import annotations

from typing import Protocol, TypeVar

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

  def prepare(self, batch: ScheduledBatch, previous: Handle | None = None) -> Prepared: ...

  def dispatch(self, inputs: Prepared, batch: ScheduledBatch) -> Handle: ...

  def dispatch_sample(self, handle: Handle, batch: ScheduledBatch) -> Handle:
    """The sampler of a step dispatched without it; `batch` carries its TokenBitmask."""

  def fetch(self, handle: Handle) -> StepOutput: ...


class CompileCounter(Protocol):
  @property
  def num_compilations(self) -> int: ...
