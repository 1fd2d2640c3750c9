"""Structured outputs and tool calling: the host side (issue 18).

Modules: spec (what a request constrains: StructuredOutputSpec, parsed from response_format /
structured_outputs / SamplingParams), llg_tokenizer (llguidance's view of our tokenizers),
grammar (spec -> validated llguidance grammar, cached per spec), matcher (per-sequence grammar
state and the batched bitmask fill), tools and tool_parsers (tool_choice constraints, parsing
calls out of model output). The device side is device/token_bitmask.apply_token_bitmask.

How it is wired into the engine (after the engine/runtime seam of issue 14):

1. Request intake. The server parses `response_format` / `structured_outputs` (spec_from_request)
   or `tool_choice` required/named (tools.tool_choice_constraint) into a StructuredOutputSpec on
   SamplingParams.structured_outputs (LLM.generate: coerce_spec). The engine's GrammarCompiler
   (one per tokenizer, owned by the engine, its LRU shared with the server) validates it at
   add_request: a bad schema/regex/grammar raises StructuredOutputError -> 400 with `param`,
   before the scheduler sees the request, so no page is ever allocated for it.
2. Per sequence, a SequenceMatcher (GrammarCompiler.compile: a deep copy of the cached template);
   n > 1 gives each choice its own matcher (their outputs diverge).
3. Step input. The sampler takes bitmask int32[num_seqs_bucket, ceil(vocab / 32)]; rows of
   unconstrained sequences (and padding) are all ones, so one compiled sampler per existing
   SamplerMode serves any mix and nothing recompiles. The sampler applies apply_token_bitmask to
   the logits it samples from (after the raw logprobs are taken, which stay the model's, before
   penalties, temperature and top-k/p); one fused elementwise pass (measured: a single XLA loop
   fusion), or a `constrained` SamplerMode flag, compiled at warmup, skips it for batches with
   no constrained row.
4. Overlap. The mask of step N+1 depends on the token sampled at step N, so it cannot be ready
   before step N ends. The runner already dispatches the forward and the sampler separately:
   with async scheduling the engine dispatches forward(N+1) (its input tokens come from step N's
   ids on device), then fetches step N's tokens, advances the matchers (BitmaskFiller.consume)
   and fills the rows (BitmaskFiller.fill, llguidance's thread pool, GIL released) while the
   device runs forward(N+1), then dispatches sample(logits, bitmask). Host mask time hides behind
   the forward unless it exceeds it (see FillReport.seconds, reported per step in metrics).
5. Finishing. After consuming, GrammarState.FINISHED ends the choice ("stop") without spending
   a step on eos; DEAD_END ends it with finish_reason "grammar_error" (never a hang or a 5xx);
   max_tokens still ends it with "length".
6. Decode bursts run k steps on device with no host in between, so no matcher can advance:
   a batch holding a constrained sequence runs single steps (the scheduler marks no burst).
   A burst that carries the matcher on device would need llguidance's automaton on device.
7. Async scheduling discards a step's tokens in some cases (a sequence finished or preempted
   after the next step was dispatched): SequenceMatcher.rollback(k) undoes exactly what was
   consumed. Preemption by recompute keeps the generated tokens, so the matcher is kept as is;
   if the engine instead drops generated tokens it rolls back that many (or rebuilds the matcher
   with compile() and consume()s the kept ones).
8. Chunked prefill: prompts are not constrained; only sampled tokens are consumed, so a
   sequence's row is filled only for the step that samples its first token and after.
"""
from __future__ import annotations

from jaxserve.structured.grammar import CacheStats, GrammarCompiler, grammar_text
from jaxserve.structured.llg_tokenizer import TokenizerInfo, build_llg_tokenizer
from jaxserve.structured.matcher import (GRAMMAR_ERROR_FINISH_REASON, BitmaskFiller, FillReport,
                                         GrammarState, SequenceMatcher)
from jaxserve.structured.spec import (ConstraintKind, StructuredOutputError, StructuredOutputSpec,
                                      WhitespacePolicy, coerce_spec, parse_response_format,
                                      parse_structured_outputs, spec_from_request)

__all__ = [
    "GRAMMAR_ERROR_FINISH_REASON",
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
