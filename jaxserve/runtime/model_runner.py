"""The jitted step and the runner that feeds it.

step(params, kv_pages, step_inputs) -> (kv_pages, StepOutput) is one compiled function per
bucket. The model writes this step's K/V into the donated pages in place, attends through the
configured backend, and samples on device. The runner pads each scheduled batch to its bucket,
sends the step inputs packed into two buffers (runtime/packing.py), runs the step and brings the
results to the host in one transfer. warmup() compiles every bucket
up front; after it, no batch the scheduler can produce triggers a compilation.

dispatch() only enqueues a step and starts the copy of its results to the host; fetch() waits
for them. Between the two the host can schedule and dispatch the next step, whose decode tokens
come from this step's sampled ids on device (StepOutput.sampled_ids_padded, a fixed
[max_seq_slots] array so every bucket takes the same shape). That is async scheduling: the
engine's host work overlaps the device step.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxserve.engine.request import Request
from jaxserve.engine.scheduled_batch import ScheduledBatch
from jaxserve.runtime.buckets import Bucket, BucketSet
from jaxserve.runtime.kv_cache import KVPages
from jaxserve.runtime.packing import PackedStepInputs, pack, unpack
from jaxserve.runtime.sampler import SampleOutput, prompt_logprobs, sample
from jaxserve.runtime.step_inputs import (PreviousSamples, StepInputs, StepShape,
                                          build_step_inputs)
from jaxserve.sampling_params import MAX_LOGPROBS

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepOutput:
  sample: SampleOutput
  sampled_ids_padded: jax.Array    # i32[max_seq_slots]: sample.token_ids, zero padded
  prompt_logprobs: jax.Array       # f32[T]: logprob of the next prompt token at each position
  prompt_top_ids: jax.Array        # i32[T, MAX_LOGPROBS]
  prompt_top_logprobs: jax.Array   # f32[T, MAX_LOGPROBS]


jax.tree_util.register_dataclass(
    StepOutput, data_fields=["sample", "sampled_ids_padded", "prompt_logprobs", "prompt_top_ids",
                             "prompt_top_logprobs"], meta_fields=[])


@dataclass(frozen=True)
class HostStepOutput:
  """A step's results on the host; the optional parts are None when no request asked for them."""
  token_ids: np.ndarray                    # i32[S]
  logprobs: np.ndarray                     # f32[S]
  top_ids: np.ndarray | None               # i32[S, N]
  top_logprobs: np.ndarray | None          # f32[S, N]
  prompt_logprobs: np.ndarray | None       # f32[T]
  prompt_top_ids: np.ndarray | None        # i32[T, N]
  prompt_top_logprobs: np.ndarray | None   # f32[T, N]


@dataclass(frozen=True)
class StepHandle:
  """A dispatched step: its outputs on device (results may still be computing)."""
  output: StepOutput
  want_top: bool
  want_prompt: bool

  def fetch_list(self) -> list[jax.Array]:
    out = self.output
    arrays = [out.sample.token_ids, out.sample.logprobs]
    if self.want_top:
      arrays += [out.sample.top_ids, out.sample.top_logprobs]
    if self.want_prompt:
      arrays += [out.prompt_logprobs, out.prompt_top_ids, out.prompt_top_logprobs]
    return arrays


def make_step_fn(model):
  """Builds step(params, kv_pages, inputs) for a LlamaForCausalLM-like flax module."""
  compute_logits = type(model).compute_logits

  def step(params, kv_pages: KVPages, inputs: StepInputs) -> tuple[KVPages, StepOutput]:
    variables = {"params": params}
    fed = inputs.prev_sampled_ids[jnp.maximum(inputs.prev_token_rows, 0)]     # [T]
    token_ids = jnp.where(inputs.prev_token_rows >= 0, fed, inputs.token_ids)  # [T]
    hidden, kv_pages = model.apply(variables, token_ids, inputs.positions, kv_pages,
                                   inputs.slot_mapping, inputs.metadata)       # [T, D]
    logits = model.apply(variables, hidden[inputs.logits_indices], method=compute_logits)
    sampled = sample(logits, inputs.sampling)                                   # [S] ...
    padded_ids = jnp.zeros_like(inputs.prev_sampled_ids).at[:sampled.token_ids.shape[0]].set(
        sampled.token_ids)                                                      # [max_seq_slots]

    def with_prompt(h):
      # in chunks of tokens, so the [chunk, vocab] logits stay small whatever the bucket
      t = h.shape[0]
      chunk = next(c for c in (256, 128, 64, 32, 16, 8, 4, 2, 1) if t % c == 0)

      def one_chunk(args):
        h_chunk, targets = args
        return prompt_logprobs(model.apply(variables, h_chunk, method=compute_logits), targets)

      out = jax.lax.map(one_chunk, (h.reshape(t // chunk, chunk, -1),
                                    inputs.prompt_target_ids.reshape(t // chunk, chunk)))
      return tuple(x.reshape(t, *x.shape[2:]) for x in out)

    def without_prompt(h):
      t = h.shape[0]
      return (jnp.zeros((t,), jnp.float32), jnp.zeros((t, MAX_LOGPROBS), jnp.int32),
              jnp.zeros((t, MAX_LOGPROBS), jnp.float32))

    prompt = jax.lax.cond(inputs.sampling.want_prompt_logprobs, with_prompt, without_prompt,
                          hidden)
    return kv_pages, StepOutput(sampled, padded_ids, *prompt)

  def packed_step(params, kv_pages: KVPages, packed: PackedStepInputs):
    return step(params, kv_pages, unpack(packed))

  return packed_step


class ModelRunner:
  """Owns the KV pages on device and runs the compiled step for scheduled batches."""

  def __init__(self, model, params, kv_pages: KVPages, buckets: BucketSet, shape: StepShape):
    self.model = model
    self.params = params
    self.kv_pages = kv_pages
    self.buckets = buckets
    self.shape = shape
    self._step = jax.jit(make_step_fn(model), donate_argnums=(1,))
    self._constants: dict[tuple, jax.Array] = {}

  @property
  def supports_async(self) -> bool:
    """Whether a step may take its tokens from the previous step's device output."""
    return True

  def device_constant(self, shape: tuple[int, ...], dtype: np.dtype, value: int) -> jax.Array:
    """A cached filled device array (laid out as the step's inputs are)."""
    key = (shape, np.dtype(dtype).str, value)
    if key not in self._constants:
      self._constants[key] = jnp.full(shape, value, dtype)
    return self._constants[key]

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

  def dispatch(self, inputs: StepInputs) -> StepHandle:
    """Enqueues the step and the copy of its results to the host; returns without waiting."""
    self.kv_pages, out = self._step(self.params, self.kv_pages, pack(inputs))
    handle = StepHandle(out, bool(inputs.sampling.want_top_logprobs),
                        bool(inputs.sampling.want_prompt_logprobs))
    for array in handle.fetch_list():
      array.copy_to_host_async()
    return handle

  def fetch(self, handle: StepHandle) -> HostStepOutput:
    """Waits for a dispatched step and returns its results on the host."""
    host = iter(jax.device_get(handle.fetch_list()))
    token_ids, logprobs = next(host), next(host)
    top = (next(host), next(host)) if handle.want_top else (None, None)
    prompt = (next(host), next(host), next(host)) if handle.want_prompt else (None, None, None)
    return HostStepOutput(token_ids, logprobs, *top, *prompt)

  def execute(self, inputs: StepInputs) -> HostStepOutput:
    return self.fetch(self.dispatch(inputs))

  def temp_bytes(self, bucket: Bucket) -> int | None:
    """Device scratch memory the compiled step of `bucket` needs, if the backend reports it."""
    lowered = self._step.lower(self.params, self.kv_pages, pack(self.dummy_inputs(bucket)))
    analysis = lowered.compile().memory_analysis()
    return None if analysis is None else int(analysis.temp_size_in_bytes)

  def dummy_inputs(self, bucket: Bucket) -> StepInputs:
    """All-padding inputs of a bucket's shape (used to compile it): an empty batch, padded."""
    return build_step_inputs(ScheduledBatch(()), {}, bucket, self.shape,
                             self.no_previous_samples(), self.empty_history)

  def warmup(self, show_progress: bool = True) -> float:
    """Compiles every bucket; returns the seconds it took."""
    buckets = self.buckets.all()
    logger.info("warmup: compiling %d buckets (%s)", len(buckets), self.buckets.describe())
    start = time.perf_counter()
    for bucket in tqdm(buckets, desc="compiling buckets", unit="bucket",
                       disable=not show_progress):
      self.execute(self.dummy_inputs(bucket))
    seconds = time.perf_counter() - start
    logger.info("warmup: %d buckets compiled in %.1f s", len(buckets), seconds)
    return seconds
