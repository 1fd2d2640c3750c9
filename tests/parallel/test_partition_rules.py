"""The partition rules and the step codec on their own (no mesh needed): every param of a model
has a rule, odd dimensions fall back to replication, unknown params and indivisible head counts are
refused by name, and step inputs survive the trip to another host bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxserve.composition.assembly import build_device
from jaxserve.device.lowering import dummy_inputs
from jaxserve.messages.buckets import Bucket
from jaxserve.models.tiny_random import tiny_random_config
from jaxserve.models.weights import hf_tensor_specs, param_shapes
from jaxserve.parallel.kv_head_replication import repeat_heads
from jaxserve.parallel.partition_rules import (
  check_experts,
  check_tensor_parallel,
  kv_head_replicas,
  param_shardings,
  param_spec,
  with_replicated_kv_heads,
)
from jaxserve.parallel.step_codec import StepEncoder, decode_step_inputs
from tests.integration.engine_helpers import small_config


def test_every_param_has_a_rule_and_sharded_dims_divide():
  config = tiny_random_config().replace(attention_bias=True, qk_norm=True)
  for spec in hf_tensor_specs(config):
    partition = param_spec(spec.path, spec.shape, 2)
    for dim, axis in zip(spec.shape, partition, strict=False):  # dims past the spec: replicated
      assert axis is None or dim % 2 == 0, spec.path


def test_rules_by_name():
  assert param_spec(("layers_0", "self_attn", "q_proj", "kernel"), (8, 16), 4) == P(None, "model")
  assert param_spec(("layers_3", "self_attn", "k_proj", "bias"), (16,), 4) == P("model")
  assert param_spec(("layers_0", "self_attn", "o_proj", "kernel"), (16, 8), 4) == P("model", None)
  assert param_spec(("layers_0", "mlp", "down_proj", "kernel"), (32, 8), 4) == P("model", None)
  assert param_spec(("layers_0", "self_attn", "q_norm", "scale"), (16,), 4) == P()
  assert param_spec(("lm_head", "kernel"), (8, 512), 4) == P(None, "model")


def test_expert_rules_split_the_intermediate_dimension_or_whole_experts():
  """Tensor parallel (the default) splits each expert's intermediate dimension; expert parallel
  splits the expert dimension E over the same axis; the router is replicated either way."""
  gate, down, router = (
    ("layers_0", "mlp", "experts", "gate_proj"),
    ("layers_0", "mlp", "experts", "down_proj"),
    ("layers_0", "mlp", "gate", "kernel"),
  )
  assert param_spec(gate, (8, 16, 32), 2) == P(None, None, "model")
  assert param_spec(down, (8, 32, 16), 2) == P(None, "model", None)
  assert param_spec(gate, (8, 16, 32), 4, expert_parallel=True) == P("model", None, None)
  assert param_spec(down, (8, 32, 16), 4, expert_parallel=True) == P("model", None, None)
  assert param_spec(router, (16, 8), 4, expert_parallel=True) == P()
  q_proj = ("layers_0", "self_attn", "q_proj", "kernel")
  assert param_spec(q_proj, (16, 32), 4, expert_parallel=True) == P(None, "model")


def test_expert_layouts_must_divide_what_they_split():
  config = tiny_random_config().replace(
    architecture="qwen3_moe", num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32
  )
  check_experts(config, 2, expert_parallel=True)
  check_experts(config, 4, expert_parallel=False)
  with pytest.raises(ValueError, match="enable_expert_parallel: 4 devices do not divide .* 6"):
    check_experts(config, 4, expert_parallel=True)
  with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide .* size 32"):
    check_experts(config, 3, expert_parallel=False)
  with pytest.raises(ValueError, match="enable_expert_parallel: llama has no experts"):
    check_experts(tiny_random_config(), 2, expert_parallel=True)


def test_fp8_experts_shard_out_in_and_their_scales_follow():
  """fp8 experts [E, out, in] (models/fp8_experts.py): tensor parallel shards I on the other
  axis than the float experts' [E, in, out]; each scale takes its weight's spec truncated to its
  rank (a per-channel down_proj scale [E, H] replicated); expert parallel splits E."""
  config = tiny_random_config().replace(
    architecture="qwen3_moe",
    hidden_size=256,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=512,
  )
  for kind, quantization, blocks in (("fp8_channel", "fp8", False), ("fp8_block", "none", True)):
    c = config.replace(quantization=quantization, block_fp8_experts=blocks)
    assert c.expert_quantization == kind
    experts = param_shapes(c)["layers_0"]["mlp"]["experts"]

    def spec(name, experts=experts, ep=False):
      tree = {"layers_0": {"mlp": {"experts": experts}}}
      shardings = param_shardings(tree, _mesh_of(2), expert_parallel=ep)
      return shardings["layers_0"]["mlp"]["experts"][name].spec

    assert experts["gate_proj"].shape == (4, 512, 256) and spec("gate_proj") == P(
      None, "model", None
    )
    assert spec("down_proj") == P(None, None, "model")
    assert spec("gate_proj_scale") == (P(None, "model", None) if blocks else P(None, "model"))
    assert spec("down_proj_scale") == (P(None, None, "model") if blocks else P(None, None))
    for name in ("gate_proj", "up_proj_scale", "down_proj", "down_proj_scale"):
      assert spec(name, ep=True)[0] == "model"
  # block scales under tensor parallelism: whole 128-blocks of I per device
  blocks = config.replace(block_fp8_experts=True, moe_intermediate_size=384)
  check_experts(blocks, 3, expert_parallel=False)  # 384 = 3 blocks of 128
  with pytest.raises(ValueError, match="tensor_parallel_size: 2 does not divide the fp8"):
    check_experts(blocks, 2, expert_parallel=False)
  check_experts(blocks, 2, expert_parallel=True)


def _mesh_of(size: int) -> jax.sharding.AbstractMesh:
  return jax.sharding.AbstractMesh((size,), ("model",))


def _one_device_mesh() -> jax.sharding.Mesh:
  return jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))


def _quantized_specs(quantization: str) -> dict[str, P]:
  """layer 0's PartitionSpecs, by "module/.../leaf", of a quantized tiny-random tree (the specs
  name the axis; a mesh of one device divides every dimension)."""
  config = tiny_random_config().replace(quantization=quantization, attention_bias=True)
  shardings = param_shardings(param_shapes(config), _one_device_mesh())
  return {
    "/".join(str(k.key) for k in path[1:]): sharding.spec
    for path, sharding in jax.tree_util.tree_leaves_with_path(shardings)
    if path[0].key == "layers_0"
  }


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_quantized_kernels_shard_their_channels_and_scales_follow(quantization):
  """A quantized kernel is [out, in]: q/k/v and gate/up split out (axis 0) with their scales
  and biases; o and down split in (axis 1) and keep every scale (their out is not split)."""
  specs = _quantized_specs(quantization)
  split_out, split_in = P("model", None), P(None, "model")
  for name in ("q_proj", "k_proj", "v_proj"):
    assert specs[f"self_attn/{name}/kernel"] == split_out
    assert specs[f"self_attn/{name}/scale"] == specs[f"self_attn/{name}/bias"] == P("model")
  for name in ("gate_proj", "up_proj"):
    assert specs[f"mlp/{name}/kernel"] == split_out and specs[f"mlp/{name}/scale"] == P("model")
  assert specs["self_attn/o_proj/kernel"] == specs["mlp/down_proj/kernel"] == split_in
  assert specs["self_attn/o_proj/scale"] == specs["mlp/down_proj/scale"] == P()
  assert specs["input_layernorm/scale"] == P()  # a norm's scale is no projection's


def test_the_rules_tell_a_quantized_kernel_by_its_scale_not_its_shape():
  """A square kernel reads the same either way: only its projection's `scale` leaf says it is
  [out, in] (shard axis 0) and not flax's [in, out] (shard axis 1)."""
  tree = {
    "layers_0": {
      "self_attn": {
        "q_proj": {"kernel": jax.ShapeDtypeStruct((8, 8), np.int8)},
        "k_proj": {
          "kernel": jax.ShapeDtypeStruct((8, 8), np.int8),
          "scale": jax.ShapeDtypeStruct((8,), np.float32),
        },
      }
    }
  }
  shardings = param_shardings(tree, _one_device_mesh())["layers_0"]["self_attn"]
  assert shardings["q_proj"]["kernel"].spec == P(None, "model")  # float rule: [in, out]
  assert shardings["k_proj"]["kernel"].spec == P("model", None)
  assert shardings["k_proj"]["scale"].spec == P("model")


def test_a_merged_projection_has_no_rule_quantized_or_not():
  with pytest.raises(ValueError, match="no partition rule matches 'layers_0/self_attn/qkv_proj"):
    param_spec(("layers_0", "self_attn", "qkv_proj", "kernel"), (24, 8), 2, quantized=True)


def test_a_dimension_the_mesh_does_not_divide_is_replicated():
  assert param_spec(("embed_tokens", "embedding"), (32001, 64), 8) == P(None, None)
  assert param_spec(("lm_head", "kernel"), (64, 32001), 8) == P(None, None)


def test_vocab_weights_are_replicated_when_not_sharding_the_vocabulary():
  assert param_spec(("embed_tokens", "embedding"), (512, 64), 4, shard_vocab=False) == P()
  assert param_spec(("lm_head", "kernel"), (64, 512), 4, shard_vocab=False) == P()
  assert param_spec(("layers_0", "mlp", "down_proj", "kernel"), (32, 8), 4, shard_vocab=False) == P(
    "model", None
  )


def test_unknown_param_and_indivisible_heads_are_refused():
  with pytest.raises(ValueError, match="no partition rule matches 'layers_0/mystery/kernel'"):
    param_spec(("layers_0", "mystery", "kernel"), (4, 4), 2)
  config = tiny_random_config()  # 4 q heads, 2 kv heads
  check_tensor_parallel(config, 2)
  check_tensor_parallel(config, 4)  # each kv head on two devices
  with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide the model's 2 kv"):
    check_tensor_parallel(config, 3)
  with pytest.raises(ValueError, match="tensor_parallel_size: 8 does not divide .* 4 query"):
    check_tensor_parallel(config, 8)


def test_fewer_kv_heads_than_devices_are_repeated_head_by_head():
  config = tiny_random_config()  # 4 q heads, 2 kv heads
  assert kv_head_replicas(config, 2) == 1 and with_replicated_kv_heads(config, 2) == config
  assert kv_head_replicas(config, 4) == 2
  assert with_replicated_kv_heads(config, 4) == config.replace(num_kv_heads=4)
  # two heads of D = 2 on the columns of a [1, 4] kernel: a b | c d -> a b | a b | c d | c d
  kernel = np.array([[1.0, 2.0, 3.0, 4.0]])
  repeated = repeat_heads(jax.numpy.asarray(kernel), axis=1, num_heads=2, replicas=2)
  np.testing.assert_array_equal(repeated, [[1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]])
  rows = repeat_heads(jax.numpy.asarray(kernel.T), axis=0, num_heads=2, replicas=2)
  np.testing.assert_array_equal(rows[:, 0], [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0])


def test_step_inputs_round_trip_through_the_codec():
  runner = build_device(
    small_config(
      max_model_len=64,
      num_pages=8,
      max_num_seqs=4,
      max_tokens_per_step=16,
      seq_buckets=(4,),
      token_buckets=(16,),
    )
  ).runner
  inputs = dummy_inputs(runner, Bucket(4, 16))
  rng = np.random.default_rng(0)
  inputs = jax.tree.map(
    lambda x: (
      x
      if isinstance(x, jax.Array)
      else (rng.integers(0, 100, x.shape).astype(x.dtype) if x.dtype != bool else np.asarray(True))
    ),
    inputs,
  )
  constants = []

  def constant(shape, dtype, value):
    constants.append((shape, dtype, value))
    return np.full(shape, value, dtype)

  decoded = decode_step_inputs(StepEncoder().encode(inputs), inputs, constant)
  assert jax.tree.structure(decoded) == jax.tree.structure(inputs)
  for ours, theirs in zip(jax.tree.leaves(decoded), jax.tree.leaves(inputs), strict=True):
    theirs = np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)
  # no previous samples (the largest seq bucket's zeros), the two penalty histories, the logit
  # bias (no ids, zero values), then the all-ones token bitmask (512 tokens: 16 words)
  assert constants == (
    [((4,), np.dtype(np.int32), 0)]
    + [((4, 64), np.dtype(np.int32), -1)] * 2
    + [((4, 300), np.dtype(np.int32), -1), ((4, 300), np.dtype(np.float32), 0)]
    + [((4, 16), np.dtype(np.int32), -1)]
  )
