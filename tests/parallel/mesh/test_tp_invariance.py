"""tp_invariant_reductions: in bfloat16 the engine at tp = 2 returns bitwise the prompt logprobs and
exactly the greedy tokens of the unsharded engine; without the switch it does not (two bfloat16
partial sums added in the all-reduce round differently from the unsharded dot).

Two random Llamas: a 256-wide one with 8 kv heads, and a 512-wide one with 2 kv heads whose k/v
projections [512, 128] shrink from 64K to 32K elements per device, where XLA:CPU's GEMM switches
kernels: the unsharded invariant model computes them as two column groups, so it runs the
per-device kernel too."""

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
SHAPES = {"hidden256_kv8": (256, 8), "hidden512_kv2": (512, 2)}  # (hidden, kv heads of 64)


@pytest.fixture(scope="module", params=sorted(SHAPES))
def checkpoint(request, tmp_path_factory):
  """llama_kv8's tokenizer with a wider random Llama (8 heads of 64, 2 layers)."""
  hidden, num_kv_heads = SHAPES[request.param]
  out_dir = build_hf_checkpoint("llama_kv8", tmp_path_factory.mktemp(request.param))
  base = transformers.AutoConfig.from_pretrained(out_dir)
  config = transformers.LlamaConfig(
    vocab_size=VOCAB_SIZE,
    hidden_size=hidden,
    intermediate_size=2 * hidden,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=num_kv_heads,
    head_dim=64,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=base.bos_token_id,
    eos_token_id=base.eos_token_id,
  )
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


def _generate(
  checkpoint, tp: int, invariant: bool, attention_backend: str = "xla"
) -> tuple[list[list[int]], np.ndarray]:
  rng = np.random.default_rng(7)
  prompts = [rng.integers(4, TOKENIZER_VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]
  engine = tp_engine(
    checkpoint, tp, attention_backend, dtype="bfloat16", tp_invariant_reductions=invariant
  )
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
