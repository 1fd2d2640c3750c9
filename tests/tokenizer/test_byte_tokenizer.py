"""The tiny-random byte tokenizer against Python's own UTF-8 codec."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from jaxserve.models.registry import load_model_tokenizer as load_tokenizer
from jaxserve.tokenizer import byte_level_tokenizer
from jaxserve.tokenizer.byte_tokenizer import SPECIAL_TOKENS

TOKENIZER = byte_level_tokenizer()


def _has_special(text: str) -> bool:
  return any(token in text for token in SPECIAL_TOKENS)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_ids_are_utf8_bytes_and_round_trip(text):
  assume(not _has_special(text))
  ids = TOKENIZER.encode(text, add_special_tokens=False)
  assert ids == list(text.encode("utf-8"))
  assert TOKENIZER.decode(ids) == text
  assert TOKENIZER.encode(text) == [256] + ids


@pytest.mark.parametrize(
  "text", ["日本語のテキスト", "🤖🚀✨👩‍👩‍👧", "naïve café", "\x00\t\n\r ", "a" * 1000]
)
def test_multibyte_round_trip(text):
  ids = TOKENIZER.encode(text)
  assert ids[0] == TOKENIZER.bos_token_id
  assert ids[1:] == list(text.encode("utf-8"))
  assert TOKENIZER.decode(ids) == text


def test_special_tokens():
  assert TOKENIZER.vocab_size == 512
  assert TOKENIZER.bos_token_id == 256
  assert TOKENIZER.eos_token_ids == (257,)
  assert TOKENIZER.all_special_ids == tuple(range(256, 262))
  text = "<s></s><|system|><|user|><|assistant|><|end|>"
  assert TOKENIZER.encode(text, add_special_tokens=False) == list(range(256, 262))
  assert TOKENIZER.decode(range(256, 262), skip_special_tokens=False) == text
  assert TOKENIZER.decode([104, 257, 105, 261]) == "hi"


def test_unused_ids_decode_to_nothing():
  assert TOKENIZER.decode([104, *range(262, 512), 105]) == "hi"
  assert TOKENIZER.id_to_token(300) == ""
  assert TOKENIZER.convert_ids_to_tokens([300]) == [""]


def test_token_strings():
  assert TOKENIZER.id_to_token(ord("h")) == "h"
  assert TOKENIZER.id_to_token(ord(" ")) == "Ġ"  # the ByteLevel alphabet's space
  pieces = TOKENIZER.convert_ids_to_tokens([ord(" "), ord("h"), 0xE4, 259])
  assert pieces == [" ", "h", "\ufffd", "<|user|>"]


def test_chat_template():
  messages = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi 🤖"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "Bye"},
  ]
  prompt = TOKENIZER.apply_chat_template(messages)
  assert prompt == (
    "<s><|system|>Be brief.<|end|><|user|>Hi 🤖<|end|><|assistant|>Hello<|end|>"
    "<|user|>Bye<|end|><|assistant|>"
  )
  assert (
    TOKENIZER.apply_chat_template(messages, add_generation_prompt=False)
    == prompt[: -len("<|assistant|>")]
  )
  ids = TOKENIZER.encode_chat(messages)
  assert ids[:2] == [256, 258] and ids[-1] == 260 and ids.count(256) == 1
  assert TOKENIZER.decode(ids, skip_special_tokens=False) == prompt


def test_chat_template_rejects_unknown_role():
  with pytest.raises(ValueError, match="chat_template.*unsupported role: critic"):
    TOKENIZER.apply_chat_template([{"role": "critic", "content": "x"}])


def test_chat_template_takes_tools_tool_calls_and_tool_messages():
  """What an OpenAI tool round trip sends: tools, an assistant's calls (content null), results."""
  call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
  messages = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": None, "tool_calls": [call]},
    {"role": "tool", "tool_call_id": "call_1", "content": "42"},
  ]
  tools = [{"type": "function", "function": {"name": name}} for name in ("f", "g")]
  assert TOKENIZER.apply_chat_template(messages, tools=tools) == (
    "<s><|system|>tools: f, g<|end|><|user|>hi<|end|>"
    '<|assistant|>[{"name":"f","arguments":{"x":1}}]<|end|>'
    "<|user|>tool result call_1: 42<|end|><|assistant|>"
  )


def test_load_tiny_random():
  tokenizer = load_tokenizer("tiny-random")
  assert tokenizer.vocab_size == 512 and tokenizer.encode("hé") == [256, 104, 0xC3, 0xA9]
