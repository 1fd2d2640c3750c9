"""Gemma through the attention paths: each layer hands the backend its own window (None for
global layers) and soft cap, and the XLA path and the GPU kernel (in Pallas interpret mode off a
GPU) give transformers' log-probs, over a prefill chunk, a decode and a chunk that reads a cached
prefix, on 16-token pages (the kernels' smallest) with windows that end inside them. (The
reference runs this in test_hf_logits_parity.py; the TPU kernel takes the same arguments from
the same layer code, and tests/attention/test_sliding_window_paths.py checks it with windows and
soft caps against the reference: its interpreter is too slow for a whole model here.)"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from jaxserve.attention.backends import XLA, pallas_gpu
from jaxserve.models import causal_lm
from jaxserve.models.weights import load_hf_config, load_hf_params
from tests.models.hf_checkpoints import VOCAB_SIZE, load_hf_model
from tests.models.paged_batch import Chunk, build_step, model_kv

PAGE, PAGES_PER_SEQ, NUM_PAGES = 16, 3, 8
LEN_A, LEN_B, SPLIT = 35, 29, 20
BACKENDS = {
  "xla": lambda: XLA,
  "pallas_gpu": lambda: pallas_gpu(interpret=jax.default_backend() != "gpu"),
}


@pytest.fixture(scope="module")
def gemma2(hf_checkpoint):
  directory = hf_checkpoint("gemma2")
  rng = np.random.default_rng(3)
  prompts = [rng.integers(0, VOCAB_SIZE, n).tolist() for n in (LEN_A, LEN_B)]
  with torch.no_grad():
    model = load_hf_model(directory)
    want = [torch.log_softmax(model(torch.tensor([p])).logits[0].double(), -1) for p in prompts]
  config = load_hf_config(directory)
  return config, load_hf_params(directory, config), prompts, [w.numpy() for w in want]


@pytest.mark.parametrize("name", BACKENDS)
def test_every_path_gives_transformers_logprobs(gemma2, name):
  config, params, (a, b), (want_a, want_b) = gemma2
  model = causal_lm(config, BACKENDS[name]())

  @jax.jit
  def step(kv, token_ids, positions, slot_mapping, metadata):
    variables = {"params": params}
    hidden, kv = model.apply(variables, token_ids, positions, kv, slot_mapping, metadata)
    logits = model.apply(variables, hidden, method=type(model).compute_logits)
    return jax.nn.log_softmax(logits, axis=-1), kv

  def run(kv, chunks):
    arrays = build_step(
      chunks,
      page_size=PAGE,
      num_tokens=64,
      num_seq_slots=4,
      pages_per_seq=PAGES_PER_SEQ,
      num_groups=num_groups,
      group_stride=NUM_PAGES,
    )
    logprobs, kv = step(
      kv, arrays.token_ids, arrays.positions, arrays.slot_mapping, arrays.metadata
    )
    return np.asarray(logprobs, np.float64), kv, arrays.offsets

  pages_a, pages_b = [5, 2, 7], [1, 6, 3]
  kv, num_groups = model_kv(config, NUM_PAGES, PAGE)
  first, kv, off1 = run(kv, [Chunk(a[:-1], 0, pages_a), Chunk(b[:SPLIT], 0, pages_b)])
  second, _, off2 = run(kv, [Chunk(a[-1:], LEN_A - 1, pages_a), Chunk(b[SPLIT:], SPLIT, pages_b)])
  got_a = np.concatenate([first[off1[0] : off1[0] + LEN_A - 1], second[off2[0] : off2[0] + 1]])
  got_b = np.concatenate(
    [first[off1[1] : off1[1] + SPLIT], second[off2[1] : off2[1] + LEN_B - SPLIT]]
  )
  np.testing.assert_allclose(got_a, want_a, atol=5e-5, rtol=0)
  np.testing.assert_allclose(got_b, want_b, atol=5e-5, rtol=0)
