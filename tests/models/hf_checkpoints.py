"""Tiny Hugging Face checkpoints built locally with transformers (no hub access), for parity tests.

`build_hf_checkpoint(family, out_dir)` writes what a hub checkpoint holds: config.json,
model.safetensors (or shards plus model.safetensors.index.json), tokenizer.json (a byte-level BPE
trained with `tokenizers` on a small corpus, vocab within the model's) and tokenizer_config.json
(bos/eos tokens and a ChatML chat template). Weights are re-drawn from a seeded torch generator with
non-trivial norms and biases (HF initialises norms to one and biases to zero, which would hide
loader mistakes), scaled so log-probs are far from uniform.

The mixtures of experts have 8 experts each (Qwen3-MoE top-4 without renormalization, Mixtral
top-2, which renormalizes), so a step with fewer than 8 assignments, a decode step say, leaves
experts without a token; transformers writes their experts one Linear per expert and projection,
the layout of published checkpoints (models/expert_weights.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

FAMILIES = (
  "llama",
  "llama3",
  "llama_tied",
  "mistral",
  "qwen2",
  "qwen3",
  "qwen3_moe",
  "mixtral",
  "gemma2",
  "gemma3",
)
# Qwen3-MoE with dense MLP layers among the sparse ones (models/families/qwen3_moe.py): layer 0
# dense by mlp_only_layers; layers 0 and 2 of 3 dense by decoder_sparse_step 2.
MIXED_MOE_FAMILIES = ("qwen3_moe_dense0", "qwen3_moe_step2")
# Gemma's windows are shorter than the parity tests' sequences and end inside a page, so they
# bite in prefill, chunked prefill and decode.
GEMMA2_WINDOW, GEMMA3_WINDOW = 6, 5
# 8 kv heads, so tensor parallelism up to 8 shards whole heads (tests/parallel).
TP_FAMILIES = ("llama_kv8", "qwen2_kv8")
VOCAB_SIZE = 512
TOKENIZER_VOCAB_SIZE = 400
SPECIAL_TOKENS = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
  "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
  "{{ message['content'] }}<|im_end|>\n{% endfor %}"
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
  "The quick brown fox jumps over the lazy dog.",
  "Hello, world! How are you today? I am fine, thank you.",
  "Paged attention stores keys and values in fixed-size pages.",
  "def main():\n    print('hello')\n    return 0\n",
  "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Symbols: + - * / = < >.",
] * 4

_COMMON = dict(
  vocab_size=VOCAB_SIZE,
  hidden_size=128,
  intermediate_size=256,
  num_hidden_layers=2,
  head_dim=64,
  max_position_embeddings=256,
  rms_norm_eps=1e-5,
)


def _hf_config(family: str) -> transformers.PretrainedConfig:
  if family == "llama_kv8":
    return transformers.LlamaConfig(
      **_COMMON,
      num_attention_heads=16,
      num_key_value_heads=8,
      tie_word_embeddings=False,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
  if family == "qwen2_kv8":
    return transformers.Qwen2Config(
      **_COMMON,
      num_attention_heads=8,
      num_key_value_heads=8,
      rope_theta=1e6,
      tie_word_embeddings=True,
    )
  if family in ("llama", "llama3", "llama_tied"):
    rope = (
      {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
      }
      if family == "llama3"
      else {"rope_type": "default", "rope_theta": 10000.0}
    )
    return transformers.LlamaConfig(
      **_COMMON,
      num_attention_heads=4,
      num_key_value_heads=2,
      rope_parameters=rope,
      tie_word_embeddings=family == "llama_tied",
    )
  if family == "mistral":
    return transformers.MistralConfig(
      **_COMMON, num_attention_heads=4, num_key_value_heads=1, sliding_window=8, rope_theta=1e6
    )
  if family == "qwen2":
    return transformers.Qwen2Config(
      **_COMMON,
      num_attention_heads=2,
      num_key_value_heads=1,
      rope_theta=1e6,
      tie_word_embeddings=False,
    )
  if family.startswith("qwen3_moe"):
    mixed = {
      "qwen3_moe": {},
      "qwen3_moe_dense0": {"mlp_only_layers": [0]},
      "qwen3_moe_step2": {"decoder_sparse_step": 2, "num_hidden_layers": 3},
    }[family]
    return transformers.Qwen3MoeConfig(
      **{**_COMMON, **mixed},
      num_attention_heads=4,
      num_key_value_heads=2,
      rope_theta=1e6,
      tie_word_embeddings=False,
      num_experts=8,
      num_experts_per_tok=4,
      moe_intermediate_size=64,
      norm_topk_prob=False,
    )
  if family == "mixtral":
    common = {**_COMMON, "intermediate_size": 64}  # each expert's
    return transformers.MixtralConfig(
      **common,
      num_attention_heads=4,
      num_key_value_heads=2,
      rope_theta=1e6,
      num_local_experts=8,
      num_experts_per_tok=2,
    )
  if family == "qwen3":
    return transformers.Qwen3Config(
      **_COMMON,
      num_attention_heads=4,
      num_key_value_heads=2,
      rope_theta=1e6,
      tie_word_embeddings=False,
    )
  if family in ("gemma2", "gemma3"):
    return _gemma_config(family)
  known = FAMILIES + MIXED_MOE_FAMILIES + TP_FAMILIES
  raise ValueError(f"family: unknown {family!r} (known: {', '.join(known)})")


def _gemma_config(family: str) -> transformers.PretrainedConfig:
  """Gemma 2: sliding and global layers alternating, both soft caps biting, one rope. Gemma 3:
  two sliding layers then a global one (sliding_window_pattern 3), q/k norms, a local rope base
  and a scaled global one. Both tied, with a query_pre_attn_scalar that is not head_dim."""
  common = {**_COMMON, "num_attention_heads": 4, "num_key_value_heads": 2}
  common.update(query_pre_attn_scalar=48, tie_word_embeddings=True)
  if family == "gemma2":
    return transformers.Gemma2Config(
      **common,
      sliding_window=GEMMA2_WINDOW,
      attn_logit_softcapping=2.0,
      final_logit_softcapping=5.0,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
  return transformers.Gemma3TextConfig(
    **{**common, "num_hidden_layers": 3},
    sliding_window=GEMMA3_WINDOW,
    sliding_window_pattern=3,
    rope_parameters={
      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
      "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
    },
  )


_MODEL_CLASSES = {
  "llama": transformers.LlamaForCausalLM,
  "mistral": transformers.MistralForCausalLM,
  "qwen2": transformers.Qwen2ForCausalLM,
  "qwen3": transformers.Qwen3ForCausalLM,
  "qwen3_moe": transformers.Qwen3MoeForCausalLM,
  "mixtral": transformers.MixtralForCausalLM,
  "gemma2": transformers.Gemma2ForCausalLM,
  "gemma3_text": transformers.Gemma3ForCausalLM,
}


def _randomize(model: torch.nn.Module, seed: int) -> None:
  generator = torch.Generator().manual_seed(seed)
  norm_center = 0.0 if model.config.model_type.startswith("gemma") else 1.0  # Gemma: 1 + weight
  with torch.no_grad():
    for name, param in model.named_parameters():
      noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
      if name.endswith("norm.weight"):
        value = norm_center + 0.2 * noise
      elif name.endswith(".bias"):
        value = 0.2 * noise
      elif "embed_tokens" in name:  # also the tied output projection: keep logits O(1)
        value = 0.25 * noise
      else:  # Linear [out, in], stacked experts [E, out, in]
        value = noise / param.shape[-1] ** 0.5
      param.copy_(value.to(param.dtype))


def _build_tokenizer(bos: str, eos: str, add_bos: bool) -> Tokenizer:
  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=TOKENIZER_VOCAB_SIZE,
    special_tokens=list(SPECIAL_TOKENS),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
  if add_bos:
    tokenizer.post_processor = processors.TemplateProcessing(
      single=f"{bos} $A",
      pair=f"{bos} $A {bos} $B",
      special_tokens=[(bos, tokenizer.token_to_id(bos))],
    )
  return tokenizer


def _write_tokenizer(out_dir: Path, family: str) -> tuple[int, list[int]]:
  """Writes tokenizer.json + tokenizer_config.json; returns (bos_token_id, eos_token_ids)."""
  is_qwen = family.startswith("qwen")
  bos, eos = "<s>", "<|im_end|>" if is_qwen else "</s>"
  tokenizer = _build_tokenizer(bos, eos, add_bos=not is_qwen)
  assert tokenizer.get_vocab_size() <= VOCAB_SIZE
  tokenizer.save(str(out_dir / "tokenizer.json"))
  (out_dir / "tokenizer_config.json").write_text(
    json.dumps(
      {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": None,
        "add_bos_token": not is_qwen,
        "model_max_length": 256,
        "chat_template": CHAT_TEMPLATE,
      },
      indent=2,
    )
  )
  eos_ids = [tokenizer.token_to_id(eos)]
  if is_qwen:
    eos_ids.append(tokenizer.token_to_id("</s>"))
  return tokenizer.token_to_id(bos), eos_ids


def build_hf_checkpoint(
  family: str,
  out_dir: Path,
  *,
  dtype: str = "float32",
  seed: int = 0,
  sharded: bool = False,
  overrides: dict | None = None,
) -> Path:
  """Writes a tiny random `family` checkpoint into out_dir (created) and returns out_dir;
  `overrides` replaces fields of its transformers config (e.g. a larger moe_intermediate_size)."""
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  config = _hf_config(family)
  for name, value in (overrides or {}).items():
    setattr(config, name, value)
  config.bos_token_id, eos_ids = _write_tokenizer(out_dir, family)
  config.eos_token_id = eos_ids if len(eos_ids) > 1 else eos_ids[0]
  model_class = _MODEL_CLASSES[config.model_type]
  model = model_class(config)
  _randomize(model, seed)
  model = model.to(
    {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
  )
  model.save_pretrained(
    out_dir, safe_serialization=True, max_shard_size="200KB" if sharded else "2GB"
  )
  return out_dir


def load_hf_model(checkpoint_dir: Path) -> torch.nn.Module:
  """The transformers float32 reference (eager attention, so sliding windows apply exactly)."""
  model = transformers.AutoModelForCausalLM.from_pretrained(
    checkpoint_dir, dtype=torch.float32, attn_implementation="eager"
  )
  return model.eval()
