"""Per-sequence grammar state (`SequenceMatcher`) and the batched bitmask fill (`BitmaskFiller`).

A bitmask row is int32[ceil(vocab / 32)]: token t is allowed iff bit t % 32 of word t // 32 is set
(llguidance's layout, and what device/token_bitmask.apply_token_bitmask reads). A row of all
ones (-1) leaves a sequence unconstrained.

States (`GrammarState`):
* ACTIVE: the grammar can continue (it may also accept, in which case eos is in the mask);
* FINISHED: the grammar is complete and only eos is allowed; the engine may end the choice
  with finish_reason "stop" without spending a step on the eos;
* DEAD_END: the grammar cannot continue (a token outside the mask was consumed, a lexer or
  parser limit was hit, a grammar with an empty language). llguidance never leaves this state and
  masks everything but eos, so a row filled for it still samples something harmless; the engine
  ends the choice with finish_reason `FinishReason.GRAMMAR_ERROR`, never hangs.

Rollback undoes consumed tokens (async scheduling that discards a speculative step, preemption
that drops generated tokens); it is refused (ValueError, matcher untouched) past the tokens
consumed since the start, because llguidance turns that into a permanent error, and in DEAD_END,
which no rollback leaves: rebuild the matcher instead (GrammarCompiler.compile, then consume the
tokens to keep).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask, fill_next_token_bitmask_par

from jaxserve.structured.llg_tokenizer import TokenizerInfo


class GrammarState(str, enum.Enum):
  ACTIVE = "active"
  FINISHED = "finished"
  DEAD_END = "dead_end"


class SequenceMatcher:
  """The grammar state of one sequence (one choice of a request: n > 1 has n of them)."""

  def __init__(self, matcher: llguidance.LLMatcher, info: TokenizerInfo) -> None:
    self._matcher = matcher
    self._info = info
    self._num_tokens = 0
    self._unrecorded_eos = 0  # eos consumed after the grammar stopped: llguidance keeps no record

  @property
  def llg_matcher(self) -> llguidance.LLMatcher:
    return self._matcher

  @property
  def num_tokens(self) -> int:
    """Tokens consumed since the start (the most `rollback` can undo)."""
    return self._num_tokens

  @property
  def state(self) -> GrammarState:
    if self._matcher.is_error():
      return GrammarState.DEAD_END
    return GrammarState.FINISHED if self._matcher.is_stopped() else GrammarState.ACTIVE

  def is_accepting(self) -> bool:
    """True if the output so far is a complete match (eos may end it here)."""
    return self._matcher.is_accepting() and not self._matcher.is_error()

  @property
  def error(self) -> str:
    """Why the matcher is in DEAD_END ("" otherwise)."""
    return self._matcher.get_error()

  def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
    """Writes this sequence's allowed tokens into `bitmask[row]` (int32, C-contiguous)."""
    _check_bitmask(bitmask, self._info)
    fill_next_token_bitmask(self._matcher, bitmask, row)

  def consume(self, token_ids: Sequence[int]) -> bool:
    """Advances over sampled tokens; False (and DEAD_END) if the grammar rejects one."""
    for token_id in token_ids:
      stopped = self._matcher.is_stopped()
      if not self._matcher.consume_token(int(token_id)):
        return False
      self._count_consumed(stopped)
    return True

  def rollback(self, num_tokens: int) -> None:
    """Undoes the last `num_tokens` consumed tokens."""
    if not 0 <= num_tokens <= self._num_tokens:
      raise ValueError(f"num_tokens: can roll back 0..{self._num_tokens} tokens, got {num_tokens}")
    if self._matcher.is_error():
      raise ValueError("num_tokens: a matcher at a dead end cannot roll back; rebuild it")
    unrecorded = min(num_tokens, self._unrecorded_eos)
    recorded = num_tokens - unrecorded
    if recorded and not self._matcher.rollback(recorded):
      raise RuntimeError(
        f"llguidance refused a rollback of {recorded}: {self._matcher.get_error()}"
      )
    self._unrecorded_eos -= unrecorded
    self._num_tokens -= num_tokens

  def _count_consumed(self, was_stopped: bool) -> None:
    """Books one consumed token; once stopped, only eos is accepted and llguidance records none."""
    self._num_tokens += 1
    if was_stopped:
      self._unrecorded_eos += 1


@dataclass(frozen=True)
class FillReport:
  """One batched fill: the bitmask (unconstrained rows all ones), host seconds, dead-end rows."""

  bitmask: np.ndarray  # int32[num_rows, ceil(vocab / 32)]
  seconds: float
  dead_end_rows: tuple[int, ...]


class BitmaskFiller:
  """Fills the rows of many matchers at once on llguidance's thread pool (GIL released)."""

  def __init__(self, info: TokenizerInfo, num_threads: int | None = None) -> None:
    self._info = info
    self._executor = llguidance.LLExecutor(num_threads)

  def new_bitmask(self, num_rows: int) -> np.ndarray:
    """All ones: every row unconstrained."""
    return np.full((num_rows, self._info.bitmask_words), -1, dtype=np.int32)

  def fill(
    self, rows: Sequence[tuple[SequenceMatcher, int]], num_rows: int, out: np.ndarray | None = None
  ) -> FillReport:
    """Fills row r of a [num_rows, words] bitmask for each (matcher, r); other rows all ones.

    `out` (reused across steps by a caller that no longer needs its previous contents) avoids
    an allocation; it is reset to all ones first.
    """
    start = time.perf_counter()
    bitmask = self._prepare(out, num_rows)
    targets = [row for _, row in rows]
    if len(set(targets)) != len(targets) or any(not 0 <= r < num_rows for r in targets):
      raise ValueError(f"rows: must be distinct and in [0, {num_rows}), got {targets}")
    if rows:
      fill_next_token_bitmask_par(self._executor, [(m.llg_matcher, r) for m, r in rows], bitmask)
    dead = tuple(r for m, r in rows if m.state is GrammarState.DEAD_END)
    return FillReport(bitmask, time.perf_counter() - start, dead)

  def consume(self, tokens: Sequence[tuple[SequenceMatcher, int]]) -> list[bool]:
    """Each matcher consumes one token, in parallel; False where the grammar rejected it."""
    stopped = [m.llg_matcher.is_stopped() for m, _ in tokens]
    results = self._executor.consume_token_par([(m.llg_matcher, int(t)) for m, t in tokens])
    for (matcher, _), was_stopped, ok in zip(tokens, stopped, results, strict=True):
      if ok:
        matcher._count_consumed(was_stopped)  # noqa: SLF001 - the filler advances what it wraps
    return list(results)

  def _prepare(self, out: np.ndarray | None, num_rows: int) -> np.ndarray:
    if out is None:
      return self.new_bitmask(num_rows)
    if out.shape != (num_rows, self._info.bitmask_words):
      raise ValueError(
        f"out: expected shape {(num_rows, self._info.bitmask_words)}, got {out.shape}"
      )
    _check_bitmask(out, self._info)
    out.fill(-1)
    return out


def _check_bitmask(bitmask: np.ndarray, info: TokenizerInfo) -> None:
  if bitmask.dtype != np.int32 or bitmask.ndim != 2 or not bitmask.flags["C_CONTIGUOUS"]:
    raise ValueError(
      f"bitmask: must be a C-contiguous int32 [rows, words] array, got "
      f"{bitmask.dtype} {bitmask.shape}"
    )
  if bitmask.shape[1] != info.bitmask_words:
    raise ValueError(
      f"bitmask: rows must have {info.bitmask_words} words "
      f"(ceil({info.vocab_size} / 32)), got {bitmask.shape[1]}"
    )
