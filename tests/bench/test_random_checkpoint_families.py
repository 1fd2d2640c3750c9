"""Random-weight checkpoints of the named Qwen3-MoE, Mixtral and Gemma 3 shapes, scaled down
(their family switches kept): the config.json reads back as the same ModelConfig, transformers
loads every tensor and computes the prompt log-probs jaxserve's engine computes, and the engine
generates. Gemma's norm weights are written as zeros (its norms scale by 1 + weight)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from jaxserve.bench.random_checkpoint import build_random_checkpoint
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.named_shapes import gemma3_layer_types, named_model_config
from jaxserve.models.weights import load_hf_config
from tests.integration.engine_helpers import generate_and_score, small_engine

PROMPT_LENGTHS = (20, 9)  # the first longer than the Gemma window
NUM_NEW_TOKENS = 6
SMALL = dict(
  vocab_size=512,
  hidden_size=64,
  num_q_heads=4,
  num_kv_heads=2,
  head_dim=16,
  max_position_embeddings=512,
  dtype="float32",
)


def _scaled_down(name: str) -> ModelConfig:
  config = named_model_config(name).replace(**SMALL)
  if config.num_experts:
    return config.replace(
      intermediate_size=32 if config.architecture == "mixtral" else 96,  # Mixtral's experts'
      num_layers=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    )  # fmt: skip
  return config.replace(
    intermediate_size=128,
    num_layers=6,
    layer_types=gemma3_layer_types(6),
    sliding_window=8,
    query_pre_attn_scalar=16.0,
  )


def _hf_prompt_logprobs(checkpoint, prompt: list[int]) -> np.ndarray:
  model, info = transformers.AutoModelForCausalLM.from_pretrained(
    checkpoint, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
  )
  assert not any(info.values()), info  # no missing, unexpected or mismatched tensor
  with torch.no_grad():
    logits = model.eval()(torch.tensor([prompt])).logits[0].double()
  logprobs = torch.log_softmax(logits, -1).numpy()  # [len, V]
  return logprobs[np.arange(len(prompt) - 1), prompt[1:]]


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b", "gemma-3-12b"])
def test_scaled_down_named_shape_loads_matches_transformers_and_generates(name, tmp_path):
  config = _scaled_down(name)
  checkpoint = build_random_checkpoint(config, tmp_path / "ckpt", seed=3)
  assert load_hf_config(checkpoint) == config
  written = json.loads((checkpoint / "config.json").read_text())
  assert written["architectures"] == [
    {
      "qwen3_moe": "Qwen3MoeForCausalLM",
      "mixtral": "MixtralForCausalLM",
      "gemma3_text": "Gemma3ForCausalLM",
    }[config.architecture]
  ]
  with safe_open(checkpoint / "model-00001.safetensors", "pt") as tensors:
    norm = tensors.get_tensor("model.norm.weight")
  assert torch.all(norm == (0.0 if config.architecture == "gemma3_text" else 1.0))  # (1 + w)

  rng = np.random.default_rng(5)
  prompts = [rng.integers(300, 500, n).tolist() for n in PROMPT_LENGTHS]
  engine = small_engine(
    str(checkpoint),
    attention_backend="xla",
    prefix_caching=False,
    max_tokens_per_step=32,
    max_num_seqs=4,
    seq_buckets=(4,),
    token_buckets=(32,),
  )  # one bucket: one compilation
  tokens, logprobs = generate_and_score(engine, prompts, NUM_NEW_TOKENS)
  assert [len(t) for t in tokens] == [NUM_NEW_TOKENS] * len(prompts)
  assert all(0 <= t < config.vocab_size for row in tokens for t in row)
  for prompt, ours in zip(prompts, logprobs, strict=True):
    np.testing.assert_allclose(ours, _hf_prompt_logprobs(checkpoint, prompt), atol=1e-4, rtol=0)


def test_an_architecture_without_a_config_writer_is_refused_by_name(tmp_path):
  config = named_model_config("llama-3.2-1b").replace(**SMALL, architecture="mistral")
  with pytest.raises(ValueError, match="architecture: random checkpoints are written for"):
    build_random_checkpoint(config, tmp_path / "ckpt")
  assert not (tmp_path / "ckpt").exists()
