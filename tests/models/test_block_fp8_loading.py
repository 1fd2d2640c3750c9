"""Block-wise fp8 checkpoints (quant_method "fp8", 128x128 blocks with `weight_scale_inv`: the
DeepSeek-V3 / Qwen3-*-FP8 format) load dequantized, dense projections and MoE experts alike, and
their log-probs match transformers run on the weights the format means (float(q) * scale per
block; transformers' own FP8 loading needs `accelerate`, which the test extra does not install,
and dequantizes the same way on a CPU). Tiny dims make partial blocks (64-row experts, 70 here);
`--quantization` re-quantizes the dequantized projections per channel."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.torch
import torch

from jaxserve.models.registry import convert_checkpoint, load_model
from jaxserve.models.weights import load_hf_config, load_hf_params
from jaxserve.quantization import reference
from jaxserve.quantization.dequantize import dequantize
from jaxserve.quantization.scheme import scheme_for
from tests.integration.engine_helpers import generate_and_score, hf_greedy, small_engine
from tests.models.block_fp8_checkpoints import (
  dequantize_blocks,
  quantize_blocks,
  write_block_fp8,
  write_dequantized,
)
from tests.models.hf_checkpoints import load_hf_model
from tests.models.paged_batch import Chunk
from tests.models.test_hf_logits_parity import TOLERANCE, Family

TENSORS = "model.safetensors"


@pytest.fixture(scope="module")
def block_fp8(hf_checkpoint, tmp_path_factory):
  """block_fp8(family) -> (block-wise fp8 checkpoint, its dequantized float32 twin), cached."""
  cache = {}

  def get(family: str):
    if family not in cache:
      root = tmp_path_factory.mktemp(f"fp8_{family}")
      stored = write_block_fp8(hf_checkpoint(family), root / "fp8")
      cache[family] = stored, write_dequantized(stored, root / "dequantized")
    return cache[family]

  return get


def _prefill_logprobs(family: Family) -> list[np.ndarray]:
  a, b = family.prompts
  chunks = [Chunk(a, 0, family.pages[0]), Chunk(b, 0, family.pages[1])]
  logprobs, _, offsets = family.run(family.empty_pages(), chunks)
  return [logprobs[o : o + len(p)] for p, o in zip((a, b), offsets, strict=True)]


@pytest.mark.parametrize("name", ["qwen3", "llama", "qwen3_moe"])
def test_logprobs_match_transformers_on_the_dequantized_weights(block_fp8, hf_checkpoint, name):
  stored, dequantized = block_fp8(name)
  family = Family(stored, reference=dequantized)
  assert family.config.quantization == "none"
  for got, want in zip(_prefill_logprobs(family), family.hf_logprobs, strict=True):
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
  # the fp8 rounding is visible: the same test against the float checkpoint would fail
  original = Family(hf_checkpoint(name))
  drift = max(
    np.abs(g - w).max() for g, w in zip(family.hf_logprobs, original.hf_logprobs, strict=True)
  )
  assert drift > 100 * TOLERANCE


def test_the_engine_generates_transformers_greedy_tokens(block_fp8):
  """`jaxserve serve` of a block-wise fp8 Qwen3-MoE: the engine's greedy tokens (chunked prefill,
  then decode steps) are transformers' on the dequantized weights."""
  stored, dequantized = block_fp8("qwen3_moe")
  engine = small_engine(
    str(stored), max_model_len=128, max_tokens_per_step=16, token_buckets=(8, 16)
  )
  prompts = [[7, 100, 33, 250, 9, 60, 301, 12, 5, 77, 140, 220, 31, 18, 90, 64, 3, 200], [42, 17]]
  tokens, _ = generate_and_score(engine, prompts, 16)
  hf_model = load_hf_model(dequantized)
  for prompt, got in zip(prompts, tokens, strict=True):
    assert got == hf_greedy(hf_model, prompt, 16)


def test_params_are_the_dequantized_weights(block_fp8):
  stored, _ = block_fp8("qwen3_moe")
  params = load_hf_params(stored, load_hf_config(stored))
  hf = safetensors.torch.load_file(stored / TENSORS)

  def want(name):
    return dequantize_blocks(hf[name + ".weight"], hf[name + ".weight_scale_inv"]).numpy()

  layer = params["layers_1"]
  np.testing.assert_array_equal(
    np.asarray(layer["self_attn"]["q_proj"]["kernel"]), want("model.layers.1.self_attn.q_proj").T
  )
  experts = np.asarray(layer["mlp"]["experts"]["down_proj"])  # [E, in, out]
  np.testing.assert_array_equal(experts[5], want("model.layers.1.mlp.experts.5.down_proj").T)
  assert experts.dtype == np.float32


def test_partial_blocks_dequantize_per_128_block():
  """A weight of 192 x 200 has a partial second row and column of blocks (scale [2, 2])."""
  w = torch.randn(192, 200, generator=torch.Generator().manual_seed(0))
  w[128:, :] *= 50  # a second block row of another magnitude: a wrong block would show
  q, scale = quantize_blocks(w)
  assert scale.shape == (2, 2)
  raw = q.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
  got = np.asarray(dequantize(jnp.asarray(raw), jnp.asarray(scale.numpy()), (128, 128)))
  np.testing.assert_array_equal(got, dequantize_blocks(q, scale).numpy())
  assert np.abs(got - w.numpy()).max() <= 0.07 * np.abs(w.numpy()).max()


def test_quantization_requantizes_the_dequantized_projections(block_fp8):
  """`--quantization fp8_w8a16` on a block-wise checkpoint: each projection per channel from its
  dequantized weight (the MoE experts stay dequantized floats); a second rounding, measured."""
  stored, dequantized = block_fp8("qwen3")
  family = Family(stored, reference=dequantized, quantization="fp8_w8a16")
  hf = safetensors.torch.load_file(stored / TENSORS)
  name = "model.layers.0.mlp.up_proj"
  w = dequantize_blocks(hf[name + ".weight"], hf[name + ".weight_scale_inv"]).numpy()
  q, scale = reference.quantize_weight(w, scheme_for("fp8_w8a16"))
  leaf = family.params["layers_0"]["mlp"]["up_proj"]
  np.testing.assert_array_equal(np.asarray(leaf["scale"]), scale)
  np.testing.assert_array_equal(np.asarray(leaf["kernel"]).view(np.uint8), q.view(np.uint8))
  errors = [
    np.abs(g - w).max() for g, w in zip(_prefill_logprobs(family), family.hf_logprobs, strict=True)
  ]
  print(f"re-quantized per channel: max |logprob - transformers| = {max(errors):.4f}")
  assert TOLERANCE < max(errors) < 0.5


def _rewrite(stored, tmp_path, tensors=None, config=None):
  out = tmp_path / "bad"
  out.mkdir()
  for item in stored.iterdir():
    if item.is_file() and item.name not in (TENSORS, "config.json"):
      (out / item.name).write_bytes(item.read_bytes())
  hf = safetensors.torch.load_file(stored / TENSORS)
  safetensors.torch.save_file(tensors(hf) if tensors else hf, out / TENSORS)
  data = json.loads((stored / "config.json").read_text())
  data["quantization_config"].update(config or {})
  (out / "config.json").write_text(json.dumps(data))
  return out


def _without(name):
  return lambda hf: {k: v for k, v in hf.items() if k != name}


def _replaced(name, value):
  return lambda hf: {**hf, name: value}


SCALE = "model.layers.1.mlp.experts.2.up_proj.weight_scale_inv"


@pytest.mark.parametrize(
  "tensors,config,match",
  [
    (_without(SCALE), None, f"missing tensor '{SCALE}'"),
    (_replaced(SCALE, torch.ones(2, 1)), None, rf"'{SCALE}' is float32\[2, 1\], expected"),
    (None, {"fmt": "e5m2"}, "quantization_config.fmt: only 'e4m3'"),
    (None, {"weight_block_size": None}, "quantization_config.weight_block_size: must be"),
    (None, {"activation_scheme": "static"}, "quantization_config.activation_scheme"),
  ],
)
def test_bad_checkpoints_are_named(block_fp8, tmp_path, tensors, config, match):
  stored, _ = block_fp8("qwen3_moe")
  bad = _rewrite(stored, tmp_path, tensors, config)
  with pytest.raises(ValueError, match=match):
    load_hf_params(bad, load_hf_config(bad))


def test_an_orbax_copy_restores_the_dequantized_params(block_fp8, tmp_path):
  """`jaxserve convert` of a block-wise fp8 checkpoint saves (and later loads restore) the
  dequantized params."""
  stored, _ = block_fp8("qwen3")
  copy = tmp_path / "fp8"
  shutil.copytree(stored, copy)
  expected = load_model(str(copy))
  convert_checkpoint(copy)
  restored = load_model(str(copy))
  assert restored.source.startswith("orbax:") and restored.config == expected.config
  for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(expected.params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
