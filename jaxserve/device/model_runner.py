"""The model runner: owns the params and KV pages on device and runs scheduled steps.

Each step is the jitted functions of device/step_fns.py: forward (the model; KV pages donated
and updated in place), the sampler compiled for the batch's SamplerMode, and prompt logprobs
when a request asks. The runner pads each scheduled batch to its bucket, sends the step inputs
packed into a few buffers (device/packing.py) and brings the results to the host in one
transfer. warmup() compiles every bucket, every sampler mode of every sequence bucket and the
prompt-logprob function of every token bucket up front; after it, no batch the scheduler can
produce triggers a compilation.

With num_scheduler_steps > 1 (set_burst_steps), a decode-only batch marked as a burst runs
step_fns' burst function instead of the forward and the sampler: num_steps decode steps in one
dispatch; its results carry a leading [num_steps] axis. Warmup compiles it for every bucket a
decode-only batch can take, in the two sampler modes a burst allows (greedy, random).

dispatch() only enqueues a step and starts the copy of its results to the host; fetch() waits
for them. Between the two the host can schedule and dispatch the next step, whose decode tokens
come from this step's sampled ids on device (a fixed [max_seq_slots] array, so every bucket
takes the same shape). That is async scheduling: the engine's host work overlaps the device.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxserve.engine.request import Request
from jaxserve.messages.scheduled_batch import ScheduledBatch
from jaxserve.device.buckets import Bucket, BucketSet
from jaxserve.device.kv_cache import KVPages
from jaxserve.device.packing import PackedStepInputs, pack
from jaxserve.device.sampler import GreedyFn, SampleOutput, SamplerMode, xla_greedy
from jaxserve.device.step_fns import (make_burst_fn, make_forward_fn, make_prompt_logprobs_fn,
                                       sample_step)
from jaxserve.device.step_inputs import (PreviousSamples, StepInputs, StepShape,
                                          build_step_inputs)

logger = logging.getLogger(__name__)


def _packed_model_inputs(inputs: StepInputs) -> PackedStepInputs:
  """The forward's part of the step inputs (all but the sampling inputs), packed."""
  return pack(dataclasses.replace(inputs, sampling=None))


@dataclass(frozen=True)
class HostStepOutput:
  """A step's results on the host; the optional parts are None when no request asked for them.
  A burst's token_ids and logprobs are [num_steps, S]."""
  token_ids: np.ndarray                    # i32[S] ([num_steps, S] for a burst)
  logprobs: np.ndarray                     # f32[S] ([num_steps, S] for a burst)
  top_ids: np.ndarray | None               # i32[S, N]
  top_logprobs: np.ndarray | None          # f32[S, N]
  prompt_logprobs: np.ndarray | None       # f32[T]
  prompt_top_ids: np.ndarray | None        # i32[T, N]
  prompt_top_logprobs: np.ndarray | None   # f32[T, N]


@dataclass(frozen=True)
class StepHandle:
  """A dispatched step: its outputs on device (results may still be computing)."""
  sample: SampleOutput
  sampled_ids_padded: jax.Array                 # i32[max_seq_slots]
  prompt: tuple[jax.Array, ...] | None          # (logprob [T], top ids, top logprobs) or None
  want_top: bool

  def fetch_list(self) -> list[jax.Array]:
    arrays = [self.sample.token_ids, self.sample.logprobs]
    if self.want_top:
      arrays += [self.sample.top_ids, self.sample.top_logprobs]
    return arrays + list(self.prompt or ())


class ModelRunner:
  """Owns the KV pages on device and runs the compiled step for scheduled batches."""

  def __init__(self, model, params, kv_pages: KVPages, buckets: BucketSet, shape: StepShape,
               compiler_options: dict[str, object] | None = None,
               greedy: GreedyFn = xla_greedy):
    self.model = model
    self.params = params
    self.kv_pages = kv_pages
    self.buckets = buckets
    self.shape = shape
    self.compiler_options = compiler_options  # XLA options of every step program
    self.greedy = greedy  # the sampler's greedy pick and log-normalizer
    jit = functools.partial(jax.jit, compiler_options=compiler_options)
    self._forward = jit(make_forward_fn(model), donate_argnums=(1,))
    self._sample = jit(functools.partial(sample_step, greedy=greedy), static_argnums=(3,))
    self._prompt = jit(make_prompt_logprobs_fn(model))
    self._constants: dict[tuple, jax.Array] = {}
    self.burst_steps = 1
    self._burst = None

  def set_burst_steps(self, num_steps: int) -> None:
    """Enables decode bursts of num_steps steps (scheduler.num_scheduler_steps); call before
    warmup."""
    self.burst_steps = num_steps
    self._burst = None if num_steps == 1 else self.jit_burst(
        make_burst_fn(self.model, num_steps, self.shape.page_size, self.greedy))

  def jit_burst(self, burst_fn):
    return jax.jit(burst_fn, donate_argnums=(1,), static_argnums=(4,),
                   compiler_options=self.compiler_options)

  @property
  def supports_async(self) -> bool:
    """Whether a step may take its tokens from the previous step's device output."""
    return True

  def device_constant(self, shape: tuple[int, ...], dtype: np.dtype, value: int) -> jax.Array:
    """A cached filled device array (laid out as the step's inputs are)."""
    key = (shape, np.dtype(dtype).str, value)
    if key not in self._constants:
      self._constants[key] = self.filled_array(shape, np.dtype(dtype), value)
    return self._constants[key]

  def filled_array(self, shape: tuple[int, ...], dtype: np.dtype, value: int) -> jax.Array:
    return jnp.full(shape, value, dtype)

  def empty_history(self, num_slots: int) -> jax.Array:
    return self.device_constant((num_slots, self.shape.history_len), np.int32, -1)

  def no_previous_samples(self) -> PreviousSamples:
    return PreviousSamples(
        self.device_constant((self.buckets.seq_buckets[-1],), np.int32, 0), {})

  def prepare(self, batch: ScheduledBatch, requests: Mapping[str, Request],
              previous: PreviousSamples | None = None) -> StepInputs:
    bucket = self.buckets.pick(batch.num_seqs, batch.num_tokens)
    return build_step_inputs(batch, requests, bucket, self.shape,
                             previous or self.no_previous_samples(), self.empty_history)

  def dispatch(self, inputs: StepInputs, num_steps: int = 1) -> StepHandle:
    """Enqueues the step (a burst of num_steps decode steps when > 1) and the copy of its
    results to the host; returns without waiting."""
    if num_steps > 1:
      return self._dispatch_burst(inputs, num_steps)
    model_inputs = _packed_model_inputs(inputs)
    self.kv_pages, logits, hidden = self._forward(self.params, self.kv_pages, model_inputs)
    mode = SamplerMode.of(inputs.sampling)
    sampled, padded = self._sample(logits, pack(inputs.sampling), inputs.prev_sampled_ids, mode)
    prompt = None
    if bool(inputs.sampling.want_prompt_logprobs):
      prompt = self._prompt(self.params, hidden, inputs.prompt_target_ids)
    handle = StepHandle(sampled, padded, prompt, mode.top_logprobs)
    for array in handle.fetch_list():
      array.copy_to_host_async()
    return handle

  def _dispatch_burst(self, inputs: StepInputs, num_steps: int) -> StepHandle:
    if num_steps != self.burst_steps:
      raise ValueError(f"step: a burst of {num_steps} steps, but the runner was set up for "
                       f"{self.burst_steps} (scheduler.num_scheduler_steps)")
    mode = SamplerMode.of(inputs.sampling)
    if mode.penalties or mode.top_logprobs:
      raise ValueError(f"step: a decode burst cannot run sampler mode {mode}")
    self.kv_pages, ids, logprobs, padded = self._burst(
        self.params, self.kv_pages, _packed_model_inputs(inputs),
        pack(inputs.sampling), mode)
    no_top = self.device_constant((0,), np.int32, 0)  # a burst returns no top-N logprobs
    handle = StepHandle(SampleOutput(ids, logprobs, no_top, no_top), padded, None, False)
    for array in handle.fetch_list():
      array.copy_to_host_async()
    return handle

  def fetch(self, handle: StepHandle) -> HostStepOutput:
    """Waits for a dispatched step and returns its results on the host."""
    host = iter(jax.device_get(handle.fetch_list()))
    token_ids, logprobs = next(host), next(host)
    top = (next(host), next(host)) if handle.want_top else (None, None)
    prompt = (next(host), next(host), next(host)) if handle.prompt else (None, None, None)
    return HostStepOutput(token_ids, logprobs, *top, *prompt)

  def execute(self, inputs: StepInputs) -> HostStepOutput:
    return self.fetch(self.dispatch(inputs))

  def temp_bytes(self, bucket: Bucket) -> int | None:
    """Device scratch memory a step of `bucket` needs (forward plus the sampler with every
    part on), if the backend reports it."""
    lowered = self.lower_step(self.dummy_inputs(bucket), SamplerMode(True, True, True))
    sizes = [program.compile().memory_analysis() for program in lowered]
    if any(size is None for size in sizes):
      return None
    return sum(int(size.temp_size_in_bytes) for size in sizes)

  def lower_step(self, inputs: StepInputs, mode: SamplerMode | None = None) -> list:
    """The lowered programs of a single step on these inputs: the forward, then the sampler (in
    `mode`, default the inputs' own)."""
    forward = self._forward.lower(
        self.params, self.kv_pages, _packed_model_inputs(inputs))
    num_slots = inputs.metadata.seq_lens.shape[0]
    logits = jax.ShapeDtypeStruct((num_slots, self.model.config.vocab_size), jnp.float32)
    sampler = self._sample.lower(logits, pack(inputs.sampling), inputs.prev_sampled_ids,
                                 mode or SamplerMode.of(inputs.sampling))
    return [forward, sampler]

  def dummy_inputs(self, bucket: Bucket, mode: SamplerMode = SamplerMode(),
                   prompt_logprobs: bool = False) -> StepInputs:
    """All-padding inputs of a bucket's shape (used to compile it): an empty batch, padded,
    with the given sampler mode and prompt-logprob flag."""
    inputs = build_step_inputs(ScheduledBatch(()), {}, bucket, self.shape,
                               self.no_previous_samples(), self.empty_history)
    sampling = dataclasses.replace(
        inputs.sampling, any_random=np.array(mode.random), any_penalty=np.array(mode.penalties),
        want_top_logprobs=np.array(mode.top_logprobs),
        want_prompt_logprobs=np.array(prompt_logprobs))
    return dataclasses.replace(inputs, sampling=sampling)

  def warmup_variants(self) -> list[tuple[Bucket, SamplerMode, bool]]:
    """(bucket, sampler mode, prompt logprobs) runs that compile everything a step can need:
    every bucket's forward, every sampler mode per sequence bucket, prompt logprobs per token
    bucket."""
    buckets = self.buckets.all()
    variants = [(bucket, SamplerMode(), False) for bucket in buckets]
    for num_seqs in self.buckets.seq_buckets:
      bucket = min((b for b in buckets if b.num_seqs == num_seqs), key=lambda b: b.num_tokens)
      variants += [(bucket, mode, False) for mode in SamplerMode.all() if mode != SamplerMode()]
    for num_tokens in self.buckets.token_buckets:
      bucket = min((b for b in buckets if b.num_tokens == num_tokens), key=lambda b: b.num_seqs)
      variants.append((bucket, SamplerMode(), True))
    return variants

  def burst_buckets(self) -> list[Bucket]:
    """Every bucket a decode-only batch (as many tokens as sequences) can take."""
    return sorted({self.buckets.pick(n, n) for n in self.buckets.seq_buckets})

  def warmup(self, show_progress: bool = True) -> float:
    """Compiles every bucket and sampler variant; returns the seconds it took."""
    variants = self.warmup_variants()
    logger.info("warmup: compiling %d buckets (%s), %d sampler modes per sequence bucket and "
                "prompt logprobs per token bucket: %d programs", len(self.buckets.all()),
                self.buckets.describe(), len(SamplerMode.all()), len(variants))
    start = time.perf_counter()
    bursts = [] if self.burst_steps == 1 else [
        (bucket, mode) for bucket in self.burst_buckets()
        for mode in (SamplerMode(), SamplerMode(random=True))]
    if bursts:
      logger.info("warmup: %d decode-burst programs of %d steps", len(bursts), self.burst_steps)
    with tqdm(total=len(variants) + len(bursts), desc="compiling", unit="program",
              disable=not show_progress) as progress:
      for bucket, mode, prompt in variants:
        self.execute(self.dummy_inputs(bucket, mode, prompt))
        progress.update()
      for bucket, mode in bursts:
        self.fetch(self.dispatch(self.dummy_inputs(bucket, mode), self.burst_steps))
        progress.update()
    seconds = time.perf_counter() - start
    logger.info("warmup: compiled in %.1f s", seconds)
    return seconds
