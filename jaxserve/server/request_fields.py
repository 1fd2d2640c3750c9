"""The one policy for the top-level fields of a generation request body that jaxserve does not
implement (POST /v1/completions, POST /v1/chat/completions).

* A field that would change what is generated and is not implemented here is refused with
  ValueError("<field>: ...") -> a 400 naming it, unless it holds its neutral value (null, or
  e.g. `best_of` equal to `n`, `modalities: ["text"]`): `suffix` (vLLM refuses it too),
  `best_of` > n, beam search, `allowed_token_ids`, `bad_words`, `truncate_prompt_tokens`, the
  guided_* fields (vLLM's older structured-output names: use `structured_outputs` or
  `response_format`), `prompt_logprobs` (use `echo` + `logprobs` on completions), OpenAI's
  deprecated `functions` / `function_call` (use `tools` / `tool_choice`), audio output.
* A field that changes nothing generated (`user`, `metadata`, `store`, `service_tier`,
  `prediction`, vLLM's `request_id`, ...) is accepted silently.
* Any other field is unknown: ignored with one warning in the server log naming the fields, as
  vLLM does ("fields were present in the request but ignored").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

logger = logging.getLogger(__name__)

# Body fields passed to SamplingParams as they are (SamplingParams validates the values), and
# the booleans among them (protocol.py reads both).
SAMPLING_FIELDS = (
  "n",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "seed",
  "repetition_penalty",
  "presence_penalty",
  "frequency_penalty",
  "min_tokens",
)
BOOL_FIELDS = ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens")
_COMMON = frozenset(SAMPLING_FIELDS + BOOL_FIELDS) | {
  "model",
  "stop",
  "stop_token_ids",
  "logit_bias",
  "max_tokens",
  "logprobs",
  "stream",
  "stream_options",
  "response_format",
  "structured_outputs",
  "priority",
}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo"}
CHAT_FIELDS = _COMMON | {
  "messages",
  "max_completion_tokens",
  "top_logprobs",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "add_generation_prompt",
  "continue_final_message",
  "chat_template_kwargs",
  "echo",
  "include_reasoning",
}

# Accepted and ignored without a word: they change nothing that is generated.
HARMLESS = frozenset(
  {
    "user",
    "metadata",
    "store",
    "service_tier",
    "prediction",
    "request_id",
    "spaces_between_special_tokens",
    "guided_decoding_backend",
  }
)


def _is_none(value: object, body: Mapping) -> bool:
  return value is None


def _best_of_neutral(value: object, body: Mapping) -> bool:
  return value is None or value == (body.get("n") or 1)


def _falsy(value: object, body: Mapping) -> bool:
  return not value


def _text_only(value: object, body: Mapping) -> bool:
  return value is None or value == ["text"]


def _one(value: object, body: Mapping) -> bool:
  return value is None or value == 1 or value == 1.0


# field -> (holds its neutral value?, why it is refused otherwise)
UNSUPPORTED: dict[str, tuple[Callable[[object, Mapping], bool], str]] = {
  "suffix": (_is_none, "is not supported (as in vLLM)"),
  "best_of": (_best_of_neutral, "is not supported: only best_of == n (or null)"),
  "use_beam_search": (_falsy, "beam search is not supported"),
  "length_penalty": (_one, "beam search is not supported"),
  "allowed_token_ids": (_is_none, "is not supported (use logit_bias)"),
  "bad_words": (_falsy, "is not supported (use logit_bias)"),
  "truncate_prompt_tokens": (_is_none, "is not supported"),
  "prompt_logprobs": (_is_none, "is not supported (on completions: echo with logprobs)"),
  "guided_json": (_is_none, "is not supported: use structured_outputs or response_format"),
  "guided_regex": (_is_none, "is not supported: use structured_outputs"),
  "guided_choice": (_is_none, "is not supported: use structured_outputs"),
  "guided_grammar": (_is_none, "is not supported: use structured_outputs"),
  "functions": (_is_none, "is deprecated and not supported: use tools"),
  "function_call": (_is_none, "is deprecated and not supported: use tool_choice"),
  "audio": (_is_none, "audio output is not supported"),
  "modalities": (_text_only, 'only ["text"] is supported'),
}


def check_fields(body: Mapping, known: frozenset[str]) -> tuple[str, ...]:
  """Applies the policy to a body whose implemented fields are `known`: ValueError naming an
  unsupported field that holds more than its neutral value; the unknown fields, sorted (already
  logged as one warning)."""
  unknown = []
  for name, value in body.items():
    if name in known or name in HARMLESS:
      continue
    if name in UNSUPPORTED:
      neutral, why = UNSUPPORTED[name]
      if not neutral(value, body):
        raise ValueError(f"{name}: {why}")
      continue
    unknown.append(name)
  if unknown:
    unknown.sort()
    logger.warning("The following fields were present in the request but ignored: %s", unknown)
  return tuple(unknown)
