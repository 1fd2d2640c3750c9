"""On-device sampling for one step: penalties, min_tokens masking, greedy / temperature / top-k /
top-p / min-p sampling with per-request keys, and logprobs.

Everything has a fixed shape. Costly parts (penalties, sorting for random sampling, top-N
logprobs) are switched by a static SamplerMode, one compiled sampler per mode and sequence
bucket, so a greedy batch pays only for an argmax (penalties and top-N logprobs share one flag:
SamplerMode.all). The mode is static rather than a lax.cond on device flags because a GPU
conditional copies its predicate to the host and blocks the dispatching thread until the device
reaches it, which would serialize the host with the step.
A request's key is fold_in(key(seed), tokens generated so far): the same seed gives the same
tokens whatever the batch mates. Logprobs are those of the model's raw distribution, restricted
to the tokens a structured-output grammar allows.

A logit bias (SamplingParams.logit_bias: fixed-width [S, MAX_LOGIT_BIAS] ids and values) is
added in the penalties part, which a batch with a biased row turns on (SamplingInputs.any_penalty),
so it needs no program of its own; logprobs stay those of the raw distribution, as penalties leave
them (vLLM's default, raw_logprobs).

Structured outputs: every batch carries a token bitmask [S, ceil(V / 32)] (all ones for
unconstrained rows and padding) that sets disallowed logits to -inf before anything else, in
every mode, so no mix of constrained and unconstrained requests compiles anything new and an
unconstrained row's logits are bit-for-bit unchanged. No SamplerMode switches it off: the
select is one elementwise pass that XLA fuses into the reductions that read the logits, or, in
front of the Pallas greedy kernel, one extra write and read of the logits, against doubling the
sampler programs compiled at warmup (docs/DECISIONS.md, "The token bitmask is always applied").
A constrained row's logprobs are then those of the allowed tokens, renormalized (what the model
can emit under the grammar), and the kernel's single read still gives the pick and the
normalizer together; top-N logprobs are floored at LOGPROB_FLOOR (vLLM's -9999) instead of -inf.

The greedy pick and the log-normalizer come from a GreedyFn: XLA's argmax and logsumexp
(xla_greedy), or on GPUs the Pallas kernel of pallas_kernels/greedy_sample, which reads the
logits once (a 512-row batch over a 128k vocabulary is 263 MB of float32 logits every decode
step; XLA reads them three times). The engine picks it (EngineConfig.sampler_backend).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.api.sampling_params import MAX_LOGPROBS
from jaxserve.device.sampling_inputs import SamplingInputs
from jaxserve.device.token_bitmask import apply_token_bitmask

NEG_INF = -jnp.inf
LOGPROB_FLOOR = -9999.0  # a disallowed token's top-N logprob (JSON has no -inf)


@dataclass(frozen=True)
class SampleOutput:
  token_ids: jax.Array  # i32[S]
  logprobs: jax.Array  # f32[S]: logprob of the sampled token
  top_ids: jax.Array  # i32[S, MAX_LOGPROBS]
  top_logprobs: jax.Array  # f32[S, MAX_LOGPROBS]


jax.tree_util.register_dataclass(
  SampleOutput, data_fields=["token_ids", "logprobs", "top_ids", "top_logprobs"], meta_fields=[]
)


@dataclass(frozen=True)
class SamplerMode:
  """Which costly parts a batch needs (static: each mode compiles once per sequence bucket)."""

  random: bool = False  # some row samples (temperature > 0): sort for top-k/top-p/min-p
  penalties: bool = False  # some row uses repetition/presence/frequency penalties
  top_logprobs: bool = False  # some row asked for top-N logprobs

  @classmethod
  def of(cls, s: SamplingInputs) -> SamplerMode:
    """The compiled mode covering host-side sampling inputs (their batch-wide flags): penalties
    and top-N logprobs are compiled together (all())."""
    extras = bool(np.asarray(s.any_penalty)) or bool(np.asarray(s.want_top_logprobs))
    return cls(bool(np.asarray(s.any_random)), extras, extras)

  @classmethod
  def all(cls) -> list[SamplerMode]:
    """The compiled modes: random sampling (its sort over the vocabulary) is static on its own,
    penalties and top-N logprobs only together (a batch asking for one pays for the other): 4
    programs per sequence bucket instead of 8 (docs/DECISIONS.md, "Four sampler modes"). A
    mode with more parts gives the same tokens (neutral penalties change no logit)."""
    return [cls(random, extras, extras) for random in (False, True) for extras in (False, True)]


def _token_counts(history: jax.Array, vocab_size: int) -> jax.Array:
  """history i32[S, H] (-1 padded) -> f32[S, V] occurrence counts."""
  rows = jnp.broadcast_to(jnp.arange(history.shape[0])[:, None], history.shape)
  ids = jnp.where(history < 0, vocab_size, history)  # out of range -> dropped
  return jnp.zeros((history.shape[0], vocab_size), jnp.float32).at[rows, ids].add(1.0, mode="drop")


def apply_logit_bias(logits: jax.Array, bias_ids: jax.Array, bias_values: jax.Array) -> jax.Array:
  """logits f32[S, V] plus each row's bias_values f32[S, B] at bias_ids i32[S, B] (-1 padded:
  dropped), one scatter-add of S * B values."""
  vocab_size = logits.shape[-1]
  rows = jnp.broadcast_to(jnp.arange(bias_ids.shape[0])[:, None], bias_ids.shape)
  ids = jnp.where(bias_ids < 0, vocab_size, bias_ids)  # out of range -> dropped
  return logits.at[rows, ids].add(bias_values, mode="drop")


def apply_penalties(logits: jax.Array, s: SamplingInputs) -> jax.Array:
  """Repetition penalty over prompt + output (as HF); presence/frequency over output (as OpenAI);
  then the logit bias (as OpenAI's, added to the penalized logits)."""
  logits = _apply_history_penalties(logits, s)
  return apply_logit_bias(logits, s.bias_ids, s.bias_values)


def _apply_history_penalties(logits: jax.Array, s: SamplingInputs) -> jax.Array:
  vocab_size = logits.shape[-1]
  output_counts = _token_counts(s.output_history, vocab_size)  # [S, V]
  seen = (output_counts + _token_counts(s.prompt_history, vocab_size)) > 0
  rep = s.repetition_penalty[:, None]
  logits = jnp.where(seen, jnp.where(logits > 0, logits / rep, logits * rep), logits)
  logits = logits - s.frequency_penalty[:, None] * output_counts
  return logits - s.presence_penalty[:, None] * (output_counts > 0)


def _filter_top_k_top_p_min_p(scaled: jax.Array, s: SamplingInputs) -> jax.Array:
  """Masks to -inf what top-k, then top-p over the top-k renormalized mass, then min-p drop
  (the order of Hugging Face's warpers and vLLM). Top-k keeps every logit tied with the k-th
  largest, and top-p's mass is renormalized over all of them (as both do)."""
  vocab_size = scaled.shape[-1]
  sorted_desc = -jnp.sort(-scaled, axis=-1)  # [S, V]
  k = jnp.where(s.top_k > 0, jnp.minimum(s.top_k, vocab_size), vocab_size)
  kth = jnp.take_along_axis(sorted_desc, (k - 1)[:, None], axis=-1)  # [S, 1]
  sorted_desc = jnp.where(sorted_desc >= kth, sorted_desc, NEG_INF)
  probs = jax.nn.softmax(sorted_desc, axis=-1)
  # keep a sorted token while the mass before it is < top_p (the first token always stays);
  # top_p 1 keeps every token, also those past where the rounded sum reaches 1
  keep = ((jnp.cumsum(probs, axis=-1) - probs) < s.top_p[:, None]) | (s.top_p[:, None] >= 1.0)
  num_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)
  top_p_min = jnp.take_along_axis(sorted_desc, (num_keep - 1)[:, None], axis=-1)
  # min-p: p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p)
  min_p_logit = jnp.where(
    s.min_p[:, None] > 0,
    sorted_desc[:, :1] + jnp.log(jnp.maximum(s.min_p[:, None], 1e-38)),
    NEG_INF,
  )
  threshold = jnp.maximum(jnp.maximum(kth, top_p_min), min_p_logit)
  return jnp.where(scaled >= threshold, scaled, NEG_INF)


def _random_sample(logits: jax.Array, s: SamplingInputs) -> jax.Array:
  temperature = jnp.where(s.temperature > 0, s.temperature, 1.0)[:, None]
  filtered = _filter_top_k_top_p_min_p(logits / temperature, s)
  keys = jax.vmap(lambda seed, i: jax.random.fold_in(jax.random.key(seed), i))(
    s.seeds, s.sample_index
  )
  gumbel = jax.vmap(lambda key: jax.random.gumbel(key, (logits.shape[-1],), jnp.float32))(keys)
  return jnp.argmax(filtered + gumbel, axis=-1).astype(jnp.int32)


def mask_banned(logits: jax.Array, banned_ids: jax.Array) -> jax.Array:
  """logits f32[S, V] with each row's banned_ids i32[S, B] (-1 padded) at -inf. Written as B
  compares against the vocabulary index, which XLA fuses into the consumer (the greedy argmax
  reads the logits once); a scatter into `logits` would first copy the whole [S, V] array,
  whose unmasked values the logprobs still need."""
  vocab_ids = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)  # [S, V]
  banned = functools.reduce(
    jnp.logical_or, [vocab_ids == banned_ids[:, j : j + 1] for j in range(banned_ids.shape[1])]
  )
  return jnp.where(banned, NEG_INF, logits)


GreedyFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def xla_greedy(logits: jax.Array, banned_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
  """logits f32[S, V], banned_ids i32[S, B] -> (argmax with the banned ids masked i32[S],
  logsumexp of the unmasked logits f32[S]): XLA's reductions (a GreedyFn)."""
  token_ids = jnp.argmax(mask_banned(logits, banned_ids), axis=-1).astype(jnp.int32)
  return token_ids, jax.nn.logsumexp(logits, axis=-1)


def sample(
  logits: jax.Array, s: SamplingInputs, mode: SamplerMode, greedy: GreedyFn = xla_greedy
) -> SampleOutput:
  """logits f32[S, V] (one row per sequence slot) -> sampled ids and logprobs. `mode` must
  cover the batch (SamplerMode.of(s)); a part it leaves out is not computed. `greedy` gives the
  greedy pick and the log-normalizer of batches without penalties (the Pallas GPU kernel
  pallas_kernels/greedy_sample reads the logits once)."""
  logits = apply_token_bitmask(logits, s.bitmask)  # f32[S, V]
  raw_logits = logits
  if mode.penalties:
    logits = apply_penalties(logits, s)
    token_ids = jnp.argmax(mask_banned(logits, s.banned_ids), axis=-1).astype(jnp.int32)
    _, log_normalizer = greedy(raw_logits, s.banned_ids)  # [S], as a batch without penalties
  else:
    token_ids, log_normalizer = greedy(raw_logits, s.banned_ids)  # [S], [S]
  if mode.random:
    masked = mask_banned(logits, s.banned_ids)
    token_ids = jnp.where(s.temperature > 0, _random_sample(masked, s), token_ids)
  # logprob of the sampled token under the raw distribution, without a [S, V] log_softmax
  token_logprobs = (
    jnp.take_along_axis(raw_logits, token_ids[:, None], axis=-1)[:, 0] - log_normalizer
  )
  num_rows = logits.shape[0]
  top_logprobs = jnp.zeros((num_rows, MAX_LOGPROBS), jnp.float32)
  top_ids = jnp.zeros((num_rows, MAX_LOGPROBS), jnp.int32)
  if mode.top_logprobs:
    top_logprobs, top_ids = jax.lax.top_k(raw_logits - log_normalizer[:, None], MAX_LOGPROBS)
    top_logprobs = jnp.maximum(top_logprobs, LOGPROB_FLOOR)
  return SampleOutput(token_ids, token_logprobs, top_ids.astype(jnp.int32), top_logprobs)


def prompt_logprobs(
  logits: jax.Array, target_ids: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """logits f32[T, V], target_ids i32[T] -> (target logprob [T], top ids [T, N], top lp [T, N])."""
  logprobs = jax.nn.log_softmax(logits, axis=-1)
  target = jnp.take_along_axis(logprobs, jnp.maximum(target_ids, 0)[:, None], axis=-1)[:, 0]
  top_lp, top_ids = jax.lax.top_k(logprobs, MAX_LOGPROBS)
  return target, top_ids.astype(jnp.int32), top_lp
