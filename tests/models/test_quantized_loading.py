"""Quantized params from safetensors (models/quantized_loading.py): a float checkpoint quantized
as it loads and a compressed-tensors checkpoint (written by the test in llm-compressor's layout
with the numpy reference quantizer) load to the same params; the param tree is the model's;
bad checkpoints fail from the headers with a one-line message naming the tensor or scheme."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch

from jaxserve.models.registry import load_model
from jaxserve.models.weights import load_hf_config, load_hf_params, param_shapes
from jaxserve.quantization import reference
from jaxserve.quantization.scheme import scheme_for
from tests.models.compressed_checkpoints import (
  quantization_config,
  write_compressed_tensors,
  write_dequantized,
)
from tests.models.paged_batch import Chunk, init_param_shapes

FAMILY = "qwen2"  # q/k/v biases: the biases stay in the model dtype beside the 8-bit kernels


@pytest.fixture(scope="module")
def bf16(hf_checkpoint):
  return hf_checkpoint(FAMILY, dtype="bfloat16")


def _abstract(tree):
  return jax.tree.map(lambda x: (x.shape, jnp.dtype(x.dtype)), tree)


@pytest.mark.parametrize("name,fuse", [("fp8", True), ("int8", False)])
def test_quantize_on_load_matches_the_model_and_the_reference(bf16, name, fuse):
  loaded = load_model(str(bf16), quantization=name, fuse_projections=fuse)
  config = loaded.config
  assert (config.quantization, config.fused_projections) == (name, fuse)
  init = init_param_shapes(config)
  assert _abstract(init) == _abstract(loaded.params)
  if not fuse:
    assert _abstract(param_shapes(config)) == _abstract(loaded.params)
  scheme = scheme_for(name)
  hf = safetensors.torch.load_file(bf16 / "model.safetensors")
  w = hf["model.layers.1.mlp.down_proj.weight"].float().numpy()  # [out, in], as stored
  q, scale = reference.quantize_weight(w, scheme)
  leaf = loaded.params["layers_1"]["mlp"]["down_proj"]
  np.testing.assert_array_equal(np.asarray(leaf["scale"]), scale)
  np.testing.assert_array_equal(np.asarray(leaf["kernel"]).view(np.uint8), q.view(np.uint8))
  assert loaded.params["lm_head"]["kernel"].dtype == jnp.bfloat16
  assert loaded.params["embed_tokens"]["embedding"].dtype == jnp.bfloat16


@pytest.mark.parametrize("name", ["fp8", "int8_w8a8", "fp8_w8a16"])
def test_compressed_tensors_loads_as_quantize_on_load(bf16, tmp_path, name):
  stored = write_compressed_tensors(bf16, tmp_path / "ct", name)
  assert load_hf_config(stored).quantization == name
  from_disk = load_model(str(stored), fuse_projections=True)
  on_load = load_model(str(bf16), quantization=name, fuse_projections=True)
  assert from_disk.config == on_load.config
  assert _abstract(from_disk.params) == _abstract(on_load.params)
  for a, b in zip(jax.tree.leaves(from_disk.params), jax.tree.leaves(on_load.params), strict=True):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
  assert load_model(str(stored), quantization=name).config.quantization == name


def test_tensor_strategy_and_static_scales(bf16, tmp_path):
  stored = write_compressed_tensors(bf16, tmp_path / "ct", "fp8", strategy="tensor", static=True)
  params = load_model(str(stored), fuse_projections=True).params
  hf = safetensors.torch.load_file(stored / "model.safetensors")
  qkv = params["layers_0"]["self_attn"]["qkv_proj"]
  expected = np.concatenate(
    [
      np.full(
        hf[f"model.layers.0.self_attn.{p}.weight"].shape[0],
        hf[f"model.layers.0.self_attn.{p}.weight_scale"].item(),
        np.float32,
      )
      for p in ("q_proj", "k_proj", "v_proj")
    ]
  )
  np.testing.assert_array_equal(np.asarray(qkv["scale"]), expected)
  raw = hf["model.layers.0.self_attn.k_proj.weight"].view(torch.uint8).numpy()  # [out, in]
  q_dim = hf["model.layers.0.self_attn.q_proj.weight"].shape[0]
  np.testing.assert_array_equal(
    np.asarray(qkv["kernel"]).view(np.uint8)[q_dim : q_dim + raw.shape[0]], raw
  )


def _rewrite(directory, drop=(), replace=None, config_change=None):
  tensors = safetensors.torch.load_file(directory / "model.safetensors")
  for name in drop:
    del tensors[name]
  tensors.update(replace or {})
  safetensors.torch.save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
  if config_change:
    config = json.loads((directory / "config.json").read_text())
    config_change(config["quantization_config"])
    (directory / "config.json").write_text(json.dumps(config))


SCALE = "model.layers.1.mlp.up_proj.weight_scale"


def _bad(bf16, tmp_path, **change):
  stored = write_compressed_tensors(bf16, tmp_path / "ct", "int8")
  _rewrite(stored, **change)
  return stored


def _one_line_error(directory, match, **kwargs):
  with pytest.raises(ValueError, match=match) as err:
    load_model(str(directory), **kwargs)
  assert "\n" not in str(err.value)


def test_a_missing_scale_is_named(bf16, tmp_path):
  _one_line_error(_bad(bf16, tmp_path, drop=[SCALE]), f"missing tensor '{SCALE}'")


def test_a_misshaped_scale_is_named(bf16, tmp_path):
  stored = _bad(bf16, tmp_path, replace={SCALE: torch.ones(3, 1)})
  _one_line_error(
    stored, rf"tensor '{SCALE}' is float32\[3, 1\], expected a float of shape \[256, 1\]"
  )


@pytest.mark.parametrize(
  "change,match",
  [
    (dict(drop=[SCALE]), f"missing tensor '{SCALE}'"),
    (dict(replace={SCALE: torch.ones(3, 1)}), rf"tensor '{SCALE}' is float32\[3, 1\]"),
  ],
  ids=["missing", "misshaped"],
)
def test_the_engine_refuses_a_bad_scale_before_taking_device_memory(
  bf16, tmp_path, monkeypatch, change, match
):
  """build_engine on the checkpoint: the one-line error comes from the safetensors headers,
  before any tensor is transferred to the device or the KV pool's maker is built (both watched,
  each still the real one)."""
  from jaxserve.composition import assembly
  from jaxserve.config import EngineConfig
  from jaxserve.models import weights

  calls = []
  for module, name in ((weights, "transfer_tensors"), (assembly, "KVPoolMaker")):
    real = getattr(module, name)
    monkeypatch.setattr(
      module, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k)
    )
  stored = _bad(bf16, tmp_path, **change)
  with pytest.raises(ValueError, match=match) as err:
    assembly.build_engine(EngineConfig(model=str(stored)), show_progress=False)
  assert "\n" not in str(err.value) and calls == []


def test_a_weight_of_the_wrong_type_is_named(bf16, tmp_path):
  name = "model.layers.0.self_attn.o_proj.weight"
  stored = _bad(bf16, tmp_path, replace={name: torch.zeros(128, 128, dtype=torch.bfloat16)})
  _one_line_error(stored, f"tensor '{name}' is bfloat16, expected int8")


@pytest.mark.parametrize(
  "change,match",
  [
    (
      lambda qc: qc["config_groups"]["group_0"]["weights"].update(
        num_bits=4, strategy="group", group_size=128
      ),
      r"unsupported compressed-tensors scheme: weights int 4-bit group \(group_size 128\)",
    ),
    (lambda qc: qc.update(quant_method="awq"), "unsupported quant_method 'awq'"),
    (lambda qc: qc.update(ignore=["lm_head", "re:.*down_proj"]), "leaves attention or dense MLP"),
    (lambda qc: qc.update(format="pack-quantized"), "format: 'pack-quantized'"),
  ],
)
def test_an_unsupported_scheme_is_named(bf16, tmp_path, change, match):
  _one_line_error(_bad(bf16, tmp_path, config_change=change), match)


def test_a_conflicting_request_is_refused(bf16, tmp_path):
  stored = write_compressed_tensors(bf16, tmp_path / "ct", "int8")
  _one_line_error(
    stored,
    r"stored as int8 \(int8 weights, W8A16\).*cannot be re-quantized to 'fp8'",
    quantization="fp8",
  )
  _one_line_error(bf16, r"^quantization: must be one of", quantization="int4")


def test_quantization_config_is_ours():
  assert quantization_config("int8")["config_groups"]["group_0"]["input_activations"] is None


def test_stored_weights_never_load_as_floats(bf16, tmp_path):
  stored = write_compressed_tensors(bf16, tmp_path / "ct", "int8")
  config = load_hf_config(stored).replace(quantization="none")
  with pytest.raises(ValueError, match="^quantization: the checkpoint stores int8, not none"):
    load_hf_params(stored, config)


def test_orbax_copies_load_the_same_params(bf16, tmp_path):
  """`jaxserve convert` of a compressed-tensors checkpoint keeps its 8-bit params; a float
  checkpoint's orbax copy is quantized after restoring, to quantize-on-load's params."""
  from jaxserve.models.registry import convert_checkpoint

  stored = write_compressed_tensors(bf16, tmp_path / "ct", "fp8")
  plain = tmp_path / "bf16"
  shutil.copytree(bf16, plain)
  expected = {
    "fp8": load_model(str(stored), fuse_projections=True),
    "int8": load_model(str(plain), quantization="int8", fuse_projections=True),
  }
  convert_checkpoint(stored)
  convert_checkpoint(plain)
  restored = {
    "fp8": load_model(str(stored), fuse_projections=True),
    "int8": load_model(str(plain), quantization="int8", fuse_projections=True),
  }
  for name, loaded in restored.items():
    assert loaded.source.startswith("orbax:") and loaded.config == expected[name].config
    for a, b in zip(
      jax.tree.leaves(loaded.params), jax.tree.leaves(expected[name].params), strict=True
    ):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(_raw(a), _raw(b))


def _raw(array) -> np.ndarray:
  array = np.asarray(array)
  return array.view(np.uint8) if array.dtype.itemsize == 1 else array


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_moe_experts_load_dequantized(hf_checkpoint, tmp_path, strategy):
  """A compressed-tensors Qwen3-MoE (experts stored in e4m3 with their weight_scale, the router
  ignored as llm-compressor's recipes leave it): the experts load dequantized in the model dtype
  and the log-probs match transformers on the weights the checkpoint means (W8A16 projections:
  the same products in another order)."""
  from tests.models.test_hf_logits_parity import TOLERANCE, Family

  stored = write_compressed_tensors(
    hf_checkpoint("qwen3_moe"), tmp_path / "ct", "fp8_w8a16", strategy
  )
  config = json.loads((stored / "config.json").read_text())
  config["quantization_config"]["ignore"] = ["lm_head", "re:.*mlp.gate$"]
  (stored / "config.json").write_text(json.dumps(config))
  family = Family(stored, reference=write_dequantized(stored, tmp_path / "dequantized"))
  experts = family.params["layers_0"]["mlp"]["experts"]["up_proj"]
  assert experts.dtype == jnp.float32
  hf = safetensors.torch.load_file(stored / "model.safetensors")
  name = "model.layers.0.mlp.experts.3.up_proj"
  want = hf[name + ".weight"].float() * hf[name + ".weight_scale"].reshape(-1, 1)
  np.testing.assert_array_equal(np.asarray(experts[3]), want.numpy().T)
  a, b = family.prompts
  chunks = [Chunk(a, 0, family.pages[0]), Chunk(b, 0, family.pages[1])]
  logprobs, _, offsets = family.run(family.empty_pages(), chunks)
  for prompt, offset, want in zip((a, b), offsets, family.hf_logprobs, strict=True):
    np.testing.assert_allclose(
      logprobs[offset : offset + len(prompt)], want, atol=TOLERANCE, rtol=0
    )


def test_a_moe_quantizes_its_attention_and_experts_on_load(hf_checkpoint):
  """`--quantization fp8` on a float Qwen3-MoE: the attention projections and the experts in e4m3
  with their per-channel scales, as quantize-on-load makes them (the experts stacked [E, out,
  in]: models/fp8_experts.py); the router stays a float."""
  loaded = load_model(str(hf_checkpoint("qwen3_moe")), quantization="fp8")
  layer = loaded.params["layers_1"]
  assert _abstract(init_param_shapes(loaded.config)) == _abstract(loaded.params)
  hf = safetensors.torch.load_file(hf_checkpoint("qwen3_moe") / "model.safetensors")
  w = hf["model.layers.1.self_attn.o_proj.weight"].float().numpy()
  q, scale = reference.quantize_weight(w, scheme_for("fp8"))
  np.testing.assert_array_equal(np.asarray(layer["self_attn"]["o_proj"]["scale"]), scale)
  np.testing.assert_array_equal(
    np.asarray(layer["self_attn"]["o_proj"]["kernel"]).view(np.uint8), q.view(np.uint8)
  )
  w = hf["model.layers.1.mlp.experts.6.gate_proj.weight"].float().numpy()
  q, scale = reference.quantize_weight(w, scheme_for("fp8"))
  experts = layer["mlp"]["experts"]
  np.testing.assert_array_equal(np.asarray(experts["gate_proj_scale"][6]), scale)
  np.testing.assert_array_equal(
    np.asarray(experts["gate_proj"][6]).view(np.uint8), q.view(np.uint8)
  )
  assert layer["mlp"]["gate"]["kernel"].dtype == jnp.float32
