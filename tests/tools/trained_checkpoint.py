"""A tiny trained checkpoint: a two-layer Llama (hidden 64) trained with torch for a few hundred
steps on English prose, then saved as a Hugging Face checkpoint in bfloat16 with the byte-level
tokenizer of tiny-random (jaxserve/tools/export_hf.write_byte_tokenizer), so `jaxserve eval
--model <dir>` runs it as any checkpoint.

The training text is Python's own documentation (the pydoc_data package of the standard
library: the language reference's topics), never the eval data it is scored on; bytes are
tokens (the byte tokenizer's ids 0..255), each topic starts with the tokenizer's bos. Seeded and
single-threaded (tests/conftest.py), so a run on the same versions trains the same weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

from jaxserve.models.model_config import ModelConfig
from jaxserve.tools.export_hf import hf_llama_config, write_byte_tokenizer

BOS = 256
CONFIG = ModelConfig(
  architecture="llama",
  vocab_size=512,  # the byte tokenizer's ids (bytes, bos, eos, chat specials) fit
  hidden_size=64,
  intermediate_size=192,
  num_layers=2,
  num_q_heads=4,
  num_kv_heads=2,
  head_dim=16,
  rms_norm_eps=1e-5,
  rope_theta=10000.0,
  max_position_embeddings=512,
  tie_word_embeddings=False,
  bos_token_id=BOS,
  eos_token_ids=(257,),
  dtype="bfloat16",
)
STEPS, BATCH, WINDOW, LEARNING_RATE = 200, 16, 64, 5e-3


def training_tokens(max_bytes: int = 200_000) -> np.ndarray:
  """bos + the bytes of each documentation topic, in name order, up to max_bytes in all."""
  from pydoc_data.topics import topics

  ids: list[int] = []
  for name in sorted(topics):
    ids += [BOS] + list(topics[name].encode("utf-8"))
    if len(ids) >= max_bytes:
      break
  return np.asarray(ids[:max_bytes], np.int64)


def train_tiny_llama(out_dir: Path, steps: int = STEPS, seed: int = 0) -> Path:
  """Trains (AdamW, cosine decay, random windows of the training text) and writes
  config.json, model.safetensors (bfloat16) and the tokenizer files to out_dir."""
  torch.manual_seed(seed)
  rng = np.random.default_rng(seed)
  model = transformers.LlamaForCausalLM(hf_llama_config(CONFIG))
  tokens = torch.from_numpy(training_tokens())
  optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
  schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
  model.train()
  for _ in range(steps):
    starts = rng.integers(0, len(tokens) - WINDOW - 1, size=BATCH)
    batch = torch.stack([tokens[s : s + WINDOW + 1] for s in starts])
    loss = model(input_ids=batch, labels=batch).loss  # shifted inside: next-token loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    schedule.step()
  out_dir = Path(out_dir)
  model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
  write_byte_tokenizer(out_dir)
  return out_dir
