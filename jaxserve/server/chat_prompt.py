"""A chat request's prompt (POST /v1/chat/completions and POST /tokenize with `messages`): its
fields, the chat template's variables and the prompt's token ids.

The template's variables, merged as vLLM merges them: server.default_chat_template_kwargs, then
the request's add_generation_prompt (default true) and continue_final_message (default false),
then its `chat_template_kwargs` (e.g. Qwen3's {"enable_thinking": false}), which win, even over
those two. The names the renderer sets itself (messages, tools: use the request's fields) and
vLLM's forbidden ones (chat_template, tokenize) are refused with a 400 naming them.

continue_final_message continues the last message (a partial assistant reply): the template
does not close it and no generation prompt follows, so add_generation_prompt must be false with
it, as in vLLM (a 400 naming continue_final_message otherwise; tokenizer/chat_template.py cuts
the rendered text, transformers' rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from jaxserve.server.chat_messages import parse_messages
from jaxserve.tokenizer.tokenizer import Tokenizer

TEMPLATE_KWARGS = "chat_template_kwargs"
RESERVED_VARIABLES = ("messages", "tools", "chat_template", "tokenize")


@dataclass(frozen=True)
class ChatPrompt:
  """What a request says of its prompt; template_kwargs: its chat_template_kwargs."""

  messages: tuple[dict, ...]
  add_generation_prompt: bool = True
  continue_final_message: bool = False
  template_kwargs: dict[str, object] = field(default_factory=dict)

  @property
  def echo_text(self) -> str:
    """What chat `echo` puts before a reply (vLLM's rule): the last message's content when the
    reply continues it (no generation prompt, or the last message is the assistant's)."""
    last = self.messages[-1]
    if self.add_generation_prompt and last["role"] != "assistant":
      return ""
    return last.get("content") or ""


def parse_chat_prompt(body: Mapping) -> ChatPrompt:
  """The prompt fields of a body; ValueError naming the field."""
  kwargs = body.get("chat_template_kwargs")
  if kwargs is None:
    kwargs = {}
  if not isinstance(kwargs, dict):
    raise ValueError(f"{TEMPLATE_KWARGS}: must be an object of template variables")
  for name in RESERVED_VARIABLES:
    if name in kwargs:
      raise ValueError(
        f"{TEMPLATE_KWARGS}.{name}: not a template variable a request may set"
        + (" (use the request's field)" if name in ("messages", "tools") else "")
      )
  return ChatPrompt(
    parse_messages(body.get("messages")),
    _flag(body, "add_generation_prompt", True),
    _flag(body, "continue_final_message", False),
    dict(kwargs),
  )


def render_chat_prompt(
  tokenizer: Tokenizer,
  prompt: ChatPrompt,
  defaults: Mapping[str, object] | None,
  tools: list[dict] | None = None,
) -> str:
  """The prompt's text (encode it without special tokens: the template writes them);
  `defaults`: server.default_chat_template_kwargs. ValueError naming chat_template (a template
  failure) or continue_final_message."""
  variables: dict[str, object] = {
    **(defaults or {}),
    "add_generation_prompt": prompt.add_generation_prompt,
    "continue_final_message": prompt.continue_final_message,
    **prompt.template_kwargs,
  }
  add_generation_prompt = bool(variables.pop("add_generation_prompt"))
  continue_final_message = bool(variables.pop("continue_final_message"))
  return tokenizer.apply_chat_template(
    list(prompt.messages), add_generation_prompt, tools, continue_final_message, **variables
  )


def encode_chat_prompt(
  tokenizer: Tokenizer,
  prompt: ChatPrompt,
  defaults: Mapping[str, object] | None,
  tools: list[dict] | None = None,
) -> list[int]:
  """The prompt's token ids (render_chat_prompt's text, encoded)."""
  return tokenizer.encode(
    render_chat_prompt(tokenizer, prompt, defaults, tools), add_special_tokens=False
  )


def _flag(body: Mapping, name: str, default: bool) -> bool:
  value = body.get(name)
  if value is None:
    return default
  if not isinstance(value, bool):
    raise ValueError(f"{name}: must be a boolean, got {value!r}")
  return value
