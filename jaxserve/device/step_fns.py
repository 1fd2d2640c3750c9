"""The device functions of one engine step, jitted by the model runner.

A step is up to three dispatches, none of which branches on device values (a GPU conditional
would block the dispatching host thread until the device reached it):

  forward(params, kv_pages, model_inputs) -> (kv_pages, logits, hidden)
      The model over the bucket's tokens: writes this step's K/V into the donated pages in
      place, attends through the configured backend, and computes the float32 logits of each
      sequence's last token. One compilation per (sequences, tokens) bucket.
  sample(logits, sampling_inputs, prev_sampled_ids, mode) -> (SampleOutput, padded ids)
      Penalties, masking and sampling (device/sampler.py); `mode` is static. The sampled ids
      are also returned zero padded to [max_seq_slots], the fixed shape in which the next step
      takes them as decode tokens (async scheduling). One compilation per (sequences, mode).
  prompt_logprobs(params, hidden, target_ids) -> (logprob, top ids, top logprobs)
      Every position's next-prompt-token logprob, only dispatched when a request asks. One
      compilation per tokens bucket.

  burst(params, kv_pages, model_inputs, sampling_inputs, mode) -> (kv_pages, ids, logprobs,
      padded ids)
      A decode burst (scheduler.num_scheduler_steps > 1): num_steps decode steps in one
      dispatch, each one token per sequence, feeding the token the step before sampled, its
      positions, KV slots and sequence lengths advanced on device. Returns the sampled ids and
      their logprobs [num_steps, S]. One compilation per (bucket, mode) for the decode buckets.

The model inputs are StepInputs without their sampling part, packed into two buffers
(device/packing.py); the sampling inputs are packed on their own, so the sampler's compiled
shape depends on the sequence count alone.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxserve.device.kv_cache import KVPages
from jaxserve.device.packing import PackedStepInputs, unpack
from jaxserve.device.sampler import (
  GreedyFn,
  SampleOutput,
  SamplerMode,
  prompt_logprobs,
  sample,
  xla_greedy,
)

PROMPT_CHUNKS = (256, 128, 64, 32, 16, 8, 4, 2, 1)


def fed_token_ids(inputs) -> jax.Array:
  """The step's token ids [T], those in flight taken from the previous step's samples."""
  fed = inputs.prev_sampled_ids[jnp.maximum(inputs.prev_token_rows, 0)]  # [T]
  return jnp.where(inputs.prev_token_rows >= 0, fed, inputs.token_ids)


def make_forward_fn(model):
  """forward(params, kv_pages, packed model inputs) for a LlamaForCausalLM-like flax module."""
  compute_logits = type(model).compute_logits

  def forward(params, kv_pages: KVPages, packed: PackedStepInputs):
    inputs = unpack(packed)
    variables = {"params": params}
    token_ids = fed_token_ids(inputs)  # [T]
    hidden, kv_pages = model.apply(
      variables, token_ids, inputs.positions, kv_pages, inputs.slot_mapping, inputs.metadata
    )  # [T, H]
    logits = model.apply(
      variables, hidden[inputs.logits_indices], method=compute_logits
    )  # f32[S, V]
    return kv_pages, logits, hidden

  return forward


def sample_step(
  logits: jax.Array,
  packed_sampling: PackedStepInputs,
  prev_sampled_ids: jax.Array,
  mode: SamplerMode,
  greedy: GreedyFn = xla_greedy,
) -> tuple[SampleOutput, jax.Array]:
  """logits f32[S, V] -> (SampleOutput, sampled ids zero padded like prev_sampled_ids)."""
  sampled = sample(logits, unpack(packed_sampling), mode, greedy)
  padded = (
    jnp.zeros_like(prev_sampled_ids).at[: sampled.token_ids.shape[0]].set(sampled.token_ids)
  )  # [max_seq_slots]
  return sampled, padded


def make_prompt_logprobs_fn(model):
  """prompt_logprobs(params, hidden [T, H], target_ids i32[T]) in chunks of tokens, so the
  [chunk, vocab] logits stay small whatever the bucket."""
  compute_logits = type(model).compute_logits

  def prompt_fn(params, hidden: jax.Array, target_ids: jax.Array):
    num_tokens = hidden.shape[0]
    chunk = next(c for c in PROMPT_CHUNKS if num_tokens % c == 0)

    def one_chunk(args):
      h_chunk, targets = args
      logits = model.apply({"params": params}, h_chunk, method=compute_logits)
      return prompt_logprobs(logits, targets)

    out = jax.lax.map(
      one_chunk,
      (
        hidden.reshape(num_tokens // chunk, chunk, -1),
        target_ids.reshape(num_tokens // chunk, chunk),
      ),
    )
    return tuple(x.reshape(num_tokens, *x.shape[2:]) for x in out)

  return prompt_fn


def make_burst_fn(model, num_steps: int, page_size: int, greedy: GreedyFn = xla_greedy):
  """burst(params, kv_pages, packed model inputs, packed sampling inputs, mode) for a batch in
  which sequence i feeds token i only (a decode-only batch; logits_indices[i] == i)."""
  compute_logits = type(model).compute_logits

  def burst(
    params,
    kv_pages: KVPages,
    packed: PackedStepInputs,
    packed_sampling: PackedStepInputs,
    mode: SamplerMode,
  ):
    inputs, sampling = unpack(packed), unpack(packed_sampling)
    variables = {"params": params}
    metadata = inputs.metadata
    num_tokens, num_slots = inputs.token_ids.shape[0], metadata.seq_lens.shape[0]
    live_tokens = jnp.arange(num_tokens) < metadata.num_seqs[0]  # [T]
    live_seqs = jnp.arange(num_slots) < metadata.num_seqs[0]  # [S]
    token_rows = jnp.minimum(jnp.arange(num_tokens), num_slots - 1)  # [T]
    token_ids = fed_token_ids(inputs)  # [T]
    first_index = sampling.sample_index - (num_steps - 1)  # the scheduler counted all samples
    capacity = metadata.block_tables.shape[2] * page_size  # positions a block table can hold

    def one_step(k, carry):
      kv_pages, token_ids, all_ids, all_logprobs = carry
      # A request that reaches max_tokens within the burst may run past its pages (block table
      # entries of the null page) or past the table: those steps write to the null page or
      # nowhere, and their samples are dropped by the engine. Every KV group's pages cover the
      # burst's positions (the scheduler allocates them up front).
      unclamped = inputs.positions + k  # [T]
      positions = jnp.where(
        live_tokens, jnp.minimum(unclamped, capacity - 1), inputs.positions
      )  # [T]
      pages = metadata.block_tables[:, token_rows, positions // page_size]  # [G, T]
      slots = jnp.where(
        live_tokens & (unclamped < capacity), pages * page_size + positions % page_size, 0
      )  # [G, T]
      seq_lens = jnp.minimum(metadata.seq_lens + k, capacity)  # [S]
      step_metadata = dataclasses.replace(
        metadata, seq_lens=jnp.where(live_seqs, seq_lens, metadata.seq_lens)
      )
      hidden, kv_pages = model.apply(
        variables, token_ids, positions, kv_pages, slots, step_metadata
      )  # [T, H]
      logits = model.apply(
        variables, hidden[inputs.logits_indices], method=compute_logits
      )  # f32[S, V]
      sampled = sample(
        logits, dataclasses.replace(sampling, sample_index=first_index + k), mode, greedy
      )
      width = min(num_tokens, num_slots)
      token_ids = jnp.zeros_like(token_ids).at[:width].set(sampled.token_ids[:width])
      return (
        kv_pages,
        token_ids,
        all_ids.at[k].set(sampled.token_ids),
        all_logprobs.at[k].set(sampled.logprobs),
      )

    carry = (
      kv_pages,
      token_ids,
      jnp.zeros((num_steps, num_slots), jnp.int32),
      jnp.zeros((num_steps, num_slots), jnp.float32),
    )
    kv_pages, _, all_ids, all_logprobs = jax.lax.fori_loop(0, num_steps, one_step, carry)
    padded = jnp.zeros_like(inputs.prev_sampled_ids).at[:num_slots].set(all_ids[-1])
    return kv_pages, all_ids, all_logprobs, padded

  return burst
