"""A planned scheduler step (engine/scheduler.py) and the `ScheduledBatch` it becomes. Pure
Python, no jax.

A step is planned as a list of `PlannedChunk`s, in scheduling order: the running requests first
(step 1), then the admitted ones (step 2, engine/waiting_admission.py), each with its pages
already allocated. `build_step_batch` then advances each request's num_computed_tokens to the
end of its chunk (the step it returns runs before the next `schedule()`). A sequence samples when
it reaches all its known tokens; one output placeholder is then counted for it, which the engine
replaces by the sampled token once it has the step's result. Batch order: decodes (one-token
queries that sample) first, then prefill chunks, each group in scheduling order
(engine/batch_builder.py fills the columns).
"""

from __future__ import annotations

from typing import NamedTuple

# relative imports: this side never touches jax
from ..messages.scheduled_batch import ScheduledBatch
from .batch_builder import BatchBuilder
from .request import Request


class PlannedChunk(NamedTuple):
  """A request's share of the step being planned: num_new tokens from position start (a named
  tuple: one is built per scheduled request per step, on the host's step loop)."""

  request: Request
  start: int
  num_new: int


def build_step_batch(
  planned: list[PlannedChunk], preempted_ids: list[str], num_groups: int
) -> ScheduledBatch:
  """Advances the planned requests (module docstring) and builds the step's batch over
  num_groups KV groups; preempted_ids: the requests this step preempted."""
  decodes: list[tuple[Request, int]] = []
  prefills: list[tuple[Request, int, int, bool]] = []
  for request, start, num_new in planned:
    end = start + num_new
    request.num_computed_tokens = end
    sample = end == request.num_tokens_with_placeholders
    request.num_output_placeholders += sample
    if num_new == 1 and sample:
      decodes.append((request, start))
    else:
      prefills.append((request, start, num_new, sample))
  columns = BatchBuilder(num_groups)
  columns.add_decodes(decodes)
  for request, start, num_new, sample in prefills:
    columns.add_prefill(request, start, num_new, sample)
  return columns.build(preempted_ids)
