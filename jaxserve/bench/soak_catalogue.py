"""What `jaxserve bench soak` sends: the mixed good requests, the bad inputs and the canary.

Good requests (`good_request`) mix what a production server sees: completions and chat, streamed
and not, n > 1, logprobs, stop strings, structured outputs (a JSON schema), tool calls (a forced
`tool_choice`) and prompts near `max_model_len` (token ids repeated from the server's own
/tokenize of a text, so they fit whatever the tokenizer). Each is a `SoakRequest` of plain data.

Bad inputs (`bad_inputs`) are the catalogue every server must answer with a 4xx and OpenAI's
error body, never a 5xx: malformed bodies, empty and out-of-range prompts, a prompt or
max_tokens past the context, out-of-range sampling fields, a huge `n` (vLLM's CVE), unknown
models and routes, a wrong method, a lone surrogate. Sizes come from the served model's
`max_model_len`, so the catalogue holds for any model. A role OpenAI does not name is not in it:
as in vLLM, the chat template decides (Llama 3.1's renders "ipython"; a template that raises on
a role is answered with a 400).

The canary is one greedy completion of a fixed prompt: with batch invariance every answer is the
first one, whatever the load.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
CANARY_PROMPT = "The soak canary: count to ten slowly."
CANARY_TOKENS = 16
GOOD_KINDS = (
  "completion",
  "completion_stream",
  "chat",
  "chat_stream",
  "n2_stream",
  "logprobs_stream",
  "stop_strings",
  "json_schema",
  "tool_call",
  "long_prompt_stream",
)


@dataclass(frozen=True)
class SoakRequest:
  """One HTTP call: `expect_4xx` for a bad input; `cancel_after` chunks for a client that goes
  away mid-stream (None: reads to the end); `raw` sends `body` as these bytes."""

  kind: str
  path: str
  body: dict = field(default_factory=dict)
  method: str = "POST"
  stream: bool = False
  expect_4xx: bool = False
  cancel_after: int | None = None
  raw: bytes | None = None


@dataclass(frozen=True)
class ServedModel:
  """What the soak knows of the server: its model name, context and a token-id run for long
  prompts (from its /tokenize)."""

  name: str
  max_model_len: int
  filler_ids: tuple[int, ...]


def long_stream(model: ServedModel) -> SoakRequest:
  """The stalled reader's call: as long as the context allows, top-5 logprobs on each token."""
  body = {"model": model.name, "prompt": "a stream nobody reads", "stream": True}
  tokens = max(1, model.max_model_len - 64)
  body.update(max_tokens=tokens, logprobs=5, ignore_eos=True)
  return SoakRequest("stalled", COMPLETIONS, body, stream=True)


def canary(model: ServedModel) -> SoakRequest:
  body = {"model": model.name, "prompt": CANARY_PROMPT, "max_tokens": CANARY_TOKENS}
  return SoakRequest("canary", COMPLETIONS, {**body, "temperature": 0})


def good_request(rng: random.Random, model: ServedModel, max_tokens: int) -> SoakRequest:
  """One of GOOD_KINDS, chosen uniformly."""
  kind = rng.choice(GOOD_KINDS)
  tokens = rng.randint(max(1, max_tokens // 2), max_tokens)
  base = {"model": model.name, "max_tokens": tokens, "temperature": rng.choice((0.0, 0.8))}
  prompt = f"soak {rng.randrange(10**6)}: tell me about request {kind}"
  messages = [{"role": "user", "content": prompt}]
  stream = {"stream": True, "stream_options": {"include_usage": True}}
  if kind == "completion":
    return SoakRequest(kind, COMPLETIONS, {**base, "prompt": prompt})
  if kind == "completion_stream":
    return SoakRequest(kind, COMPLETIONS, {**base, "prompt": prompt, **stream}, stream=True)
  if kind == "chat":
    return SoakRequest(kind, CHAT, {**base, "messages": messages})
  if kind == "chat_stream":
    return SoakRequest(kind, CHAT, {**base, "messages": messages, **stream}, stream=True)
  if kind == "n2_stream":
    return SoakRequest(kind, COMPLETIONS, {**base, "prompt": prompt, "n": 2, **stream}, stream=True)
  if kind == "logprobs_stream":
    body = {**base, "messages": messages, "logprobs": True, "top_logprobs": 5, **stream}
    return SoakRequest(kind, CHAT, body, stream=True)
  if kind == "stop_strings":
    return SoakRequest(kind, COMPLETIONS, {**base, "prompt": prompt, "stop": ["e", "\n"]})
  if kind == "json_schema":
    return SoakRequest(kind, CHAT, {**base, "messages": messages, "response_format": JSON_SCHEMA})
  if kind == "tool_call":
    body = {**base, "messages": messages, "tools": [WEATHER_TOOL], "tool_choice": "required"}
    return SoakRequest(kind, CHAT, body)
  room = model.max_model_len - tokens - 1
  ids = (model.filler_ids * (room // len(model.filler_ids) + 1))[: max(1, room)]
  return SoakRequest(kind, COMPLETIONS, {**base, "prompt": list(ids), **stream}, stream=True)


JSON_SCHEMA = {
  "type": "json_schema",
  "json_schema": {
    "name": "reading",
    "schema": {
      "type": "object",
      "properties": {"city": {"type": "string", "maxLength": 12}, "celsius": {"type": "integer"}},
      "required": ["city", "celsius"],
      "additionalProperties": False,
    },
  },
}
WEATHER_TOOL = {
  "type": "function",
  "function": {
    "name": "get_weather",
    "parameters": {
      "type": "object",
      "properties": {"city": {"type": "string", "maxLength": 12}},
      "required": ["city"],
      "additionalProperties": False,
    },
  },
}


def bad_inputs(model: ServedModel) -> list[SoakRequest]:
  """Every entry must get a 4xx with OpenAI's error body."""
  name, limit = model.name, model.max_model_len
  user = [{"role": "user", "content": "hello"}]
  completion = [
    {},
    {"prompt": ""},
    {"prompt": []},
    {"prompt": ["ok", ""]},
    {"prompt": [1, 10**9]},
    {"prompt": [[1, 2], [-1]]},
    {"prompt": list(model.filler_ids) * (limit // len(model.filler_ids) + 2)},
    {"prompt": "hi", "max_tokens": limit + 1},
    {"prompt": "hi", "max_tokens": -1},
    {"prompt": "hi", "max_tokens": "ten"},
    {"prompt": "hi", "temperature": -1},
    {"prompt": "hi", "top_p": 0},
    {"prompt": "hi", "top_k": -2},
    {"prompt": "hi", "logprobs": 21},
    {"prompt": "hi", "n": 0},
    {"prompt": "hi", "n": 10**9},
    {"prompt": "hi", "seed": -1},
    {"prompt": "hi", "stop": [""]},
    {"prompt": "hi", "logit_bias": {"5": 101}},
    {"prompt": "hi", "stream": "yes"},
    {"prompt": "hi", "model": f"not-{name}"},
  ]
  chat = [
    {},
    {"messages": []},
    {"messages": [{"content": "no role"}]},
    {"messages": [{"role": "user", "content": 7}]},
    {"messages": user, "max_tokens": limit + 1},
    {"messages": user, "top_logprobs": 2},
    {"messages": user, "tools": [WEATHER_TOOL], "tool_choice": {"type": "nope"}},
    {"messages": user, "response_format": {"type": "xml"}},
  ]
  requests = [
    SoakRequest("bad", path, {"model": name, **body}, expect_4xx=True)
    for path, bodies in ((COMPLETIONS, completion), (CHAT, chat))
    for body in bodies
  ]
  requests += [
    SoakRequest("bad", COMPLETIONS, expect_4xx=True, raw=b"{not json"),
    SoakRequest("bad", COMPLETIONS, expect_4xx=True, raw=b"[1, 2, 3]"),
    SoakRequest("bad", COMPLETIONS, expect_4xx=True, raw=b'{"prompt": "\\ud800"}'),
    SoakRequest("bad", "/v1/no-such-route", {"prompt": "hi"}, expect_4xx=True),
    SoakRequest("bad", "/v1/../../etc/passwd", method="GET", expect_4xx=True),
    SoakRequest("bad", COMPLETIONS, method="GET", expect_4xx=True),
  ]
  return requests
