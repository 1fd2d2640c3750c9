"""How chat choices become tool calls (server/tool_calls.py), on hand-written model outputs:
"auto" through the Hermes parser, "required" / a named function from the constrained JSON, whole
and streamed (the arguments in fragments as written), cut by max_tokens (a truncated call)."""

from __future__ import annotations

import json

from jaxserve.server.protocol import parse_chat_request
from jaxserve.server.tool_calls import ToolCallFormatter

TOOL = {
  "type": "function",
  "function": {
    "name": "get_weather",
    "parameters": {
      "type": "object",
      "properties": {"city": {"type": "string"}},
      "required": ["city"],
    },
  },
}
HERMES = (
  'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
)


def _formatter(tool_choice, parser="hermes") -> ToolCallFormatter:
  body = {
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [TOOL],
    "tool_choice": tool_choice,
  }
  return ToolCallFormatter(parse_chat_request(body, 256), parser)


def _streamed(formatter: ToolCallFormatter, text: str, finish_reason: str):
  """Content, calls (with the number of argument fragments) and finish_reason of `text` streamed
  7 characters at a time."""
  stream = formatter.stream()
  deltas = [delta for i in range(0, len(text), 7) for delta in stream.feed(text[i : i + 7])]
  last, reason = stream.finish(finish_reason)
  deltas += last
  content = "".join(d.content for d in deltas)
  calls: dict[int, dict] = {}
  for delta in deltas:
    assert len({call.index for call in delta.tool_calls}) == len(delta.tool_calls)  # one chunk
    for call in delta.tool_calls:
      entry = calls.setdefault(
        call.index, {"id": call.id, "name": call.name, "arguments": "", "fragments": 0}
      )
      entry["arguments"] += call.arguments
      entry["fragments"] += bool(call.arguments)
  return content, list(calls.values()), reason


def test_auto_with_the_hermes_parser_whole_and_streamed():
  message = _formatter("auto").final(HERMES, "stop")
  assert message.finish_reason == "tool_calls" and message.content == "Let me check."
  assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [
    ("get_weather", {"city": "Oslo"})
  ]
  content, calls, reason = _streamed(_formatter("auto"), HERMES, "stop")
  assert reason == "tool_calls" and content == "Let me check."
  assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
    ("get_weather", {"city": "Oslo"})
  ]


def test_plain_text_and_no_parser_stay_content():
  assert _formatter("auto").final("just text", "stop").tool_calls == ()
  message = _formatter("auto", parser=None).final(HERMES, "stop")
  assert message.content == HERMES and message.finish_reason == "stop"
  assert not _formatter("auto", parser=None).active


def test_forced_calls_whole_streamed_and_cut_by_max_tokens():
  named = {"type": "function", "function": {"name": "get_weather"}}
  text = '{"name":"get_weather","arguments":{"city":"Lima"}}'
  message = _formatter(named).final(text, "stop")
  assert message.content is None and message.finish_reason == "tool_calls"
  assert message.tool_calls[0].arguments == '{"city":"Lima"}'
  content, calls, reason = _streamed(_formatter(named), text, "stop")
  assert (content, reason) == ("", "tool_calls") and calls[0]["name"] == "get_weather"
  assert calls[0]["id"].startswith("call_") and json.loads(calls[0]["arguments"]) == {
    "city": "Lima"
  }
  assert calls[0]["fragments"] >= 2  # the arguments streamed as written, not whole at the end
  required = _formatter("required").final(f"[{text},{text}]", "stop")
  assert len(required.tool_calls) == 2


def test_forced_calls_cut_by_max_tokens_are_truncated_calls():
  text = (
    '[{"name":"get_weather","arguments":{"city":"Lima"}},{"name":"get_weather","arguments":{"ci'
  )
  cut = _formatter("required").final(text, "length")
  assert (cut.content, cut.finish_reason) == (None, "length")
  assert [c.arguments for c in cut.tool_calls] == ['{"city":"Lima"}', '{"ci']
  content, calls, reason = _streamed(_formatter("required"), text, "length")
  assert (content, reason) == ("", "length")
  assert [c["arguments"] for c in calls] == ['{"city":"Lima"}', '{"ci']
  early = _formatter("required").final('[{"name":"get_w', "length")
  assert (early.content, early.tool_calls, early.finish_reason) == (None, (), "length")
