"""The mixture-of-experts fields of ModelConfig (models/moe_config.py): the published Qwen3-30B-A3B
and Mixtral-8x7B config.json files, what transformers 5 writes, and every refusal naming its
field."""

from __future__ import annotations

import json
import math

import jax
import pytest

from jaxserve.composition.assembly import build_engine
from jaxserve.models.families import family_of
from jaxserve.models.hf_config import model_config_from_hf
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.weights import param_shapes
from tests.integration.engine_helpers import small_config

# config.json of Qwen/Qwen3-30B-A3B and mistralai/Mixtral-8x7B-v0.1 on the Hugging Face hub
QWEN3_30B_A3B = {
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": False,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": True,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": False,
  "rms_norm_eps": 1e-06,
  "rope_scaling": None,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": None,
  "tie_word_embeddings": False,
  "torch_dtype": "bfloat16",
  "use_sliding_window": False,
  "vocab_size": 151936,
}
MIXTRAL_8X7B = {
  "architectures": ["MixtralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": False,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": None,
  "tie_word_embeddings": False,
  "torch_dtype": "bfloat16",
  "vocab_size": 32000,
}


def _num_params(config: ModelConfig) -> int:
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(param_shapes(config)))


def test_qwen3_30b_a3b():
  c = model_config_from_hf(QWEN3_30B_A3B)
  assert (c.architecture, c.num_experts, c.num_experts_per_tok) == ("qwen3_moe", 128, 8)
  assert (c.moe_intermediate_size, c.norm_topk_prob, c.qk_norm) == (768, True, True)
  assert c.sliding_window is None and c.dtype == "bfloat16"
  assert round(_num_params(c) / 1e9, 1) == 30.5  # the model card's parameter count


def test_mixtral_8x7b():
  c = model_config_from_hf(MIXTRAL_8X7B)
  assert (c.architecture, c.num_experts, c.num_experts_per_tok) == ("mixtral", 8, 2)
  assert (c.moe_intermediate_size, c.norm_topk_prob, c.qk_norm) == (14336, True, False)
  assert c.sliding_window is None
  assert _num_params(c) == 46_702_792_704  # Mixtral-8x7B's published parameter count


def test_what_transformers_writes(hf_checkpoint):
  """transformers 5 names the expert count num_local_experts for both families."""
  for family, top_k, normalize in (("qwen3_moe", 4, False), ("mixtral", 2, True)):
    d = json.loads((hf_checkpoint(family) / "config.json").read_text())
    assert "num_local_experts" in d
    c = model_config_from_hf(d)
    assert (c.num_experts, c.num_experts_per_tok, c.norm_topk_prob) == (8, top_k, normalize)
    assert c.moe_intermediate_size == 64


@pytest.mark.parametrize(
  "changes, match",
  [
    ({"mlp_only_layers": [48]}, "mlp_only_layers"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ({"num_local_experts": 64}, "num_experts: expected one expert count"),
    ({"num_experts": None}, "num_experts"),
    ({"num_experts_per_tok": 129}, "num_experts_per_tok: must not exceed"),
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size"),
  ],
)
def test_refusals(changes, match):
  with pytest.raises(ValueError, match=match):
    model_config_from_hf({**QWEN3_30B_A3B, **changes})


def test_unsupported_switches_name_their_field():
  config = model_config_from_hf(MIXTRAL_8X7B)
  with pytest.raises(ValueError, match="^batch_invariant: .*mixture-of-experts"):
    config.replace(batch_invariant=True)
  assert config.replace(quantization="fp8").quantization == "fp8"
  with pytest.raises(ValueError, match="^block_fp8_experts: needs a mixture of experts"):
    model_config_from_hf({**MIXTRAL_8X7B, "architectures": ["MistralForCausalLM"]}).replace(
      block_fp8_experts=True
    )
  with pytest.raises(ValueError, match=r"^block_fp8_experts: needs .* multiples of 128"):
    config.replace(moe_intermediate_size=14400, block_fp8_experts=True)
  with pytest.raises(ValueError, match="^block_fp8_experts: .*tp_invariant_reductions"):
    config.replace(block_fp8_experts=True, tp_invariant_reductions=True)


@pytest.mark.parametrize(
  "quantization, blocks, want",
  [
    ("none", False, "none"),
    ("fp8", False, "fp8_channel"),  # quantized on load, or compressed-tensors' stored fp8
    ("fp8_w8a16", False, "none"),  # weight-only and int8 schemes: attention only
    ("int8_w8a8", False, "none"),
    ("none", True, "fp8_block"),  # a block-wise fp8 checkpoint keeps its blocks ...
    ("fp8", True, "fp8_block"),  # ... whatever the attention runs
  ],
)
def test_which_experts_run_in_fp8(quantization, blocks, want):
  config = model_config_from_hf(QWEN3_30B_A3B)
  config = config.replace(quantization=quantization, block_fp8_experts=blocks)
  assert config.expert_quantization == want
  experts = param_shapes(config)["layers_0"]["mlp"]["experts"]
  if want == "none":
    assert experts["down_proj"].shape == (128, 768, 2048) and "down_proj_scale" not in experts
  else:  # [E, out, in] e4m3, scales per channel or per 128 x 128 block
    assert experts["down_proj"].shape == (128, 2048, 768)
    assert experts["down_proj"].dtype == jax.numpy.float8_e4m3fn
    scale = (128, 16, 6) if blocks else (128, 2048)
    assert experts["down_proj_scale"].shape == scale


def test_dense_architectures_keep_zero_experts():
  config = model_config_from_hf({**MIXTRAL_8X7B, "architectures": ["MistralForCausalLM"]})
  assert config.num_experts == 0
  experts = config.replace(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)
  with pytest.raises(ValueError, match="num_experts: must be 0 for mistral"):
    family_of(experts)


def test_engine_refuses_batch_invariant_for_a_mixture_of_experts(hf_checkpoint):
  config = small_config(str(hf_checkpoint("mixtral")), batch_invariant=True)
  with pytest.raises(ValueError, match="^batch_invariant: .*mixture-of-experts"):
    build_engine(config, show_progress=False)
