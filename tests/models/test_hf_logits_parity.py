"""Log-prob parity of each family's decoder (paged, reference attention) with transformers' float32
forward, for every supported family (the mixtures of experts included), over ragged
multi-sequence steps with scattered pages (Gemma's windows are shorter than the prompts: they bite
in prefill, in the second chunk and in decode)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
import torch

from jaxserve.attention import get_attention_backend
from jaxserve.models import LlamaForCausalLM, causal_lm
from jaxserve.models.grouped_matmul import expert_ffn
from jaxserve.models.weights import load_hf_config, load_hf_params
from tests.models.hf_checkpoints import FAMILIES, MIXED_MOE_FAMILIES, VOCAB_SIZE, load_hf_model
from tests.models.paged_batch import Chunk, build_step, empty_kv_pages, model_kv

PAGE_SIZE, NUM_PAGES, PAGES_PER_SEQ = 4, 12, 4
NUM_TOKENS, NUM_SEQ_SLOTS = 32, 3
TOLERANCE = 5e-5  # observed max ~1e-5 (float32 vs float32, different op order)
LEN_A, LEN_B = 13, 11  # both longer than the sliding windows (Mistral 8, Gemma 6 and 5)


class Family:
  """A family's checkpoint loaded both ways, its prompts, HF log-probs and a jitted step."""

  def __init__(self, checkpoint_dir, experts=None, *, reference=None, quantization=None):
    """`reference`: the checkpoint transformers runs (default: the same); `quantization`: the
    ModelConfig's (default: the checkpoint's)."""
    self.config = load_hf_config(checkpoint_dir)
    if quantization is not None:
      self.config = self.config.replace(quantization=quantization)
    self.params = load_hf_params(checkpoint_dir, self.config)
    model = causal_lm(self.config, get_attention_backend("reference"), None, experts)
    rng = np.random.default_rng(1)
    self.prompts = [rng.integers(0, VOCAB_SIZE, n).tolist() for n in (LEN_A, LEN_B)]
    pages = rng.permutation(np.arange(1, NUM_PAGES)).tolist()  # page 0 is the null page
    self.pages = [pages[:PAGES_PER_SEQ], pages[PAGES_PER_SEQ : 2 * PAGES_PER_SEQ]]
    hf_model = load_hf_model(reference or checkpoint_dir)
    with torch.no_grad():
      self.hf_logprobs = [
        torch.log_softmax(hf_model(torch.tensor([p])).logits[0].double(), -1).numpy()
        for p in self.prompts
      ]

    def step(params, kv_pages, token_ids, positions, slot_mapping, metadata):
      hidden, kv_pages = model.apply(
        {"params": params}, token_ids, positions, kv_pages, slot_mapping, metadata
      )
      logits = model.apply({"params": params}, hidden, method=type(model).compute_logits)
      return jax.nn.log_softmax(logits, axis=-1), kv_pages

    self.step = jax.jit(step)

  def run(self, kv_pages, chunks: list[Chunk], num_tokens: int = NUM_TOKENS):
    arrays = build_step(
      chunks,
      page_size=PAGE_SIZE,
      num_tokens=num_tokens,
      num_seq_slots=NUM_SEQ_SLOTS,
      pages_per_seq=PAGES_PER_SEQ,
      num_groups=self.num_groups,
      group_stride=NUM_PAGES,
    )
    logprobs, kv_pages = self.step(
      self.params,
      kv_pages,
      arrays.token_ids,
      arrays.positions,
      arrays.slot_mapping,
      arrays.metadata,
    )
    return np.asarray(logprobs, np.float64), kv_pages, arrays.offsets

  def empty_pages(self):
    kv, self.num_groups = model_kv(self.config, NUM_PAGES, PAGE_SIZE)
    return kv


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, hf_checkpoint) -> Family:
  return Family(hf_checkpoint(request.param))


def test_two_prompts_in_one_step(family):
  a, b = family.prompts
  chunks = [Chunk(a, 0, family.pages[0]), Chunk(b, 0, family.pages[1])]
  logprobs, _, offsets = family.run(family.empty_pages(), chunks)
  for prompt, offset, want in zip((a, b), offsets, family.hf_logprobs, strict=True):
    got = logprobs[offset : offset + len(prompt)]
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)


def test_chunked_prefill_then_decode(family):
  """Step 1: A minus its last token, and B's first 6 tokens. Step 2: A's last token as a decode
  (first), then the rest of B as a second prefill chunk reading B's cached K/V."""
  a, b = family.prompts
  pages_a, pages_b = family.pages
  kv = family.empty_pages()
  logprobs1, kv, off1 = family.run(kv, [Chunk(a[:-1], 0, pages_a), Chunk(b[:6], 0, pages_b)])
  logprobs2, kv, off2 = family.run(
    kv, [Chunk(a[-1:], len(a) - 1, pages_a), Chunk(b[6:], 6, pages_b)]
  )
  hf_a, hf_b = family.hf_logprobs
  np.testing.assert_allclose(
    logprobs1[off1[0] : off1[0] + len(a) - 1], hf_a[:-1], atol=TOLERANCE, rtol=0
  )
  np.testing.assert_allclose(logprobs1[off1[1] : off1[1] + 6], hf_b[:6], atol=TOLERANCE, rtol=0)
  np.testing.assert_allclose(logprobs2[off2[0]], hf_a[-1], atol=TOLERANCE, rtol=0)
  np.testing.assert_allclose(
    logprobs2[off2[1] : off2[1] + len(b) - 6], hf_b[6:], atol=TOLERANCE, rtol=0
  )


def test_one_token_decode_leaves_experts_empty(family):
  """A step of one token and no padding: top-k of 8 experts leaves 8 - k groups empty."""
  if not family.config.num_experts:
    pytest.skip("dense MLP")
  assert family.config.num_experts_per_tok < family.config.num_experts
  a, _ = family.prompts
  kv = family.empty_pages()
  _, kv, _ = family.run(kv, [Chunk(a[:-1], 0, family.pages[0])])
  logprobs, _, offsets = family.run(kv, [Chunk(a[-1:], len(a) - 1, family.pages[0])], num_tokens=1)
  np.testing.assert_allclose(
    logprobs[offsets[0]], family.hf_logprobs[0][-1], atol=TOLERANCE, rtol=0
  )


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_experts_through_the_pallas_grouped_matmul(name, hf_checkpoint):
  """The experts through the Pallas grouped-matmul kernel (what CUDA GPUs run; interpret mode
  here) instead of ragged_dot: the same parity, prefill then a one-token decode."""
  family = Family(hf_checkpoint(name), functools.partial(expert_ffn, kernel="pallas"))
  test_two_prompts_in_one_step(family)
  test_one_token_decode_leaves_experts_empty(family)


@pytest.mark.parametrize("name", MIXED_MOE_FAMILIES)
def test_dense_layers_among_the_experts(name, hf_checkpoint):
  """Qwen3-MoE with mlp_only_layers=[0] (layer 0 of 2 dense) and with decoder_sparse_step=2
  (layers 0 and 2 of 3 dense): each dense layer loads transformers' Qwen3MoeMLP of
  intermediate_size, each other one the experts, and the log-probs match as above."""
  family = Family(hf_checkpoint(name))
  dense = {"qwen3_moe_dense0": (0,), "qwen3_moe_step2": (0, 2)}[name]
  assert family.config.dense_mlp_layers == dense
  for i in range(family.config.num_layers):
    mlp = family.params[f"layers_{i}"]["mlp"]
    if i in dense:
      assert set(mlp) == {"gate_proj", "up_proj", "down_proj"}
      assert mlp["gate_proj"]["kernel"].shape == (128, family.config.intermediate_size)
    else:
      assert set(mlp) == {"gate", "experts"}
  test_two_prompts_in_one_step(family)
  test_chunked_prefill_then_decode(family)
  test_one_token_decode_leaves_experts_empty(family)
  test_logprobs_are_not_uniform(family)


def test_logprobs_are_not_uniform(family):
  """The parity above is only meaningful if the reference distribution is far from flat."""
  for want in family.hf_logprobs:
    assert np.exp(want).max(axis=-1).mean() > 5.0 / VOCAB_SIZE


def test_bfloat16_model_tracks_float32_reference(hf_checkpoint):
  """bf16 params and activations: within bf16 rounding of HF's float32 forward on the same
  (bf16-valued) weights; a wrong cast or dtype promotion shows up as O(1) errors."""
  directory = hf_checkpoint("qwen3", dtype="bfloat16")
  config = load_hf_config(directory)
  assert config.dtype == "bfloat16"
  params = load_hf_params(directory, config)
  model = LlamaForCausalLM(config, get_attention_backend("reference"))
  prompt = np.random.default_rng(2).integers(0, VOCAB_SIZE, LEN_A).tolist()
  arrays = build_step(
    [Chunk(prompt, 0, [3, 1, 5, 2])],
    page_size=PAGE_SIZE,
    num_tokens=16,
    num_seq_slots=2,
    pages_per_seq=PAGES_PER_SEQ,
  )
  kv = empty_kv_pages(
    config.num_layers, config.num_kv_heads, 6, PAGE_SIZE, config.head_dim, jax.numpy.bfloat16
  )
  hidden, kv = model.apply(
    {"params": params}, arrays.token_ids, arrays.positions, kv, arrays.slot_mapping, arrays.metadata
  )
  assert hidden.dtype == jax.numpy.bfloat16 and kv[0][0].dtype == jax.numpy.bfloat16
  logits = model.apply({"params": params}, hidden, method=LlamaForCausalLM.compute_logits)
  assert logits.dtype == jax.numpy.float32
  got = np.asarray(jax.nn.log_softmax(logits, axis=-1))[: len(prompt)]
  with torch.no_grad():
    want = torch.log_softmax(load_hf_model(directory)(torch.tensor([prompt])).logits[0], -1).numpy()
  assert np.abs(got - want).max() < 0.15  # observed ~0.04
  assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9
