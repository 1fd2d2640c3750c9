"""The partition rules and the step codec on their own (no mesh needed): every param of a model
has a rule, odd dimensions fall back to replication, unknown params and indivisible head counts are
refused by name, and step inputs survive the trip to another host bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxserve.assembly import build_device
from jaxserve.device.lowering import dummy_inputs
from jaxserve.messages.buckets import Bucket
from jaxserve.models.tiny_random import tiny_random_config
from jaxserve.models.weights import hf_tensor_specs
from jaxserve.parallel.mesh import check_tensor_parallel
from jaxserve.parallel.partition_rules import param_spec
from jaxserve.parallel.step_codec import StepEncoder, decode_step_inputs
from tests.integration.engine_helpers import small_config


def test_every_param_has_a_rule_and_sharded_dims_divide():
  config = tiny_random_config().replace(attention_bias=True, qk_norm=True)
  for spec in hf_tensor_specs(config):
    partition = param_spec(spec.path, spec.shape, 2)
    for dim, axis in zip(spec.shape, partition):
      assert axis is None or dim % 2 == 0, spec.path


def test_rules_by_name():
  assert param_spec(("layers_0", "self_attn", "q_proj", "kernel"), (8, 16), 4) == P(None, "model")
  assert param_spec(("layers_3", "self_attn", "k_proj", "bias"), (16,), 4) == P("model")
  assert param_spec(("layers_0", "self_attn", "o_proj", "kernel"), (16, 8), 4) == P("model", None)
  assert param_spec(("layers_0", "mlp", "down_proj", "kernel"), (32, 8), 4) == P("model", None)
  assert param_spec(("layers_0", "self_attn", "q_norm", "scale"), (16,), 4) == P()
  assert param_spec(("lm_head", "kernel"), (8, 512), 4) == P(None, "model")


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
  with pytest.raises(ValueError, match="tensor_parallel_size: 4 does not divide the model's 2 kv"):
    check_tensor_parallel(config, 4)


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
  for ours, theirs in zip(jax.tree.leaves(decoded), jax.tree.leaves(inputs)):
    theirs = np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)
  # no previous samples (the largest seq bucket's zeros), the two penalty histories, then the
  # all-ones token bitmask (512 tokens: 16 words)
  assert constants == (
    [((4,), np.dtype(np.int32), 0)]
    + [((4, 64), np.dtype(np.int32), -1)] * 2
    + [((4, 16), np.dtype(np.int32), -1)]
  )
