"""The engine core: admit token-id requests, schedule a step, run it on device, report tokens.

Single-threaded by design, and token-level: step() returns EngineCoreOutputs (token ids, logprobs,
finish reasons; engine/core_io.py), never text. Detokenization and stop strings are the output
processor's (engine/output_processor.py): LLMEngine (engine/llm_engine.py) composes the two in one
process for the offline API; `jaxserve serve` runs this alone under CoreLoop (core/loop.py: in the
engine core process, or on a thread of the one-process server) and ships the outputs to the API
servers, which run the processor. A stop string found there comes back as stop_request().

Bad input raises ValueError in add_request and never reaches the device, so other requests keep
running. A request arrives as its record (engine/core_io.EngineCoreRequest, its prompt ids
checked where it was built); the core's Request shares the record's prompt ids. A finished
step's results reach its requests through engine/step_results.py; the loop's timings are
engine/step_timings.py's StepTimings.

Async scheduling (scheduler.async_scheduling, on by default): step() schedules and dispatches
step N+1 before it waits for step N's results, so scheduling, building the inputs and processing
outputs run while the device computes. Step N+1's decode tokens are step N's samples, fed on
device (device/model_runner.py, behind engine/device_port.StepRunner); each call to step()
returns the outputs of the step before. A request that stopped at step N has computed one more
token in step N+1, which is dropped. Penalties need every generated id on the host, so a step
whose batch holds a penalized request waiting for its in-flight token first completes the step
in flight (synchronously).

Structured outputs (engine/constraints.py, owned by the core: the tokenizer's grammar compiler
validates a request's constraint in add_request, and each request's matcher lives in its
RequestState, where sampling decisions are made): a step with grammar-constrained sequences is
dispatched in two parts. The forward goes first; then the core takes the step before's tokens
(each constrained sequence's matcher consumes its token), fills the constrained rows' token
bitmask on the host while the device runs the forward, and dispatches the sampler with the mask
in the step's batch. The mask's host time hides behind the forward unless it is longer
(StepTimings: phase "bitmask"). Such a batch never runs as a decode burst (Request.can_burst).

Sleep mode (engine/sleep_mode.py holds the rules): sleep() completes the step in flight, aborts
every request, resets the page allocator and has the runner free its memory; while asleep step()
only hands out outputs already due (can_step() says whether it has any), and requests added
wait. wake_up() has the runner put the memory back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.engine.admission import check_multi_host_sampling, check_priority, check_token_ids
from jaxserve.engine.constraints import Constraints, live_matcher
from jaxserve.engine.core_io import EngineCoreOutput, EngineCoreRequest
from jaxserve.engine.device_port import CompileCounter, MemoryGauge, ProgramStatus, StepRunner
from jaxserve.engine.engine_stats import EngineStats
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.engine.request_state import RequestState
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.sleep_mode import SleepState
from jaxserve.engine.step_results import apply_step_output
from jaxserve.engine.step_timings import StepTimings
from jaxserve.messages.buckets import Bucket, BucketSet
from jaxserve.messages.program_readiness import ANY_BUCKET, ProgramReadiness
from jaxserve.messages.scheduled_batch import ScheduledBatch
from jaxserve.structured import SequenceMatcher

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _StepInFlight:
  """A dispatched step: what it was fed and where its results will come from."""

  batch: ScheduledBatch
  requests: tuple[Request, ...]  # batch.seqs' requests, to recognise finished ones
  handle: object  # the runner's handle of the dispatched step
  bucket: tuple[int, int]
  dispatch_time: float

  def feeds_penalized_request(self) -> bool:
    return any(
      sample and request.sampling_params.uses_penalties
      for sample, request in zip(self.batch.sample, self.requests, strict=True)
    )


class _AllReady:
  """The ProgramStatus of a runner whose programs compile on first use (warmup "lazy")."""

  def readiness(self) -> ProgramReadiness:
    return ANY_BUCKET

  def watch_load(self, busy) -> None:
    pass

  def close(self) -> None:
    pass


class EngineCore:
  """Continuous batching over one model, token-level. Build it with jaxserve.composition.assembly
  (as part of an LLMEngine). Each step is padded to the smallest bucket of `buckets` that holds it
  among those `programs` reports compiled (while programs compile in the background, a step may take
  a larger bucket than it will once all are)."""

  def __init__(
    self,
    *,
    runner: StepRunner,
    scheduler: Scheduler,
    allocator: PageAllocator,
    max_model_len: int,
    vocab_size: int,
    eos_token_ids: tuple[int, ...],
    ledger: CompileCounter,
    seed: int = 0,
    buckets: BucketSet | None = None,
    programs: ProgramStatus | None = None,
    constraints: Constraints | None = None,
    memory: MemoryGauge | None = None,
    sleep_mode: bool = False,
  ):
    self.runner = runner
    self._sleep = SleepState(sleep_mode)
    self.memory = memory
    self.constraints = constraints
    self.buckets = buckets
    self.programs: ProgramStatus = programs or _AllReady()
    self.programs.watch_load(self.has_unfinished_requests)
    self.scheduler = scheduler
    self.allocator = allocator
    self.max_model_len = max_model_len
    self.vocab_size = vocab_size
    self.eos_token_ids = eos_token_ids
    self.ledger = ledger
    self._rng = np.random.default_rng(seed)
    self._requests: dict[str, Request] = {}
    self._states: dict[str, RequestState] = {}
    self._pending: list[RequestState] = []
    self._in_flight: _StepInFlight | None = None
    self._last_done_time = 0.0
    self.async_scheduling = scheduler.config.async_scheduling and runner.supports_async
    self.timings = StepTimings()

  @property
  def requests(self) -> dict[str, Request]:
    """The unfinished requests by id (read-only use: benchmarks look at their progress)."""
    return self._requests

  # -- admission ---------------------------------------------------------------------------
  def add_request(self, spec: EngineCoreRequest) -> None:
    """Validates (check_request) and queues a request: the one admission point of every
    request. n > 1 is expanded by the callers (LLM, server) with sampling_params.expand_n. A
    request that does not stream is reported once it has finished, unless it has stop strings
    (the output processor needs its tokens as they come)."""
    matcher = self.check_request(spec)
    params = spec.params
    seed = params.seed if params.seed is not None else int(self._rng.integers(0, 2**63 - 1))
    request = Request(
      request_id=spec.request_id,
      prompt_token_ids=spec.prompt_token_ids,
      sampling_params=params,
      seed=seed,
      arrival_time=spec.arrival_time or time.monotonic(),
      priority=spec.priority,
      eos_token_ids=self.eos_token_ids,
    )
    self.scheduler.add_request(request)
    self._requests[spec.request_id] = request
    self._states[spec.request_id] = RequestState(
      request, self.max_model_len, spec.stream or bool(params.stop), matcher=matcher
    )

  def check_request(self, spec: EngineCoreRequest) -> SequenceMatcher | None:
    """The request's admission rules that need the core (engine/admission.py holds them; its
    prompt ids were checked where its record was built, engine/core_io.new_core_requests): a
    ValueError naming the field it breaks, else its grammar matcher (None without structured
    outputs). Queues nothing: a caller that must refuse for load (a 429) checks first, so a
    request that can never be served is told so (a 400) however full the queue is."""
    params = spec.params
    if not isinstance(params, SamplingParams):
      raise ValueError("sampling_params: must be a SamplingParams")
    if spec.request_id in self._requests:
      raise ValueError(f"request_id: {spec.request_id!r} is already in use")
    check_priority(spec.priority, self.scheduler.config.policy)
    if params.logit_bias:
      check_token_ids(params.logit_bias_ids, self.vocab_size, "logit_bias")
    if not self.runner.supports_async:  # a multi-host job's steps travel to the other hosts
      check_multi_host_sampling(params)
    self.scheduler.check_servable(len(spec.prompt_token_ids), params.max_tokens)
    if params.structured_outputs is None:
      return None
    if self.constraints is None:
      raise ValueError("structured_outputs: this engine core has no grammar compiler")
    return self.constraints.matcher_for(params)  # a bad constraint: StructuredOutputError

  def abort_request(self, request_id: str) -> bool:
    """Stops a request wherever it is; its pages return to the pool at once. Its last output
    (finish_reason "abort") comes with the next step."""
    state = self._states.get(request_id)
    if state is None or not self.scheduler.abort_request(request_id):
      return False
    self._finish(state, RequestStatus.FINISHED_ABORTED, notify_scheduler=False)
    self._pending.append(state)
    return True

  def stop_request(self, request_id: str) -> bool:
    """Ends a request the output processor finished (a stop string): its pages return to the
    pool (full ones to the prefix cache) and nothing more is reported for it."""
    state = self._states.pop(request_id, None)
    if state is None:
      return False
    self._requests.pop(request_id, None)
    self._finish(state, RequestStatus.FINISHED_STOPPED)
    return True

  # -- the loop ----------------------------------------------------------------------------
  def has_unfinished_requests(self) -> bool:
    return (
      self.scheduler.has_unfinished_requests() or bool(self._pending) or self._in_flight is not None
    )

  def can_step(self) -> bool:
    """Whether step() has anything to do: outputs due, or requests to run while awake."""
    return bool(self._pending) or (not self.is_sleeping and self.has_unfinished_requests())

  def step(self) -> list[EngineCoreOutput]:
    """Schedules and dispatches one step; returns outputs for requests that progressed or
    finished in the step completed by this call (the previous one with async scheduling).
    Asleep: the outputs due, nothing scheduled."""
    if self.is_sleeping:
      touched, self._pending = self._pending, []
      return self._outputs(touched)
    start = time.perf_counter()
    wait_before = self.timings.wait_seconds
    touched, self._pending = self._pending, []
    previous, self._in_flight = self._in_flight, None
    if previous is not None and previous.feeds_penalized_request():
      touched += self._complete(previous)
      previous = None
    timings = self.timings
    mark = time.perf_counter()
    batch = self.scheduler.schedule()
    mark = timings.add_phase("schedule", mark)
    if not batch.is_empty:
      inputs = self.runner.prepare(
        batch, previous.handle if previous else None, self._bucket(batch)
      )
      mark = timings.add_phase("prepare", mark)
      handle = self.runner.dispatch(inputs, batch)
      mark = timings.add_phase("dispatch", mark)
      if batch.sampling.bitmask_rows:  # the sampler waits for the constrained rows' mask
        if previous is not None:
          touched += self._complete(previous)
          previous = None
        mark = time.perf_counter()
        bitmask = self.constraints.fill(batch, live_matcher(self._states), inputs.bucket.num_seqs)
        handle = self.runner.dispatch_sample(handle, batch.with_bitmask(bitmask))
        mark = timings.add_phase("bitmask", mark)
      current = _StepInFlight(
        batch,
        tuple(map(self._requests.__getitem__, batch.request_ids)),
        handle,
        (inputs.bucket.num_seqs, inputs.bucket.num_tokens),
        mark,
      )
      if self.async_scheduling:
        self._in_flight = current
      else:
        touched += self._complete(current)
    if previous is not None:
      touched += self._complete(previous)
    outputs = self._outputs(touched)
    waited = self.timings.wait_seconds - wait_before
    host_seconds = time.perf_counter() - start - waited
    timings.host_seconds += host_seconds
    if not batch.is_empty:
      entry = timings.host_per_bucket.setdefault(current.bucket, [0, 0.0])
      entry[0] += 1
      entry[1] += host_seconds
    return outputs

  def _outputs(self, touched: list[RequestState]) -> list[EngineCoreOutput]:
    mark = time.perf_counter()
    outputs = []
    for state in touched:
      finished = state.request.status.finished
      if finished or state.stream:  # state.wants_output
        outputs.append(state.make_output())
      if finished:
        self._requests.pop(state.request.request_id, None)
        self._states.pop(state.request.request_id, None)
    self.timings.add_phase("outputs", mark)
    return outputs

  # -- sleep mode (engine/sleep_mode.py) ---------------------------------------------------
  @property
  def is_sleeping(self) -> bool:
    return self._sleep.is_sleeping

  def sleep(self, level: int = 1, mode: str = "abort") -> None:
    """Aborts every request (their outputs come with the next step()), empties the KV pool's
    bookkeeping and has the runner move the weights to the host and free the pool."""
    if not self._sleep.going_to_sleep(level, mode):
      return
    previous, self._in_flight = self._in_flight, None
    done = self._complete(previous) if previous is not None else []
    for request_id in list(self._states):
      self.abort_request(request_id)
    due = {id(state) for state in self._pending}
    self._pending += [state for state in done if id(state) not in due]  # one output each
    self.allocator.reset()
    self.runner.sleep(level)
    self._sleep.asleep()

  def wake_up(self, tags: list[str] | None = None) -> None:
    """Has the runner put back the parts `tags` names (None: all)."""
    self._sleep.wake(tags, self.runner.wake_up)

  def _bucket(self, batch: ScheduledBatch) -> Bucket | None:
    """The smallest ready bucket holding the batch (None: the runner's smallest)."""
    if self.buckets is None:
      return None
    ready = self.programs.readiness()
    return self.buckets.pick(
      batch.num_seqs, batch.num_tokens, ready.bursts if batch.num_steps > 1 else ready.steps
    )

  def _complete(self, step: _StepInFlight) -> list[RequestState]:
    """Waits for a dispatched step and applies its results."""
    wait_start = time.perf_counter()
    host = self.runner.fetch(step.handle)
    done = time.perf_counter()
    self.timings.wait_seconds += done - wait_start
    self.timings.record(step.bucket, done - max(step.dispatch_time, self._last_done_time))
    self._last_done_time = done
    touched = apply_step_output(step.batch, step.requests, host, self._states, self._finish)
    self.timings.add_phase("process", done)
    return touched

  def _finish(
    self, state: RequestState, status: RequestStatus, notify_scheduler: bool = True
  ) -> None:
    if notify_scheduler:
      self.scheduler.finish_request(state.request.request_id, status)
    state.request.status = status
    state.finished_time = time.monotonic()

  # -- introspection -----------------------------------------------------------------------
  def stats(self) -> EngineStats:
    ready = self.programs.readiness()
    return EngineStats(
      num_running=self.scheduler.num_running,
      num_waiting=self.scheduler.num_waiting,
      num_used_pages=self.allocator.num_used_pages,
      num_total_pages=self.allocator.num_usable_pages,
      num_preemptions=self.scheduler.num_preemptions_total,
      num_compilations=self.ledger.num_compilations,
      num_programs_compiled=ready.num_compiled,
      num_programs_total=ready.num_total,
      programs_finished_after_s=ready.finished_after_s or 0.0,
      num_prefix_cache_queries=self.scheduler.prefix_cache_queries,
      num_prefix_cache_hits=self.scheduler.prefix_cache_hits,
      device_bytes_in_use=self.memory.bytes_in_use if self.memory else 0,
      num_sleeping=int(self.is_sleeping),
    )

  def close(self) -> None:
    """Stops the background compilation (after the program it is compiling) and releases the
    runner (a multi-host job's other hosts)."""
    self.programs.close()
    self.runner.close()
