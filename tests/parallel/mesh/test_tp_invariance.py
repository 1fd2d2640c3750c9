"""tp_invariant_reductions: in bfloat16 the engine at tp = 2 returns bitwise the prompt logprobs and
exactly the greedy tokens of the unsharded engine; without the switch it does not (two bfloat16
partial sums added in the all-reduce round differently from the unsharded dot).

The checkpoint is a 256-wide Llama: XLA:CPU's GEMM switches kernels when a weight shrinks from
64K to 32K elements (as 128-wide k/v projections do when halved), which changes the columns of a
column-parallel projection; every weight here, whole or halved, stays on one side of that."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tests.integration.engine_helpers import generate_and_score
from tests.models.hf_checkpoints import TOKENIZER_VOCAB_SIZE, VOCAB_SIZE, build_hf_checkpoint
from tests.parallel.mesh.conftest import tp_engine

NUM_NEW_TOKENS = 16
PROMPT_LENGTHS = (5, 19, 40)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """llama_kv8's tokenizer with a wider random Llama (hidden 256, 8 heads of 64, 8 kv heads)."""
  out_dir = build_hf_checkpoint("llama_kv8", tmp_path_factory.mktemp("llama_wide"))
  base = transformers.AutoConfig.from_pretrained(out_dir)
  config = transformers.LlamaConfig(
      vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
      num_attention_heads=8, num_key_value_heads=8, head_dim=64, max_position_embeddings=256,
      rms_norm_eps=1e-5, bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(config)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if name.endswith("norm.weight"):
        param.copy_(1.0 + 0.2 * torch.randn_like(param))
      elif "embed_tokens" in name:
        param.copy_(0.25 * torch.randn_like(param))
      else:  # Linear [out, in]
        param.copy_(torch.randn_like(param) / param.shape[1] ** 0.5)
  model.save_pretrained(out_dir, safe_serialization=True)
  return out_dir


def _generate(checkpoint, tp: int, invariant: bool) -> tuple[list[list[int]], np.ndarray]:
  rng = np.random.default_rng(7)
  prompts = [rng.integers(4, TOKENIZER_VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]
  engine = tp_engine(checkpoint, tp, dtype="bfloat16", tp_invariant_reductions=invariant)
  assert engine.runner.model.config.tp_invariant_reductions is invariant
  tokens, logprobs = generate_and_score(engine, prompts, NUM_NEW_TOKENS)
  return tokens, np.concatenate(logprobs).astype(np.float32)


def test_bfloat16_tp2_is_bitwise_tp1_with_invariant_reductions(checkpoint):
  tokens_1, logprobs_1 = _generate(checkpoint, 1, invariant=True)
  tokens_2, logprobs_2 = _generate(checkpoint, 2, invariant=True)
  assert tokens_2 == tokens_1
  np.testing.assert_array_equal(logprobs_2.view(np.int32), logprobs_1.view(np.int32))


def test_bfloat16_tp2_differs_from_tp1_without_invariant_reductions(checkpoint):
  _, logprobs_1 = _generate(checkpoint, 1, invariant=False)
  _, logprobs_2 = _generate(checkpoint, 2, invariant=False)
  assert not np.array_equal(logprobs_2, logprobs_1)
  np.testing.assert_allclose(logprobs_2, logprobs_1, atol=0.2, rtol=0)
