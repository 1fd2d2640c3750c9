"""Step inputs made of padding, and the step's programs lowered on them: what compiling a bucket
ahead of serving (device/warmup.py), sizing the step's scratch memory
(jaxserve/composition/pool_sizing.py) and profiling (investigations/profile_step.py) need.

dummy_inputs(runner, bucket) is an empty batch padded to the bucket, so it has exactly the
shapes and dtypes a real step of that bucket has (standalone_dummy_inputs: the same without a
runner). lower_step lowers the forward and the sampler on them; `abstract(tree)` turns any
inputs into jax.ShapeDtypeStruct leaves (committed shardings kept) for lowering without arrays,
e.g. for a device topology this machine does not have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.api.sampling_params import MAX_LOGIT_BIAS
from jaxserve.device.model_runner import ModelRunner, packed_model_inputs
from jaxserve.device.packing import pack
from jaxserve.device.sampler import SamplerMode
from jaxserve.device.step_inputs import PreviousSamples, StepInputs, StepShape, build_step_inputs
from jaxserve.messages.buckets import Bucket, BucketSet
from jaxserve.messages.scheduled_batch import ScheduledBatch


def dummy_inputs(
  runner: ModelRunner,
  bucket: Bucket,
  mode: SamplerMode = SamplerMode(),
  prompt_logprobs: bool = False,
) -> StepInputs:
  """All-padding inputs of a bucket's shape (used to compile it): an empty batch, padded,
  with the given sampler mode and prompt-logprob flag."""
  return padding_inputs(
    bucket,
    runner.shape,
    runner.no_previous_samples(),
    runner.empty_history,
    mode,
    prompt_logprobs,
    runner.all_allowed,
    runner.no_logit_bias,
  )


def standalone_dummy_inputs(
  buckets: BucketSet,
  shape: StepShape,
  bucket: Bucket,
  mode: SamplerMode = SamplerMode(),
  prompt_logprobs: bool = False,
) -> StepInputs:
  """dummy_inputs without a runner: its cached device constants (no previous samples, the empty
  penalty history) are uncommitted arrays on JAX's default device, so they pack as the runner's
  do (device leaves, outside the packed buffers) and abstract() leaves their placement to the
  program's in_shardings. Inputs for lowering on devices that hold no memory (a TPU topology's)."""
  previous = PreviousSamples(jnp.zeros(buckets.seq_buckets[-1], jnp.int32), {})

  def empty_history(num_slots: int) -> jax.Array:
    return jnp.full((num_slots, shape.history_len), -1, jnp.int32)

  def all_allowed(num_slots: int) -> jax.Array:
    return jnp.full((num_slots, shape.bitmask_words), -1, jnp.int32)

  def no_logit_bias(num_slots: int) -> tuple[jax.Array, jax.Array]:
    ids = jnp.full((num_slots, MAX_LOGIT_BIAS), -1, jnp.int32)
    return ids, jnp.zeros((num_slots, MAX_LOGIT_BIAS), jnp.float32)

  return padding_inputs(
    bucket, shape, previous, empty_history, mode, prompt_logprobs, all_allowed, no_logit_bias
  )


def padding_inputs(
  bucket: Bucket,
  shape: StepShape,
  previous: PreviousSamples,
  empty_history: Callable[[int], jax.Array | np.ndarray],
  mode: SamplerMode = SamplerMode(),
  prompt_logprobs: bool = False,
  all_allowed: Callable[[int], jax.Array] | None = None,
  no_logit_bias: Callable[[int], tuple[jax.Array, jax.Array]] | None = None,
) -> StepInputs:
  """An empty batch padded to `bucket`, with the given sampler mode and prompt-logprob flag."""
  inputs = build_step_inputs(
    ScheduledBatch(), bucket, shape, previous, empty_history, all_allowed, no_logit_bias
  )
  sampling = dataclasses.replace(
    inputs.sampling,
    any_random=np.array(mode.random),
    any_penalty=np.array(mode.penalties),
    want_top_logprobs=np.array(mode.top_logprobs),
    want_prompt_logprobs=np.array(prompt_logprobs),
  )
  return dataclasses.replace(inputs, sampling=sampling)


def abstract(tree):
  """`tree` with every array leaf replaced by a jax.ShapeDtypeStruct (the sharding of a committed
  jax.Array kept; an uncommitted one, like a host array, takes the program's placement):
  arguments for lowering without allocating or transferring anything."""

  def leaf(x):
    sharding = x.sharding if isinstance(x, jax.Array) and x.committed else None
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)

  return jax.tree.map(leaf, tree)


def lower_step(
  runner: ModelRunner, inputs: StepInputs, mode: SamplerMode | None = None
) -> list[jax.stages.Lowered]:
  """The lowered programs of a single step on these inputs: the forward, then the sampler (in
  `mode`, default the inputs' own)."""
  programs = runner.programs
  forward = programs.forward.lower(runner.params, runner.kv_pages, packed_model_inputs(inputs))
  num_slots = inputs.metadata.seq_lens.shape[0]
  logits = jax.ShapeDtypeStruct((num_slots, runner.model.config.vocab_size), jnp.float32)
  sampler = programs.sample.lower(
    logits, pack(inputs.sampling), inputs.prev_sampled_ids, mode or SamplerMode.of(inputs.sampling)
  )
  return [forward, sampler]


def temp_bytes(runner: ModelRunner, bucket: Bucket) -> int | None:
  """Device scratch memory a step of `bucket` needs (forward plus the sampler with every part
  on), if the backend reports it."""
  lowered = lower_step(runner, dummy_inputs(runner, bucket), SamplerMode(True, True, True))
  sizes = [program.compile().memory_analysis() for program in lowered]
  if any(size is None for size in sizes):
    return None
  return sum(int(size.temp_size_in_bytes) for size in sizes)
