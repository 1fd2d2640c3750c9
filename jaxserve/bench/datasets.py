"""Benchmark workloads: random prompts and ShareGPT conversations, as `SampleRequest`s.

Random (as vLLM's benchmark): input and output lengths are drawn uniformly from
[len * (1 - ratio), len * (1 + ratio)]. A prompt is a list of random token ids when a tokenizer is
known (servers such as jaxserve accept token-id prompts, so the input length is exact), else a
string of random words (one word is counted as one token, an estimate).

ShareGPT (a JSON list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt",
"value": ...}, ...]}): the first human turn is the prompt and the expected output length is the
token count of the gpt turn that follows it. Counts come from the model's tokenizer when given,
else from a whitespace split (`len(text.split())`), which undercounts subword tokens.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TokenCounter = Callable[[str], int]
_WORDS = (
  "the of and to in is was for on that with as by at from his her an which are be this "
  "have it not or had were but one all new more first two time after also some can into "
  "other its only over most may such any where when made about years they there city"
).split()


@dataclass(frozen=True)
class SampleRequest:
  """One benchmark request: the prompt (text or token ids), its length and the output length."""

  prompt: str | tuple[int, ...]
  prompt_len: int
  expected_output_len: int


def whitespace_token_count(text: str) -> int:
  return len(text.split())


def uniform_lengths(
  rng: np.random.Generator, length: int, range_ratio: float, count: int
) -> np.ndarray:
  """Integers uniform in [length * (1 - ratio), length * (1 + ratio)], at least 1."""
  if not 0.0 <= range_ratio < 1.0:
    raise ValueError(f"random_range_ratio: must be in [0, 1), got {range_ratio}")
  if length < 1:
    raise ValueError(f"length: must be >= 1, got {length}")
  low = max(1, int(length * (1 - range_ratio)))
  high = max(low, int(length * (1 + range_ratio)))
  return rng.integers(low, high + 1, size=count)


def random_requests(
  num_prompts: int,
  input_len: int,
  output_len: int,
  *,
  range_ratio: float = 0.0,
  seed: int = 0,
  token_ids: Sequence[int] | None = None,
) -> list[SampleRequest]:
  """Random prompts: token ids drawn from `token_ids` (when given) or random words."""
  if num_prompts < 1:
    raise ValueError(f"num_prompts: must be >= 1, got {num_prompts}")
  rng = np.random.default_rng(seed)
  input_lens = uniform_lengths(rng, input_len, range_ratio, num_prompts)
  output_lens = uniform_lengths(rng, output_len, range_ratio, num_prompts)
  pool = np.asarray(token_ids) if token_ids is not None else None
  requests = []
  for n_in, n_out in zip(input_lens.tolist(), output_lens.tolist(), strict=True):
    if pool is not None:
      prompt: str | tuple[int, ...] = tuple(int(t) for t in rng.choice(pool, size=n_in))
    else:
      prompt = " ".join(rng.choice(_WORDS, size=n_in).tolist())
    requests.append(SampleRequest(prompt, n_in, n_out))
  return requests


def load_sharegpt(
  path: str | Path,
  num_prompts: int,
  *,
  count_tokens: TokenCounter | None = None,
  seed: int = 0,
  min_len: int = 4,
  max_prompt_len: int = 1024,
  max_total_len: int = 2048,
) -> list[SampleRequest]:
  """The first human turn and the following gpt turn of shuffled conversations, filtered as vLLM
  does (both at least `min_len` tokens, prompt <= max_prompt_len, sum <= max_total_len)."""
  path = Path(path)
  count = count_tokens or whitespace_token_count
  conversations = _read_sharegpt(path)
  order = np.random.default_rng(seed).permutation(len(conversations))
  requests: list[SampleRequest] = []
  for index in order.tolist():
    pair = _first_exchange(conversations[index])
    if pair is None:
      continue
    prompt, reply = pair
    prompt_len, output_len = count(prompt), count(reply)
    if (
      prompt_len < min_len
      or output_len < min_len
      or prompt_len > max_prompt_len
      or prompt_len + output_len > max_total_len
    ):
      continue
    requests.append(SampleRequest(prompt, prompt_len, output_len))
    if len(requests) == num_prompts:
      break
  if not requests:
    raise ValueError(f"{path}: no usable conversations (need a human turn then a gpt turn)")
  return requests


def _read_sharegpt(path: Path) -> list:
  if not path.is_file():
    raise ValueError(f"dataset_path: file not found: {path}")
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as err:
    raise ValueError(f"{path}: invalid JSON: {err}") from err
  if not isinstance(data, list):
    raise ValueError(f"{path}: expected a JSON list of conversations")
  return data


def _first_exchange(entry: object) -> tuple[str, str] | None:
  turns = entry.get("conversations") if isinstance(entry, dict) else None
  if not isinstance(turns, list):
    return None
  for first, second in itertools.pairwise(turns):
    if (
      isinstance(first, dict)
      and isinstance(second, dict)
      and first.get("from") == "human"
      and second.get("from") == "gpt"
    ):
      prompt, reply = first.get("value"), second.get("value")
      if isinstance(prompt, str) and isinstance(reply, str) and prompt and reply:
        return prompt, reply
    if isinstance(first, dict) and first.get("from") == "human":
      return None  # only the first human turn counts
  return None
