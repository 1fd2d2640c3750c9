"""The device functions of one engine step, jitted by the model runner.

A step is up to three dispatches, none of which branches on device values (a GPU conditional
would block the dispatching host thread until the device reached it):

  forward(params, kv_pages, model_inputs) -> (kv_pages, logits, hidden)
      The model over the bucket's tokens: writes this step's K/V into the donated pages in
      place, attends through the configured backend, and computes the float32 logits of each
      sequence's last token. One compilation per (sequences, tokens) bucket.
  sample(logits, sampling_inputs, prev_sampled_ids, mode) -> (SampleOutput, padded ids)
      Penalties, masking and sampling (runtime/sampler.py); `mode` is static. The sampled ids
      are also returned zero padded to [max_seq_slots], the fixed shape in which the next step
      takes them as decode tokens (async scheduling). One compilation per (sequences, mode).
  prompt_logprobs(params, hidden, target_ids) -> (logprob, top ids, top logprobs)
      Every position's next-prompt-token logprob, only dispatched when a request asks. One
      compilation per tokens bucket.

The model inputs are StepInputs without their sampling part, packed into two buffers
(runtime/packing.py); the sampling inputs are packed on their own, so the sampler's compiled
shape depends on the sequence count alone.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxserve.runtime.kv_cache import KVPages
from jaxserve.runtime.packing import PackedStepInputs, unpack
from jaxserve.runtime.sampler import SampleOutput, SamplerMode, prompt_logprobs, sample

PROMPT_CHUNKS = (256, 128, 64, 32, 16, 8, 4, 2, 1)


def make_forward_fn(model):
  """forward(params, kv_pages, packed model inputs) for a LlamaForCausalLM-like flax module."""
  compute_logits = type(model).compute_logits

  def forward(params, kv_pages: KVPages, packed: PackedStepInputs):
    inputs = unpack(packed)
    variables = {"params": params}
    fed = inputs.prev_sampled_ids[jnp.maximum(inputs.prev_token_rows, 0)]     # [T]
    token_ids = jnp.where(inputs.prev_token_rows >= 0, fed, inputs.token_ids)  # [T]
    hidden, kv_pages = model.apply(variables, token_ids, inputs.positions, kv_pages,
                                   inputs.slot_mapping, inputs.metadata)       # [T, H]
    logits = model.apply(variables, hidden[inputs.logits_indices],
                         method=compute_logits)                                 # f32[S, V]
    return kv_pages, logits, hidden

  return forward


def sample_step(logits: jax.Array, packed_sampling: PackedStepInputs, prev_sampled_ids: jax.Array,
                mode: SamplerMode) -> tuple[SampleOutput, jax.Array]:
  """logits f32[S, V] -> (SampleOutput, sampled ids zero padded like prev_sampled_ids)."""
  sampled = sample(logits, unpack(packed_sampling), mode)
  padded = jnp.zeros_like(prev_sampled_ids).at[:sampled.token_ids.shape[0]].set(
      sampled.token_ids)                                                     # [max_seq_slots]
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

    out = jax.lax.map(one_chunk, (hidden.reshape(num_tokens // chunk, chunk, -1),
                                  target_ids.reshape(num_tokens // chunk, chunk)))
    return tuple(x.reshape(num_tokens, *x.shape[2:]) for x in out)

  return prompt_fn
