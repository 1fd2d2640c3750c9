"""LLMEngine: the engine core and the output processor in one process, with text outputs.

EngineCore (engine/engine_core.py) schedules and runs steps and reports tokens; the
OutputProcessor (engine/output_processor.py) turns them into RequestOutputs with text and applies
stop strings. This composes them for the callers that keep everything in one process: the
offline API (LLM.generate: no IPC) and the benchmarks. `jaxserve serve` runs the same two
pieces apart: the core under CoreLoop (core/loop.py, in the engine core process or on a thread)
and the processor in each API server's client (core/client.py). Pure Python, no jax.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from jaxserve.api.outputs import RequestOutput
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import EngineConfig
from jaxserve.config.generation_config import GenerationDefaults
from jaxserve.engine.core_io import new_core_requests
from jaxserve.engine.device_port import ProgramStatus
from jaxserve.engine.engine_core import EngineCore
from jaxserve.engine.engine_stats import EngineStats
from jaxserve.engine.output_processor import OutputProcessor
from jaxserve.engine.step_timings import StepTimings
from jaxserve.tokenizer.tokenizer import Tokenizer

__all__ = ["EngineStats", "LLMEngine", "StepTimings"]


class LLMEngine:
  """Continuous-batching engine over one model, with text: an EngineCore and the output
  processor. Build it with jaxserve.composition.assembly."""

  def __init__(
    self,
    core: EngineCore,
    *,
    tokenizer: Tokenizer,
    model_name: str = "",
    warmup_seconds: float = 0.0,
    config: EngineConfig | None = None,
    generation_defaults: GenerationDefaults = GenerationDefaults(),
  ):
    self.core = core
    self.processor = OutputProcessor(tokenizer)
    self.tokenizer = tokenizer
    # the core's parts and limits, as the callers of the offline API read them
    self.runner, self.scheduler, self.allocator = core.runner, core.scheduler, core.allocator
    self.ledger, self.constraints, self.timings = core.ledger, core.constraints, core.timings
    self.max_model_len, self.vocab_size = core.max_model_len, core.vocab_size
    self.eos_token_ids = core.eos_token_ids
    self.model_name = model_name
    self.generation_defaults = generation_defaults  # the model's sampling defaults
    self.warmup_seconds = warmup_seconds
    self.config = config  # the configuration it was built from, defaults resolved
    self._ids = itertools.count()

  @property
  def programs(self) -> ProgramStatus:
    """Which buckets' programs are compiled (the compile thread's progress)."""
    return self.core.programs

  def close(self) -> None:
    """Stops the background compilation, then releases the runner."""
    self.core.close()

  @property
  def async_scheduling(self) -> bool:
    """Whether step() dispatches the next step before it reads this one's results (the core's
    setting; a benchmark may turn it off)."""
    return self.core.async_scheduling

  @async_scheduling.setter
  def async_scheduling(self, value: bool) -> None:
    self.core.async_scheduling = value

  # -- admission ---------------------------------------------------------------------------
  def next_request_number(self) -> int:
    return next(self._ids)

  def encode_prompt(self, prompt: str | Sequence[int]) -> Sequence[int]:
    """A text prompt's token ids (ValueError naming `prompt` if empty); a token-id prompt as it
    is (its ids are checked where its records are built: add_requests)."""
    if isinstance(prompt, str):
      if not prompt:
        raise ValueError("prompt: must not be empty")
      return self.tokenizer.encode(prompt)
    return prompt

  def add_requests(
    self,
    prompt: str | Sequence[int],
    params: Sequence[SamplingParams],
    request_ids: Sequence[str],
    *,
    arrival_time: float | None = None,
    stream: bool = True,
    priority: int = 0,
  ) -> tuple[int, ...]:
    """One prompt's requests, request_ids[i] sampling with params[i]: each one record
    (engine/core_io.new_core_requests: the ids checked once, one tuple they share) into the core
    (EngineCore.add_request is the admission point) and the output processor. Returns the
    prompt's ids. With stream=False, step() reports a request only once it has finished."""
    for p in params:
      if not isinstance(p, SamplingParams):
        raise ValueError("sampling_params: must be a SamplingParams")
    records = new_core_requests(
      request_ids,
      self.encode_prompt(prompt),
      params,
      self.vocab_size,
      arrival_time=arrival_time or time.monotonic(),
      stream=stream,
      priority=priority,
    )
    added: list[str] = []
    try:
      for record in records:
        self.core.add_request(record)
        self.processor.add_request(record)
        added.append(record.request_id)
    except ValueError:
      for request_id in added:  # all or none
        self.core.abort_request(request_id)
        self.processor.remove(request_id)
      raise
    return records[0].prompt_token_ids

  def add_request(
    self,
    prompt: str | Sequence[int],
    params: SamplingParams,
    request_id: str | None = None,
    arrival_time: float | None = None,
    stream: bool = True,
    priority: int = 0,
  ) -> str:
    """Validates and queues one request (add_requests) and returns its id."""
    request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
    self.add_requests(
      prompt,
      [params],
      [request_id],
      arrival_time=arrival_time,
      stream=stream,
      priority=priority,
    )
    return request_id

  def abort_request(self, request_id: str) -> bool:
    """Stops a request wherever it is; its pages return to the pool at once."""
    return self.core.abort_request(request_id)

  # -- the loop ----------------------------------------------------------------------------
  def has_unfinished_requests(self) -> bool:
    return self.core.has_unfinished_requests()

  def step(self) -> list[RequestOutput]:
    """One EngineCore.step(), its outputs through the output processor; a request a stop string
    ended is stopped in the core before the next step."""
    outputs, stopped = self.processor.process(self.core.step())
    for request_id in stopped:
      self.core.stop_request(request_id)
    return outputs

  # -- sleep mode (engine/sleep_mode.py) ---------------------------------------------------
  def sleep(self, level: int = 1, mode: str = "abort") -> list[RequestOutput]:
    """EngineCore.sleep; returns the last outputs of the requests it aborted."""
    self.core.sleep(level, mode)
    return self.step()

  def wake_up(self, tags: list[str] | None = None) -> None:
    self.core.wake_up(tags)

  @property
  def is_sleeping(self) -> bool:
    return self.core.is_sleeping

  def stats(self) -> EngineStats:
    return self.core.stats()
