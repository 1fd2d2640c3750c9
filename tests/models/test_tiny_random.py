"""The built-in tiny-random model and the registry's name resolution."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.attention import get_attention_backend
from jaxserve.models import LlamaForCausalLM, load_model
from jaxserve.models.tiny_random import TINY_RANDOM_NAME, tiny_random_config, tiny_random_params
from jaxserve.models.weights import param_shapes
from tests.models.paged_batch import Chunk, build_step, empty_kv_pages

PAGE_SIZE, NUM_TOKENS, PAGES_PER_SEQ = 8, 16, 4


def test_config():
  c = tiny_random_config()
  assert (c.architecture, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (
    "llama",
    512,
    256,
    512,
    2,
  )
  assert (c.num_q_heads, c.num_kv_heads, c.head_dim, c.max_position_embeddings) == (4, 2, 64, 2048)
  assert (c.bos_token_id, c.eos_token_ids, c.dtype, c.tie_word_embeddings) == (
    256,
    (257,),
    "float32",
    False,
  )


def test_params_are_deterministic_and_shaped():
  config = tiny_random_config()
  a, b = tiny_random_params(config), tiny_random_params(config)
  jax.tree.map(np.testing.assert_array_equal, a, b)
  shapes = jax.tree.map(lambda x: (x.shape, x.dtype), param_shapes(config))
  assert jax.tree.map(lambda x: (x.shape, x.dtype), a) == shapes


def _greedy(model, step, params, prompt: list[int], num_new: int) -> list[int]:
  config = model.config
  kv = empty_kv_pages(
    config.num_layers, config.num_kv_heads, 1 + PAGES_PER_SEQ, PAGE_SIZE, config.head_dim
  )
  pages = list(range(1, 1 + PAGES_PER_SEQ))
  chunk, out = Chunk(prompt, 0, pages), []
  for _ in range(num_new):
    arrays = build_step(
      [chunk],
      page_size=PAGE_SIZE,
      num_tokens=NUM_TOKENS,
      num_seq_slots=1,
      pages_per_seq=PAGES_PER_SEQ,
    )
    logits, kv = step(
      params, kv, arrays.token_ids, arrays.positions, arrays.slot_mapping, arrays.metadata
    )
    out.append(int(jnp.argmax(logits[len(chunk.token_ids) - 1])))
    chunk = Chunk(out[-1:], chunk.start + len(chunk.token_ids), pages)
  return out


def _logits(model, params, kv, token_ids, positions, slot_mapping, metadata):
  hidden, kv = model.apply({"params": params}, token_ids, positions, kv, slot_mapping, metadata)
  return model.apply({"params": params}, hidden, method=LlamaForCausalLM.compute_logits), kv


def test_greedy_generation_is_varied():
  loaded = load_model(TINY_RANDOM_NAME)
  model = LlamaForCausalLM(loaded.config, get_attention_backend("reference"))
  prompts = [[256, *b"Hello"], [256, *b"What is"], [256, 1, 2, 3]]
  step = jax.jit(lambda params, kv, *inputs: _logits(model, params, kv, *inputs))
  outputs = [_greedy(model, step, loaded.params, p, 10) for p in prompts]
  assert all(len(set(out)) >= 5 for out in outputs), outputs
  assert len({tuple(out) for out in outputs}) == len(prompts), outputs


def test_load_model_tiny_random_dtypes():
  assert load_model(TINY_RANDOM_NAME).config.dtype == "float32"
  loaded = load_model(TINY_RANDOM_NAME, dtype="bfloat16")
  assert loaded.config.dtype == "bfloat16" and loaded.source == TINY_RANDOM_NAME
  assert {x.dtype for x in jax.tree.leaves(loaded.params)} == {jnp.dtype(jnp.bfloat16)}


def test_load_model_refusals(tmp_path):
  with pytest.raises(ValueError, match="model: 'no-such-model'"):
    load_model("no-such-model")
  with pytest.raises(ValueError, match=f"model: '{tmp_path}'"):
    load_model(str(tmp_path))
  with pytest.raises(ValueError, match="dtype"):
    load_model(TINY_RANDOM_NAME, dtype="float16")


def test_load_model_from_hf_directory(hf_checkpoint):
  loaded = load_model(str(hf_checkpoint("mistral")))
  assert loaded.config.architecture == "mistral" and loaded.source.startswith("safetensors:")
