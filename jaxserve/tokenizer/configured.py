"""The engine's tokenizer as configured: `tokenizer` (a directory other than the model's) and
`chat_template` (a file, or the template text itself, replacing the tokenizer's), vLLM's
--tokenizer and --chat-template. models/registry.load_configured_tokenizer applies them."""

from __future__ import annotations

import os

from jaxserve.tokenizer.chat_template import compile_chat_template
from jaxserve.tokenizer.tokenizer import DEFAULT_TEMPLATE_NAME, Tokenizer


def chat_template_source(value: str) -> str:
  """The template text of a chat_template setting: a file's contents, or the value itself when
  it is template text (holds "{{" or "{%"); a ValueError naming chat_template otherwise."""
  if os.path.isfile(value):
    with open(value, encoding="utf-8") as f:
      source = f.read()
  elif "{{" in value or "{%" in value:
    source = value
  else:
    raise ValueError(f"chat_template: {value!r} is neither a file nor Jinja template text")
  try:
    compile_chat_template(source)
  except Exception as err:  # jinja2 raises its own TemplateSyntaxError
    raise ValueError(f"chat_template: cannot compile the template: {err}") from err
  return source


def with_chat_template(tokenizer: Tokenizer, source: str) -> Tokenizer:
  """The same tokenizer with `source` as its default chat template."""
  return Tokenizer(
    tokenizer.backend,
    special_tokens=tokenizer.special_tokens,
    extra_eos_token_ids=tokenizer.eos_token_ids,
    chat_templates={DEFAULT_TEMPLATE_NAME: source},
    vocab_size=tokenizer.vocab_size,
    tokenizer_class=tokenizer.tokenizer_class,
  )
