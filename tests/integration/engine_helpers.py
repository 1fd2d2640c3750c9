"""Small engine configurations and a run-to-completion loop shared by the integration tests."""

from __future__ import annotations

from jaxserve.api.outputs import RequestOutput
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.attention import backends
from jaxserve.composition.assembly import build_engine
from jaxserve.config import CacheConfig, EngineConfig, SchedulerConfig
from jaxserve.engine.llm_engine import LLMEngine


def small_config(
  model: str = "tiny-random",
  *,
  num_pages: int = 256,
  page_size: int = 16,
  max_num_seqs: int = 8,
  max_tokens_per_step: int = 64,
  seq_buckets=(2, 8),
  token_buckets=(8, 16, 32, 64),
  max_model_len: int = 512,
  prefix_caching: bool = True,
  chunked_prefill: bool = True,
  async_scheduling: bool = True,
  num_scheduler_steps: int = 1,
  prefill_first: bool = False,
  pool_seq_rungs: bool = False,
  latency_batched_tokens: int | None = None,
  **fields,
) -> EngineConfig:
  return EngineConfig(
    model=model,
    max_model_len=max_model_len,
    cache=CacheConfig(page_size=page_size, num_pages=num_pages),
    scheduler=SchedulerConfig(
      max_num_seqs=max_num_seqs,
      max_num_batched_tokens=max_tokens_per_step,
      enable_chunked_prefill=chunked_prefill,
      enable_prefix_caching=prefix_caching,
      seq_buckets=tuple(seq_buckets),
      token_buckets=tuple(token_buckets),
      async_scheduling=async_scheduling,
      num_scheduler_steps=num_scheduler_steps,
      prefill_first=prefill_first,
      pool_seq_rungs=pool_seq_rungs,
      latency_batched_tokens=latency_batched_tokens,
    ),
    **fields,
  )


def small_engine(model: str = "tiny-random", **kwargs) -> LLMEngine:
  """An engine of small_config. Its step programs compile lazily, each on the first step that
  needs it (a test uses a few of its buckets); pass warmup="full" to compile every one first."""
  return build_engine(small_config(model, **kwargs), show_progress=False, default_warmup="lazy")


def run_to_completion(engine: LLMEngine, max_steps: int = 100_000) -> dict[str, RequestOutput]:
  finished: dict[str, RequestOutput] = {}
  for _ in range(max_steps):
    if not engine.has_unfinished_requests():
      return finished
    for output in engine.step():
      if output.finished:
        finished[output.request_id] = output
  raise AssertionError(f"engine did not finish within {max_steps} steps")


def generate_and_score(
  engine: LLMEngine, prompts: list[list[int]], num_new: int
) -> tuple[list[list[int]], list[list[float]]]:
  """Greedy tokens of every prompt and the prompt's logprobs (positions 1..), in one batch."""
  greedy = SamplingParams(temperature=0.0, max_tokens=num_new, ignore_eos=True)
  scoring = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
  for i, prompt in enumerate(prompts):
    engine.add_request(prompt, greedy, request_id=f"gen-{i}")
    engine.add_request(prompt, scoring, request_id=f"score-{i}")
  finished = run_to_completion(engine)
  tokens = [list(finished[f"gen-{i}"].token_ids) for i in range(len(prompts))]
  logprobs = [
    [e.logprob for e in finished[f"score-{i}"].prompt_logprobs[1:]] for i in range(len(prompts))
  ]
  return tokens, logprobs


def hf_greedy(model, prompt: list[int], num_new: int) -> list[int]:
  """Greedy decoding with a transformers model by full forward passes (no cache API)."""
  import torch

  ids = list(prompt)
  with torch.no_grad():
    for _ in range(num_new):
      ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
  return ids[len(prompt) :]


def record_steps_per_dispatch(engine: LLMEngine) -> list[int]:
  """Wraps engine.runner.dispatch; the returned list grows by each dispatch's batch.num_steps (1 for
  a
  single step, num_scheduler_steps for a decode burst)."""
  steps: list[int] = []
  dispatch = engine.runner.dispatch

  def recording_dispatch(inputs, batch):
    steps.append(batch.num_steps)
    return dispatch(inputs, batch)

  engine.runner.dispatch = recording_dispatch
  return steps


def interpreted_backend(module_name: str) -> backends.AttentionBackend:
  """The Pallas attention kernel of ragged_paged_attention/<module_name>/ in interpret mode."""
  factory = {"gpu": backends.pallas_gpu, "tpu": backends.pallas_tpu}[module_name]
  return factory(interpret=True)
