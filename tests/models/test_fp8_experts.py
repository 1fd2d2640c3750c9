"""fp8 experts (models/fp8_experts.py) on the CPU: loaded from a block-wise fp8 checkpoint (kept in
e4m3 with their 128 x 128 scales) and quantized per channel by `--quantization fp8` on a float
checkpoint, then run W8A8, against twins whose weights are those fp8 weights dequantized.

The twins. Block-wise: transformers' dequantization of the same checkpoint
(tests/models/block_fp8_checkpoints.write_dequantized: float(q) * scale per block, in torch), so
attention and routers are bitwise the same in both and the only difference is the experts'
activation quantization (e4m3 per token and 128 of K). Per channel: the fp8 model's own
attention (fp8 weights, run weight-only: fp8_w8a16) and its experts dequantized to float32
(weight * scale), their weights checked against the numpy quantizer first; the differences are
the activations' quantization in attention and experts.

The tolerance. An e4m3 rounding is off by at most 2**-4 of the value (3 mantissa bits), the error
of a dot product of K such values about 2**-4 / sqrt(3) of its root-mean-square term times
sqrt(K), i.e. a few percent of a projection's output; through two layers of a tiny random
model that moves log-probs by a few hundredths (observed max below 0.05), so LOGPROB_TOLERANCE
= 0.15 holds with margin and greedy tokens must agree wherever the twin's top-1 leads its top-2
by more than twice that. The drift must also be nonzero (the activations really are quantized)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.torch
import torch

from jaxserve.attention import get_attention_backend
from jaxserve.models import causal_lm
from jaxserve.models.weights import load_hf_config, load_hf_params
from jaxserve.quantization import reference
from jaxserve.quantization.scheme import SCHEMES
from tests.models.block_fp8_checkpoints import write_block_fp8, write_dequantized
from tests.models.hf_checkpoints import VOCAB_SIZE, build_hf_checkpoint
from tests.models.paged_batch import Chunk, build_step, model_kv

PAGE_SIZE, NUM_PAGES, PAGES_PER_SEQ, NUM_TOKENS = 4, 8, 6, 24
PROMPT, NEW_TOKENS = 8, 12
LOGPROB_TOLERANCE = 0.15
E4M3 = ml_dtypes.float8_e4m3fn
HF_NAMES = {"qwen3_moe": ("mlp", "down_proj"), "mixtral": ("block_sparse_moe", "w2")}


class Greedy:
  """A config's model (reference attention) and params, greedy-decoding one sequence by full
  prefills of the growing sequence (one compiled program)."""

  def __init__(self, config, params):
    self.config, self.params = config, params
    model = causal_lm(config, get_attention_backend("reference"), None, None)

    def step(params, kv, token_ids, positions, slots, metadata):
      hidden, _ = model.apply({"params": params}, token_ids, positions, kv, slots, metadata)
      logits = model.apply({"params": params}, hidden, method=type(model).compute_logits)
      return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)

    self.step = jax.jit(step)

  def logprobs(self, tokens: list[int]) -> np.ndarray:
    """float64 [V]: the next token's log-probs after `tokens`."""
    kv, groups = model_kv(self.config, NUM_PAGES, PAGE_SIZE)
    arrays = build_step(
      [Chunk(tokens, 0, list(range(1, 1 + PAGES_PER_SEQ)))],
      page_size=PAGE_SIZE,
      num_tokens=NUM_TOKENS,
      num_seq_slots=1,
      pages_per_seq=PAGES_PER_SEQ,
      num_groups=groups,
      group_stride=NUM_PAGES,
    )
    out = self.step(
      self.params, kv, arrays.token_ids, arrays.positions, arrays.slot_mapping, arrays.metadata
    )
    return np.asarray(out, np.float64)[arrays.offsets[0] + len(tokens) - 1]

  def generate(self, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    tokens, steps = list(prompt), []
    for _ in range(n):
      steps.append(self.logprobs(tokens))
      tokens.append(int(np.argmax(steps[-1])))
    return tokens[len(prompt) :], steps


def _assert_twins_agree(fp8: Greedy, twin: Greedy, seed: int) -> None:
  """Greedy tokens equal while the twin's margin allows; log-probs within the tolerance on the
  common prefix, and not identical (the activations are quantized)."""
  prompt = np.random.default_rng(seed).integers(0, VOCAB_SIZE, PROMPT).tolist()
  want, twin_steps = twin.generate(prompt, NEW_TOKENS)
  got, fp8_steps = fp8.generate(prompt, NEW_TOKENS)
  checked, drift = 0, 0.0
  for i, (a, b) in enumerate(zip(fp8_steps, twin_steps, strict=True)):
    drift = max(drift, float(np.abs(a - b).max()))
    assert np.abs(a - b).max() < LOGPROB_TOLERANCE, f"token {i}: {np.abs(a - b).max()}"
    top2 = np.sort(b)[-2:]
    if top2[1] - top2[0] <= 2 * LOGPROB_TOLERANCE:
      break  # too close to call: the sequences may part here
    assert got[i] == want[i], f"token {i}: {got[i]} != {want[i]} (margin {top2[1] - top2[0]})"
    checked += 1
  print(f"{checked} tokens checked, max |logprob drift| {drift:.4f}")
  assert checked >= 3 and drift > 1e-5


@pytest.fixture(scope="module")
def block_moe(tmp_path_factory):
  """A Qwen3-MoE with H = I = 128 (whole blocks) as a block-wise fp8 checkpoint, and its twin."""
  root = tmp_path_factory.mktemp("fp8_experts")
  source = build_hf_checkpoint(
    "qwen3_moe", root / "float", seed=3, overrides={"moe_intermediate_size": 128}
  )
  stored = write_block_fp8(source, root / "fp8")
  return stored, write_dequantized(stored, root / "dequantized")


def test_block_fp8_experts_load_as_stored(block_moe):
  """The experts' params are the checkpoint's e4m3 bytes and weight_scale_inv, stacked [E, out,
  in] / [E, out/128, in/128]; their dequantization is transformers' (write_dequantized)."""
  stored, dequantized = block_moe
  config = load_hf_config(stored)
  assert config.block_fp8_experts and config.expert_quantization == "fp8_block"
  assert config.quantization == "none"  # attention loads dequantized, as before
  experts = load_hf_params(stored, config)["layers_1"]["mlp"]["experts"]
  hf = safetensors.torch.load_file(stored / "model.safetensors")
  twin = safetensors.torch.load_file(dequantized / "model.safetensors")
  weight, scale = np.asarray(experts["down_proj"]), np.asarray(experts["down_proj_scale"])
  assert weight.dtype == E4M3 and weight.shape == (8, 128, 128) and scale.shape == (8, 1, 1)
  for j in (0, 5):
    name = f"model.layers.1.mlp.experts.{j}.down_proj"
    raw = hf[name + ".weight"].view(dtype=torch.uint8).numpy()
    np.testing.assert_array_equal(weight[j].view(np.uint8), raw)
    np.testing.assert_array_equal(scale[j], hf[name + ".weight_scale_inv"].numpy())
    np.testing.assert_array_equal(
      weight[j].astype(np.float32) * scale[j, 0, 0], twin[name + ".weight"].numpy()
    )


def test_block_fp8_moe_matches_its_dequantized_twin(block_moe):
  stored, dequantized = block_moe
  config = load_hf_config(stored)
  twin_config = load_hf_config(dequantized)
  assert twin_config.expert_quantization == "none"
  fp8 = Greedy(config, load_hf_params(stored, config))
  twin = Greedy(twin_config, load_hf_params(dequantized, twin_config))
  _assert_twins_agree(fp8, twin, seed=0)


def _dequantized_twin(config, params) -> tuple:
  """The per-channel fp8 model's twin: attention as stored (run fp8_w8a16), experts
  weight * scale as float32 [E, in, out]."""
  twin = jax.tree.map(lambda x: x, params)
  for layer in twin.values():
    experts = layer.get("mlp", {}).get("experts") if isinstance(layer, dict) else None
    if experts is None:
      continue
    for name in ("gate_proj", "up_proj", "down_proj"):
      w = np.asarray(experts.pop(name)).astype(np.float32)  # [E, out, in]
      s = np.asarray(experts.pop(name + "_scale"))  # [E, out]
      experts[name] = jnp.asarray(np.swapaxes(w * s[:, :, None], 1, 2))
  return config.replace(quantization="fp8_w8a16"), twin


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_quantization_fp8_runs_the_experts_in_fp8(hf_checkpoint, family):
  """`--quantization fp8` on a float MoE checkpoint: every expert quantized per channel as the
  numpy reference quantizes a dense projection, and greedy tokens of the W8A8 model equal its
  dequantized twin's where margins allow."""
  path = hf_checkpoint(family)
  config = load_hf_config(path).replace(quantization="fp8")
  assert config.expert_quantization == "fp8_channel"
  params = load_hf_params(path, config)
  module, projection = HF_NAMES[family]
  hf = safetensors.torch.load_file(path / "model.safetensors")
  experts = params["layers_0"]["mlp"]["experts"]
  want_q, want_scale = reference.quantize_weight(
    hf[f"model.layers.0.{module}.experts.3.{projection}.weight"].numpy(), SCHEMES["fp8"]
  )
  got_q = np.asarray(experts["down_proj"][3])
  np.testing.assert_array_equal(got_q.view(np.uint8), want_q.view(np.uint8))
  np.testing.assert_array_equal(np.asarray(experts["down_proj_scale"][3]), want_scale)
  fp8 = Greedy(config, params)
  twin = Greedy(*_dequantized_twin(config, params))
  _assert_twins_agree(fp8, twin, seed=1)
