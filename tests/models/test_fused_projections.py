"""Merged q/k/v and gate/up projections (models/fused_projections.py): the merged tree holds the
same weights side by side, and an engine with them generates what one without them does."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import EngineConfig
from jaxserve.models.fused_projections import fuse_params
from jaxserve.models.tiny_random import tiny_random_config
from tests.integration.engine_helpers import run_to_completion, small_engine


def _layer(rng, hidden: int, q: int, kv: int, inter: int, bias: bool) -> dict:
  def dense(out):
    leaves = {"kernel": rng.standard_normal((hidden, out)).astype(np.float32)}
    if bias:
      leaves["bias"] = rng.standard_normal(out).astype(np.float32)
    return leaves

  return {
    "input_layernorm": {"scale": np.ones(hidden, np.float32)},
    "self_attn": {
      "q_proj": dense(q),
      "k_proj": dense(kv),
      "v_proj": dense(kv),
      "o_proj": {"kernel": np.ones((q, hidden), np.float32)},
    },
    "mlp": {
      "gate_proj": {"kernel": rng.standard_normal((hidden, inter)).astype(np.float32)},
      "up_proj": {"kernel": rng.standard_normal((hidden, inter)).astype(np.float32)},
      "down_proj": {"kernel": np.ones((inter, hidden), np.float32)},
    },
  }


@pytest.mark.parametrize("bias", [False, True])
def test_merged_kernels_hold_the_separate_ones_side_by_side(bias):
  rng = np.random.default_rng(0)
  layer = _layer(rng, hidden=4, q=6, kv=2, inter=5, bias=bias)
  params = {"embed_tokens": {"embedding": np.zeros((3, 4))}, "layers_0": layer}
  embedding = params["embed_tokens"]
  fused = fuse_params(params)
  assert fused is params  # merged in place
  attn, mlp = fused["layers_0"]["self_attn"], fused["layers_0"]["mlp"]
  assert set(attn) == {"qkv_proj", "o_proj"} and set(mlp) == {"gate_up_proj", "down_proj"}
  for leaf in ("kernel", "bias") if bias else ("kernel",):
    np.testing.assert_array_equal(
      attn["qkv_proj"][leaf],
      np.concatenate([layer["self_attn"][n][leaf] for n in ("q_proj", "k_proj", "v_proj")], -1),
    )
  gate_up = mlp["gate_up_proj"]["kernel"]
  assert attn["qkv_proj"]["kernel"].shape == (4, 10) and gate_up.shape == (4, 10)
  np.testing.assert_array_equal(gate_up[:, :5], layer["mlp"]["gate_proj"]["kernel"])
  np.testing.assert_array_equal(gate_up[:, 5:], layer["mlp"]["up_proj"]["kernel"])
  assert fused["embed_tokens"] is embedding


def test_quantized_kernels_and_scales_merge_along_out():
  """A quantized projection's kernel is [out, in] (models/quantized_dense.py): merged kernels,
  scales and biases are concatenated along axis 0."""
  rng = np.random.default_rng(3)

  def quantized(out, bias=False):
    leaves = {
      "kernel": rng.integers(-127, 128, (out, 4)).astype(np.int8),
      "scale": rng.uniform(0.1, 1, out).astype(np.float32),
    }
    if bias:
      leaves["bias"] = rng.standard_normal(out).astype(np.float32)
    return leaves

  attn = {"q_proj": quantized(6, True), "k_proj": quantized(2, True), "v_proj": quantized(2, True)}
  mlp = {"gate_proj": quantized(5), "up_proj": quantized(5)}
  layer = {"self_attn": dict(attn), "mlp": dict(mlp)}
  fused = fuse_params({"layers_0": layer})["layers_0"]
  qkv, gate_up = fused["self_attn"]["qkv_proj"], fused["mlp"]["gate_up_proj"]
  assert qkv["kernel"].shape == (10, 4) and gate_up["kernel"].shape == (10, 4)
  for merged, parts in ((qkv, attn.values()), (gate_up, mlp.values())):
    for leaf in merged:
      np.testing.assert_array_equal(merged[leaf], np.concatenate([p[leaf] for p in parts], 0))


def test_fused_and_separate_engines_generate_the_same():
  outputs = {}
  for fuse in (False, True):
    engine = small_engine(fuse_projections=fuse)
    assert engine.runner.model.config.fused_projections is fuse
    rng = np.random.default_rng(1)
    for i in range(4):
      prompt = rng.integers(0, engine.vocab_size, size=int(rng.integers(5, 30))).tolist()
      engine.add_request(
        prompt,
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=0, ignore_eos=True),
        request_id=f"r{i}",
      )
    outputs[fuse] = run_to_completion(engine)
  for request_id, separate in outputs[False].items():
    fused = outputs[True][request_id]
    assert fused.token_ids == separate.token_ids
    np.testing.assert_allclose(
      [e.logprob for e in fused.logprobs], [e.logprob for e in separate.logprobs], atol=1e-5
    )


def test_fusion_is_refused_with_tp_invariant_reductions():
  with pytest.raises(ValueError, match="^fused_projections:"):
    tiny_random_config().replace(fused_projections=True, tp_invariant_reductions=True)
  with pytest.raises(ValueError, match="^fuse_projections:"):
    EngineConfig(fuse_projections="yes")


def test_fusing_frees_the_separate_kernels():
  """Held only through the tree, the separate kernels are gone once fused: live device arrays
  drop by 3 per layer (q/k/v -> qkv, gate/up -> gate_up)."""
  gc.collect()
  baseline = len(jax.live_arrays())
  rng = np.random.default_rng(2)
  params = {
    f"layers_{i}": jax.tree.map(jnp.asarray, _layer(rng, 4, 6, 2, 5, bias=False)) for i in range(3)
  }
  num_leaves = len(jax.tree.leaves(params))
  fuse_params(params)
  gc.collect()
  assert len(jax.live_arrays()) - baseline == num_leaves - 3 * 3


def test_merging_while_loading_a_checkpoint_equals_merging_after(hf_checkpoint):
  """load_model(fuse_projections=True) merges in the loader's device programs (both memory
  layouts: tests/models/test_weight_transfer.py); fuse_params merges a loaded tree."""
  from jaxserve.models.registry import load_model

  directory = str(hf_checkpoint("qwen2", dtype="bfloat16"))  # q/k/v biases
  merged = load_model(directory, fuse_projections=True)
  separate = load_model(directory)
  assert merged.config.fused_projections and not separate.config.fused_projections
  expected = fuse_params(dict(separate.params))
  assert jax.tree.structure(merged.params) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(merged.params), jax.tree.leaves(expected), strict=True):
    assert got.dtype == want.dtype and np.asarray(got).tobytes() == np.asarray(want).tobytes()
