"""Qwen3-MoE configs that mix dense and MoE layers (models/families/qwen3_moe.py): which layers
are dense is transformers' own rule (its decoder layers built from the same config), bad values
are refused by field, the random checkpoint writer writes them so that transformers loads every
tensor, LLM.generate's greedy tokens equal transformers', and the weights one token reads count
a dense layer's MLP whole. (The log-prob parity is tests/models/test_hf_logits_parity.py's
test_dense_layers_among_the_experts.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers
from transformers.models.qwen3_moe import modeling_qwen3_moe

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.bench.active_weights import active_weight_bytes
from jaxserve.bench.random_checkpoint import build_random_checkpoint
from jaxserve.entrypoints.llm import LLM
from jaxserve.models.families import family_of
from jaxserve.models.hf_config import model_config_from_hf
from jaxserve.models.hf_config_json import hf_config_json
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.named_shapes import named_model_config
from jaxserve.models.weights import hf_tensor_specs, load_hf_config
from tests.integration.engine_helpers import hf_greedy, small_config
from tests.models.hf_checkpoints import TOKENIZER_VOCAB_SIZE, load_hf_model
from tests.models.test_moe_config import QWEN3_30B_A3B

TINY = dict(
  hidden_size=16,
  intermediate_size=24,
  moe_intermediate_size=8,
  num_attention_heads=2,
  num_key_value_heads=1,
  head_dim=8,
  num_experts=4,
  num_experts_per_tok=2,
  vocab_size=64,
)
SPECIAL = dict(bos_token_id=1, eos_token_id=2)


def _transformers_dense_layers(**fields) -> tuple[int, ...]:
  """The layers whose MLP transformers builds as the dense Qwen3MoeMLP."""
  config = transformers.Qwen3MoeConfig(**TINY, **fields)
  return tuple(
    i
    for i in range(config.num_hidden_layers)
    if isinstance(
      modeling_qwen3_moe.Qwen3MoeDecoderLayer(config, i).mlp, modeling_qwen3_moe.Qwen3MoeMLP
    )
  )


@pytest.mark.parametrize(
  "fields",
  [
    dict(num_hidden_layers=4),
    dict(num_hidden_layers=4, mlp_only_layers=[0]),
    dict(num_hidden_layers=5, decoder_sparse_step=2),
    dict(num_hidden_layers=6, decoder_sparse_step=3, mlp_only_layers=[2, 4]),
    dict(num_hidden_layers=3, mlp_only_layers=[2, 0]),
  ],
)
def test_dense_layers_are_the_ones_transformers_builds_dense(fields):
  config = model_config_from_hf({**QWEN3_30B_A3B, **TINY, **SPECIAL, **fields})
  assert config.dense_mlp_layers == _transformers_dense_layers(**fields)
  assert [config.is_moe_layer(i) for i in range(config.num_layers)] == [
    i not in config.dense_mlp_layers for i in range(config.num_layers)
  ]
  assert model_config_from_hf(hf_config_json(config)) == config  # written as mlp_only_layers


@pytest.mark.parametrize(
  "changes, match",
  [
    ({"mlp_only_layers": [48]}, r"mlp_only_layers: must list layer indices in \[0, 48\)"),
    ({"mlp_only_layers": [-1]}, "mlp_only_layers"),
    ({"mlp_only_layers": "0"}, "mlp_only_layers"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step: must be a positive integer, got 0"),
    ({"decoder_sparse_step": 1.5}, "decoder_sparse_step"),
  ],
)
def test_bad_values_are_refused_by_field(changes, match):
  with pytest.raises(ValueError, match=match):
    model_config_from_hf({**QWEN3_30B_A3B, **changes})


def test_model_config_checks_its_dense_layers():
  config = model_config_from_hf(QWEN3_30B_A3B)
  assert config.replace(dense_mlp_layers=[1, 3]).dense_mlp_layers == (1, 3)
  for bad in ((3, 1), (1, 1), (48,), (True,)):
    with pytest.raises(ValueError, match="dense_mlp_layers: must be distinct layer indices"):
      config.replace(dense_mlp_layers=bad)
  dense = config.replace(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0)
  with pytest.raises(ValueError, match="dense_mlp_layers: must be empty for a model without"):
    dense.replace(dense_mlp_layers=(0,))


def test_mixtral_keeps_every_layer_sparse():
  config = named_model_config("mixtral-8x7b").replace(dense_mlp_layers=(0,))
  with pytest.raises(ValueError, match="dense_mlp_layers: must be empty for mixtral"):
    family_of(config)


MIXED = ModelConfig(
  architecture="qwen3_moe",
  vocab_size=512,
  hidden_size=64,
  intermediate_size=96,
  num_layers=3,
  num_q_heads=4,
  num_kv_heads=2,
  head_dim=16,
  qk_norm=True,
  num_experts=8,
  num_experts_per_tok=2,
  moe_intermediate_size=32,
  norm_topk_prob=True,
  dense_mlp_layers=(1,),
  bos_token_id=256,
  eos_token_ids=(257,),
)


def test_random_checkpoint_of_a_mixed_config_loads_in_transformers(tmp_path):
  checkpoint = build_random_checkpoint(MIXED, tmp_path / "ckpt", seed=1)
  assert load_hf_config(checkpoint) == MIXED
  model, info = transformers.AutoModelForCausalLM.from_pretrained(
    checkpoint, dtype=torch.float32, output_loading_info=True
  )
  assert not any(info.values()), info  # no missing, unexpected or mismatched tensor
  kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
  assert kinds == ["Qwen3MoeSparseMoeBlock", "Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock"]


def test_active_weights_count_a_dense_layer_whole():
  """Layer 1's dense MLP is read whole; layers 0 and 2 read 2 of their 8 experts."""
  h, vocab = 64, 512
  attention = 2 * h * 4 * 16 + 2 * h * 2 * 16 + 2 * 16  # q, o, k, v, q/k norms
  dense = 3 * (attention + 2 * h) + 2 * h * 8 + 3 * h * 96  # + 2 routers, layer 1's MLP
  dense += h + vocab * h + h  # embedding row, lm_head, final norm
  experts = 2 * 2 * 3 * h * 32
  assert active_weight_bytes(MIXED) == 4 * (dense + experts)
  assert sum(math.prod(s.hf_shape) for s in hf_tensor_specs(MIXED)) == (
    dense - h + vocab * h + 2 * 8 * 3 * h * 32
  )


def test_llm_generate_greedy_tokens_equal_transformers(hf_checkpoint):
  """decoder_sparse_step 2 (layers 0 and 2 dense, layer 1 sparse): two layer programs."""
  checkpoint = hf_checkpoint("qwen3_moe_step2")
  config = small_config(
    str(checkpoint),
    max_model_len=128,
    max_num_seqs=2,
    max_tokens_per_step=32,
    seq_buckets=(2,),
    token_buckets=(32,),
  )
  llm = LLM(str(checkpoint), config=config, show_progress=False)
  rng = np.random.default_rng(7)
  prompts = [rng.integers(4, TOKENIZER_VOCAB_SIZE, n).tolist() for n in (9, 21)]
  params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
  results = llm.generate(prompts, params, use_tqdm=False)
  reference = load_hf_model(checkpoint)
  for prompt, result in zip(prompts, results, strict=True):
    assert list(result.outputs[0].token_ids) == hf_greedy(reference, prompt, 10)
