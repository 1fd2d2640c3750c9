"""The model runner: owns the params and KV pages on device and runs scheduled steps.

Each step is the programs of device/step_programs.py: forward (the model; KV pages donated and
updated in place), the sampler compiled for the batch's SamplerMode, and prompt logprobs when a
request asks. The runner pads each ScheduledBatch to its bucket (device/step_inputs.py), sends
the step inputs packed into a few buffers (device/packing.py) and brings the results to the host
in one transfer, as a StepOutput. Compiling every bucket up front is device/warmup.py's job.

With StepPrograms.burst_steps > 1, a decode-only batch marked as a burst runs the burst program
instead of the forward and the sampler: num_steps decode steps in one dispatch; its results
carry a leading [num_steps] axis.

A batch with grammar-constrained rows (structured outputs: batch.sampling.bitmask_rows) whose
TokenBitmask is not known yet is dispatched in two parts: dispatch() enqueues the forward only,
and dispatch_sample(handle, batch.with_bitmask(mask)) the sampler once the host has filled the
mask (while the device ran the forward): the mask crosses the seam inside the ScheduledBatch.
Every other batch's sampler takes the cached all-ones bitmask.

dispatch() only enqueues a step and starts the copy of its results to the host; fetch() waits
for them. Between the two the host can schedule and dispatch the next step, whose decode tokens
come from this step's sampled ids on device (a fixed [max_seq_slots] array, so every bucket
takes the same shape): prepare(batch, previous=handle) names them. That is async scheduling:
the engine's host work overlaps the device.

Sleep mode (device/sleep_mode.py): sleep() moves the weights to host memory and deletes the KV
pool; wake_up("weights") / wake_up("kv_cache") put each back (the pool from `kv_pool`, the
KVPoolMaker that built it, so nothing compiles). No step runs while either is away (the engine
core's rule, engine/sleep_mode.py).

On a multi-host job process 0's runner hands each step's inputs to the other hosts right before
running it (`publisher`, which also covers warmup); those hosts replay single steps from them,
so such a runner neither supports async scheduling nor runs bursts. close() releases them.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import jax
import numpy as np
from flax import linen as nn

from jaxserve.api.sampling_params import MAX_LOGIT_BIAS
from jaxserve.device import sleep_mode
from jaxserve.device.kv_cache import KVPages, KVPoolMaker
from jaxserve.device.packing import PackedStepInputs, pack
from jaxserve.device.program_groups import Program
from jaxserve.device.sampler import SampleOutput, SamplerMode
from jaxserve.device.sampling_inputs import with_token_bitmask
from jaxserve.device.step_inputs import PreviousSamples, StepInputs, StepShape, build_step_inputs
from jaxserve.device.step_programs import StepPrograms
from jaxserve.messages.buckets import Bucket, BucketSet
from jaxserve.messages.scheduled_batch import ScheduledBatch, TokenBitmask
from jaxserve.messages.step_output import StepOutput

SINGLE_STEP = ScheduledBatch()  # what a step dispatched without its batch (a replay) counts as


class StepSink(Protocol):
  """Where process 0 sends each step before running it (parallel/multihost.StepPublisher)."""

  def publish(self, inputs: StepInputs) -> None: ...

  def stop(self) -> None: ...


def packed_model_inputs(inputs: StepInputs) -> PackedStepInputs:
  """The forward's part of the step inputs (all but the sampling inputs), packed."""
  return pack(dataclasses.replace(inputs, sampling=None))


@dataclass(frozen=True)
class PendingSample:
  """A step whose forward is dispatched and whose sampler waits for its token bitmask."""

  inputs: StepInputs
  logits: jax.Array  # f32[S, V]
  prompt: tuple[jax.Array, ...] | None


@dataclass(frozen=True)
class StepHandle:
  """A dispatched step: its outputs on device (results may still be computing); `pending` is
  set while its sampler waits for dispatch_sample."""

  batch: ScheduledBatch
  sample: SampleOutput | None
  sampled_ids_padded: jax.Array | None  # i32[max_seq_slots]
  prompt: tuple[jax.Array, ...] | None  # (logprob [T], top ids, top logprobs) or None
  want_top: bool
  pending: PendingSample | None = None

  def fetch_list(self) -> list[jax.Array]:
    arrays = [self.sample.token_ids, self.sample.logprobs]
    if self.want_top:
      arrays += [self.sample.top_ids, self.sample.top_logprobs]
    return arrays + list(self.prompt or ())

  @functools.cached_property
  def previous_samples(self) -> PreviousSamples:
    """This step's sampled ids, as the next step feeds them."""
    batch = self.batch
    rows: Mapping[str, int] = dict(
      itertools.compress(zip(batch.request_ids, itertools.count()), batch.sample)
    )
    return PreviousSamples(self.sampled_ids_padded, rows)


class ModelRunner:
  """Owns the KV pages on device and runs the step programs for scheduled batches."""

  def __init__(
    self,
    model: nn.Module,
    params: dict,
    kv_pages: KVPages,
    buckets: BucketSet,
    shape: StepShape,
    programs: StepPrograms,
    publisher: StepSink | None = None,
    kv_pool: KVPoolMaker | None = None,
  ):
    if programs.burst_steps > 1 and publisher is not None:
      raise ValueError(
        "scheduler.num_scheduler_steps: decode bursts do not run on multi-host "
        "jobs (the other hosts replay single steps); set it to 1"
      )
    self.model = model
    self.params = params
    self.kv_pages = kv_pages
    self.buckets = buckets
    self.shape = shape
    self.programs = programs
    self.publisher = publisher
    self.kv_pool = kv_pool
    self._host_params: sleep_mode.HostTree | None = None  # the weights while asleep
    self._constants: dict[tuple, jax.Array] = {}
    self._compiled: dict[tuple, jax.stages.Compiled] = {}  # Program.key -> its executable

  def install(self, key: tuple, compiled: jax.stages.Compiled) -> None:
    """Runs the program of `key` (device/program_groups.Program.key) as `compiled` from now on,
    without jit's dispatch; a program not installed runs through its jitted function."""
    self._compiled[key] = compiled

  def _run(self, program: Program, jitted: Callable, *args, static: tuple = ()):
    """Runs `program` on `args`: its installed executable (which takes no static arguments),
    else `jitted` with `static`."""
    compiled = self._compiled.get(program.key)
    return compiled(*args) if compiled is not None else jitted(*args, *static)

  @property
  def burst_steps(self) -> int:
    return self.programs.burst_steps

  @property
  def supports_async(self) -> bool:
    """Whether a step may take its tokens from the previous step's device output: not on a
    multi-host job, whose other hosts replay each step from its published inputs."""
    return self.publisher is None

  def device_constant(self, shape: tuple[int, ...], dtype: np.dtype, value: int) -> jax.Array:
    """A cached filled device array (laid out as the step's inputs are)."""
    key = (shape, np.dtype(dtype).str, value)
    if key not in self._constants:
      self._constants[key] = self.programs.filled(shape, np.dtype(dtype), value)
    return self._constants[key]

  def empty_history(self, num_slots: int) -> jax.Array:
    return self.device_constant((num_slots, self.shape.history_len), np.int32, -1)

  def all_allowed(self, num_slots: int) -> jax.Array:
    """The all-ones token bitmask: no row constrained."""
    return self.device_constant((num_slots, self.shape.bitmask_words), np.int32, -1)

  def no_logit_bias(self, num_slots: int) -> tuple[jax.Array, jax.Array]:
    """The logit-bias ids (all -1) and biases (all 0) of a batch without a bias."""
    shape = (num_slots, MAX_LOGIT_BIAS)
    return self.device_constant(shape, np.int32, -1), self.device_constant(shape, np.float32, 0)

  def no_previous_samples(self) -> PreviousSamples:
    return PreviousSamples(self.device_constant((self.buckets.seq_buckets[-1],), np.int32, 0), {})

  def prepare(
    self, batch: ScheduledBatch, previous: StepHandle | None = None, bucket: Bucket | None = None
  ) -> StepInputs:
    """The batch padded to `bucket` (the host's pick; default the smallest that holds it);
    tokens in flight come from `previous`'s samples."""
    bucket = bucket or self.buckets.pick(batch.num_seqs, batch.num_tokens)
    samples = previous.previous_samples if previous is not None else self.no_previous_samples()
    return build_step_inputs(
      batch,
      bucket,
      self.shape,
      samples,
      self.empty_history,
      self.all_allowed,
      self.no_logit_bias,
    )

  def dispatch(self, inputs: StepInputs, batch: ScheduledBatch = SINGLE_STEP) -> StepHandle:
    """Enqueues the step (a burst of batch.num_steps decode steps when > 1) and the copy of its
    results to the host; returns without waiting. A batch with constrained rows and no
    TokenBitmask yet gets its forward only: the handle is pending until dispatch_sample."""
    deferred = bool(batch.sampling.bitmask_rows) and batch.sampling.bitmask is None
    if deferred and (self.publisher is not None or batch.num_steps > 1):
      raise ValueError(
        "structured_outputs: a constrained batch cannot run as a decode burst or "
        "on a multi-host job (its token bitmask comes after the forward)"
      )
    if self.publisher is not None:
      self.publisher.publish(inputs)
    if batch.num_steps > 1:
      return self._started(self._dispatch_burst(inputs, batch))
    programs, bucket = self.programs, inputs.bucket
    self.kv_pages, logits, hidden = self._run(
      Program("forward", bucket),
      programs.forward,
      self.params,
      self.kv_pages,
      packed_model_inputs(inputs),
    )
    prompt = None
    if bool(inputs.sampling.want_prompt_logprobs):
      prompt = self._run(
        Program("prompt", bucket),
        programs.prompt_logprobs,
        self.params,
        hidden,
        inputs.prompt_target_ids,
      )
    pending = PendingSample(inputs, logits, prompt)
    if deferred:
      return StepHandle(batch, None, None, prompt, False, pending)
    return self._sample(batch, pending)

  def dispatch_sample(self, handle: StepHandle, batch: ScheduledBatch) -> StepHandle:
    """Enqueues the sampler of a pending step: `batch` is the step's batch carrying its
    constrained rows' TokenBitmask (ScheduledBatch.with_bitmask)."""
    bitmask: TokenBitmask | None = batch.sampling.bitmask
    if handle.pending is None or bitmask is None or batch.request_ids != handle.batch.request_ids:
      raise ValueError(
        "step: dispatch_sample needs a step dispatched without its bitmask and "
        "that step's batch with the bitmask"
      )
    pending = handle.pending
    inputs = dataclasses.replace(
      pending.inputs, sampling=with_token_bitmask(pending.inputs.sampling, bitmask)
    )
    return self._sample(batch, dataclasses.replace(pending, inputs=inputs))

  def _sample(self, batch: ScheduledBatch, pending: PendingSample) -> StepHandle:
    inputs = pending.inputs
    mode = SamplerMode.of(inputs.sampling)
    sampled, padded = self._run(
      Program("sample", inputs.bucket, mode),
      self.programs.sample,
      pending.logits,
      pack(inputs.sampling),
      inputs.prev_sampled_ids,
      static=(mode,),
    )
    return self._started(StepHandle(batch, sampled, padded, pending.prompt, mode.top_logprobs))

  @staticmethod
  def _started(handle: StepHandle) -> StepHandle:
    for array in handle.fetch_list():
      array.copy_to_host_async()
    return handle

  def _dispatch_burst(self, inputs: StepInputs, batch: ScheduledBatch) -> StepHandle:
    if batch.num_steps != self.burst_steps:
      raise ValueError(
        f"step: a burst of {batch.num_steps} steps, but the runner was set up "
        f"for {self.burst_steps} (scheduler.num_scheduler_steps)"
      )
    mode = SamplerMode.of(inputs.sampling)
    if mode.penalties or mode.top_logprobs:
      raise ValueError(f"step: a decode burst cannot run sampler mode {mode}")
    self.kv_pages, ids, logprobs, padded = self._run(
      Program("burst", inputs.bucket, mode),
      self.programs.burst,
      self.params,
      self.kv_pages,
      packed_model_inputs(inputs),
      pack(inputs.sampling),
      static=(mode,),
    )
    no_top = self.device_constant((0,), np.int32, 0)  # a burst returns no top-N logprobs
    return StepHandle(batch, SampleOutput(ids, logprobs, no_top, no_top), padded, None, False)

  def fetch(self, handle: StepHandle) -> StepOutput:
    """Waits for a dispatched step and returns its results on the host."""
    if handle.pending is not None:
      raise ValueError("step: fetch of a step whose sampler was never dispatched (dispatch_sample)")
    host = iter(jax.device_get(handle.fetch_list()))
    token_ids, logprobs = next(host), next(host)
    top = (next(host), next(host)) if handle.want_top else (None, None)
    prompt = (next(host), next(host), next(host)) if handle.prompt else (None, None, None)
    return StepOutput(token_ids, logprobs, *top, *prompt)

  def execute(self, inputs: StepInputs, batch: ScheduledBatch = SINGLE_STEP) -> StepOutput:
    return self.fetch(self.dispatch(inputs, batch))

  def sleep(self, level: int) -> None:
    """Sleep level 1: the weights to host memory, the KV pool deleted (the engine core has
    checked the level and that no step is in flight)."""
    if self.kv_pool is None or self.publisher is not None:
      raise ValueError(
        "enable_sleep_mode: this runner cannot sleep (built without its KV pool maker, or "
        "on a multi-host job)"
      )
    if self._host_params is None:
      self._host_params = sleep_mode.offload(self.params)
      self.params = None
    if self.kv_pages is not None:
      sleep_mode.release(self.kv_pages)
      self.kv_pages = None

  def wake_up(self, tag: str) -> None:
    """Puts back what sleep took: "weights" (with their shardings) or "kv_cache" (an empty
    pool); a no-op for what is already there."""
    if tag == "weights" and self._host_params is not None:
      self.params = sleep_mode.restore(self._host_params)
      self._host_params = None
    elif tag == "kv_cache" and self.kv_pages is None:
      self.kv_pages = jax.block_until_ready(self.kv_pool())

  def close(self) -> None:
    """Ends the other hosts' step loops (no-op on one host)."""
    if self.publisher is not None:
      self.publisher.stop()
      self.publisher = None
