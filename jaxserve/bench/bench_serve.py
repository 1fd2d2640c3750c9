"""`jaxserve bench serve`: a load generator for an OpenAI-compatible server, as vLLM's bench serve.

It loads /v1/completions (prompts as text or token ids) or, with `--endpoint /v1/chat/completions`,
the chat route (each prompt one user message). Requests are sent at gamma/Poisson arrival times (see
arrivals.py), optionally capped at `max_concurrency` in flight, each streaming its completion over
SSE (serve_client.py), from one or several client processes (client_processes.py:
`--client-processes`, by default as many as the load needs) so that the client keeps up. Timing
follows vLLM's benchmark_serving (see latency_stats.py). After vLLM's result table the report says
how many client processes ran and why, their CPU time and share of a core, the share of chunk
gaps under 1 ms in each, and warns when a client process had no idle time (client_usage.py). A
sweep runs the same workload at several rates and plots throughput against latency. Flags follow
vLLM's benchmark_serving (--dataset-name, --endpoint, --percentile-metrics, --metric-percentiles,
--goodput, --save-result / --result-dir); results are written only with --save-result. The server is
checked (GET /v1/models) before anything runs: one line if it cannot be reached.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx  # the async streaming HTTP client (the `bench` extra; checked by tools/cli.py)

from jaxserve.bench.client_processes import machine_cores, plan_clients, run_clients
from jaxserve.bench.client_usage import (
  bottleneck_warnings,
  client_report,
  paired_warnings,
  small_gap_fraction,
)
from jaxserve.bench.datasets import SampleRequest
from jaxserve.bench.goodput import meets_slos, parse_goodput
from jaxserve.bench.latency_stats import (
  format_table,
  parse_percentile_metrics,
  parse_percentiles,
  summarize,
)
from jaxserve.bench.serve_client import CHAT_PATH, ServeBenchConfig


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
  config: ServeBenchConfig,
  requests: Sequence[SampleRequest],
  options: ReportOptions,
  client_processes: int | None = None,
) -> dict:
  """Runs the workload at config.request_rate from `client_processes` client processes (None:
  plan_clients decides); returns the JSON-ready result of that run."""
  cores = machine_cores()
  plan = plan_clients(
    client_processes, requests, config.request_rate, config.max_concurrency, cores
  )
  clients = run_clients(config, requests, plan)
  records = clients.records
  num_good = None
  if options.goodput_slos is not None:
    num_good = sum(meets_slos(r, options.goodput_slos) for r in records)
  metrics = summarize(records, clients.duration_s, options.percentiles, num_good)
  print(
    format_table(
      metrics,
      f"Serving Benchmark Result (rate {_rate_str(config.request_rate)})",
      options.percentile_metrics,
    )
  )
  warnings = bottleneck_warnings(clients.usages, cores) + paired_warnings(clients.usages)
  print("\n".join(client_report(clients.usages, plan.reason) + warnings))
  errors = sorted({r.error for r in records if not r.success})
  for error in errors[:5]:
    print(f"  failed: {error}")
  return {
    "request_rate": _rate_str(config.request_rate),
    "burstiness": config.burstiness,
    "max_concurrency": config.max_concurrency,
    "metrics": metrics.to_dict(),
    "client": {
      "processes": plan.processes,
      "reason": plan.reason,
      "cpu_s": sum(u.cpu_s for u in clients.usages),
      "small_gap_fraction": small_gap_fraction(clients.usages),
      "per_process": [u.to_dict() for u in clients.usages],
      "bottleneck": any(u.bottleneck for u in clients.usages),
      "paired": any(u.paired for u in clients.usages),
      "warnings": warnings,
    },
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
  if args.client_processes is not None and args.client_processes < 1:
    raise ValueError(f"client_processes: must be >= 1, got {args.client_processes}")
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
    runs.append(run_one_rate(config, requests, options, args.client_processes))
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
