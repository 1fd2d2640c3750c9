"""Mixtures of experts on a mesh: expert parallelism (whole experts per device, attention and KV
pages still split by head over the same devices) and tensor parallelism (each expert's
intermediate dimension split) give the unsharded engine's greedy tokens, and the stacked experts
are laid out by their rules."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxserve.composition.assembly import build_engine
from jaxserve.models.weights import load_hf_config, load_hf_params
from tests.integration.engine_helpers import generate_and_score, small_config
from tests.models.hf_checkpoints import TOKENIZER_VOCAB_SIZE
from tests.parallel.mesh.conftest import tp_engine

NUM_NEW_TOKENS = 12
PROMPT_LENGTHS = (3, 17, 41)


def _prompts(seed: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [rng.integers(4, TOKENIZER_VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]


# layout -> (tensor_parallel_size, enable_expert_parallel); the checkpoint has 2 kv heads, so at
# 4 devices each is repeated on two (partition_rules.with_replicated_kv_heads)
LAYOUTS = {"ep2": (2, True), "tp2": (2, False), "ep4": (4, True)}


def test_expert_and_tensor_parallel_tokens_equal_one_devices(hf_checkpoint, engine_for):
  """Mixtral's 8 experts, 4 per device at ep2 and 2 at ep4 (with replicated kv heads); each
  expert's intermediate dimension halved at tp2 (the layout of any MoE at tensor_parallel_size
  > 1 without the flag)."""
  checkpoint = hf_checkpoint("mixtral")
  prompts = _prompts(seed=3)
  tokens, logprobs = generate_and_score(engine_for(checkpoint, 1), prompts, NUM_NEW_TOKENS)
  for name, (size, expert_parallel) in LAYOUTS.items():
    engine = tp_engine(checkpoint, size, enable_expert_parallel=expert_parallel)
    sharded_tokens, sharded_logprobs = generate_and_score(engine, prompts, NUM_NEW_TOKENS)
    assert sharded_tokens == tokens, name
    for ours, reference in zip(sharded_logprobs, logprobs, strict=True):
      np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=0, err_msg=name)


def test_dense_layers_among_the_experts_at_ep2(hf_checkpoint, engine_for):
  """Qwen3-MoE with decoder_sparse_step 2 (layers 0 and 2 dense): at ep2 the sparse layer's
  experts are split by expert and the dense layers' MLP by its intermediate dimension, as a dense
  model's; the greedy tokens are one device's."""
  checkpoint = hf_checkpoint("qwen3_moe_step2")
  prompts = _prompts(seed=5)
  tokens, logprobs = generate_and_score(engine_for(checkpoint, 1), prompts, NUM_NEW_TOKENS)
  engine = tp_engine(checkpoint, 2, enable_expert_parallel=True)
  sharded_tokens, sharded_logprobs = generate_and_score(engine, prompts, NUM_NEW_TOKENS)
  assert sharded_tokens == tokens
  for ours, reference in zip(sharded_logprobs, logprobs, strict=True):
    np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=0)
  params = engine.runner.params
  gate = params["layers_0"]["mlp"]["gate_proj"]["kernel"]  # [H, I]
  assert {s.data.shape for s in gate.addressable_shards} == {(gate.shape[0], gate.shape[1] // 2)}
  experts = params["layers_1"]["mlp"]["experts"]["gate_proj"]  # [E, H, I]
  assert {s.data.shape[0] for s in experts.addressable_shards} == {experts.shape[0] // 2}


def test_expert_parallel_splits_experts_on_e_and_attention_on_heads(hf_checkpoint):
  """Mixtral's checkpoint: 8 experts, 4 q heads and 2 kv heads of 64."""
  engine = tp_engine(hf_checkpoint("mixtral"), 2, enable_expert_parallel=True)
  layer = engine.runner.params["layers_0"]
  for name in ("gate_proj", "up_proj", "down_proj"):
    leaf = layer["mlp"]["experts"][name]
    halves = {(s.index[0].start, s.data.shape) for s in leaf.addressable_shards}
    assert halves == {(0, (4,) + leaf.shape[1:]), (4, (4,) + leaf.shape[1:])}, name
  assert layer["mlp"]["gate"]["kernel"].sharding.is_fully_replicated
  hidden = layer["self_attn"]["q_proj"]["kernel"].shape[0]
  for name, heads in (("q_proj", 4), ("k_proj", 2), ("v_proj", 2)):
    shards = layer["self_attn"][name]["kernel"].addressable_shards
    assert {s.data.shape for s in shards} == {(hidden, heads // 2 * 64)}, name
  o_shards = layer["self_attn"]["o_proj"]["kernel"].addressable_shards
  assert {s.data.shape for s in o_shards} == {(2 * 64, hidden)}
  for pages in jax.tree_util.tree_leaves(engine.runner.kv_pages):
    assert {s.data.shape[1] for s in pages.addressable_shards} == {1}  # one kv head per device


def test_four_devices_hold_one_repeated_kv_head_each(hf_checkpoint):
  """2 kv heads over 4 devices: the engine runs 4 kv heads, head n the checkpoint's head n // 2,
  so device d's k_proj columns are the checkpoint's kv head d // 2."""
  checkpoint = hf_checkpoint("mixtral")
  engine = tp_engine(checkpoint, 4, enable_expert_parallel=True)
  assert engine.runner.model.config.num_kv_heads == 4
  original = load_hf_params(checkpoint, load_hf_config(checkpoint))
  for name in ("k_proj", "v_proj"):
    whole = np.asarray(original["layers_1"]["self_attn"][name]["kernel"])  # [H, 2*64]
    leaf = engine.runner.params["layers_1"]["self_attn"][name]["kernel"]
    for shard in leaf.addressable_shards:
      device = shard.index[1].start // 64
      head = device // 2
      np.testing.assert_array_equal(np.asarray(shard.data), whole[:, head * 64 : (head + 1) * 64])
  for pages in jax.tree_util.tree_leaves(engine.runner.kv_pages):
    assert pages.shape[1] == 4 and {s.data.shape[1] for s in pages.addressable_shards} == {1}


def test_expert_parallel_refusals(hf_checkpoint):
  # attention stays tensor-parallel under expert parallelism: its heads must divide first
  # (the experts' own divisibility: tests/parallel/test_partition_rules.py)
  with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide .* 2 kv heads"):
    build_engine(
      small_config(
        str(hf_checkpoint("mixtral")), tensor_parallel_size=3, enable_expert_parallel=True
      ),
      show_progress=False,
    )
  with pytest.raises(ValueError, match="enable_expert_parallel: llama has no experts"):
    build_engine(
      small_config(
        str(hf_checkpoint("llama")), tensor_parallel_size=2, enable_expert_parallel=True
      ),
      show_progress=False,
    )


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp2", "ep2"])
def test_bfloat16_two_devices_are_bitwise_one_with_invariant_reductions(
  hf_checkpoint, expert_parallel
):
  """tp_invariant_reductions in bfloat16: one device, its experts cut as two devices cut them
  (models/invariant_experts.py), gives bitwise the prompt logprobs and exactly the greedy tokens
  of two devices, for Qwen3-MoE (8 experts, top-4, QK-norm) split by intermediate column and by
  expert."""
  assert_two_devices_bitwise_one(hf_checkpoint("qwen3_moe", dtype="bfloat16"), expert_parallel)


def assert_two_devices_bitwise_one(
  checkpoint, expert_parallel: bool, attention_backend: str = "xla", seed: int = 5
) -> None:
  """Engines at tensor_parallel_size 1 and 2 with tp_invariant_reductions, in bfloat16: the same
  greedy tokens and bitwise the same prompt logprobs (also the GPU test's check)."""
  prompts = _prompts(seed)
  results = []
  for size in (1, 2):
    engine = tp_engine(
      checkpoint,
      size,
      attention_backend,
      dtype="bfloat16",
      tp_invariant_reductions=True,
      enable_expert_parallel=expert_parallel,
    )
    tokens, logprobs = generate_and_score(engine, prompts, NUM_NEW_TOKENS)
    results.append((tokens, np.concatenate(logprobs).astype(np.float32)))
  (tokens_1, logprobs_1), (tokens_2, logprobs_2) = results
  assert tokens_2 == tokens_1
  np.testing.assert_array_equal(logprobs_2.view(np.int32), logprobs_1.view(np.int32))
