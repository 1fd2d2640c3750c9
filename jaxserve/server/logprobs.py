"""Engine logprobs -> OpenAI's two logprobs shapes.

Completions (legacy): `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`,
one entry per token; with echo the prompt's tokens come first and the first has null logprobs.
Chat: `{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`.
Tokens are shown as each id decoded on its own (Tokenizer.convert_ids_to_tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from jaxserve.api.outputs import TokenLogprob
from jaxserve.tokenizer.tokenizer import Tokenizer


@dataclass
class CompletionLogprobs:
  """The completions logprobs object, built incrementally (streaming sends slices of it)."""

  tokens: list[str] = field(default_factory=list)
  token_logprobs: list[float | None] = field(default_factory=list)
  top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
  text_offset: list[int] = field(default_factory=list)

  def to_json(self) -> dict:
    return {
      "tokens": self.tokens,
      "token_logprobs": self.token_logprobs,
      "top_logprobs": self.top_logprobs,
      "text_offset": self.text_offset,
    }


def completion_logprobs(
  tokenizer: Tokenizer,
  token_ids: Sequence[int],
  entries: Sequence[TokenLogprob | None],
  start_offset: int,
) -> CompletionLogprobs:
  """Logprobs of `token_ids` (entries[i] belongs to token_ids[i]; None for the first prompt
  token); text offsets count characters from `start_offset`, special tokens (bos) taking none,
  as they are not in the text."""
  result = CompletionLogprobs()
  tokens = tokenizer.convert_ids_to_tokens(token_ids)
  top_ids = sorted({t for e in entries if e is not None for t, _ in e.top})
  top_names = dict(zip(top_ids, tokenizer.convert_ids_to_tokens(top_ids), strict=True))
  special = set(tokenizer.all_special_ids)
  offset = start_offset
  for token_id, token, entry in zip(token_ids, tokens, entries, strict=True):
    result.tokens.append(token)
    result.text_offset.append(offset)
    offset += 0 if token_id in special else len(token)
    if entry is None:
      result.token_logprobs.append(None)
      result.top_logprobs.append(None)
      continue
    result.token_logprobs.append(entry.logprob)
    top: dict[str, float] = {}
    for token_id, logprob in entry.top:
      top.setdefault(top_names[token_id], logprob)
    result.top_logprobs.append(top)
  return result


def chat_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> dict:
  """`{"content": [...]}` for the sampled tokens `entries`."""
  ids = sorted({e.token_id for e in entries} | {t for e in entries for t, _ in e.top})
  names = dict(zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True))
  content = []
  for entry in entries:
    top = [_chat_token(names[t], lp) for t, lp in entry.top]
    content.append({**_chat_token(names[entry.token_id], entry.logprob), "top_logprobs": top})
  return {"content": content}


def _chat_token(token: str, logprob: float) -> dict:
  return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
