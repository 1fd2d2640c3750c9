"""The `tokenizer` and `chat_template` config keys (--tokenizer, --chat-template): another
directory's tokenizer, a template file or inline template replacing the tokenizer's, and a clear
error naming the key for a bad one."""

from __future__ import annotations

import pytest

from jaxserve.config import EngineConfig
from jaxserve.models.registry import load_configured_tokenizer

MESSAGES = [{"role": "user", "content": "Hi"}]
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def test_chat_template_from_a_file_or_inline(tmp_path):
  path = tmp_path / "chat.jinja"
  path.write_text(TEMPLATE)
  default = load_configured_tokenizer(EngineConfig())
  for value in (str(path), TEMPLATE):
    tokenizer = load_configured_tokenizer(EngineConfig(chat_template=value))
    assert tokenizer.apply_chat_template(MESSAGES) == "[user] Hi\n"
    assert tokenizer.chat_template == TEMPLATE
    assert tokenizer.eos_token_ids == default.eos_token_ids
    assert tokenizer.encode("abc") == default.encode("abc")
  assert default.apply_chat_template(MESSAGES) != "[user] Hi\n"


def test_bad_chat_template_or_tokenizer_names_the_key(tmp_path):
  with pytest.raises(ValueError, match=r"^chat_template: 'missing.jinja' is neither a file nor"):
    load_configured_tokenizer(EngineConfig(chat_template="missing.jinja"))
  with pytest.raises(ValueError, match=r"^chat_template: cannot compile the template"):
    load_configured_tokenizer(EngineConfig(chat_template="{% for %}"))
  with pytest.raises(ValueError, match=r"^tokenizer: .* is neither 'tiny-random' nor a tokenizer"):
    load_configured_tokenizer(EngineConfig(tokenizer=str(tmp_path / "none")))
  with pytest.raises(ValueError, match=r"^tokenizer: must be a non-empty string or null"):
    EngineConfig(tokenizer="")


def test_tokenizer_from_another_directory(hf_checkpoint):
  checkpoint = hf_checkpoint("llama")
  tokenizer = load_configured_tokenizer(EngineConfig(tokenizer=str(checkpoint)))
  assert tokenizer.vocab_size != load_configured_tokenizer(EngineConfig()).vocab_size
