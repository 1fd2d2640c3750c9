"""A prompt too long for the context is refused before its token ids are built and, where its byte
length already proves it, before it is tokenized at all (400, context_length_exceeded).

The rule is admission's (engine/admission.check_length: prompt + max_tokens <= max_model_len,
which the engine core applies to every request anyway); a chat completion without max_tokens
gives its reply the rest of the context, so its prompt must leave room for one token. The server
applies it early, in the tokenizer thread pool (server/state.py), so that a prompt of megabytes
costs neither the tokenization nor, after it, a list of millions of ids built, detokenized and sent
to the core on the event loop:

1. from the byte length: a tokenizer that proves that no token stands for more than M bytes
   (tokenizer/token_bound.py) encodes B bytes to at least ceil(B / M) tokens (the built-in
   byte-level tokenizer: M = 13, its longest special token); a tokenizer with no such proof skips
   this step. The text checked is the one encoded: a chat prompt's rendered template, so the
   template's own text counts, exactly;
2. from the count the tokenizer returns, before the ids become Python ints.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxserve.engine.admission import ContextLengthError, check_length
from jaxserve.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class PromptBudget:
  """What a prompt's token count must fit: max_model_len with the reply's max_tokens, or with
  one token left for a reply that takes the rest (max_tokens None)."""

  max_model_len: int
  max_tokens: int | None

  def check(self, num_tokens: int, at_least: bool = False) -> None:
    """ContextLengthError (naming `prompt`) if a prompt of num_tokens tokens (at least that many:
    `at_least`) does not fit."""
    if self.max_tokens is not None:
      check_length(num_tokens, self.max_tokens, self.max_model_len, at_least=at_least)
    elif num_tokens >= self.max_model_len:
      raise ContextLengthError(
        f"prompt: the prompt has {'at least ' if at_least else ''}{num_tokens} tokens, which "
        f"leaves no room for a reply within max_model_len {self.max_model_len}"
      )


def encode_prompt(
  tokenizer: Tokenizer, text: str, budget: PromptBudget, add_special_tokens: bool = True
) -> list[int]:
  """`text`'s token ids; budget.check's ContextLengthError first if they cannot fit (see the
  module docstring)."""
  bound = tokenizer.min_num_tokens(text, add_special_tokens)
  if bound is not None:
    budget.check(bound, at_least=True)
  return tokenizer.encode(text, add_special_tokens, check_count=budget.check)
