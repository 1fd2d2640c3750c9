"""fp8 experts (models/fp8_experts.py) on the CPU: loaded from a block-wise fp8 checkpoint (kept in
e4m3 with their 128 x 128 scales) and quantized per channel by `--quantization fp8` on a float
checkpoint, then run W8A8, against twins whose weights are those fp8 weights dequantized; and the
model's grouped matmuls over fp8 experts (each `kernel`) against the kernel's reference.

The twins differ from the fp8 models only in the experts' activations, which the fp8 model
quantizes to e4m3 and the twin does not. Block-wise: transformers' dequantization of the same
checkpoint (tests/models/block_fp8_checkpoints.write_dequantized: float(q) * scale per block, in
torch), attention and routers bitwise the same in both. Per channel: the same params (attention
W8A8 in both), the twin's experts the fp8 ones dequantized (weight * scale) through the float
grouped matmuls; the fp8 weights themselves are checked against the numpy quantizer first.

The tolerance. e4m3 keeps 3 mantissa bits: an activation rounds by up to 2**-4 of itself, a dot
product over K such values by ~2**-4 / sqrt(3) of its RMS term times sqrt(K), a few percent of
an expert's output. These tiny random models amplify any rounding (docs/DECISIONS.md: fp8 weight
rounding moves their log-probs by 0.3-0.9), so the activations' rounding moves the largest
log-prob over the vocabulary by a tenth or two (observed: 0.08-0.25); TOLERANCE = 0.3
leaves margin, and is tight enough to see the weights' own rounding (the float models the fp8
weights came from are farther than it from the twins: checked). Greedy tokens must agree
wherever the twin's top-1 leads its top-2 by more than twice the tolerance, and the fp8 model's
own greedy decode equals the twin's up to the first token too close to call. The drift must also
be nonzero: the activations really are quantized."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.torch
import torch

from jaxserve.attention import get_attention_backend
from jaxserve.models import causal_lm
from jaxserve.models.fp8_experts import Fp8Weights
from jaxserve.models.grouped_matmul import expert_ffn, grouped_matmul, grouped_swiglu
from jaxserve.models.weights import load_hf_config, load_hf_params
from jaxserve.quantization import reference
from jaxserve.quantization.scheme import SCHEMES
from pallas_kernels.grouped_matmul.reference import (
  grouped_matmul_fp8_reference,
  grouped_swiglu_fp8_reference,
)
from tests.integration.engine_helpers import generate_and_score, small_engine
from tests.models.block_fp8_checkpoints import quantize_blocks, write_block_fp8, write_dequantized
from tests.models.compressed_checkpoints import write_compressed_tensors
from tests.models.hf_checkpoints import VOCAB_SIZE, build_hf_checkpoint
from tests.models.paged_batch import Chunk, build_step, model_kv

PAGE_SIZE, NUM_PAGES, PAGES_PER_SEQ, NUM_TOKENS = 4, 8, 6, 24
PROMPT, NEW_TOKENS = 8, 12
TOLERANCE = 0.3  # the module docstring
E4M3 = ml_dtypes.float8_e4m3fn
HF_NAMES = {"qwen3_moe": ("mlp", "down_proj"), "mixtral": ("block_sparse_moe", "w2")}


class Greedy:
  """A config's model (reference attention) and params, greedy-decoding one sequence by full
  prefills of the growing sequence (one compiled program)."""

  def __init__(self, config, params, experts=None):
    self.config, self.params = config, params
    model = causal_lm(config, get_attention_backend("reference"), None, experts)

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


def _drift(a: Greedy, b: Greedy, prompt: list[int], tokens: list[int]) -> float:
  """max |log-prob of a - log-prob of b| over the vocabulary, both fed prompt + tokens."""
  return max(
    float(np.abs(a.logprobs(prompt + tokens[:i]) - b.logprobs(prompt + tokens[:i])).max())
    for i in range(len(tokens))
  )


def _assert_twins_agree(fp8: Greedy, twin: Greedy, tolerance: float, seeds=(0, 1)) -> int:
  """Per prompt, along the twin's greedy tokens (both models fed the same sequence): log-probs
  within the tolerance and not identical (the activations are quantized), the same argmax
  wherever the twin's top-1 leads its top-2 by more than twice the tolerance; and the fp8
  model's own greedy tokens equal the twin's up to the first position too close to call.
  Returns how many tokens were clear."""
  clear_tokens = 0
  for seed in seeds:
    prompt = np.random.default_rng(seed).integers(0, VOCAB_SIZE, PROMPT).tolist()
    want, twin_steps = twin.generate(prompt, NEW_TOKENS)
    fed = [fp8.logprobs(prompt + want[:i]) for i in range(NEW_TOKENS)]
    drift = max(float(np.abs(a - b).max()) for a, b in zip(fed, twin_steps, strict=True))
    margins = [float(np.diff(np.sort(b)[-2:])[0]) for b in twin_steps]
    clear = [i for i, m in enumerate(margins) if m > 2 * tolerance]
    print(f"seed {seed}: max |logprob drift| {drift:.4f}; {len(clear)} of {NEW_TOKENS} clear")
    assert 1e-5 < drift < tolerance
    for i in clear:
      assert int(np.argmax(fed[i])) == want[i], f"token {i} (margin {margins[i]:.3f})"
    got, _ = fp8.generate(prompt, NEW_TOKENS)
    first_close = min(set(range(NEW_TOKENS)) - set(clear), default=NEW_TOKENS)
    assert got[:first_close] == want[:first_close]
    clear_tokens += len(clear)
  assert clear_tokens >= 4
  return clear_tokens


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
  _assert_twins_agree(fp8, twin, TOLERANCE)
  # the tolerance sees the fp8 weights' own rounding: the float model they came from is farther
  source = stored.parent / "float"
  original = Greedy(load_hf_config(source), load_hf_params(source, load_hf_config(source)))
  prompt = np.random.default_rng(0).integers(0, VOCAB_SIZE, PROMPT).tolist()
  assert _drift(original, twin, prompt, twin.generate(prompt, 4)[0]) > TOLERANCE


def _dequantized(w: Fp8Weights) -> jax.Array:
  """Per-channel fp8 experts [E, out, in] -> their float32 values [E, in, out]."""
  return jnp.swapaxes(w.weight.astype(jnp.float32) * w.scale[:, :, None], 1, 2)


def _dequantized_experts(x, expert_ids, weights, gate, up, down):
  """The twin's experts: the fp8 params dequantized, through the float grouped matmuls."""
  return expert_ffn(x, expert_ids, weights, *(_dequantized(w) for w in (gate, up, down)))


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
  twin = Greedy(config, params, experts=_dequantized_experts)
  _assert_twins_agree(fp8, twin, TOLERANCE)
  original = Greedy(load_hf_config(path), load_hf_params(path, load_hf_config(path)))
  prompt = np.random.default_rng(0).integers(0, VOCAB_SIZE, PROMPT).tolist()
  assert _drift(original, twin, prompt, twin.generate(prompt, 4)[0]) > TOLERANCE


@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "block"])
@pytest.mark.parametrize("kernel", ["auto", "ragged_dot", "pallas"])
def test_grouped_matmuls_over_fp8_experts_match_the_reference(kernel, blocks):
  """models/grouped_matmul's grouped matmul and SwiGLU over Fp8Weights, on every path (the CPU's
  "auto" is the ragged_dot one), against the kernel's pure-jnp reference: ragged sizes, an empty
  group, rows past the groups (unspecified: not compared)."""
  rng = np.random.default_rng(7)
  m, k, n, g = 40, 256, 128, 5
  rows = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1)), jnp.float32)
  w = jnp.asarray(rng.uniform(-448, 448, (g, n, k)), jnp.float32).astype(jnp.float8_e4m3fn)
  shape = (g, n // 128, k // 128) if blocks else (g, n)
  scale = jnp.asarray(rng.uniform(0.1, 1.0, shape) / 448, jnp.float32)
  sizes = jnp.array([7, 0, 13, 10, 5], jnp.int32)  # 35 rows, 5 past the groups
  weights = Fp8Weights(w, scale)
  got = grouped_matmul(rows, weights, sizes, kernel)[:35]
  want = grouped_matmul_fp8_reference(rows, w, scale, sizes)[:35]
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)
  got = grouped_swiglu(rows, weights, weights, sizes, kernel)[:35]
  want = grouped_swiglu_fp8_reference(rows, w, scale, w, scale, sizes)[:35]
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("blocks", [False, True], ids=["channel", "block"])
def test_the_routed_fp8_ffn_agrees_with_the_sorted_paths(blocks):
  """expert_ffn over fp8 experts: "pallas" (CUDA's "auto": the routing kernel, the tokens
  gathered into the gate/up product, the outputs scattered from the down product) against
  "pallas_sorted" (XLA's sort, the same fp8 kernel) and "ragged_dot" (the CPU's "auto"), for the
  whole layer and for two devices' halves of the experts (expert parallel: first_expert) that sum
  to it."""
  rng = np.random.default_rng(3)
  tokens, top_k, e, h, i = 7, 2, 4, 128, 256
  x = jnp.asarray(rng.standard_normal((tokens, h)), jnp.bfloat16)
  ids = jnp.asarray(rng.integers(0, e, (tokens, top_k)), jnp.int32)
  weights = jnp.asarray(rng.random((tokens, top_k)), jnp.float32)

  def experts(n, k):
    w = jnp.asarray(rng.uniform(-448, 448, (e, n, k)), jnp.float32).astype(jnp.float8_e4m3fn)
    shape = (e, n // 128, k // 128) if blocks else (e, n)
    return Fp8Weights(w, jnp.asarray(rng.uniform(0.1, 1.0, shape) / (448 * k**0.5), jnp.float32))

  gate, up, down = experts(i, h), experts(i, h), experts(h, i)
  runs = {
    kernel: np.asarray(expert_ffn(x, ids, weights, gate, up, down, kernel=kernel))
    for kernel in ("pallas", "pallas_sorted", "ragged_dot")
  }
  assert np.abs(runs["ragged_dot"]).max() > 0.1
  for kernel in ("pallas", "pallas_sorted"):
    np.testing.assert_allclose(runs[kernel], runs["ragged_dot"], rtol=2e-2, atol=2e-2)

  def half(w, j):
    return Fp8Weights(w.weight[j * 2 : j * 2 + 2], w.scale[j * 2 : j * 2 + 2])

  shards = [
    expert_ffn(x, ids, weights, half(gate, j), half(up, j), half(down, j), 2 * j, kernel="pallas")
    for j in (0, 1)
  ]
  np.testing.assert_allclose(
    np.asarray(shards[0] + shards[1]), runs["pallas"], rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_fp8_moe_keeps_its_experts_in_fp8(hf_checkpoint, tmp_path, strategy):
  """A compressed-tensors `fp8` (W8A8) Qwen3-MoE (llm-compressor's layout, written with the numpy
  quantizer: tests/models/compressed_checkpoints.py): its experts load as stored, e4m3 bytes and
  weight_scale per channel (a tensor's one scale broadcast to its channels), not dequantized."""
  stored = write_compressed_tensors(hf_checkpoint("qwen3_moe"), tmp_path / "ct", "fp8", strategy)
  config = load_hf_config(stored)
  assert config.quantization == "fp8" and config.expert_quantization == "fp8_channel"
  experts = load_hf_params(stored, config)["layers_1"]["mlp"]["experts"]
  hf = safetensors.torch.load_file(stored / "model.safetensors")
  name = "model.layers.1.mlp.experts.4.up_proj"
  raw = hf[name + ".weight"].view(dtype=torch.uint8).numpy()
  np.testing.assert_array_equal(np.asarray(experts["up_proj"][4]).view(np.uint8), raw)
  want = np.broadcast_to(hf[name + ".weight_scale"].numpy().reshape(-1), (raw.shape[0],))
  np.testing.assert_array_equal(np.asarray(experts["up_proj_scale"][4]), want)
  assert experts["up_proj_scale"].shape == (8, raw.shape[0])


def test_the_engine_serves_block_fp8_experts(block_moe):
  """`jaxserve serve` of the block-wise fp8 Qwen3-MoE: the engine's step programs (chunked
  prefill, batched decode) run the fp8 experts and generate the greedy tokens of the model run
  alone (Greedy: whole-sequence prefills), the prompts' log-probs within float32 noise (the
  activations are quantized per row, so batch mates do not move them)."""
  stored, _ = block_moe
  engine = small_engine(
    str(stored), max_model_len=128, max_tokens_per_step=16, token_buckets=(8, 16)
  )
  assert engine.runner.model.config.expert_quantization == "fp8_block"
  prompts = [np.random.default_rng(s).integers(0, VOCAB_SIZE, PROMPT).tolist() for s in (0, 1)]
  tokens, logprobs = generate_and_score(engine, prompts, 6)
  config = load_hf_config(stored)
  alone = Greedy(config, load_hf_params(stored, config))
  for prompt, got, prompt_logprobs in zip(prompts, tokens, logprobs, strict=True):
    assert got == alone.generate(prompt, 6)[0]
    want = [alone.logprobs(prompt[:i])[prompt[i]] for i in range(1, len(prompt))]
    np.testing.assert_allclose(prompt_logprobs, want, atol=1e-4, rtol=0)


def test_float_experts_of_a_block_fp8_checkpoint_are_quantized_into_blocks(block_moe, tmp_path):
  """A block-wise fp8 checkpoint that left its experts in float32 (`modules_to_not_convert`):
  they are quantized per 128 x 128 block on load, as the format's writer
  (tests/models/block_fp8_checkpoints.quantize_blocks, torch) would have stored them: the same
  e4m3 bytes, the scales within an ulp (amax times the float32 reciprocal of 448, as XLA
  computes a division by a constant, against torch's division)."""
  stored, _ = block_moe
  source = safetensors.torch.load_file(stored.parent / "float" / "model.safetensors")
  tensors = safetensors.torch.load_file(stored / "model.safetensors")
  for name in list(tensors):
    if ".experts." in name:
      del tensors[name]
  tensors.update({name: t for name, t in source.items() if ".experts." in name})
  mixed = tmp_path / "mixed"
  shutil.copytree(stored, mixed)
  safetensors.torch.save_file(tensors, mixed / "model.safetensors", metadata={"format": "pt"})
  config = load_hf_config(mixed)
  assert config.expert_quantization == "fp8_block"
  experts = load_hf_params(mixed, config)["layers_0"]["mlp"]["experts"]
  q, scale = quantize_blocks(source["model.layers.0.mlp.experts.6.gate_proj.weight"])
  np.testing.assert_array_equal(
    np.asarray(experts["gate_proj"][6]).view(np.uint8), q.view(torch.uint8).numpy()
  )
  np.testing.assert_allclose(np.asarray(experts["gate_proj_scale"][6]), scale.numpy(), rtol=2e-7)
