"""OpenAI request bodies -> typed requests with validated SamplingParams.

Every check raises ValueError("field: message") with the body's field name, which the handlers
turn into a 400 whose `param` is that field. Fields not implemented here follow one policy
(server/request_fields.py): refused when they would change what is generated (`suffix`,
`best_of` > n, ...), else ignored with a warning naming them; `null` means "the default".
`logit_bias` ({"<token id>": bias in [-100, 100]}, at most 300) is applied on the device.
vLLM's extensions (top_k, min_p, repetition_penalty, min_tokens, ignore_eos, stop_token_ids, ...)
are accepted on both endpoints. A sampling field left unset (absent or null) takes the model's
default from its generation_config.json (jaxserve/config/generation_config.py) where it sets one.

Structured outputs: OpenAI's `response_format` and vLLM's `structured_outputs` (both endpoints)
become SamplingParams.structured_outputs (jaxserve/structured/spec.py parses their shape; the
engine validates the grammar itself at admission). Chat tool calling: `tools` and `tool_choice`
(jaxserve/structured/tools.py); "required" or a named function becomes the constraint that forces
the call, so it cannot be combined with another constraint. Messages keep what chat templates
read for tool calling: an assistant's `tool_calls` (arguments parsed from their JSON text into
objects, as vLLM hands them to templates) and a `tool` message's `tool_call_id` / `name`
(server/chat_messages.py). The prompt's own fields (add_generation_prompt,
continue_final_message, chat_template_kwargs) are server/chat_prompt.py's; chat `echo` and
`include_reasoning` shape the reply (server/chat_choices.py); stream_options'
continuous_usage_stats puts usage on every chunk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jaxserve.api.sampling_params import MAX_LOGPROBS, SamplingParams
from jaxserve.config.generation_config import GenerationDefaults
from jaxserve.server.chat_prompt import ChatPrompt, parse_chat_prompt
from jaxserve.server.request_fields import (
  BOOL_FIELDS,
  CHAT_FIELDS,
  COMPLETION_FIELDS,
  SAMPLING_FIELDS,
  check_fields,
)
from jaxserve.structured.spec import StructuredOutputError, StructuredOutputSpec, spec_from_request
from jaxserve.structured.tools import (
  TOOL_CHOICE,
  ToolChoice,
  ToolChoiceMode,
  ToolFunction,
  parse_tool_choice,
  parse_tools,
  tool_choice_constraint,
)

Prompt = str | tuple[int, ...]
DEFAULT_COMPLETION_MAX_TOKENS = 16


@dataclass(frozen=True)
class CompletionRequest:
  """POST /v1/completions. max_tokens 0 (scoring) runs one token with prompt logprobs and drops
  it: `score_only` is then True and params.max_tokens is 1."""

  prompts: tuple[Prompt, ...]
  params: SamplingParams
  stream: bool
  include_usage: bool
  echo: bool
  logprobs: int | None
  score_only: bool
  continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk
  priority: int = 0  # vLLM's: the order under --scheduling-policy priority (lower first)


@dataclass(frozen=True)
class ChatRequest:
  """POST /v1/chat/completions. params.max_tokens is provisional when max_tokens is None: the
  default (max_new_tokens of the generation config, at most max_model_len - prompt tokens) is
  known only after the prompt is tokenized."""

  prompt: ChatPrompt
  params: SamplingParams
  max_tokens: int | None
  stream: bool
  include_usage: bool
  logprobs: bool
  top_logprobs: int | None
  tools: tuple[ToolFunction, ...] = ()
  tool_choice: ToolChoice = ToolChoice(ToolChoiceMode.NONE)
  continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk
  echo: bool = False  # the last message's content starts the reply (ChatPrompt.echo_text)
  include_reasoning: bool = True  # with a reasoning parser: report the reasoning
  priority: int = 0  # vLLM's: the order under --scheduling-policy priority (lower first)

  @property
  def forced_tool_calls(self) -> bool:
    """tool_choice "required" or a named function: the output is the constrained calls."""
    return self.tool_choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED)


def parse_completion_request(
  body: Mapping,
  max_logprobs: int = MAX_LOGPROBS,
  defaults: GenerationDefaults = GenerationDefaults(),
) -> CompletionRequest:
  """max_logprobs: the server's cap on `logprobs` (server.max_logprobs); defaults: the model's
  sampling defaults, for the fields the body leaves unset."""
  check_fields(body, COMPLETION_FIELDS)
  prompts = parse_prompts(body.get("prompt"))
  max_tokens = _optional_int(body, "max_tokens", minimum=0)
  max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if max_tokens is None else max_tokens
  echo = _bool(body, "echo", False)
  logprobs = _optional_int(body, "logprobs", minimum=0, maximum=max_logprobs)
  prompt_logprobs = logprobs if echo and logprobs is not None else None
  score_only = max_tokens == 0
  params = sampling_params(
    body,
    max_tokens=max(max_tokens, 1),
    logprobs=logprobs,
    prompt_logprobs=prompt_logprobs,
    structured_outputs=_constraint(body),
    defaults=defaults,
  )
  stream, include_usage, continuous = _stream_flags(body)
  return CompletionRequest(
    prompts,
    params,
    stream,
    include_usage,
    echo,
    logprobs,
    score_only,
    continuous,
    parse_priority(body),
  )


def parse_chat_request(
  body: Mapping,
  max_model_len: int,
  max_logprobs: int = MAX_LOGPROBS,
  defaults: GenerationDefaults = GenerationDefaults(),
) -> ChatRequest:
  """max_logprobs: the server's cap on `top_logprobs` (server.max_logprobs); defaults: the
  model's sampling defaults, for the fields the body leaves unset (max_tokens: ChatRequest's)."""
  check_fields(body, CHAT_FIELDS)
  prompt = parse_chat_prompt(body)
  max_tokens = _optional_int(body, "max_completion_tokens", minimum=1)
  if max_tokens is None:
    max_tokens = _optional_int(body, "max_tokens", minimum=1)
  logprobs = _bool(body, "logprobs", False)
  top_logprobs = _optional_int(body, "top_logprobs", minimum=0, maximum=max_logprobs)
  if top_logprobs is not None and not logprobs:
    raise ValueError("top_logprobs: requires logprobs to be true")
  tools = parse_tools(body.get("tools"))
  tool_choice = parse_tool_choice(body.get("tool_choice"), tools)
  constraint = _constraint(body)
  forced = tool_choice_constraint(tools, tool_choice, _bool(body, "parallel_tool_calls", True))
  if forced is not None:
    if constraint is not None:
      raise StructuredOutputError(
        TOOL_CHOICE,
        f"{tool_choice.mode.value!r} cannot be combined with response_format or structured_outputs",
      )
    constraint = forced
  params = sampling_params(
    body,
    max_tokens=max_tokens or max_model_len,
    logprobs=(top_logprobs or 0) if logprobs else None,
    prompt_logprobs=None,
    structured_outputs=constraint,
    defaults=defaults,
  )
  stream, include_usage, continuous = _stream_flags(body)
  return ChatRequest(
    prompt,
    params,
    max_tokens,
    stream,
    include_usage,
    logprobs,
    top_logprobs,
    tools,
    tool_choice,
    continuous,
    _bool(body, "echo", False),
    _bool(body, "include_reasoning", True),
    parse_priority(body),
  )


def parse_priority(body: Mapping) -> int:
  """vLLM's `priority` (default 0): an integer; whether the server schedules by it is the engine
  core's rule (engine/admission.check_priority), which refuses a non-zero one under fcfs."""
  value = body.get("priority")
  return 0 if value is None else _int_value("priority", value)


def _constraint(body: Mapping) -> StructuredOutputSpec | None:
  return spec_from_request(body.get("response_format"), body.get("structured_outputs"))


def sampling_params(
  body: Mapping,
  *,
  max_tokens: int,
  logprobs: int | None,
  prompt_logprobs: int | None,
  structured_outputs: StructuredOutputSpec | None = None,
  defaults: GenerationDefaults = GenerationDefaults(),
) -> SamplingParams:
  kwargs: dict = {name: body[name] for name in SAMPLING_FIELDS if body.get(name) is not None}
  for name in BOOL_FIELDS:
    if body.get(name) is not None:
      kwargs[name] = _bool(body, name, False)
  for name in ("n", "top_k", "seed", "min_tokens"):
    if name in kwargs:
      kwargs[name] = _int_value(name, kwargs[name])
  kwargs["stop"] = parse_stop(body.get("stop"))
  kwargs["stop_token_ids"] = _int_list(body, "stop_token_ids")
  kwargs["logit_bias"] = parse_logit_bias(body.get("logit_bias"))
  kwargs = defaults.fill(kwargs)
  return SamplingParams(
    max_tokens=max_tokens,
    logprobs=logprobs,
    prompt_logprobs=prompt_logprobs,
    structured_outputs=structured_outputs,
    **kwargs,
  )


def parse_logit_bias(value: object) -> tuple[tuple[int, float], ...]:
  """OpenAI's {"<token id>": bias} -> (id, bias) pairs (SamplingParams checks the ranges)."""
  if value is None:
    return ()
  if not isinstance(value, dict):
    raise ValueError("logit_bias: must be an object mapping token ids (as strings) to biases")
  pairs = []
  for key, bias in value.items():
    token = key.strip()
    if not (token.isascii() and token.isdigit()):
      raise ValueError(f"logit_bias: keys must be token ids, got {key!r}")
    if isinstance(bias, bool) or not isinstance(bias, (int, float)):
      raise ValueError(f"logit_bias: bias of token {key} must be a number, got {bias!r}")
    pairs.append((int(token), bias))
  return tuple(pairs)


def parse_prompts(value: object) -> tuple[Prompt, ...]:
  """A string, a list of strings, a list of token ids, or a list of token-id lists."""
  if isinstance(value, str):
    return (_text_prompt(value, "prompt"),)
  if not isinstance(value, list) or not value:
    raise ValueError(
      "prompt: must be a non-empty string, list of strings, list of token ids "
      "or list of token-id lists"
    )
  if all(_is_int(t) for t in value):
    return (tuple(value),)
  prompts: list[Prompt] = []
  for i, item in enumerate(value):
    if isinstance(item, str):
      prompts.append(_text_prompt(item, f"prompt[{i}]"))
    elif isinstance(item, list) and item and all(_is_int(t) for t in item):
      prompts.append(tuple(item))
    else:
      raise ValueError(f"prompt[{i}]: must be a non-empty string or a non-empty list of token ids")
  return tuple(prompts)


def parse_stop(value: object) -> tuple[str, ...]:
  if value is None:
    return ()
  if isinstance(value, str):
    value = [value]
  if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
    raise ValueError("stop: must be a non-empty string or a list of non-empty strings")
  return tuple(value)


def _stream_flags(body: Mapping) -> tuple[bool, bool, bool]:
  """stream, include_usage, and usage on every chunk (continuous_usage_stats, which counts only
  with include_usage, as in vLLM)."""
  stream = _bool(body, "stream", False)
  options = body.get("stream_options")
  if options is None:
    return stream, False, False
  if not isinstance(options, dict):
    raise ValueError("stream_options: must be an object")
  if not stream:
    raise ValueError("stream_options: only allowed when stream is true")
  include = _bool(options, "include_usage", False, name="stream_options.include_usage")
  continuous = _bool(
    options, "continuous_usage_stats", False, name="stream_options.continuous_usage_stats"
  )
  return stream, include, include and continuous


def _text_prompt(text: str, name: str) -> str:
  if not text:
    raise ValueError(f"{name}: must not be empty")
  return text


def _bool(body: Mapping, key: str, default: bool, name: str | None = None) -> bool:
  value = body.get(key)
  if value is None:
    return default
  if not isinstance(value, bool):
    raise ValueError(f"{name or key}: must be a boolean, got {value!r}")
  return value


def _is_int(value: object) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _int_value(name: str, value: object) -> int:
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  if not _is_int(value):
    raise ValueError(f"{name}: must be an integer, got {value!r}")
  return value


def _optional_int(
  body: Mapping, name: str, *, minimum: int, maximum: int | None = None
) -> int | None:
  value = body.get(name)
  if value is None:
    return None
  value = _int_value(name, value)
  if value < minimum or (maximum is not None and value > maximum):
    upper = "" if maximum is None else f", <= {maximum}"
    raise ValueError(f"{name}: must be an integer >= {minimum}{upper}, got {value!r}")
  return value


def _int_list(body: Mapping, name: str) -> tuple[int, ...]:
  value = body.get(name)
  if value is None:
    return ()
  if not isinstance(value, list) or not all(_is_int(t) and t >= 0 for t in value):
    raise ValueError(f"{name}: must be a list of non-negative integers")
  return tuple(value)
