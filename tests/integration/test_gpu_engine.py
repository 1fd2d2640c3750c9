"""On a GPU: the engine with the Pallas kernel gives the same greedy tokens as with the XLA path,
and as transformers, for the parity checkpoints. Skipped where JAX has no GPU."""

from __future__ import annotations

import jax
import pytest

from jaxserve.api.sampling_params import SamplingParams
from tests.integration.engine_helpers import hf_greedy, run_to_completion, small_engine
from tests.integration.test_hf_parity import NUM_NEW_TOKENS, _prompts
from tests.models.hf_checkpoints import FAMILIES, load_hf_model

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")


def _greedy_tokens(checkpoint, backend: str, prompts) -> list[tuple[int, ...]]:
  engine = small_engine(
    str(checkpoint),
    max_model_len=128,
    max_tokens_per_step=32,
    token_buckets=(8, 16, 32),
    attention_backend=backend,
  )
  params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
  for i, prompt in enumerate(prompts):
    engine.add_request(prompt, params, request_id=f"gen-{i}")
  finished = run_to_completion(engine)
  return [finished[f"gen-{i}"].token_ids for i in range(len(prompts))]


@pytest.mark.parametrize("family", FAMILIES)
def test_pallas_gpu_engine_matches_xla_path_and_transformers(family, hf_checkpoint):
  checkpoint = hf_checkpoint(family)
  prompts = _prompts(seed=FAMILIES.index(family))
  with jax.default_matmul_precision("highest"):
    pallas = _greedy_tokens(checkpoint, "pallas_gpu", prompts)
    xla = _greedy_tokens(checkpoint, "xla", prompts)
  assert pallas == xla
  hf_model = load_hf_model(checkpoint)
  assert [list(t) for t in pallas] == [hf_greedy(hf_model, p, NUM_NEW_TOKENS) for p in prompts]
