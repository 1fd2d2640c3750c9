"""`jaxserve bench serve`: an asyncio load generator for an OpenAI-compatible server.

It loads /v1/completions (prompts as text or token ids) or, with `--endpoint /v1/chat/completions`,
the chat route (each prompt one user message). Requests are sent at gamma/Poisson arrival times (see
arrivals.py), optionally capped at `max_concurrency` in flight, each streaming its completion over
SSE through one shared httpx.AsyncClient. Every request asks for `stream_options.include_usage`, so
output token counts come from the server's usage; when a server reports none, the number of chunks
carrying choices is used instead. Timing follows vLLM's benchmark_serving (see latency_stats.py). A
sweep runs the same workload at several rates and plots throughput against latency. Flags follow
vLLM's benchmark_serving (--dataset-name, --endpoint, --percentile-metrics, --metric-percentiles,
--goodput, --save-result / --result-dir); results are written only with --save-result. The server is
checked (GET /v1/models) before anything runs: one line if it cannot be reached.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import httpx  # the async streaming HTTP client (the `bench` extra; checked by tools/cli.py)
from tqdm.auto import tqdm

from jaxserve.bench.arrivals import arrival_gaps
from jaxserve.bench.datasets import SampleRequest
from jaxserve.bench.goodput import meets_slos, parse_goodput
from jaxserve.bench.latency_stats import (
  RequestRecord,
  format_table,
  parse_percentile_metrics,
  parse_percentiles,
  summarize,
)

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class ServeBenchConfig:
  base_url: str
  model: str
  request_rate: float = math.inf
  burstiness: float = 1.0
  max_concurrency: int | None = None
  ignore_eos: bool = False
  seed: int = 0
  api_key: str | None = None
  timeout_s: float = 600.0
  endpoint: str = COMPLETIONS_PATH
  show_progress: bool = False


def completion_payload(config: ServeBenchConfig, request: SampleRequest) -> dict:
  common = {
    "model": config.model,
    "temperature": 0.0,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": config.ignore_eos,
  }
  if config.endpoint == CHAT_PATH:
    if not isinstance(request.prompt, str):
      raise ValueError("random_prompt_type: chat prompts are text; use --random-prompt-type text")
    return {
      **common,
      "messages": [{"role": "user", "content": request.prompt}],
      "max_completion_tokens": request.expected_output_len,
    }
  prompt = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
  return {**common, "prompt": prompt, "max_tokens": request.expected_output_len}


def _content(choice: dict) -> str | None:
  """The text a completion or chat chunk's choice carries ("" for a token whose text is held
  back); None for a chat chunk that is not a token: the opening role chunk, or one with
  neither content nor a finish reason."""
  if "delta" in choice:
    delta = choice["delta"]
    if choice.get("finish_reason"):
      return delta.get("content") or ""
    if "role" in delta or delta.get("content") is None:
      return None
    return delta["content"]
  return choice.get("text", "")


async def send_request(
  client: httpx.AsyncClient, config: ServeBenchConfig, request: SampleRequest
) -> RequestRecord:
  """Streams one completion and times its chunks."""
  start = time.perf_counter()
  ttft, last, itls, num_chunks, usage_tokens = None, start, [], 0, None
  base = dict(prompt_len=request.prompt_len, expected_output_len=request.expected_output_len)
  try:
    async with client.stream(
      "POST",
      config.base_url.rstrip("/") + config.endpoint,
      json=completion_payload(config, request),
    ) as response:
      if response.status_code != 200:
        body = (await response.aread()).decode(errors="replace")[:500]
        return RequestRecord(False, **base, error=f"HTTP {response.status_code}: {body}")
      async for line in response.aiter_lines():
        data = _sse_data(line)
        if data is None:
          continue
        if data == "[DONE]":
          break
        chunk = json.loads(data)
        now = time.perf_counter()
        if chunk.get("choices") and _content(chunk["choices"][0]) is not None:
          if ttft is None:
            ttft = now - start
          else:
            itls.append(now - last)
          last, num_chunks = now, num_chunks + 1
        if chunk.get("usage"):
          usage_tokens = chunk["usage"].get("completion_tokens")
  except (httpx.HTTPError, json.JSONDecodeError) as err:
    return RequestRecord(False, **base, error=f"{type(err).__name__}: {err}")
  if ttft is None:
    return RequestRecord(False, **base, error="stream ended without a completion chunk")
  output_tokens = usage_tokens if usage_tokens is not None else num_chunks
  return RequestRecord(
    True,
    **base,
    output_tokens=int(output_tokens),
    ttft=ttft,
    e2e=last - start,
    itls=tuple(itls),
    start_time=start,
    usage_reported=usage_tokens is not None,
  )


def _sse_data(line: str) -> str | None:
  if not line.startswith("data:"):
    return None
  return line[len("data:") :].strip()


async def run_requests(
  config: ServeBenchConfig, requests: Sequence[SampleRequest]
) -> tuple[list[RequestRecord], float]:
  """Sends every request on schedule; returns their records (in order) and the wall time."""
  gaps = arrival_gaps(len(requests), config.request_rate, config.burstiness, config.seed)
  limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
  headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
  async with httpx.AsyncClient(
    timeout=httpx.Timeout(config.timeout_s), limits=limits, headers=headers
  ) as client:
    bar = tqdm(total=len(requests), desc="requests", unit="req", disable=not config.show_progress)

    async def limited(request: SampleRequest) -> RequestRecord:
      if limit is None:
        record = await send_request(client, config, request)
      else:
        async with limit:
          record = await send_request(client, config, request)
      bar.update(1)
      return record

    start = time.perf_counter()
    tasks = []
    for request, gap in zip(requests, gaps.tolist()):
      tasks.append(asyncio.create_task(limited(request)))
      if gap > 0:
        await asyncio.sleep(gap)
    records = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    bar.close()
  return [_relative(r, start) for r in records], duration


def _relative(record: RequestRecord, start: float) -> RequestRecord:
  if not record.success:
    return record
  return RequestRecord(**{**asdict(record), "start_time": record.start_time - start})


def fetch_model_name(base_url: str, api_key: str | None = None) -> str:
  """The first model the server lists at /v1/models; a ValueError naming base_url if the server
  cannot be reached or answers with an error."""
  headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
  url = base_url.rstrip("/") + "/v1/models"
  try:
    response = httpx.get(url, headers=headers, timeout=30.0)
  except httpx.TransportError as err:
    raise ValueError(
      f"base_url: cannot reach a server at {base_url} ({type(err).__name__}: "
      f"{err}); start one with `jaxserve serve` or pass --base-url"
    ) from err
  if response.status_code != 200:
    raise ValueError(f"base_url: GET {url} answered {response.status_code}: {response.text[:200]}")
  models = response.json().get("data") or []
  if not models:
    raise ValueError(f"model: {base_url}/v1/models lists no models; pass --model")
  return models[0]["id"]


@dataclass(frozen=True)
class ReportOptions:
  """How results are summarized: percentiles, the metrics printed, goodput SLOs (ms)."""

  percentiles: tuple[float, ...]
  percentile_metrics: tuple[str, ...]
  goodput_slos: dict[str, float] | None


def run_one_rate(
  config: ServeBenchConfig, requests: Sequence[SampleRequest], options: ReportOptions
) -> dict:
  """Runs the workload at config.request_rate; returns the JSON-ready result of that run."""
  records, duration = asyncio.run(run_requests(config, requests))
  num_good = None
  if options.goodput_slos is not None:
    num_good = sum(meets_slos(r, options.goodput_slos) for r in records)
  metrics = summarize(records, duration, options.percentiles, num_good)
  print(
    format_table(
      metrics,
      f"Serving Benchmark Result (rate {_rate_str(config.request_rate)})",
      options.percentile_metrics,
    )
  )
  errors = sorted({r.error for r in records if not r.success})
  for error in errors[:5]:
    print(f"  failed: {error}")
  return {
    "request_rate": _rate_str(config.request_rate),
    "burstiness": config.burstiness,
    "max_concurrency": config.max_concurrency,
    "metrics": metrics.to_dict(),
    "requests": [asdict(r) for r in records],
  }


def _rate_str(rate: float) -> str | float:
  return "inf" if math.isinf(rate) else rate


def parse_rates(text: str) -> list[float]:
  rates = []
  for item in text.split(","):
    item = item.strip()
    try:
      rate = math.inf if item in ("inf", "Inf", "INF") else float(item)
    except ValueError as err:
      raise ValueError(f"sweep_rates: {item!r} is not a number or inf") from err
    if not rate > 0:
      raise ValueError(f"sweep_rates: rates must be > 0, got {item!r}")
    rates.append(rate)
  if not rates:
    raise ValueError("sweep_rates: empty")
  return rates


def workload_label(result: dict) -> str:
  """The workload in words, for plot titles: model, route, dataset, prompts and lengths."""
  lengths = result.get("lengths")
  return (
    f"{result['model']} {result['endpoint']}: {result['num_prompts']} {result['dataset']} "
    f"prompts" + (f", {lengths}" if lengths else "")
  )


def write_results(out_dir: Path, result: dict) -> list[Path]:
  """Writes bench_serve.json and the plots; returns the paths written."""
  from jaxserve.tools import plots

  out_dir.mkdir(parents=True, exist_ok=True)
  json_path = out_dir / "bench_serve.json"
  json_path.write_text(json.dumps(result, indent=2))
  paths = [json_path]
  label = workload_label(result)
  for run in result["runs"]:
    name = f"latency_cdf_rate_{run['request_rate']}.png"
    paths.append(
      plots.latency_cdfs(
        run["requests"], out_dir / name, title=f"{label}\nrate {run['request_rate']} req/s"
      )
    )
  if len(result["runs"]) > 1:
    paths.append(
      plots.sweep_curve(result["runs"], out_dir / "sweep_throughput_latency.png", title=label)
    )
  return paths


def load_workload(args) -> tuple[list[SampleRequest], str]:
  """The requests `args` describe, and how their lengths were counted."""
  from jaxserve.bench import datasets

  tokenizer = _try_tokenizer(args.tokenizer or args.model)
  if args.dataset == "sharegpt":
    if not args.dataset_path:
      raise ValueError("dataset_path: --dataset sharegpt needs --dataset-path FILE")
    counter = (
      (lambda text: len(tokenizer.encode(text, add_special_tokens=False))) if tokenizer else None
    )
    requests = datasets.load_sharegpt(
      args.dataset_path, args.num_prompts, count_tokens=counter, seed=args.seed
    )
    return requests, "tokenizer" if tokenizer else "whitespace"
  pool = None
  prompt_type = args.random_prompt_type or ("text" if args.endpoint == CHAT_PATH else "ids")
  if prompt_type == "ids" and args.endpoint == CHAT_PATH:
    raise ValueError("random_prompt_type: chat prompts are text; use --random-prompt-type text")
  if tokenizer is not None and prompt_type == "ids":
    special = set(tokenizer.all_special_ids)
    pool = [i for i in range(tokenizer.backend.get_vocab_size()) if i not in special]
  requests = datasets.random_requests(
    args.num_prompts,
    args.random_input_len,
    args.random_output_len,
    range_ratio=args.random_range_ratio,
    seed=args.seed,
    token_ids=pool,
  )
  return requests, "token_ids" if pool is not None else "words"


def _try_tokenizer(name: str | None):
  if not name:
    return None
  from jaxserve.models.registry import load_model_tokenizer

  try:
    return load_model_tokenizer(name)
  except (ValueError, OSError):
    return None


def report_options(args) -> ReportOptions:
  return ReportOptions(
    parse_percentiles(args.metric_percentiles),
    parse_percentile_metrics(args.percentile_metrics),
    parse_goodput(args.goodput) if args.goodput else None,
  )


def main(args) -> int:
  logging.getLogger("httpx").setLevel(logging.WARNING)  # no INFO line per request
  options = report_options(args)  # bad flags fail before anything is sent
  rates = parse_rates(args.sweep_rates) if args.sweep_rates else [args.request_rate]
  served = fetch_model_name(args.base_url, args.api_key)  # also checks the server is up
  model = args.model or served
  args.model = model
  requests, length_source = load_workload(args)
  runs = []
  for rate in rates:
    config = ServeBenchConfig(
      base_url=args.base_url,
      model=model,
      request_rate=rate,
      burstiness=args.burstiness,
      max_concurrency=args.max_concurrency,
      ignore_eos=args.ignore_eos,
      seed=args.seed,
      api_key=args.api_key,
      endpoint=args.endpoint,
      show_progress=not args.disable_tqdm,
    )
    runs.append(run_one_rate(config, requests, options))
  lengths = (
    f"in {args.random_input_len} / out {args.random_output_len} tokens"
    if args.dataset == "random"
    else None
  )
  result = {
    "model": model,
    "base_url": args.base_url,
    "endpoint": args.endpoint,
    "dataset": args.dataset,
    "num_prompts": len(requests),
    "lengths": lengths,
    "length_source": length_source,
    "ignore_eos": args.ignore_eos,
    "seed": args.seed,
    "percentiles": list(options.percentiles),
    "goodput_slos_ms": options.goodput_slos,
    "runs": runs,
  }
  if args.save_result or args.result_dir:
    for path in write_results(Path(args.result_dir or "."), result):
      print(f"wrote {path}")
  return 0 if all(r["metrics"]["failed"] == 0 for r in runs) else 1
