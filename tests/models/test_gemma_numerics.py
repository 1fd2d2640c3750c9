"""Gemma's bfloat16 numerics against transformers' own modules: the scaled embedding (the scale
rounded to bfloat16), the (1 + w) RMSNorm computed in float32 before the cast, and a bfloat16
Gemma 2 model (soft caps included) against transformers' float32 forward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers.models.gemma2.modeling_gemma2 import (
  Gemma2RMSNorm,
  Gemma2TextScaledWordEmbedding,
)

from jaxserve.attention import get_attention_backend
from jaxserve.models import causal_lm
from jaxserve.models.families.gemma import scaled_embedding
from jaxserve.models.layers.norms import GemmaRMSNorm
from jaxserve.models.weights import load_hf_config, load_hf_params
from tests.models.hf_checkpoints import VOCAB_SIZE, load_hf_model
from tests.models.paged_batch import Chunk, build_step, model_kv

HIDDEN = 3072  # sqrt(3072) = 55.4256 rounds to 55.5 in bfloat16


def _to_numpy(t: torch.Tensor) -> np.ndarray:
  return t.float().numpy()


def test_embedding_scale_rounds_as_transformers():
  rng = np.random.default_rng(0)
  weight = torch.tensor(rng.standard_normal((8, HIDDEN), dtype=np.float32)).bfloat16()
  hf = Gemma2TextScaledWordEmbedding(8, HIDDEN, 0, embed_scale=HIDDEN**0.5).bfloat16()
  hf.weight.data.copy_(weight)
  hf.embed_scale.fill_(HIDDEN**0.5)  # a float32 buffer, as transformers' init sets it
  ids = torch.arange(8)
  with torch.no_grad():
    want = _to_numpy(hf(ids))
  got = scaled_embedding(jnp.asarray(_to_numpy(weight), jnp.bfloat16), HIDDEN)
  np.testing.assert_array_equal(np.asarray(got, np.float32), want)


def test_rms_norm_matches_transformers_in_bfloat16():
  rng = np.random.default_rng(1)
  x = torch.tensor(4.0 * rng.standard_normal((5, 256), dtype=np.float32)).bfloat16()
  weight = torch.tensor(0.3 * rng.standard_normal(256, dtype=np.float32)).bfloat16()
  hf = Gemma2RMSNorm(256, eps=1e-6).bfloat16()
  hf.weight.data.copy_(weight)
  with torch.no_grad():
    want = _to_numpy(hf(x))
  norm = GemmaRMSNorm(1e-6, jnp.bfloat16)
  params = {"params": {"scale": jnp.asarray(_to_numpy(weight), jnp.bfloat16)}}
  got = norm.apply(params, jnp.asarray(_to_numpy(x), jnp.bfloat16))
  assert got.dtype == jnp.bfloat16
  # float32 statistics and (1 + w) in float32, one rounding at the end, as transformers
  np.testing.assert_array_equal(np.asarray(got, np.float32), want)


def test_bfloat16_gemma2_tracks_float32_reference(hf_checkpoint):
  directory = hf_checkpoint("gemma2", dtype="bfloat16")
  config = load_hf_config(directory)
  assert config.dtype == "bfloat16"
  params = load_hf_params(directory, config)
  model = causal_lm(config, get_attention_backend("reference"))
  prompt = np.random.default_rng(2).integers(0, VOCAB_SIZE, 13).tolist()
  kv, num_groups = model_kv(config, 6, 4, jnp.bfloat16)
  step = build_step(
    [Chunk(prompt, 0, [3, 1, 5, 2])],
    page_size=4,
    num_tokens=16,
    num_seq_slots=2,
    pages_per_seq=4,
    num_groups=num_groups,
    group_stride=6,
  )

  @jax.jit
  def forward(kv, token_ids, positions, slot_mapping, metadata):
    variables = {"params": params}
    hidden, _ = model.apply(variables, token_ids, positions, kv, slot_mapping, metadata)
    return hidden, model.apply(variables, hidden, method=type(model).compute_logits)

  hidden, logits = forward(kv, step.token_ids, step.positions, step.slot_mapping, step.metadata)
  assert hidden.dtype == jnp.bfloat16 and logits.dtype == jnp.float32
  got = np.asarray(jax.nn.log_softmax(logits, axis=-1))[: len(prompt)]
  with torch.no_grad():
    want = torch.log_softmax(load_hf_model(directory)(torch.tensor([prompt])).logits[0], -1)
  assert np.abs(got - want.numpy()).max() < 0.15
  assert (got.argmax(-1) == want.numpy().argmax(-1)).mean() >= 0.9
