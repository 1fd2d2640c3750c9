"""Incremental detokenization: streamed text equals a one-shot decode, stop strings cut it
exactly."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from jaxserve.tokenizer import (
  DetokenizerDelta,
  IncrementalDetokenizer,
  byte_level_tokenizer,
  load_tokenizer,
)
from jaxserve.tokenizer.byte_tokenizer import SPECIAL_TOKENS
from tests.tokenizer import tokenizer_checkpoints as ckpt

BYTES = byte_level_tokenizer()
PROMPT_IDS = BYTES.encode_chat([{"role": "user", "content": "héllo"}])


def _chunks(ids: list[int], sizes: list[int]) -> list[list[int]]:
  """Splits ids into consecutive chunks with the given sizes (cycled; 0 gives an empty chunk)."""
  sizes = sizes if any(sizes) else [1]
  chunks, i, k = [], 0, 0
  while i < len(ids):
    size = sizes[k % len(sizes)]
    chunks.append(ids[i : i + size])
    i, k = i + size, k + 1
  return chunks


def _stream(detokenizer: IncrementalDetokenizer, chunks: list[list[int]]) -> list[DetokenizerDelta]:
  deltas = []
  for chunk in chunks:
    deltas.append(detokenizer.add_tokens(chunk))
    if deltas[-1].stop_string is not None:
      break
  return deltas


CHUNK_SIZES = st.lists(st.integers(0, 4), max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=40), CHUNK_SIZES)
def test_utf8_text_streams_without_replacement_chars(text, sizes):
  assume(not any(token in text for token in SPECIAL_TOKENS) and "\ufffd" not in text)
  detokenizer = IncrementalDetokenizer(BYTES, PROMPT_IDS)
  deltas = _stream(detokenizer, _chunks(list(text.encode("utf-8")), sizes))
  assert all("\ufffd" not in d.text and d.stop_string is None for d in deltas)
  assert "".join(d.text for d in deltas) == text  # nothing held once the bytes are complete
  assert detokenizer.flush() == "" and detokenizer.output_text == text


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=24), CHUNK_SIZES)
def test_invalid_utf8_streams_like_a_lossy_decode(data, sizes):
  detokenizer = IncrementalDetokenizer(BYTES, PROMPT_IDS)
  deltas = _stream(detokenizer, _chunks(list(data), sizes))
  assert not any(d.text.endswith("\ufffd") for d in deltas)  # an incomplete character is held
  streamed = "".join(d.text for d in deltas) + detokenizer.flush()
  assert streamed == data.decode("utf-8", errors="replace") == BYTES.decode(list(data))
  assert detokenizer.output_text == streamed


def test_split_emoji_is_held_until_complete():
  detokenizer = IncrementalDetokenizer(BYTES, [])
  emoji = list("🤖".encode())
  assert [detokenizer.add_tokens([b]).text for b in emoji] == ["", "", "", "🤖"]
  assert detokenizer.add_tokens([emoji[0]]).text == ""
  assert detokenizer.flush() == "\ufffd"  # a truly incomplete character at the end


def test_special_tokens_kept_or_skipped():
  ids = BYTES.encode("a<|end|>b</s>", add_special_tokens=False)
  for skip in (True, False):
    detokenizer = IncrementalDetokenizer(BYTES, PROMPT_IDS, skip_special_tokens=skip)
    text = "".join(detokenizer.add_tokens([i]).text for i in ids) + detokenizer.flush()
    assert text == BYTES.decode(ids, skip_special_tokens=skip)


@pytest.fixture(scope="module")
def bpe_tokenizers(tmp_path_factory):
  root = tmp_path_factory.mktemp("detokenizer")
  return {
    "llama3": load_tokenizer(ckpt.llama3_checkpoint(str(root / "llama3"))),
    "sentencepiece": load_tokenizer(ckpt.sentencepiece_checkpoint(str(root / "sp"))),
  }


@pytest.mark.parametrize("name", ["llama3", "sentencepiece"])
def test_random_token_streams_match_decode(bpe_tokenizers, name):
  tokenizer = bpe_tokenizers[name]
  prompt_ids = tokenizer.encode("Hello there, you")
  special = set(tokenizer.all_special_ids)
  token_ids = [i for i in range(tokenizer.vocab_size) if i not in special]

  @settings(max_examples=80, deadline=None)
  @given(st.lists(st.sampled_from(token_ids), max_size=30), CHUNK_SIZES)
  def check(output_ids, sizes):
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    deltas = _stream(detokenizer, _chunks(output_ids, sizes))
    streamed = "".join(d.text for d in deltas) + detokenizer.flush()
    # The prompt gives context: a leading "▁" decodes to a space after other text.
    expected = tokenizer.decode(prompt_ids + output_ids)[len(tokenizer.decode(prompt_ids)) :]
    assert streamed == expected
    if name == "llama3":
      assert streamed == tokenizer.decode(output_ids)

  check()


def _first_stop(text: str, stops: tuple[str, ...], include: bool) -> tuple[str, str | None]:
  """Reference: scan text one character at a time; the first stop string to complete wins."""
  for end in range(1, len(text) + 1):
    matches = [(end - len(s), i, s) for i, s in enumerate(stops) if text[:end].endswith(s)]
    if matches:
      start, _, stop = min(matches)
      return (text[:end] if include else text[:start]), stop
  return text, None


def _run_with_stops(
  text: str, stops: tuple[str, ...], include: bool, sizes: list[int], tokenizer=BYTES
) -> tuple[str, str | None]:
  detokenizer = IncrementalDetokenizer(
    tokenizer, PROMPT_IDS, stop=stops, include_stop_str_in_output=include
  )
  deltas = _stream(detokenizer, _chunks(tokenizer.encode(text, add_special_tokens=False), sizes))
  stop = deltas[-1].stop_string if deltas else None
  streamed = "".join(d.text for d in deltas)
  if stop is None:
    streamed += detokenizer.flush()
  else:
    assert detokenizer.add_tokens(BYTES.encode("more", add_special_tokens=False)).text == ""
    assert detokenizer.flush() == ""
  assert detokenizer.output_text == streamed and detokenizer.stop_string == stop
  return streamed, stop


@pytest.mark.parametrize("sizes", [[1], [2], [3], [1, 2]])
def test_stop_string_across_tokens(sizes):
  text = "Hello 世界, stop here STOP and after"
  assert _run_with_stops(text, ("STOP",), False, sizes) == ("Hello 世界, stop here ", "STOP")
  assert _run_with_stops(text, ("STOP",), True, sizes) == ("Hello 世界, stop here STOP", "STOP")
  assert _run_with_stops(text, ("世界",), False, sizes) == ("Hello ", "世界")  # multi-byte stop
  assert _run_with_stops(text, ("after", "here", "stop"), False, sizes) == ("Hello 世界, ", "stop")
  assert _run_with_stops(text, ("absent",), False, sizes) == (text, None)


def test_stop_string_across_bpe_tokens(bpe_tokenizers):
  tokenizer = bpe_tokenizers["llama3"]
  text = "The quick brown fox jumps over the lazy dog."
  ids = tokenizer.encode(text, add_special_tokens=False)
  assert len(ids) < len(text) // 2  # multi-character tokens
  for stop, expected in ((" brown fox j", "The quick"), ("x jumps o", "The quick brown fo")):
    assert _run_with_stops(text, (stop,), False, [1], tokenizer) == (expected, stop)


def test_first_completed_stop_wins():
  # "b" completes before "abc" does, as it would if text came one character at a time.
  assert _run_with_stops("xabc", ("abc", "b"), False, [4]) == ("xa", "b")
  # Same end: the one starting earlier; same start and end: the first listed.
  assert _run_with_stops("xabc", ("bc", "abc"), False, [4]) == ("x", "abc")
  assert _run_with_stops("xab", ("ab", "ab"), True, [3]) == ("xab", "ab")


def test_only_possible_stop_prefixes_are_held():
  detokenizer = IncrementalDetokenizer(BYTES, [], stop=("abc", "xyz"))
  assert detokenizer.add_tokens(BYTES.encode("hello a", False)).text == "hello "
  assert detokenizer.add_tokens(BYTES.encode("b", False)).text == ""
  assert detokenizer.add_tokens(BYTES.encode("d", False)).text == "abd"
  assert detokenizer.add_tokens(BYTES.encode("x", False)).text == ""
  assert detokenizer.flush() == "x" and detokenizer.output_text == "hello abdx"


@settings(max_examples=300, deadline=None)
@given(
  text=st.text(alphabet="ab c世🤖", max_size=30),
  stops=st.lists(st.text(alphabet="ab c世🤖", min_size=1, max_size=4), min_size=1, max_size=3),
  include=st.booleans(),
  sizes=CHUNK_SIZES,
)
def test_output_is_text_up_to_first_stop(text, stops, include, sizes):
  stops = tuple(stops)
  assert _run_with_stops(text, stops, include, sizes) == _first_stop(text, stops, include)


def test_empty_stop_string_rejected():
  with pytest.raises(ValueError, match="stop"):
    IncrementalDetokenizer(BYTES, [], stop=("",))


def test_stop_strings_before_min_tokens_are_text():
  """vLLM's rule (its tests/detokenizer/test_min_tokens.py: min_tokens 5, stop "e"): a stop
  string counts only if it ends in the text of a token past the first min_tokens; it may begin
  inside them."""
  ids = BYTES.encode("ab STOP cd STOP ef", add_special_tokens=False)
  for min_tokens, text in [(8, "ab STOP cd "), (7, "ab STOP cd "), (6, "ab "), (5, "ab ")]:
    for sizes in ([[i] for i in ids], [ids[:3], ids[3:9], ids[9:]], [ids]):
      detokenizer = IncrementalDetokenizer(BYTES, [], stop=("STOP",), min_tokens=min_tokens)
      deltas = _stream(detokenizer, sizes)
      assert "".join(d.text for d in deltas) == text, (min_tokens, sizes)
      assert deltas[-1].stop_string == "STOP"
