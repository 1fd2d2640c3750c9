"""Parity of an eval run with Hugging Face transformers on the same token ids.

Generation queries are decoded greedily by transformers `generate` (stopping at the engine's eos
ids or max_tokens, as the engine does); scoring queries get the transformers
logprob of every scored prompt token. Reported: the share of generations whose tokens are
identical, the share of generated tokens inside the common prefix (tokens after a first divergence
count as disagreeing), and the largest absolute logprob difference over the scored tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm


def load_reference(model_dir: str, dtype: str):
  import torch
  import transformers

  model = transformers.AutoModelForCausalLM.from_pretrained(
    model_dir, dtype=getattr(torch, dtype), attn_implementation="eager"
  )
  return model.eval()


def hf_greedy(
  model, prompt_ids: Sequence[int], max_tokens: int, eos_token_ids: Sequence[int]
) -> list[int]:
  """transformers' greedy `generate`, stopping at any of `eos_token_ids` (kept) or max_tokens."""
  import torch

  with torch.inference_mode():
    out = model.generate(
      input_ids=torch.tensor([list(prompt_ids)]),
      do_sample=False,
      max_new_tokens=max_tokens,
      eos_token_id=list(eos_token_ids),
      pad_token_id=eos_token_ids[0] if eos_token_ids else 0,
      temperature=None,
      top_p=None,
      top_k=None,
    )
  return [int(t) for t in out[0, len(prompt_ids) :]]


def hf_prompt_logprobs(model, prompt_ids: Sequence[int], first_scored: int) -> np.ndarray:
  """logprob of prompt[j] given prompt[:j] for j >= first_scored. [len(prompt) - first_scored]"""
  import torch

  with torch.inference_mode():
    logits = model(torch.tensor([list(prompt_ids)])).logits[0].double()  # [T, vocab]
  logprobs = torch.log_softmax(logits, dim=-1)
  return np.array(
    [float(logprobs[j - 1, prompt_ids[j]]) for j in range(first_scored, len(prompt_ids))]
  )


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
  n = 0
  for x, y in zip(a, b, strict=False):
    if x != y:
      break
    n += 1
  return n


def hf_parity(
  model_dir: str, queries: Sequence, eos_token_ids: Sequence[int], dtype: str, use_tqdm: bool = True
) -> dict:
  """Compares eval queries (already run by the engine) with the transformers model."""
  model = load_reference(model_dir, dtype)
  identical = num_sequences = agreeing = num_tokens = num_scored = 0
  max_diff = 0.0
  for query in tqdm(queries, desc="transformers parity", unit="query", disable=not use_tqdm):
    if query.params.prompt_logprobs is None:
      reference = hf_greedy(model, query.prompt_ids, query.params.max_tokens, eos_token_ids)
      num_sequences += 1
      identical += reference == query.output_ids
      agreeing += common_prefix(reference, query.output_ids)
      num_tokens += max(len(reference), len(query.output_ids))
    else:
      reference = hf_prompt_logprobs(model, query.prompt_ids, query.first_scored)
      if len(reference) != len(query.scored_logprobs):
        raise ValueError(
          f"parity: {len(query.scored_logprobs)} scored tokens for task "
          f"{query.task} example {query.example_index}, transformers has "
          f"{len(reference)}"
        )
      if len(reference):
        max_diff = max(max_diff, float(np.abs(reference - query.scored_logprobs).max()))
      num_scored += len(reference)
  return {
    "model_dir": model_dir,
    "dtype": dtype,
    "num_sequences": num_sequences,
    "sequence_agreement": identical / max(num_sequences, 1),
    "num_tokens": num_tokens,
    "token_agreement": agreeing / max(num_tokens, 1),
    "num_scored_tokens": num_scored,
    "max_abs_logprob_diff": max_diff,
  }
