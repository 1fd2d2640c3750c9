"""The reasoning parsers (jaxserve/reasoning): the cases of vLLM's Qwen3 and DeepSeek-R1 parser
tests, and streamed deltas that join to the whole reply's split however the text is cut."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxserve.reasoning import get_reasoning_parser, reasoning_parser_names

# (text, qwen3's (reasoning, content), deepseek_r1's): vLLM's cases where both agree on a
# reply that opens and closes its think block, and each parser's own
CASES = [
  (
    "<think>This is a reasoning section</think>This is the rest",
    ("This is a reasoning section", "This is the rest"),
    ("This is a reasoning section", "This is the rest"),
  ),
  (
    "<think>This is a reasoning section</think>",
    ("This is a reasoning section", None),
    ("This is a reasoning section", None),
  ),
  ("This is content", (None, "This is content"), ("This is content", None)),
  (
    "This is a reasoning section</think>This is the rest",
    (None, "This is a reasoning section</think>This is the rest"),
    ("This is a reasoning section", "This is the rest"),
  ),
  (
    "<think>a\nmultiline\nreasoning</think>\n\nThe answer",
    ("a\nmultiline\nreasoning", "\n\nThe answer"),
    ("a\nmultiline\nreasoning", "\n\nThe answer"),
  ),
  ("<think>cut by max_tokens", ("cut by max_tokens", None), ("cut by max_tokens", None)),
  ("\n<think>x</think>y", ("x", "y"), ("x", "y")),
  ("", (None, None), (None, None)),
]


def test_the_names_are_vllms():
  assert reasoning_parser_names() == ("deepseek_r1", "qwen3")
  with pytest.raises(ValueError, match="reasoning_parser: unknown parser 'r1'"):
    get_reasoning_parser("r1")


@pytest.mark.parametrize("text, qwen3, deepseek_r1", CASES)
def test_whole_replies(text, qwen3, deepseek_r1):
  for name, expected in (("qwen3", qwen3), ("deepseek_r1", deepseek_r1)):
    split = get_reasoning_parser(name).split(text)
    assert (split.reasoning, split.content) == expected, name


def _streamed(name: str, text: str, cuts: list[int]) -> tuple[str, str]:
  stream = get_reasoning_parser(name).stream()
  bounds = [0, *sorted(set(c % (len(text) + 1) for c in cuts)), len(text)]
  deltas = [stream.feed(text[a:b]) for a, b in itertools.pairwise(bounds)] + [stream.finish()]
  return "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
@given(
  parts=st.lists(
    st.sampled_from(["<think>", "</think>", "<thi", "</th", " ", "\n", "ab", "<", "k>"]), max_size=8
  ),
  cuts=st.lists(st.integers(0, 200), max_size=6),
)
def test_streamed_deltas_join_to_the_whole_split(name, parts, cuts):
  text = "".join(parts)
  split = get_reasoning_parser(name).split(text)
  assert _streamed(name, text, cuts) == (split.reasoning or "", split.content or "")


def test_a_tag_cut_over_deltas_is_held_not_leaked():
  stream = get_reasoning_parser("qwen3").stream()
  assert stream.feed("<th") == stream.feed("") and stream.feed("ink>hm</th").reasoning == "hm"
  delta = stream.feed("ink>ok")
  assert (delta.reasoning, delta.content) == ("", "ok")
