"""Incremental detokenization with stop strings, one instance per sequence.

Text from tokens: a token's text depends on its neighbours (a multi-byte UTF-8 character split over
byte tokens, a SentencePiece "▁" that decodes to a space only after other text), so each step
decodes a short window `ids[prefix_offset:]` and emits only what it adds to
`ids[prefix_offset:read_offset]`, as vLLM and transformers' TextStreamer do. The window starts with
the last prompt tokens for context. Text ending in U+FFFD (an incomplete character) is held until a
later token completes it; `flush()` releases it as is when generation ends.

Stop strings: newly decoded text joins a held-back tail and only that region is searched, so the
work per step is O(new text + longest stop). The tail is the longest suffix that could still begin a
stop string (at most max(len(stop)) - 1 characters). The stop string that completes first wins, as
if text arrived one character at a time (same end: the one starting earlier; then the first listed),
so the result does not depend on how text splits into tokens. The text is cut before it (or after it
with include_stop_str_in_output) and nothing more is ever released. As in vLLM, a stop string
must end in the text of a token past the first `min_tokens` output tokens: one that completes
within them is ordinary text (it may still begin there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jaxserve.tokenizer.tokenizer import Tokenizer

NUM_PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


@dataclass(frozen=True)
class DetokenizerDelta:
  """Text released by one `add_tokens` call; `stop_string` is the stop string that ended the
  text."""

  text: str
  stop_string: str | None = None


class IncrementalDetokenizer:
  """Turns a stream of generated token ids into released text (see the module docstring)."""

  def __init__(
    self,
    tokenizer: Tokenizer,
    prompt_token_ids: Sequence[int],
    *,
    skip_special_tokens: bool = True,
    stop: Sequence[str] = (),
    include_stop_str_in_output: bool = False,
    min_tokens: int = 0,
  ) -> None:
    if any(not isinstance(s, str) or not s for s in stop):
      raise ValueError(f"stop: stop strings must be non-empty strings, got {stop!r}")
    self._tokenizer = tokenizer
    self._skip_special_tokens = skip_special_tokens
    self._stop = tuple(stop)
    self._include_stop = include_stop_str_in_output
    self._min_tokens = min_tokens
    self._num_output_tokens = 0
    context = list(prompt_token_ids[-NUM_PROMPT_CONTEXT_TOKENS:])
    self._token_ids = context
    self._prefix_offset = 0
    self._read_offset = len(context)
    self._held = ""
    self._released: list[str] = []
    self._stop_string: str | None = None

  @property
  def output_text(self) -> str:
    if len(self._released) > 1:
      self._released = ["".join(self._released)]
    return self._released[0] if self._released else ""

  @property
  def stop_string(self) -> str | None:
    return self._stop_string

  def add_tokens(self, token_ids: Sequence[int]) -> DetokenizerDelta:
    if self._stop_string is not None:
      return DetokenizerDelta("", self._stop_string)
    below = self._min_tokens - self._num_output_tokens
    if 0 < below < len(token_ids):  # the first min_tokens' text is never searched for a stop
      head = self.add_tokens(token_ids[:below])
      tail = self.add_tokens(token_ids[below:])
      return DetokenizerDelta(head.text + tail.text, tail.stop_string)
    self._token_ids.extend(token_ids)
    self._num_output_tokens += len(token_ids)
    return self._release(self._decode_new_text(final=False), final=False)

  def flush(self) -> str:
    """Releases everything held back (generation ended for a reason other than a stop string)."""
    if self._stop_string is not None:
      return ""
    return self._release(self._decode_new_text(final=True), final=True).text

  def _decode_new_text(self, final: bool) -> str:
    if self._read_offset == len(self._token_ids):
      return ""
    decode = self._tokenizer.decode
    prefix_text = decode(
      self._token_ids[self._prefix_offset : self._read_offset], self._skip_special_tokens
    )
    full_text = decode(self._token_ids[self._prefix_offset :], self._skip_special_tokens)
    if full_text.endswith(REPLACEMENT_CHAR) and not final:
      return ""
    self._prefix_offset = self._read_offset
    self._read_offset = len(self._token_ids)
    # Emitted windows end on a character boundary, so the prefix decodes the same inside full_text.
    return full_text[len(prefix_text) :]

  def _release(self, new_text: str, final: bool) -> DetokenizerDelta:
    region = self._held + new_text
    match = self._find_stop(region) if self._num_output_tokens > self._min_tokens else None
    if match is not None:
      start, stop_string = match
      end = start + len(stop_string) if self._include_stop else start
      self._stop_string = stop_string
      self._held = ""
      return self._emit(region[:end], stop_string)
    num_held = 0 if final else self._num_chars_to_hold(region)
    self._held = region[len(region) - num_held :]
    return self._emit(region[: len(region) - num_held], None)

  def _emit(self, text: str, stop_string: str | None) -> DetokenizerDelta:
    if text:
      self._released.append(text)
    return DetokenizerDelta(text, stop_string)

  def _find_stop(self, region: str) -> tuple[int, str] | None:
    """The first stop string to complete: the earliest end, then the earliest start, then list
    order."""
    best: tuple[int, int, str] | None = None
    for stop_string in self._stop:
      start = region.find(stop_string)
      if start < 0:
        continue
      key = (start + len(stop_string), start, stop_string)
      if best is None or key[:2] < best[:2]:
        best = key
    return None if best is None else (best[1], best[2])

  def _num_chars_to_hold(self, region: str) -> int:
    """Length of the longest suffix of `region` that is a proper prefix of some stop string."""
    longest = 0
    for stop_string in self._stop:
      for length in range(min(len(stop_string) - 1, len(region)), longest, -1):
        if region.endswith(stop_string[:length]):
          longest = length
          break
    return longest
