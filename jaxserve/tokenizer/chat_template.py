"""Chat templates: jinja2 rendering of a conversation into a prompt string.

Rendering follows Hugging Face transformers' `apply_chat_template(..., tokenize=False)` so that a
model's template produces the same prompt here as there:
* an `ImmutableSandboxedEnvironment` (templates come from checkpoints and are untrusted) with
  `trim_blocks`, `lstrip_blocks` and the `loopcontrols` extension;
* the globals `raise_exception(message)` and `strftime_now(format)`, a `tojson` filter that does not
  escape HTML and accepts `indent` / `separators` / `sort_keys`, and a `namespace` that refuses
  underscore-prefixed attributes;
* the variables `messages`, `tools`, `documents` (None unless given), `add_generation_prompt`,
  `bos_token`, `eos_token` and any extra keyword (e.g. `unk_token`, `enable_thinking`);
* message keys whose value is None are dropped (OpenAI clients send `content: null` with tool
  calls);
* continue_final_message (with add_generation_prompt false): the prompt ends with the last
  message's content, without what the template writes after it (its end-of-turn tokens), cut as
  transformers does: a marker appended to the content is rendered and cut off again (where the
  template trims the content, its trailing whitespace goes too).

Any template failure, including `raise_exception`, is a ValueError naming chat_template.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker of continue_final_message


def _raise_exception(message: str) -> None:
  raise jinja2.exceptions.TemplateError(message)


def _tojson(
  value: object,
  ensure_ascii: bool = False,
  indent: int | None = None,
  separators: tuple[str, str] | None = None,
  sort_keys: bool = False,
) -> str:
  return json.dumps(
    value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
  )


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates use
  return datetime.now().strftime(format)


class _TemplateNamespace(jinja2.utils.Namespace):
  """jinja2's `namespace` without underscore-prefixed attributes (no reach into Python's
  internals)."""

  def __init__(*args: object, **kwargs: object) -> None:
    self, args = args[0], args[1:]
    attrs = dict(*args, **kwargs)
    for name in attrs:
      _TemplateNamespace._check_name(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name: str, value: object) -> None:
    _TemplateNamespace._check_name(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
      raise jinja2.exceptions.SecurityError(
        f"chat_template: namespace attribute {name!r} may not start with an underscore"
      )


def compile_chat_template(source: str) -> jinja2.Template:
  """Compiles a chat template; a syntax error is a ValueError naming chat_template."""
  if not isinstance(source, str):
    raise ValueError(f"chat_template: must be a string, got {type(source).__name__}")
  env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
  )
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  env.globals["namespace"] = _TemplateNamespace
  try:
    return env.from_string(source)
  except jinja2.exceptions.TemplateError as e:
    raise ValueError(f"chat_template: cannot compile the template: {e}") from e


def _normalize_messages(messages: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
  if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
    raise ValueError(f"messages: must be a list of dicts, got {type(messages).__name__}")
  normalized = []
  for i, message in enumerate(messages):
    if not isinstance(message, Mapping):
      raise ValueError(f"messages[{i}]: must be a dict, got {type(message).__name__}")
    normalized.append({key: value for key, value in message.items() if value is not None})
  return normalized


def render_chat_template(
  template: str | jinja2.Template,
  messages: Sequence[Mapping[str, object]],
  *,
  add_generation_prompt: bool,
  bos_token: str | None,
  eos_token: str | None,
  tools: list[dict] | None = None,
  continue_final_message: bool = False,
  **extra: object,
) -> str:
  """Renders `messages` with `template` (source text or the result of `compile_chat_template`)."""
  if continue_final_message and add_generation_prompt:
    raise ValueError(
      "continue_final_message: cannot be combined with add_generation_prompt (set it to false): "
      "the last message is continued, no new one is started"
    )
  compiled = compile_chat_template(template) if isinstance(template, str) else template
  variables: dict[str, object] = {"documents": None, **extra}
  if bos_token is not None:
    variables["bos_token"] = bos_token
  if eos_token is not None:
    variables["eos_token"] = eos_token
  normalized = _normalize_messages(messages)
  final = ""
  if continue_final_message:
    final = normalized[-1].get("content") if normalized else None
    if not isinstance(final, str):
      raise ValueError("continue_final_message: the last message has no text content to continue")
    normalized[-1]["content"] = final + _CONTINUE_TAG
  try:
    rendered = compiled.render(
      messages=normalized,
      tools=tools,
      add_generation_prompt=add_generation_prompt,
      **variables,
    )
  except (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, AttributeError) as e:
    raise ValueError(f"chat_template: rendering failed: {type(e).__name__}: {e}") from e
  return _cut_after_final_message(rendered, final) if continue_final_message else rendered


def _cut_after_final_message(rendered: str, final: str) -> str:
  """`rendered` (of a conversation whose last content ended in _CONTINUE_TAG) cut at the tag:
  transformers' rule (its trailing space gone, the template trimmed the content: cut before the
  trailing whitespace too)."""
  if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
    raise ValueError(
      "continue_final_message: the chat template does not write the last message's content "
      "as it is, so it cannot be continued"
    )
  location = rendered.rindex(_CONTINUE_TAG.strip())
  if rendered[location : location + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
    return rendered[:location]
  return rendered[:location].rstrip()
