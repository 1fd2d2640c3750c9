"""The on-device sampler against Hugging Face's logits processors and the OpenAI penalty formula."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.generation import logits_process as hf

from jaxserve.api.sampling_params import MAX_LOGIT_BIAS
from jaxserve.device.sampler import (
  SamplerMode,
  _filter_top_k_top_p_min_p,
  apply_penalties,
  mask_banned,
  sample,
)
from jaxserve.device.sampling_inputs import NUM_BANNED_IDS, SamplingInputs
from jaxserve.device.token_bitmask import bitmask_words
from pallas_kernels.greedy_sample.gpu import greedy_sample

VOCAB = 64


def make_inputs(num_rows: int, history_len: int = 8, **overrides) -> SamplingInputs:
  fields = dict(
    temperature=np.zeros(num_rows, np.float32),
    top_k=np.zeros(num_rows, np.int32),
    top_p=np.ones(num_rows, np.float32),
    min_p=np.zeros(num_rows, np.float32),
    seeds=np.arange(num_rows, dtype=np.uint32),
    sample_index=np.zeros(num_rows, np.int32),
    repetition_penalty=np.ones(num_rows, np.float32),
    presence_penalty=np.zeros(num_rows, np.float32),
    frequency_penalty=np.zeros(num_rows, np.float32),
    prompt_history=np.full((num_rows, history_len), -1, np.int32),
    output_history=np.full((num_rows, history_len), -1, np.int32),
    banned_ids=np.full((num_rows, NUM_BANNED_IDS), -1, np.int32),
    bias_ids=np.full((num_rows, MAX_LOGIT_BIAS), -1, np.int32),
    bias_values=np.zeros((num_rows, MAX_LOGIT_BIAS), np.float32),
    bitmask=np.full((num_rows, bitmask_words(VOCAB)), -1, np.int32),
    any_random=np.array(False),
    any_penalty=np.array(False),
    want_top_logprobs=np.array(False),
    want_prompt_logprobs=np.array(False),
  )
  fields.update(overrides)
  return SamplingInputs(**fields)


def run_sample(logits, inputs: SamplingInputs):
  """The sampler compiled for the inputs' own mode, as the model runner runs it."""
  return jax.jit(sample, static_argnames="mode")(
    jnp.asarray(logits), inputs, mode=SamplerMode.of(inputs)
  )


def random_logits(num_rows: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).normal(0, 3, size=(num_rows, VOCAB)).astype(np.float32)


def test_greedy_picks_argmax_and_reports_its_logprob():
  logits = random_logits(4)
  out = run_sample(logits, make_inputs(4))
  np.testing.assert_array_equal(out.token_ids, logits.argmax(-1))
  expected = torch.log_softmax(torch.tensor(logits), -1).numpy()[np.arange(4), logits.argmax(-1)]
  np.testing.assert_allclose(out.logprobs, expected, atol=1e-5)


def test_top_logprobs_are_the_largest_raw_logprobs():
  logits = random_logits(3, seed=1)
  out = run_sample(logits, make_inputs(3, want_top_logprobs=np.array(True)))
  reference = torch.log_softmax(torch.tensor(logits), -1).topk(20)
  np.testing.assert_array_equal(out.top_ids, reference.indices.numpy())
  np.testing.assert_allclose(out.top_logprobs, reference.values.numpy(), atol=1e-5)


def test_penalties_match_hf_repetition_and_openai_presence_frequency():
  rng = np.random.default_rng(2)
  logits = random_logits(3, seed=2)
  prompt = np.full((3, 8), -1, np.int32)
  output = np.full((3, 8), -1, np.int32)
  prompt[:, :5] = rng.integers(0, VOCAB, size=(3, 5))
  output[:, :6] = rng.integers(0, VOCAB, size=(3, 6))
  rep = np.array([1.0, 1.3, 0.8], np.float32)
  presence = np.array([0.5, 0.0, -0.4], np.float32)
  frequency = np.array([0.0, 0.7, 0.3], np.float32)
  inputs = make_inputs(
    3,
    prompt_history=prompt,
    output_history=output,
    repetition_penalty=rep,
    presence_penalty=presence,
    frequency_penalty=frequency,
  )
  ours = np.asarray(jax.jit(apply_penalties)(jnp.asarray(logits), inputs))
  for row in range(3):
    seen = np.concatenate([prompt[row, :5], output[row, :6]])
    expected = hf.RepetitionPenaltyLogitsProcessor(float(rep[row]))(
      torch.tensor(seen[None]).long(), torch.tensor(logits[row : row + 1])
    ).numpy()[0]
    counts = np.bincount(output[row, :6], minlength=VOCAB)  # OpenAI: mu - c*f - (c>0)*p
    expected = expected - counts * frequency[row] - (counts > 0) * presence[row]
    np.testing.assert_allclose(ours[row], expected, rtol=1e-6, atol=1e-6)


def test_logit_bias_adds_to_its_ids_only_and_steers_greedy_and_random_rows():
  logits = random_logits(3, seed=4)
  bias_ids = np.full((3, MAX_LOGIT_BIAS), -1, np.int32)
  bias_values = np.zeros((3, MAX_LOGIT_BIAS), np.float32)
  bias_ids[0, :2], bias_values[0, :2] = [7, 9], [100.0, -2.5]
  bias_ids[1, :1], bias_values[1, :1] = [VOCAB - 1], [100.0]
  inputs = make_inputs(
    3,
    bias_ids=bias_ids,
    bias_values=bias_values,
    any_penalty=np.array(True),
    temperature=np.array([0.0, 1.0, 0.0], np.float32),
    any_random=np.array(True),
  )
  ours = np.asarray(jax.jit(apply_penalties)(jnp.asarray(logits), inputs))
  expected = logits.copy()
  expected[0, 7] += 100.0
  expected[0, 9] -= 2.5
  expected[1, VOCAB - 1] += 100.0
  np.testing.assert_allclose(ours, expected, rtol=1e-6)
  out = run_sample(logits, inputs)
  assert out.token_ids.tolist() == [7, VOCAB - 1, int(logits[2].argmax())]
  raw = torch.log_softmax(torch.tensor(logits), -1).numpy()  # logprobs stay raw
  np.testing.assert_allclose(out.logprobs[0], raw[0, 7], atol=1e-5)


@pytest.mark.parametrize(
  "top_k, top_p, min_p",
  [(5, 1.0, 0.0), (0, 0.7, 0.0), (0, 1.0, 0.2), (10, 0.5, 0.0), (8, 0.9, 0.1), (1, 1.0, 0.0)],
)
def test_filters_keep_the_same_tokens_as_hf_warpers(top_k, top_p, min_p):
  logits = random_logits(4, seed=3) / 2
  inputs = make_inputs(
    4,
    top_k=np.full(4, top_k, np.int32),
    top_p=np.full(4, top_p, np.float32),
    min_p=np.full(4, min_p, np.float32),
  )
  ours = np.isfinite(np.asarray(_filter_top_k_top_p_min_p(jnp.asarray(logits), inputs)))
  scores = torch.tensor(logits)
  if top_k > 0:
    scores = hf.TopKLogitsWarper(top_k)(None, scores)
  if top_p < 1.0:
    scores = hf.TopPLogitsWarper(top_p)(None, scores)
  if min_p > 0:
    scores = hf.MinPLogitsWarper(min_p)(None, scores)
  np.testing.assert_array_equal(ours, torch.isfinite(scores).numpy())


def test_top_p_renormalizes_over_every_logit_tied_with_the_kth_as_hf_does():
  # top_k 3 keeps 3, 2.5 and the three 1s (tied with the 3rd). Over those five, p(3) = 0.497,
  # so top_p 0.52 keeps 2.5 too (Hugging Face's warpers keep {3, 2.5}); renormalized over
  # exactly three logits p(3) would be 0.574 and 2.5 would go.
  logits = np.full((1, VOCAB), -5.0, np.float32)
  logits[0, :5] = [3.0, 2.5, 1.0, 1.0, 1.0]
  inputs = make_inputs(
    1,
    top_k=np.array([3], np.int32),
    top_p=np.array([0.52], np.float32),
    min_p=np.zeros(1, np.float32),
  )
  ours = np.isfinite(np.asarray(_filter_top_k_top_p_min_p(jnp.asarray(logits), inputs)))
  scores = hf.TopPLogitsWarper(0.52)(None, hf.TopKLogitsWarper(3)(None, torch.tensor(logits)))
  np.testing.assert_array_equal(ours, torch.isfinite(scores).numpy())
  assert np.nonzero(ours[0])[0].tolist() == [0, 1]


def test_top_p_1_keeps_the_tokens_past_where_the_rounded_mass_reaches_1():
  # p(token 0) rounds to 1.0 in float32, so the mass before every later token is already 1.0
  logits = np.full((1, VOCAB), -30.0, np.float32)
  logits[0, 0] = 0.0
  inputs = make_inputs(1, top_p=np.ones(1, np.float32))
  ours = np.isfinite(np.asarray(_filter_top_k_top_p_min_p(jnp.asarray(logits), inputs)))
  scores = hf.TopPLogitsWarper(1.0)(None, torch.tensor(logits))
  np.testing.assert_array_equal(ours, torch.isfinite(scores).numpy())
  assert ours.all()


def test_random_sampling_follows_the_tempered_distribution():
  logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05] + [1e-9] * (VOCAB - 4)], np.float32))
  num_draws = 4000
  rows = np.repeat(logits, num_draws, axis=0)
  inputs = make_inputs(
    num_draws,
    temperature=np.full(num_draws, 1.0, np.float32),
    seeds=np.arange(num_draws, dtype=np.uint32),
    any_random=np.array(True),
  )
  ids = np.asarray(run_sample(rows, inputs).token_ids)
  freq = np.bincount(ids, minlength=VOCAB)[:4] / num_draws
  np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)


def test_same_seed_and_step_give_the_same_token_in_any_row():
  logits = np.tile(random_logits(1, seed=4) / 4, (6, 1))
  seeds = np.array([7, 1, 2, 7, 3, 7], np.uint32)
  steps = np.array([0, 0, 0, 0, 0, 1], np.int32)
  inputs = make_inputs(
    6,
    temperature=np.ones(6, np.float32),
    seeds=seeds,
    sample_index=steps,
    any_random=np.array(True),
  )
  ids = np.asarray(run_sample(logits, inputs).token_ids)
  assert ids[0] == ids[3]
  shuffled = make_inputs(
    6,
    temperature=np.ones(6, np.float32),
    seeds=seeds[::-1].copy(),
    sample_index=steps[::-1].copy(),
    any_random=np.array(True),
  )
  ids_shuffled = np.asarray(run_sample(logits, shuffled).token_ids)
  np.testing.assert_array_equal(ids_shuffled[::-1], ids)


def test_banned_ids_are_never_sampled_and_greedy_rows_ignore_temperature_of_others():
  logits = random_logits(2, seed=5)
  best = logits.argmax(-1)
  banned = np.full((2, NUM_BANNED_IDS), -1, np.int32)
  banned[0, 0] = best[0]
  inputs = make_inputs(2, banned_ids=banned, temperature=np.array([0.0, 0.0], np.float32))
  ids = np.asarray(run_sample(logits, inputs).token_ids)
  assert ids[0] != best[0] and ids[0] == np.argsort(logits[0])[-2]
  assert ids[1] == best[1]


def test_a_mode_with_more_parts_gives_the_same_tokens():
  """Turning on penalties (all neutral), random sampling (all rows greedy) and top logprobs
  changes nothing about the tokens: the cheap modes are exact special cases."""
  logits = random_logits(5, seed=6)
  inputs = make_inputs(5)
  cheap = jax.jit(sample, static_argnames="mode")(jnp.asarray(logits), inputs, mode=SamplerMode())
  full = jax.jit(sample, static_argnames="mode")(
    jnp.asarray(logits), inputs, mode=SamplerMode(True, True, True)
  )
  np.testing.assert_array_equal(cheap.token_ids, full.token_ids)
  np.testing.assert_allclose(cheap.logprobs, full.logprobs, atol=1e-6)
  # the compiled modes: random alone, penalties and top-N logprobs together
  assert SamplerMode.all() == [
    SamplerMode(),
    SamplerMode(False, True, True),
    SamplerMode(True),
    SamplerMode(True, True, True),
  ]
  only_top = dataclasses.replace(inputs, want_top_logprobs=np.array(True))
  assert SamplerMode.of(only_top) == SamplerMode(False, True, True)


def test_mask_banned_hand_computed():
  logits = jnp.asarray([[0.5, 1.0, 2.0, 3.0], [4.0, 3.0, 2.0, 1.0]], jnp.float32)
  banned = np.full((2, NUM_BANNED_IDS), -1, np.int32)
  banned[0, :2] = [3, 1]
  banned[1, 0] = 0
  masked = np.asarray(mask_banned(logits, jnp.asarray(banned)))
  inf = -np.inf
  np.testing.assert_array_equal(masked, [[0.5, inf, 2.0, inf], [inf, 3.0, 2.0, 1.0]])


def test_banned_ids_are_never_sampled_in_random_rows():
  logits = random_logits(4, seed=3)
  banned = np.full((4, NUM_BANNED_IDS), -1, np.int32)
  banned[:, :3] = np.argsort(-logits, axis=-1)[:, :3]  # the three likeliest tokens of each row
  inputs = make_inputs(
    4,
    banned_ids=banned,
    temperature=np.full(4, 0.7, np.float32),
    sample_index=np.arange(4, dtype=np.int32),
    any_random=np.array(True),
  )
  for step in range(8):
    inputs = dataclasses.replace(inputs, seeds=np.arange(4, dtype=np.uint32) + 10 * step)
    token_ids = np.asarray(run_sample(logits, inputs).token_ids)
    assert not any(t in row for t, row in zip(token_ids, banned[:, :3], strict=True))


@pytest.mark.parametrize(
  "overrides",
  [
    {},
    {"want_top_logprobs": np.array(True)},
    {"temperature": np.array([0.0, 0.7, 0.0, 1.3], np.float32), "any_random": np.array(True)},
  ],
)
def test_the_pallas_greedy_kernel_gives_the_xla_samples(overrides):
  """The sampler with the GPU greedy kernel (Pallas interpret mode) against XLA's reductions,
  banned ids included."""
  logits = np.round(random_logits(4, seed=5))  # ties between the largest
  banned = np.full((4, NUM_BANNED_IDS), -1, np.int32)
  banned[0, :2] = np.argsort(-logits[0])[:2]
  inputs = make_inputs(4, banned_ids=banned, **overrides)
  kernel = functools.partial(greedy_sample, block_vocab=16, num_splits=2, interpret=True)
  fn = jax.jit(sample, static_argnames=("mode", "greedy"))
  with_kernel = fn(jnp.asarray(logits), inputs, mode=SamplerMode.of(inputs), greedy=kernel)
  with_xla = fn(jnp.asarray(logits), inputs, mode=SamplerMode.of(inputs))
  np.testing.assert_array_equal(with_kernel.token_ids, with_xla.token_ids)
  assert with_kernel.token_ids[0] not in banned[0]
  np.testing.assert_allclose(with_kernel.logprobs, with_xla.logprobs, rtol=1e-6)
  np.testing.assert_allclose(with_kernel.top_logprobs, with_xla.top_logprobs, rtol=1e-6)
