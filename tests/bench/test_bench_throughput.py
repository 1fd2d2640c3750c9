"""`jaxserve bench throughput` with the transformers baseline, the tiny-random export, and the
random-weight checkpoints of real Llama shapes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from jaxserve.bench.random_checkpoint import build_random_checkpoint
from jaxserve.cli import main as jaxserve_main
from jaxserve.models.model_config import ModelConfig, RopeScaling
from jaxserve.models.named_shapes import named_model_config
from jaxserve.models.registry import load_model
from jaxserve.models.weights import hf_tensor_specs, load_hf_config
from jaxserve.tools.export_hf import export_tiny_random_hf
from tests.tools.tool_helpers import SMALL_ENGINE_ARGS

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 8, 24, 8


def test_throughput_with_transformers_baseline(tmp_path, capsys):
  out = tmp_path / "throughput.json"
  code = jaxserve_main(
    [
      "bench",
      "throughput",
      *SMALL_ENGINE_ARGS,
      "--num-prompts",
      str(NUM_PROMPTS),
      "--input-len",
      str(INPUT_LEN),
      "--output-len",
      str(OUTPUT_LEN),
      "--hf-baseline",
      "--hf-batch-size",
      "4",
      "--out",
      str(out),
    ]
  )
  assert code == 0
  result = json.loads(out.read_text())
  ours, hf = result["jaxserve"], result["transformers"]
  assert ours["output_tokens"] == hf["output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
  assert ours["all_outputs_full_length"] and ours["compilations_after_warmup"] == 0
  for engine in (ours, hf):
    assert engine["output_tokens_per_s"] == pytest.approx(
      engine["output_tokens"] / engine["elapsed_s"]
    )
    assert engine["total_tokens_per_s"] == pytest.approx(
      (engine["output_tokens"] + NUM_PROMPTS * INPUT_LEN) / engine["elapsed_s"]
    )
  assert hf["dtype"] == "float32" and hf["batch_size"] == 4
  ratio = ours["output_tokens_per_s"] / hf["output_tokens_per_s"]
  assert result["speedup_vs_transformers"] == pytest.approx(ratio)
  captured = capsys.readouterr()
  assert f"{ratio:.2f}x" in captured.out
  assert "compiling: 100%" in captured.err  # the warmup's progress, not minutes of silence


def test_exported_tiny_random_loads_back_identically(tmp_path):
  out_dir = export_tiny_random_hf(tmp_path / "hf")
  original, exported = load_model("tiny-random"), load_model(str(out_dir))
  assert exported.config == original.config
  for spec in hf_tensor_specs(original.config):
    a, b = original.params, exported.params
    for key in spec.path:
      a, b = a[key], b[key]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=spec.hf_name)


def test_random_llama_shapes_have_the_published_parameter_counts():
  for name, expected in (("llama-3.2-1b", 1_235_814_400), ("llama-3.1-8b", 8_030_261_248)):
    config = named_model_config(name)
    assert sum(int(np.prod(s.hf_shape)) for s in hf_tensor_specs(config)) == expected, name
    assert config.dtype == "bfloat16" and config.rope_scaling.rope_type == "llama3"


def test_random_checkpoint_loads_in_jaxserve_and_transformers(tmp_path):
  config = ModelConfig(
    architecture="llama",
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 64),
    max_position_embeddings=256,
    tie_word_embeddings=True,
    bos_token_id=256,
    eos_token_ids=(257,),
    dtype="bfloat16",
  )
  out_dir = build_random_checkpoint(config, tmp_path / "ckpt", seed=1)
  assert load_hf_config(out_dir) == config
  loaded = load_model(str(out_dir))
  embedding = np.asarray(loaded.params["embed_tokens"]["embedding"], dtype=np.float32)
  assert embedding.shape == (300, 64) and 0.015 < embedding.std() < 0.025
  hf = transformers.AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16)
  assert hf.config.tie_word_embeddings and hf.dtype == torch.bfloat16
  np.testing.assert_array_equal(hf.model.embed_tokens.weight.detach().float().numpy(), embedding)
