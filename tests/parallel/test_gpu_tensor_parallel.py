"""On 2+ GPUs: with the Pallas GPU kernel running per shard under shard_map, tensor parallelism
over 2 GPUs gives the unsharded engine's greedy tokens (and transformers'); in bfloat16 with
tp_invariant_reductions, bitwise its prompt logprobs too. Skipped elsewhere."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tests.integration.engine_helpers import generate_and_score, hf_greedy
from tests.models.hf_checkpoints import TP_FAMILIES, load_hf_model
from tests.parallel.mesh.conftest import tp_engine
from tests.parallel.mesh.test_expert_parallel import assert_two_devices_bitwise_one
from tests.parallel.mesh.test_tp_invariance import _generate, checkpoint  # noqa: F401, F811 (fixture)
from tests.parallel.mesh.test_tp_parity import NUM_NEW_TOKENS, _prompts

pytestmark = pytest.mark.skipif(
  jax.default_backend() != "gpu" or jax.device_count() < 2, reason="needs 2 GPUs"
)


@pytest.mark.parametrize("family", TP_FAMILIES)
def test_pallas_gpu_tensor_parallel_matches_unsharded(family, hf_checkpoint):
  checkpoint = hf_checkpoint(family)
  prompts = _prompts(seed=TP_FAMILIES.index(family))
  with jax.default_matmul_precision("highest"):
    results = {
      tp: generate_and_score(
        tp_engine(checkpoint, tp, attention_backend="pallas_gpu"), prompts, NUM_NEW_TOKENS
      )
      for tp in (1, 2)
    }
  assert results[2][0] == results[1][0]
  hf_model = load_hf_model(checkpoint)
  assert results[1][0] == [hf_greedy(hf_model, p, NUM_NEW_TOKENS) for p in prompts]


def test_pallas_gpu_bfloat16_tp2_is_bitwise_tp1_with_invariant_reductions(checkpoint):
  tokens_1, logprobs_1 = _generate(checkpoint, 1, invariant=True, attention_backend="pallas_gpu")
  tokens_2, logprobs_2 = _generate(checkpoint, 2, invariant=True, attention_backend="pallas_gpu")
  assert tokens_2 == tokens_1
  np.testing.assert_array_equal(logprobs_2.view(np.int32), logprobs_1.view(np.int32))


@pytest.mark.parametrize(
  "family, expert_parallel",
  [
    ("qwen3", False),
    ("qwen3_moe", False),
    ("qwen3_moe", True),
    ("mixtral", False),
    ("mixtral", True),
  ],
)
def test_pallas_gpu_bfloat16_families_tp2_bitwise_tp1_with_invariant_reductions(
  family, expert_parallel, hf_checkpoint
):
  """QK-norm (Qwen3) and the experts' grouped matmuls through the Pallas kernel, split by
  intermediate column and by expert (models/invariant_experts.py)."""
  assert_two_devices_bitwise_one(
    hf_checkpoint(family, dtype="bfloat16"), expert_parallel, "pallas_gpu", seed=11
  )
