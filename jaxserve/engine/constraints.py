"""Structured outputs in the engine: validating constraints, per-sequence matchers, and each
step's token bitmask. Pure Python and numpy (llguidance), no jax.

The engine core owns one `Constraints` (LLMEngine builds it with the tokenizer), the one place a
request's constraint is validated: EngineCore.add_request calls `matcher_for`, which compiles the
spec with the engine's GrammarCompiler (an LRU cache per spec) and raises StructuredOutputError,
a ValueError naming the request field, for a bad schema, regex or grammar, before the scheduler
sees the request, so no page is ever allocated for it.
Each engine request (each choice of an n > 1 request) gets its own SequenceMatcher.

A matcher advances over exactly the tokens the engine appends to its request (RequestState), so
it never needs a rollback: tokens async scheduling discards (sampled after a request stopped) are
never consumed, and preemption by recompute keeps the generated tokens, so the matcher is kept.

`fill` writes the rows of a step's constrained sequences (batch.sampling.bitmask_rows; a complete
grammar's row allows eos only) into a bitmask covering the step's bucket, every other row all ones,
on llguidance's thread pool with the GIL released. The engine calls it after dispatching the step's
forward and taking the step before's tokens, so the mask is computed while the device runs the
forward.

The compiler is built on the first constrained request (llguidance reads the tokenizer's whole
vocabulary), so engines that never see one pay nothing (docs/DECISIONS.md, "The grammar compiler
is built on the first constrained request").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.engine.request_state import RequestState
from jaxserve.messages.scheduled_batch import ScheduledBatch, TokenBitmask
from jaxserve.structured import (
  BitmaskFiller,
  GrammarCompiler,
  GrammarState,
  SequenceMatcher,
  StructuredOutputError,
  build_llg_tokenizer,
)
from jaxserve.tokenizer.tokenizer import Tokenizer


class Constraints:
  """The engine's grammar compiler, matchers and bitmask filler (see the module docstring)."""

  def __init__(self, tokenizer: Tokenizer, vocab_size: int, supported: bool = True) -> None:
    self._tokenizer = tokenizer
    self._vocab_size = vocab_size
    self._supported = supported
    self._compiler: GrammarCompiler | None = None
    self._filler: BitmaskFiller | None = None
    self.fill_seconds = 0.0  # host time spent filling masks
    self.num_fills = 0  # steps that filled a mask

  @property
  def compiler(self) -> GrammarCompiler:
    if self._compiler is None:
      llg_tokenizer, info = build_llg_tokenizer(self._tokenizer, self._vocab_size)
      self._compiler = GrammarCompiler(llg_tokenizer, info)
      self._filler = BitmaskFiller(info)
    return self._compiler

  def matcher_for(self, params: SamplingParams) -> SequenceMatcher | None:
    """A new matcher for a request's constraint (None if unconstrained); raises
    StructuredOutputError naming the field if the constraint does not compile."""
    spec = params.structured_outputs
    if spec is None:
      return None
    if not self._supported:
      raise StructuredOutputError(
        spec.param,
        "structured outputs are not supported on a "
        "multi-host job (each step's mask comes after its forward)",
      )
    compiler = self.compiler
    return SequenceMatcher(compiler.compile(spec), compiler.info)

  def fill(
    self, batch: ScheduledBatch, matcher_of: Callable[[str], SequenceMatcher | None], num_rows: int
  ) -> TokenBitmask:
    """The bitmask of `batch`'s constrained rows, [num_rows, words], other rows all ones.
    `matcher_of(request_id)` is None for a request that finished meanwhile (its row stays all
    ones; what it samples is dropped)."""
    start = time.perf_counter()
    rows = []
    for row in batch.sampling.bitmask_rows:
      matcher = matcher_of(batch.request_ids[row])
      if matcher is not None and matcher.state is not GrammarState.DEAD_END:
        rows.append((matcher, row))
    if self._filler is None:  # a batch has constrained rows only after matcher_for built it
      raise RuntimeError("bitmask: no constrained request was admitted")
    report = self._filler.fill(rows, num_rows)
    self.fill_seconds += time.perf_counter() - start
    self.num_fills += 1
    return TokenBitmask(report.bitmask)


def live_matcher(states: Mapping[str, RequestState]) -> Callable[[str], SequenceMatcher | None]:
  """matcher_of for `fill`: the matcher of a request still unfinished in `states`."""

  def matcher_of(request_id: str) -> SequenceMatcher | None:
    state = states.get(request_id)
    if state is None or state.request.status.finished:
      return None
    return state.matcher

  return matcher_of
