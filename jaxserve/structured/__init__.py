"""Structured outputs and tool calling: the host side.

Modules: spec (what a request constrains: StructuredOutputSpec, parsed from response_format /
structured_outputs / SamplingParams), llg_tokenizer (llguidance's view of our tokenizers),
grammar (spec -> validated llguidance grammar, cached per spec), matcher (per-sequence grammar
state and the batched bitmask fill), tools and tool_parsers (tool_choice constraints, parsing
calls out of model output). The device side is device/token_bitmask.apply_token_bitmask.

How it is wired into the engine (engine/constraints.py, engine/engine_core.py, device/sampler.py):

1. Request intake. The server parses `response_format` / `structured_outputs` (spec_from_request)
   or `tool_choice` required/named (tools.tool_choice_constraint) into a StructuredOutputSpec on
   SamplingParams.structured_outputs (LLM.generate: coerce_spec). The engine core's Constraints
   owns the GrammarCompiler (built on the first constrained request) and validates the spec in
   EngineCore.add_request: a bad schema/regex/grammar raises StructuredOutputError -> 400 with
   `param`, before the scheduler sees the request, so no page is ever allocated for it. The
   server does not validate grammars itself (one owner; the engine may live in another process).
2. Per sequence, a SequenceMatcher (GrammarCompiler.compile: a deep copy of the cached template),
   kept in the request's RequestState; n > 1 gives each choice its own matcher.
3. Step input. The sampler always takes a device bitmask int32[num_seqs_bucket, ceil(vocab / 32)]
   (the runner's cached all-ones array when no row is constrained) and applies it to the logits
   before anything else, in every SamplerMode (device/sampler.py; docs/DECISIONS.md, "The token
   bitmask is always applied"). A constrained row's logprobs are those of the allowed tokens,
   renormalized.
4. Overlap. The mask of step N+1 depends on the token sampled at step N. The engine dispatches
   forward(N+1) (its input tokens come from step N's ids on device), then fetches step N's
   tokens, advances the matchers and fills the rows (BitmaskFiller.fill, llguidance's thread
   pool, GIL released) while the device runs forward(N+1), then dispatches the sampler with the
   mask (ModelRunner.dispatch_sample; the mask, a messages.TokenBitmask, travels inside the step's
   ScheduledBatch: batch.with_bitmask). Host mask time hides behind the forward unless it
   exceeds it (StepTimings phase "bitmask"; Constraints.fill_seconds).
5. Finishing. A complete grammar (GrammarState.FINISHED) lets only eos through the next mask, so
   the choice ends with "stop" on that eos (one more step; the engine core reports tokens and the
   output processor drops a stop token's text wherever it runs); DEAD_END ends it with
   finish_reason "grammar_error" (never a hang or a 5xx); max_tokens still ends it with "length".
6. Decode bursts run k steps on device with no host in between, so no matcher can advance:
   a batch holding a constrained sequence runs single steps (Request.can_burst).
7. Rollback is not needed by the engine: a matcher consumes only tokens appended to its request,
   so tokens async scheduling discards are never consumed, and preemption by recompute keeps the
   generated tokens (and the matcher). SequenceMatcher.rollback stays for callers that drop
   tokens.
8. Chunked prefill: prompts are not constrained; only a sequence's sampling rows are
   (BatchSampling.bitmask_rows holds a prefill chunk only when it samples the first token).
"""

from __future__ import annotations

from jaxserve.structured.grammar import CacheStats, GrammarCompiler, grammar_text
from jaxserve.structured.llg_tokenizer import TokenizerInfo, build_llg_tokenizer
from jaxserve.structured.matcher import BitmaskFiller, FillReport, GrammarState, SequenceMatcher
from jaxserve.structured.spec import (
  ConstraintKind,
  StructuredOutputError,
  StructuredOutputSpec,
  WhitespacePolicy,
  coerce_spec,
  parse_response_format,
  parse_structured_outputs,
  spec_from_request,
)

__all__ = [
  "BitmaskFiller",
  "CacheStats",
  "ConstraintKind",
  "FillReport",
  "GrammarCompiler",
  "GrammarState",
  "SequenceMatcher",
  "StructuredOutputError",
  "StructuredOutputSpec",
  "TokenizerInfo",
  "WhitespacePolicy",
  "build_llg_tokenizer",
  "coerce_spec",
  "grammar_text",
  "parse_response_format",
  "parse_structured_outputs",
  "spec_from_request",
]
