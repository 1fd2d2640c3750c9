"""render_chat_template on its own: helpers, variables, sandboxing and errors."""

from __future__ import annotations

from datetime import datetime

import pytest
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

from jaxserve.tokenizer import compile_chat_template, render_chat_template

MESSAGES = [{"role": "user", "content": "hi"}]


def _render(template: str, messages=MESSAGES, **kwargs) -> str:
  kwargs.setdefault("add_generation_prompt", False)
  kwargs.setdefault("bos_token", "<s>")
  kwargs.setdefault("eos_token", "</s>")
  return render_chat_template(template, messages, **kwargs)


def test_variables_match_transformers():
  template = (
    "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|"
    "{{ documents is none }}|{{ enable_thinking }}|{{ messages[0].content }}"
    "|{{ messages[1].content is defined }}"
  )
  messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]
  ours = _render(template, messages, add_generation_prompt=True, enable_thinking=False)
  # apply_chat_template normalizes messages (drops None values) before rendering.
  reference, _ = render_jinja_template(
    [_normalize_chat_messages(messages)],
    chat_template=template,
    add_generation_prompt=True,
    bos_token="<s>",
    eos_token="</s>",
    enable_thinking=False,
  )
  assert ours == reference[0] == "<s>|</s>|True|True|True|False|hi|False"


def test_tojson_keeps_unicode_and_html():
  assert _render("{{ x | tojson }}", x={"a": "ü <b>&"}) == '{"a": "ü <b>&"}'
  assert _render("{{ x | tojson(indent=2) }}", x=[1]) == "[\n  1\n]"


def test_strftime_now():
  assert _render("{{ strftime_now('%Y') }}") == str(datetime.now().year)


def test_raise_exception_is_value_error():
  with pytest.raises(ValueError, match="chat_template.*roles must alternate"):
    _render("{{ raise_exception('roles must alternate') }}")


def test_syntax_error_is_value_error():
  with pytest.raises(ValueError, match="chat_template"):
    compile_chat_template("{% for m in messages %}")
  with pytest.raises(ValueError, match="chat_template"):
    _render("{{ messages[0]['content'] + 1 }}")


def test_sandbox_blocks_python_internals():
  with pytest.raises(ValueError, match="chat_template"):
    _render("{{ ''.__class__.__mro__[1].__subclasses__() }}")
  with pytest.raises(ValueError, match="chat_template"):
    _render("{% set ns = namespace() %}{% set ns._x = 1 %}")
  with pytest.raises(ValueError, match="chat_template"):
    _render("{{ messages.append(1) }}")  # immutable sandbox


def test_bad_messages():
  with pytest.raises(ValueError, match="messages"):
    _render("x", messages="hi")
  with pytest.raises(ValueError, match=r"messages\[1\]"):
    _render("x", messages=[{"role": "user"}, "hi"])
