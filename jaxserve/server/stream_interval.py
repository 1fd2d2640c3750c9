"""Which engine outputs become SSE chunks: one per choice per engine step, or one per K steps.

The engine delivers an output for a request after every step that produced its tokens (a decode
burst's several tokens come in one output) and when it finishes. With `server.stream_interval`
1 (the default) each of them is one chunk, even when the detokenizer holds the text back (a
multi-byte character split over tokens, the start of a possible stop string): the chunk then
has empty text, as vLLM streams, so clients and `jaxserve bench serve` see every token's time
and one logprobs entry per token.

With K > 1 the outputs of K steps are merged into one chunk: their tokens, text and logprobs
concatenated. A choice's first output (time to first token) and its final one (finish_reason)
are sent at once; a held merge is sent with the final output.
"""

from __future__ import annotations

from jaxserve.api.outputs import RequestOutput, merge_outputs


class StepCoalescer:
  """Per HTTP call: decides, output by output, what to send now (see the module docstring)."""

  def __init__(self, interval: int):
    if interval < 1:
      raise ValueError(f"server.stream_interval: must be an integer >= 1, got {interval!r}")
    self._interval = interval
    self._held: dict[str, RequestOutput] = {}
    self._steps: dict[str, int] = {}

  def push(self, output: RequestOutput) -> RequestOutput | None:
    """The output to stream now (merged with the ones held before it), or None to hold it."""
    if self._interval == 1:
      return output
    request_id = output.request_id
    held = self._held.pop(request_id, None)
    if held is not None:
      output = merge_outputs(held, output)
    steps = self._steps.get(request_id)  # None: nothing sent yet for this choice
    if steps is None or output.finished or steps + 1 >= self._interval:
      self._steps[request_id] = 0
      return output
    self._held[request_id] = output
    self._steps[request_id] = steps + 1
    return None
