"""Random checkpoints written in fp8 (bench/random_checkpoint.py `quantization="fp8"`,
bench/fp8_random_weights.py), on scaled-down Mixtral-8x7B and mixed Qwen3-MoE shapes: config.json's
quantization_config is the compressed-tensors FP8-dynamic scheme the loader reads, every tensor is
the bfloat16 checkpoint's of the same seed quantized by the numpy reference (jaxserve/quantization/
reference.py) or kept as it is, and the loader plans and loads all of it, refusing nothing."""

from __future__ import annotations

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from jaxserve.bench import random_checkpoint
from jaxserve.bench.random_checkpoint import build_random_checkpoint, parse_args
from jaxserve.models.named_shapes import named_model_config
from jaxserve.models.weights import (
  load_hf_config,
  load_hf_weights,
  plan_hf_tensors,
)
from jaxserve.quantization import reference
from jaxserve.quantization.compressed_tensors import stored_quantization
from jaxserve.quantization.scheme import SCHEMES
from tests.integration.engine_helpers import generate_and_score, small_engine

SMALL = dict(
  vocab_size=512,
  hidden_size=64,
  num_q_heads=4,
  num_kv_heads=2,
  head_dim=16,
  max_position_embeddings=512,
  num_layers=2,
  num_experts=4,
  num_experts_per_tok=2,
)
SHAPES = {
  "mixtral": dict(intermediate_size=48, moe_intermediate_size=48),
  "qwen3_moe_mixed": dict(intermediate_size=96, moe_intermediate_size=32, dense_mlp_layers=(0,)),
}
EXPERT_1_GATE = {"mixtral": "block_sparse_moe.experts.1.w1", "qwen3_moe": "mlp.experts.1.gate_proj"}
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def _config(name: str):
  base = named_model_config("mixtral-8x7b" if name == "mixtral" else "qwen3-30b-a3b")
  return base.replace(**SMALL, **SHAPES[name])


def _numpy(tensor: torch.Tensor) -> np.ndarray:
  if tensor.dtype == torch.float8_e4m3fn:
    return tensor.view(torch.uint8).numpy().view(E4M3)
  return tensor.float().numpy()


@pytest.fixture(scope="module", params=sorted(SHAPES))
def written(request, tmp_path_factory):
  """(config, the fp8 checkpoint, its tensors, the bfloat16 twin's tensors), each written in
  several shards."""
  config = _config(request.param)
  tmp = tmp_path_factory.mktemp(request.param)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(random_checkpoint, "SHARD_BYTES", 40_000)
    fp8 = build_random_checkpoint(config, tmp / "fp8", seed=4, quantization="fp8")
    bf16 = build_random_checkpoint(config, tmp / "bf16", seed=4)
  return config, fp8, _tensors(fp8), _tensors(bf16)


def _tensors(checkpoint) -> dict[str, torch.Tensor]:
  index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
  tensors, files = {}, sorted(set(index["weight_map"].values()))
  assert len(files) > 2  # SHARD_BYTES patched: written shard by shard
  for file in files:
    tensors.update(load_file(checkpoint / file))
  assert set(index["weight_map"]) == set(tensors)
  assert index["metadata"]["total_size"] == sum(
    t.numel() * t.element_size() for t in tensors.values()
  )
  return tensors


def test_config_is_the_fp8_dynamic_scheme_the_loader_reads(written):
  config, checkpoint, tensors, _ = written
  assert load_hf_config(checkpoint) == config.replace(quantization="fp8")
  hf = json.loads((checkpoint / "config.json").read_text())
  stored = stored_quantization(hf)
  assert (stored.scheme, stored.strategy, stored.static_input_scale) == (
    SCHEMES["fp8"],
    "channel",
    False,
  )
  qc = hf["quantization_config"]
  assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "float-quantized"
  routers = [
    name.removesuffix(".weight")
    for name in tensors
    if name.endswith(".gate.weight") and "experts" not in name
  ]
  assert len(routers) == config.num_layers - len(config.dense_mlp_layers)
  assert sorted(qc["ignore"]) == sorted(routers + ["lm_head"])


def test_every_projection_is_the_bf16_twin_quantized_per_channel(written):
  config, _, tensors, twin = written
  scheme = SCHEMES["fp8"]
  scales = {name for name in tensors if name.endswith(".weight_scale")}
  quantized = {name.removesuffix("_scale") for name in scales}
  assert set(tensors) == set(twin) | scales
  expert_layers = config.num_layers - len(config.dense_mlp_layers)
  per_layer = 4 + 3 * config.num_experts  # q/k/v/o and the experts' projections
  dense = 4 + 3  # q/k/v/o and the dense MLP's
  assert len(quantized) == expert_layers * per_layer + len(config.dense_mlp_layers) * dense
  for name, tensor in tensors.items():
    if name in scales:
      continue
    want = twin[name]
    if name not in quantized:
      assert tensor.dtype == want.dtype == torch.bfloat16
      assert torch.equal(tensor, want), name
      continue
    assert tensor.dtype == torch.float8_e4m3fn, name
    w = want.float().numpy()  # [out, in], the bfloat16 draw
    scale = tensors[name + "_scale"]
    assert scale.dtype == torch.bfloat16 and scale.shape == (w.shape[0], 1), name
    ref_scale = reference.scales_of(np.abs(w).max(axis=1), scheme)
    np.testing.assert_array_equal(
      _numpy(scale)[:, 0], ref_scale.astype(ml_dtypes.bfloat16).astype(np.float32)
    )
    inverse = (np.float32(1) / _numpy(scale)).astype(np.float32)
    np.testing.assert_array_equal(_numpy(tensor), reference.to_quantized(w * inverse, scheme))


def test_the_loader_plans_and_loads_everything(written):
  """No tensor refused: the projections load as stored fp8 kernels with their scales, and so do
  the experts (fp8 W8A8 experts, [E, out, in] as stored, their per-channel scales beside them),
  within fp8's rounding of the twin's bfloat16 weights."""
  config, checkpoint, tensors, twin = written
  loaded = load_hf_config(checkpoint)
  plan_hf_tensors(checkpoint, loaded)
  params, _ = load_hf_weights(checkpoint, loaded)
  for i in range(config.num_layers):
    layer = params[f"layers_{i}"]
    q = layer["self_attn"]["q_proj"]
    assert q["kernel"].dtype == jnp.float8_e4m3fn and q["scale"].dtype == jnp.float32
    name = f"model.layers.{i}.self_attn.q_proj.weight"
    np.testing.assert_array_equal(np.asarray(q["kernel"]), _numpy(tensors[name]))
    if not config.is_moe_layer(i):
      assert layer["mlp"]["gate_proj"]["kernel"].dtype == jnp.float8_e4m3fn
      continue
    experts = layer["mlp"]["experts"]
    gate, scale = experts["gate_proj"], experts["gate_proj_scale"]  # [E, I, H] e4m3, [E, I]
    assert gate.dtype == jnp.float8_e4m3fn
    assert gate.shape == (config.num_experts, config.moe_intermediate_size, config.hidden_size)
    stored = f"model.layers.{i}.{EXPERT_1_GATE[config.architecture]}.weight"
    np.testing.assert_array_equal(np.asarray(gate[1]), _numpy(tensors[stored]))
    np.testing.assert_array_equal(np.asarray(scale[1]), _numpy(tensors[stored + "_scale"])[:, 0])
    dequantized = np.asarray(gate[1], np.float32) * np.asarray(scale[1])[:, None]  # [I, H]
    want = twin[stored].float().numpy()
    np.testing.assert_allclose(dequantized, want, rtol=0.07, atol=1e-6)


def test_the_engine_serves_it(written):
  """The serving path (compressed-tensors scheme resolved to fp8, W8A8 attention) starts on the
  checkpoint and generates."""
  config, checkpoint, _, _ = written
  engine = small_engine(
    str(checkpoint),
    max_model_len=64,
    max_num_seqs=2,
    max_tokens_per_step=16,
    seq_buckets=(2,),
    token_buckets=(16,),
    prefix_caching=False,
  )
  assert engine.runner.model.config.quantization == "fp8"
  tokens, _ = generate_and_score(engine, [[300, 301, 302], [400, 401]], 3)
  assert [len(t) for t in tokens] == [3, 3]
  assert all(0 <= t < config.vocab_size for row in tokens for t in row)


def test_the_command_line_takes_the_option():
  args = parse_args(["mixtral-8x7b", "/tmp/x", "--quantization", "fp8"])
  assert (args.shape, args.quantization) == ("mixtral-8x7b", "fp8")
  with pytest.raises(SystemExit):
    parse_args(["mixtral-8x7b", "/tmp/x", "--quantization", "int8"])
  with pytest.raises(ValueError, match="quantization: must be one of"):
    build_random_checkpoint(_config("mixtral"), "/nonexistent/x", quantization="int8")
