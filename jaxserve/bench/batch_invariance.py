"""Does a greedy request give the same tokens and logprobs alone and in a crowd, on this device?

    jaxserve bench batch-invariance --model /tmp/llama1b --config configs/h100.yaml \
        --batch-invariant on --out out/invariance_1b_on.json
    python -m jaxserve.bench.batch_invariance ...   # the same flags

N probe prompts (random ids, --min-len to --max-len tokens) each generate T greedy tokens with
their logprobs in four scenarios, and every scenario is compared with the first, bitwise:

  alone     each probe by itself, the reference;
  crowd     all probes interleaved with M other prompts (random lengths, greedy and sampled);
  preempt   the same crowd with all but a few sequences' KV pages held back, so the scheduler
            preempts and recomputes (the run reports how many preemptions happened);
  prefix    each probe after a request for its first pages, so those pages come from the
            prefix cache.

One engine runs them all (prefix caching on; the cache is emptied before each probe or crowd
by taking and returning every free page), so every scenario runs the same compiled programs.

Per probe: identical tokens, identical logprobs (bitwise), and the first differing position;
then a summary line per scenario. The component checks (bench/invariance_components.py) isolate
the sources on the device itself: the dense GEMMs over the config's token buckets, RMSNorm rows,
the attention kernel alone / in a batch / chunked, logits, logsumexp and the greedy sampler.
--batch-invariant on|off sets EngineConfig.batch_invariant; everything else comes from --config
and --set. JSON goes to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass

import jax
import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.bench.flags import INVARIANCE_SCENARIOS, add_batch_invariance_flags, standalone_parser
from jaxserve.bench.invariance_components import model_config_of, run_components
from jaxserve.composition.assembly import build_engine
from jaxserve.config import EngineConfig
from jaxserve.config.device_defaults import Usage
from jaxserve.config.loader import load_config
from jaxserve.device.platforms import prepare_jax_process
from jaxserve.engine.llm_engine import LLMEngine
from jaxserve.tools.json_file import write_json


@dataclass(frozen=True)
class Workload:
  probes: list[list[int]]
  others: list[tuple[list[int], SamplingParams]]
  num_tokens: int


@dataclass(frozen=True)
class ProbeResult:
  tokens: tuple[int, ...]
  logprobs: tuple[float, ...]


def make_workload(
  vocab_size: int,
  num_probes: int,
  num_others: int,
  num_tokens: int,
  min_len: int,
  max_len: int,
  seed: int,
) -> Workload:
  rng = np.random.default_rng(seed)
  high = min(vocab_size, 32000)

  def prompt() -> list[int]:
    return rng.integers(1, high, int(rng.integers(min_len, max_len + 1))).tolist()

  probes = [prompt() for _ in range(num_probes)]
  others = [
    (
      prompt(),
      SamplingParams(
        temperature=float(rng.choice([0.0, 0.8])),
        seed=i,
        max_tokens=int(rng.integers(1, num_tokens + 1)),
        ignore_eos=True,
      ),
    )
    for i in range(num_others)
  ]
  return Workload(probes, others, num_tokens)


def probe_params(num_tokens: int) -> SamplingParams:
  return SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True, logprobs=0)


def run_requests(
  engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]]
) -> dict[str, ProbeResult]:
  """Queues every request, steps until all finish, returns the probes' ("probe-*") results."""
  for rid, prompt, params in requests:
    engine.add_request(prompt, params, request_id=rid)
  done = {}
  while engine.has_unfinished_requests():
    for out in engine.step():
      if out.finished and out.request_id.startswith("probe-"):
        done[out.request_id] = ProbeResult(
          tuple(out.token_ids), tuple(e.logprob for e in out.logprobs or ())
        )
  return done


def crowd_requests(work: Workload) -> list[tuple[str, list[int], SamplingParams]]:
  """The others with the probes spread among them (probe i after other i * M / N)."""
  requests = [(f"other-{j}", p, params) for j, (p, params) in enumerate(work.others)]
  step = max(1, len(requests) // max(1, len(work.probes)))
  for i, probe in enumerate(work.probes):
    requests.insert(
      min(len(requests), i * (step + 1) + step // 2),
      (f"probe-{i}", probe, probe_params(work.num_tokens)),
    )
  return requests


def reset_prefix_cache(engine: LLMEngine) -> None:
  """Empties the prefix cache: taking every free page evicts the cached ones, and pages that were
  never registered go back uncached."""
  engine.allocator.free(engine.allocator.allocate(engine.allocator.num_free_pages))


def run_alone(engine: LLMEngine, work: Workload, page_size: int) -> dict[str, ProbeResult]:
  results = {}
  for i, probe in enumerate(work.probes):
    reset_prefix_cache(engine)
    results.update(run_requests(engine, [(f"probe-{i}", probe, probe_params(work.num_tokens))]))
  return results


def run_crowd(engine: LLMEngine, work: Workload, page_size: int) -> dict[str, ProbeResult]:
  reset_prefix_cache(engine)
  return run_requests(engine, crowd_requests(work))


def run_preempt(engine: LLMEngine, work: Workload, page_size: int) -> dict[str, ProbeResult]:
  """The crowd with all but about four of the longest sequences' pages held back, so the
  scheduler preempts (and recomputes) requests."""
  reset_prefix_cache(engine)
  longest = max(len(p) for p in work.probes + [o[0] for o in work.others]) + work.num_tokens
  keep = 4 * -(-longest // page_size)
  allocator = engine.allocator
  held = allocator.allocate(max(0, allocator.num_free_pages - keep))
  try:
    return run_requests(engine, crowd_requests(work))
  finally:
    allocator.free(held)


def run_prefix(engine: LLMEngine, work: Workload, page_size: int) -> dict[str, ProbeResult]:
  """Each probe after a one-token request for its first full pages (at least one page)."""
  results = {}
  warm = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
  for i, probe in enumerate(work.probes):
    reset_prefix_cache(engine)
    cached = max(page_size, (len(probe) // 2) // page_size * page_size)
    run_requests(engine, [(f"prefix-{i}", probe[:cached], warm)])
    if engine.allocator.num_cached_pages == 0:
      raise RuntimeError("prefix scenario: the probe's first pages were not cached")
    results.update(run_requests(engine, [(f"probe-{i}", probe, probe_params(work.num_tokens))]))
  return results


def compare(reference: dict[str, ProbeResult], other: dict[str, ProbeResult]) -> list[dict]:
  rows = []
  for rid in sorted(reference, key=lambda r: int(r.split("-")[1])):
    a, b = reference[rid], other[rid]
    first = next(
      (k for k, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)) if x != y), None
    )
    if first is None and len(a.tokens) != len(b.tokens):
      first = min(len(a.tokens), len(b.tokens))
    lp_first = next(
      (
        k
        for k, (x, y) in enumerate(zip(a.logprobs, b.logprobs, strict=False))
        if np.float32(x).tobytes() != np.float32(y).tobytes()
      ),
      None,
    )
    rows.append(
      {
        "probe": rid,
        "tokens_identical": first is None,
        "logprobs_bitwise": first is None
        and lp_first is None
        and len(a.logprobs) == len(b.logprobs),
        "first_differing_token": first,
        "first_differing_logprob": lp_first,
      }
    )
  return rows


def probe_engine_config(config: EngineConfig, work: Workload) -> EngineConfig:
  """`config` with prefix caching on and, unless it sets one, a pool that holds every request of
  the crowd at once (preemption is forced by holding pages back)."""
  page = config.cache.page_size
  longest = max(len(p) for p in work.probes + [o[0] for o in work.others]) + work.num_tokens
  num_pages = config.cache.num_pages or (
    (len(work.probes) + len(work.others) + 2) * -(-longest // page) + 1
  )
  return config.replace(
    cache=dataclasses.replace(config.cache, num_pages=num_pages),
    scheduler=dataclasses.replace(config.scheduler, enable_prefix_caching=True),
  )


SCENARIO_RUNS = {
  "alone": run_alone,
  "crowd": run_crowd,
  "preempt": run_preempt,
  "prefix": run_prefix,
}


def run_scenarios(
  engine: LLMEngine, work: Workload, scenarios: tuple[str, ...], page_size: int
) -> dict:
  """Runs each scenario on `engine`; returns each one's comparison with "alone"."""
  results, stats = {}, {}
  for name in scenarios:
    start, preemptions = time.perf_counter(), engine.stats().num_preemptions
    results[name] = SCENARIO_RUNS[name](engine, work, page_size)
    stats[name] = {
      "seconds": round(time.perf_counter() - start, 2),
      "num_preemptions": engine.stats().num_preemptions - preemptions,
    }
  report = {}
  for name in scenarios:
    if name != "alone":
      rows = compare(results["alone"], results[name])
      report[name] = {
        **stats[name],
        "num_tokens_identical": sum(r["tokens_identical"] for r in rows),
        "num_logprobs_bitwise": sum(r["logprobs_bitwise"] for r in rows),
        "probes": rows,
      }
  return report


def print_report(report: dict, num_probes: int) -> None:
  for name, entry in report.items():
    print(f"--- {name} ({entry['num_preemptions']} preemptions, {entry['seconds']} s)")
    for r in entry["probes"]:
      tokens = "identical" if r["tokens_identical"] else "DIFFER"
      print(
        f"{name} {r['probe']:>9}: tokens {tokens:>9}"
        f"  logprobs {'bitwise' if r['logprobs_bitwise'] else 'DIFFER':>7}"
        f"  first differing token {r['first_differing_token']}"
        f"  logprob {r['first_differing_logprob']}"
      )
  summary = ", ".join(
    f"{name} {e['num_tokens_identical']}/{num_probes} tokens "
    f"{e['num_logprobs_bitwise']}/{num_probes} logprobs"
    for name, e in report.items()
  )
  print(f"SUMMARY identical vs alone: {summary}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = standalone_parser("batch_invariance", __doc__)
  add_batch_invariance_flags(parser)
  return parser.parse_args(argv)


def engine_config(args: argparse.Namespace) -> EngineConfig:
  overrides = [f"model={args.model}", *args.set]
  if args.batch_invariant != "config":
    overrides.append(f"batch_invariant={'true' if args.batch_invariant == 'on' else 'false'}")
  config = load_config(args.config, overrides)
  max_len = args.max_len + args.num_tokens
  if config.max_model_len is None or config.max_model_len < max_len:
    config = config.replace(max_model_len=max_len)
  return config


def main(argv: list[str] | None = None) -> dict:
  return command(parse_args(argv))


def command(args: argparse.Namespace) -> dict:
  """The check on parsed flags (`jaxserve bench batch-invariance` calls it); returns the report."""
  config = engine_config(args)
  scenarios = tuple(s for s in args.scenarios.split(",") if s)
  unknown = [s for s in scenarios if s not in INVARIANCE_SCENARIOS]
  if unknown or "alone" not in scenarios:
    raise ValueError(
      f"--scenarios: must include alone and name only {INVARIANCE_SCENARIOS}, got {scenarios}"
    )
  prepare_jax_process(config.cache.memory_fraction)
  vocab = model_config_of(config).vocab_size
  work = make_workload(
    vocab, args.num_probes, args.num_others, args.num_tokens, args.min_len, args.max_len, args.seed
  )
  device = jax.devices()[0]
  result = {
    "device": device.device_kind,
    "jax": jax.__version__,
    "model": config.model,
    "batch_invariant": config.batch_invariant,
    "num_probes": args.num_probes,
    "num_tokens": args.num_tokens,
    "num_others": args.num_others,
  }
  print(
    f"{device.device_kind}, jax {jax.__version__}, {config.model}, batch_invariant "
    f"{config.batch_invariant}: {args.num_probes} probes x {args.num_tokens} tokens, "
    f"{args.num_others} others"
  )
  if args.components != "off":
    result["components"] = run_components(
      config, timed=args.components == "on", all_forms=args.components != "configured"
    )
  engine = build_engine(probe_engine_config(config, work), show_progress=False, usage=Usage.OFFLINE)
  result["scenarios"] = run_scenarios(engine, work, scenarios, config.cache.page_size)
  print_report(result["scenarios"], args.num_probes)
  if args.out:
    print(f"wrote {write_json(args.out, result)}")
  return result


if __name__ == "__main__":
  main()
