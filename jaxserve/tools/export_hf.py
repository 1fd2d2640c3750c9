"""Hugging Face checkpoints of jaxserve models, for transformers baselines and parity checks.

`export_tiny_random_hf(out_dir)` writes the built-in tiny-random model as a transformers Llama
checkpoint (config.json, model.safetensors) plus its byte-level tokenizer (tokenizer.json,
tokenizer_config.json). Tensors are mapped with `hf_tensor_specs`, the loader's own table, read in
reverse; transformers' `load_state_dict(strict=True)` then checks every name and shape. Loading the
directory back with jaxserve gives the same params, and transformers computes the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxserve.models.families import LLAMA, family_of
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.weights import hf_tensor_specs
from jaxserve.tokenizer.byte_tokenizer import (
  BOS_TOKEN,
  BYTE_CHAT_TEMPLATE,
  EOS_TOKEN,
  byte_level_tokenizer,
)


def rope_kwargs(rope_theta: float, scaling: dict | None = None) -> dict:
  """RoPE settings in the form this transformers version's configs take (5.x rope_parameters,
  4.x rope_theta + rope_scaling)."""
  import transformers

  if int(transformers.__version__.split(".")[0]) >= 5:
    return {
      "rope_parameters": {"rope_type": "default", **(scaling or {}), "rope_theta": rope_theta}
    }
  return {"rope_theta": rope_theta, "rope_scaling": scaling}


def hf_llama_config(config: ModelConfig, **extra):
  """A transformers LlamaConfig with `config`'s shapes (architecture llama, no biases)."""
  import transformers

  plain = not (config.attention_bias or config.qk_norm or config.sliding_window)
  if family_of(config) is not LLAMA or not plain:
    raise ValueError(f"architecture: only plain llama configs export, got {config.architecture!r}")
  scaling = None
  if config.rope_scaling is not None:
    s = config.rope_scaling
    scaling = {
      "rope_type": s.rope_type,
      "factor": s.factor,
      "low_freq_factor": s.low_freq_factor,
      "high_freq_factor": s.high_freq_factor,
      "original_max_position_embeddings": s.original_max_position_embeddings,
    }
  return transformers.LlamaConfig(
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    intermediate_size=config.intermediate_size,
    num_hidden_layers=config.num_layers,
    num_attention_heads=config.num_q_heads,
    num_key_value_heads=config.num_kv_heads,
    head_dim=config.head_dim,
    rms_norm_eps=config.rms_norm_eps,
    max_position_embeddings=config.max_position_embeddings,
    tie_word_embeddings=config.tie_word_embeddings,
    bos_token_id=config.bos_token_id,
    eos_token_id=config.eos_token_ids[0] if config.eos_token_ids else None,
    **rope_kwargs(config.rope_theta, scaling),
    **extra,
  )


def write_byte_tokenizer(out_dir: Path) -> None:
  """The tiny-random byte tokenizer as tokenizer.json + tokenizer_config.json."""
  out_dir = Path(out_dir)
  byte_level_tokenizer().backend.save(str(out_dir / "tokenizer.json"))
  (out_dir / "tokenizer_config.json").write_text(
    json.dumps(
      {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "add_bos_token": True,
        "chat_template": BYTE_CHAT_TEMPLATE,
      },
      indent=2,
    )
  )


def _leaf(tree: dict, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


def export_tiny_random_hf(out_dir: str | Path) -> Path:
  """Writes tiny-random as a transformers Llama checkpoint into out_dir (created); returns it."""
  import torch
  import transformers

  from jaxserve.models.tiny_random import tiny_random_config, tiny_random_params

  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  config = tiny_random_config()
  params = tiny_random_params(config)
  state = {}
  for spec in hf_tensor_specs(config):
    value = np.asarray(_leaf(params, spec.path), dtype=np.float32)  # [in, out] kernels
    state[spec.hf_name] = torch.from_numpy(
      np.array(value.T if spec.transpose else value, copy=True)
    )
  hf_config = hf_llama_config(config)
  model = transformers.LlamaForCausalLM(hf_config)
  model.load_state_dict(state, strict=True)
  model.save_pretrained(out_dir, safe_serialization=True)
  write_byte_tokenizer(out_dir)
  return out_dir
