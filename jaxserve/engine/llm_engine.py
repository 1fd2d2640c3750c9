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

from jaxserve.config import EngineConfig
from jaxserve.engine.admission import check_token_ids
from jaxserve.engine.constraints import Constraints
from jaxserve.engine.core_io import EngineCoreRequest
from jaxserve.engine.device_port import CompileCounter, MemoryGauge, ProgramStatus, StepRunner
from jaxserve.engine.engine_core import EngineCore
from jaxserve.engine.engine_stats import EngineStats
from jaxserve.engine.output_processor import OutputProcessor
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.scheduler import Scheduler
from jaxserve.engine.step_timings import StepTimings
from jaxserve.generation_config import GenerationDefaults
from jaxserve.messages.buckets import BucketSet
from jaxserve.outputs import RequestOutput
from jaxserve.sampling_params import SamplingParams
from jaxserve.tokenizer.tokenizer import Tokenizer

__all__ = ["EngineStats", "LLMEngine", "StepTimings"]


class LLMEngine:
  """Continuous-batching engine over one model, with text. Build it with jaxserve.assembly."""

  def __init__(
    self,
    *,
    tokenizer: Tokenizer,
    runner: StepRunner,
    scheduler: Scheduler,
    allocator: PageAllocator,
    max_model_len: int,
    vocab_size: int,
    eos_token_ids: tuple[int, ...],
    ledger: CompileCounter,
    seed: int = 0,
    model_name: str = "",
    warmup_seconds: float = 0.0,
    buckets: BucketSet | None = None,
    programs: ProgramStatus | None = None,
    config: EngineConfig | None = None,
    memory: MemoryGauge | None = None,
    generation_defaults: GenerationDefaults = GenerationDefaults(),
  ):
    self.core = EngineCore(
      runner=runner,
      scheduler=scheduler,
      allocator=allocator,
      max_model_len=max_model_len,
      vocab_size=vocab_size,
      eos_token_ids=eos_token_ids,
      ledger=ledger,
      seed=seed,
      buckets=buckets,
      programs=programs,
      constraints=Constraints(tokenizer, vocab_size, supported=runner.supports_async),
      memory=memory,
      sleep_mode=config is not None and config.enable_sleep_mode,
    )
    self.constraints = self.core.constraints
    self.processor = OutputProcessor(tokenizer)
    self.tokenizer = tokenizer
    self.runner, self.scheduler, self.allocator, self.ledger = runner, scheduler, allocator, ledger
    self.max_model_len = max_model_len
    self.vocab_size = vocab_size
    self.eos_token_ids = eos_token_ids
    self.model_name = model_name
    self.generation_defaults = generation_defaults  # the model's sampling defaults
    self.warmup_seconds = warmup_seconds
    self.timings = self.core.timings
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

  def encode_prompt(self, prompt: str | list[int]) -> list[int]:
    """Tokenizes a text prompt or checks a token-id prompt; ValueError names `prompt`."""
    if isinstance(prompt, str):
      if not prompt:
        raise ValueError("prompt: must not be empty")
      return self.tokenizer.encode(prompt)
    ids = list(prompt)
    if not ids:
      raise ValueError("prompt: must not be empty")
    return check_token_ids(ids, self.vocab_size)

  def add_request(
    self,
    prompt: str | list[int],
    params: SamplingParams,
    request_id: str | None = None,
    arrival_time: float | None = None,
    stream: bool = True,
    priority: int = 0,
  ) -> str:
    """Validates and queues a request (EngineCore.add_request is the admission point) and
    returns its id. With stream=False, step() reports the request only once it has finished."""
    if not isinstance(params, SamplingParams):
      raise ValueError("sampling_params: must be a SamplingParams")
    request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
    prompt_ids = self.encode_prompt(prompt)
    arrival_time = arrival_time or time.monotonic()
    self.core.add_request(
      EngineCoreRequest(request_id, prompt_ids, params, arrival_time, stream, priority)
    )
    self.processor.add_request(request_id, prompt_ids, params, arrival_time, stream)
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
