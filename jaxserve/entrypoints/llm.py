"""The offline API: LLM(model=...).generate(prompts, SamplingParams(...)), .chat(messages, ...).

Keyword arguments are vLLM's engine arguments (gpu_memory_utilization, max_num_seqs, ...; the
table in jaxserve/config/engine_args.py, shared with the CLI flags) or EngineConfig fields. Prompts
are validated up front (a bad one raises ValueError before anything runs), then all are queued and
the engine loops until every request finishes, with a progress bar. Without sampling params,
generate and chat sample with get_default_sampling_params() (the model's generation_config.json
defaults, as vLLM's LLM does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tqdm.auto import tqdm

from jaxserve.api.outputs import Completion, GenerationResult, RequestOutput
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.composition.assembly import build_engine
from jaxserve.config import EngineConfig
from jaxserve.config.device_defaults import Usage
from jaxserve.config.engine_args import BY_NAME, config_with_engine_args, is_engine_arg
from jaxserve.device.platforms import prepare_jax_process
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.tokenizer.tokenizer import Tokenizer

Prompt = str | Sequence[int]
Message = dict[str, str]


class LLM:
  """Offline generation. `model` is "tiny-random" or a Hugging Face checkpoint directory; other
  keyword arguments are engine arguments (gpu_memory_utilization=0.5, max_model_len=1024,
  tensor_parallel_size=2, ...: jaxserve/config/engine_args.py) or EngineConfig fields
  (cache=CacheConfig(...)); an unknown one is a ValueError naming it."""

  def __init__(
    self,
    model: str = "tiny-random",
    *,
    config: EngineConfig | None = None,
    show_progress: bool = True,
    **kwargs: object,
  ):
    self.config = engine_config_for(model, config or EngineConfig(), kwargs)
    prepare_jax_process(self.config.cache.memory_fraction)  # before jax starts a backend
    # warmup "auto" is lazy: an offline run compiles the few buckets its batches use, on the
    # step that first needs each, instead of every bucket up front (warmup="full" for all)
    self.engine: LLMEngine = build_engine(
      self.config, show_progress=show_progress, default_warmup="lazy", usage=Usage.OFFLINE
    )
    self.config = (
      self.engine.config
    )  # with the device-aware defaults (jaxserve/config/device_defaults.py)
    self.tokenizer = self.engine.tokenizer

  def get_tokenizer(self) -> Tokenizer:
    return self.tokenizer

  def get_default_sampling_params(self) -> SamplingParams:
    """What generate and chat sample with when given no sampling params (vLLM's): the model's
    generation_config.json defaults (generation_config: auto, or a directory), else
    SamplingParams() (jaxserve/config/generation_config.py)."""
    return self.engine.generation_defaults.sampling_params()

  def chat(
    self,
    messages: Sequence[Message] | Sequence[Sequence[Message]],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    use_tqdm: bool = True,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: dict[str, object] | None = None,
  ) -> list[GenerationResult]:
    """Generates a reply to one conversation (a list of {"role", "content"} messages) or to each
    of a list of them, through the chat template (which writes bos itself, as the chat route);
    continue_final_message (with add_generation_prompt False) continues the last message, and
    chat_template_kwargs are more template variables (e.g. {"enable_thinking": False}), as in
    vLLM's LLM.chat."""
    conversations = _as_conversations(messages)
    prompts = [
      self.tokenizer.encode_chat(
        list(c), add_generation_prompt, None, continue_final_message, **(chat_template_kwargs or {})
      )
      for c in conversations
    ]
    return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

  def generate(
    self,
    prompts: Prompt | Sequence[Prompt],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    use_tqdm: bool = True,
  ) -> list[GenerationResult]:
    if self.engine.is_sleeping:
      raise RuntimeError("the engine is sleeping: call LLM.wake_up() first")
    prompt_list = _as_prompt_list(prompts)
    if sampling_params is None:
      sampling_params = self.get_default_sampling_params()
    params_list = _as_params_list(sampling_params, len(prompt_list))
    encoded: list[tuple[int, ...]] = []
    request_ids: list[list[str]] = []
    finished: dict[str, RequestOutput] = {}
    first_step_tokens = self.config.scheduler.max_num_batched_tokens
    queued_tokens, started = 0, False
    try:
      for i, (prompt, params) in enumerate(zip(prompt_list, params_list, strict=True)):
        children = params.expand_n()
        rids = [self._request_id(i, k) for k in range(len(children))]
        encoded.append(self.engine.add_requests(prompt, children, rids, stream=False))
        request_ids.append(rids)
        queued_tokens += len(encoded[-1]) * params.n
        if not started and queued_tokens >= first_step_tokens and self.engine.async_scheduling:
          # The first step's prompts are queued (admission is first come, first served within
          # its token budget): dispatch it and queue the rest while the device runs it.
          started = True
          self._collect(self.engine.step(), finished)
    except ValueError:
      for ids_of_prompt in request_ids:
        for rid in ids_of_prompt:
          self.engine.abort_request(rid)
      self._drain()
      raise
    self._run(sum(len(r) for r in request_ids), use_tqdm, finished)
    return [
      self._result(prompt_list[i], encoded[i], [finished[r] for r in rids])
      for i, rids in enumerate(request_ids)
    ]

  def sleep(self, level: int = 1, mode: str = "abort") -> None:
    """vLLM's LLM.sleep: level 1 moves the weights to host memory and frees the KV pool (the
    engine needs enable_sleep_mode=True; engine/sleep_mode.py); mode "abort" (the only one)
    aborts what runs. generate raises until wake_up()."""
    self.engine.sleep(level, mode)

  def wake_up(self, tags: list[str] | None = None) -> None:
    """Puts back what sleep freed: tags "weights", "kv_cache", or None for both."""
    self.engine.wake_up(tags)

  def _request_id(self, prompt_index: int, sample_index: int) -> str:
    return f"offline-{id(self)}-{prompt_index}-{sample_index}-{self.engine.next_request_number()}"

  def _run(self, num_requests: int, use_tqdm: bool, finished: dict[str, RequestOutput]) -> None:
    """Steps until every request has finished, adding each finished output to `finished`."""
    with tqdm(
      total=num_requests, initial=len(finished), desc="generating", unit="req", disable=not use_tqdm
    ) as bar:
      while self.engine.has_unfinished_requests():
        bar.update(self._collect(self.engine.step(), finished))

  @staticmethod
  def _collect(outputs: list[RequestOutput], finished: dict[str, RequestOutput]) -> int:
    done = [output for output in outputs if output.finished]
    finished.update((output.request_id, output) for output in done)
    return len(done)

  def _drain(self) -> None:
    while self.engine.has_unfinished_requests():
      self.engine.step()

  @staticmethod
  def _result(
    prompt: Prompt, prompt_ids: tuple[int, ...], outputs: list[RequestOutput]
  ) -> GenerationResult:
    completions = tuple(
      Completion(
        index=k,
        text=o.text,
        token_ids=o.token_ids,
        finish_reason=o.finish_reason,
        stop_reason=o.stop_reason,
        logprobs=o.logprobs,
      )
      for k, o in enumerate(outputs)
    )
    return GenerationResult(
      prompt=prompt if isinstance(prompt, str) else None,
      prompt_token_ids=prompt_ids,
      outputs=completions,
      prompt_logprobs=outputs[0].prompt_logprobs,
    )


def engine_config_for(model: str, base: EngineConfig, kwargs: dict[str, object]) -> EngineConfig:
  """`base` with model, the EngineConfig fields and then the engine arguments of `kwargs`."""
  fields = {f.name for f in dataclasses.fields(EngineConfig)}
  unknown = [name for name in kwargs if name not in fields and not is_engine_arg(name)]
  if unknown:
    raise ValueError(
      f"{unknown[0]}: not an engine argument ({', '.join(BY_NAME)}) nor an EngineConfig field"
    )
  engine_args = {k: v for k, v in kwargs.items() if is_engine_arg(k)}
  config_fields = {k: v for k, v in kwargs.items() if not is_engine_arg(k)}
  config = dataclasses.replace(base, model=model, **config_fields)
  return config_with_engine_args(config, engine_args)


def _as_conversations(messages) -> list[Sequence[Message]]:
  messages = list(messages)
  if not messages:
    raise ValueError("messages: must not be empty")
  if all(isinstance(m, dict) for m in messages):
    return [messages]
  if all(
    isinstance(c, (list, tuple)) and c and all(isinstance(m, dict) for m in c) for c in messages
  ):
    return messages
  raise ValueError("messages: give a list of {role, content} messages or a list of such lists")


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
  if isinstance(prompts, str):
    return [prompts]
  prompts = list(prompts)
  if prompts and all(isinstance(t, int) for t in prompts):
    return [prompts]  # a single token-id prompt
  if not prompts:
    raise ValueError("prompts: must not be empty")
  return prompts


def _as_params_list(
  params: SamplingParams | Sequence[SamplingParams], count: int
) -> list[SamplingParams]:
  if isinstance(params, SamplingParams):
    return [params] * count
  params = list(params)
  if len(params) != count:
    raise ValueError(f"sampling_params: got {len(params)} for {count} prompts")
  return params
