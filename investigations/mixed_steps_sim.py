"""What the step budget (engine/step_budget.py: `scheduler.mixed_step_prefill_tokens`,
`latency_batched_tokens`) and the scheduler limits do to a burst, simulated on the host: the real
Scheduler and PageAllocator (pure Python) step through a burst under a linear step-time model,
and the script prints, per setting, the simulated output tok/s, TTFT p50/p99, TPOT p50/p99, ITL
p50/p99 and ITL p50 / TPOT p50 (issue 29 asks for it within 25%).

    python -m investigations.mixed_steps_sim --caps none,256,320,384,512
    # a large GPU's serve default against 256 / 2,048, each step costed at its bucket (--pad):
    python -m investigations.mixed_steps_sim --pad --max-num-seqs 512 \
        --max-num-batched-tokens 8192 --latency-batched-tokens 2048

The model: a step costs base_ms + row_ms x decode rows + token_ms x prompt tokens. Its defaults
fit the 8B-shaped bfloat16 server on one H200 (docs/PERFORMANCE.md, "ITL against TPOT"):
a decode-only step of 256 sequences about 11.3 ms (the burst's ITL median), a mean step of
about 16 ms with about 230 prompt tokens a step (the burst's TPOT), a lone decode about 5.5 ms
(the weight read). It has no host overhead and no async scheduling, and no bucket padding unless
`--pad` costs each step at its bucket (messages/buckets.py: the padded tokens as prompt tokens,
seq_pad_ms a padded sequence): a guide to which settings to measure, not a measurement. By
default every request arrives at once (rate inf) and runs to its max_tokens (ignore_eos), as
`bench serve --random-input-len 256 --random-output-len 256 --ignore-eos` does; `--request-rate
16 --input-len 1024 --output-len 128 --range-ratio 0.5 --num-requests 320` is the issue's
rate-16 workload (20 s of it).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import SchedulerConfig
from jaxserve.engine.page_allocator import PageAllocator
from jaxserve.engine.request import Request, RequestStatus
from jaxserve.engine.scheduler import Scheduler
from jaxserve.messages.buckets import BucketSet


@dataclass(frozen=True)
class StepModel:
  base_ms: float = 5.5
  row_ms: float = 0.0227  # (11.3 - 5.5) / 256
  token_ms: float = 0.0205  # (16 - 11.3) / 230
  seq_pad_ms: float = 0.002  # a padded sequence's sampling row (with --pad)

  def step_ms(self, decode_rows: int, prompt_tokens: int, padded_seqs: int = 0) -> float:
    return (
      self.base_ms
      + self.row_ms * decode_rows
      + self.token_ms * prompt_tokens
      + self.seq_pad_ms * padded_seqs
    )


@dataclass(frozen=True)
class Burst:
  """The workload: num_requests of input_len / output_len tokens (each length drawn from
  [len x (1 - range_ratio), len x (1 + range_ratio)], as `bench serve --random-range-ratio`),
  arriving at once (request_rate inf) or as a Poisson process; and the scheduler's limits."""

  num_requests: int = 1000
  input_len: int = 256
  output_len: int = 256
  request_rate: float = float("inf")
  range_ratio: float = 0.0
  max_num_seqs: int = 256
  max_num_batched_tokens: int = 2048
  latency_batched_tokens: int | None = None
  pad: bool = False  # cost each step at its bucket
  page_size: int = 16
  num_pages: int = 100_000


def simulate(burst: Burst, cap: int | None, model: StepModel) -> dict[str, float]:
  config = SchedulerConfig(
    max_num_seqs=burst.max_num_seqs,
    max_num_batched_tokens=burst.max_num_batched_tokens,
    enable_prefix_caching=False,
    mixed_step_prefill_tokens=cap,
    latency_batched_tokens=burst.latency_batched_tokens,
  )
  buckets = BucketSet.from_config(config)
  longest = int(burst.input_len * (1 + burst.range_ratio)) + int(
    burst.output_len * (1 + burst.range_ratio)
  )
  scheduler = Scheduler(config, PageAllocator(burst.num_pages, burst.page_size), longest)
  rng = np.random.default_rng(0)
  arrivals = np.zeros(burst.num_requests)
  if np.isfinite(burst.request_rate):
    arrivals = np.cumsum(rng.exponential(1000 / burst.request_rate, burst.num_requests))
  requests = []
  for i in range(burst.num_requests):
    low, high = 1 - burst.range_ratio, 1 + burst.range_ratio
    prompt_len = int(rng.integers(int(burst.input_len * low), int(burst.input_len * high) + 1))
    output_len = int(rng.integers(int(burst.output_len * low), int(burst.output_len * high) + 1))
    params = SamplingParams(max_tokens=max(1, output_len), ignore_eos=True)
    prompt = rng.integers(0, 1000, max(1, prompt_len)).tolist()
    requests.append(Request(f"r{i}", prompt, params, seed=0))
  times: dict[str, list[float]] = {r.request_id: [] for r in requests}
  now, added = 0.0, 0
  while added < len(requests) or scheduler.has_unfinished_requests():
    if not scheduler.has_unfinished_requests():
      now = max(now, arrivals[added])
    while added < len(requests) and arrivals[added] <= now:
      scheduler.add_request(requests[added])
      added += 1
    batch = scheduler.schedule()
    decode_rows = sum(1 for s in batch.seqs if s.num_tokens == 1 and s.sample)
    num_seqs, num_tokens = len(batch.seqs), batch.num_tokens
    if burst.pad:
      bucket = buckets.pick(num_seqs, num_tokens)
      num_seqs, num_tokens = bucket.num_seqs - num_seqs, bucket.num_tokens
    else:
      num_seqs = 0
    now += model.step_ms(decode_rows, num_tokens - decode_rows, num_seqs)
    for seq in batch.seqs:
      if not seq.sample:
        continue
      request = scheduler.get_request(seq.request_id)
      request.append_sampled(1)
      times[seq.request_id].append(now)
      if len(request.output_token_ids) >= request.sampling_params.max_tokens:
        scheduler.finish_request(seq.request_id, RequestStatus.FINISHED_LENGTH)
  ttft = np.array([t[0] - arrivals[i] for i, t in enumerate(times.values())])
  tpot = np.array([(t[-1] - t[0]) / (len(t) - 1) for t in times.values() if len(t) > 1])
  itl = np.concatenate([np.diff(t) for t in times.values()])
  return {
    "tok_s": sum(map(len, times.values())) / (now / 1000),
    "ttft_p50": float(np.median(ttft)),
    "ttft_p99": float(np.percentile(ttft, 99)),
    "tpot_p50": float(np.median(tpot)),
    "tpot_p99": float(np.percentile(tpot, 99)),
    "itl_p50": float(np.median(itl)),
    "itl_p99": float(np.percentile(itl, 99)),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--caps", default="none,256,320,384,512", help="P values (none: unset)")
  parser.add_argument("--num-requests", type=int, default=1000)
  parser.add_argument("--input-len", type=int, default=256)
  parser.add_argument("--output-len", type=int, default=256)
  parser.add_argument("--request-rate", type=float, default=float("inf"))
  parser.add_argument("--range-ratio", type=float, default=0.0)
  parser.add_argument("--max-num-seqs", type=int, default=256)
  parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
  parser.add_argument("--latency-batched-tokens", type=int, default=None)
  parser.add_argument("--pad", action="store_true", help="cost each step at its bucket")
  args = parser.parse_args()
  burst = Burst(
    args.num_requests,
    args.input_len,
    args.output_len,
    args.request_rate,
    args.range_ratio,
    args.max_num_seqs,
    args.max_num_batched_tokens,
    args.latency_batched_tokens,
    args.pad,
  )
  head = f"{'P':>6} {'tok/s':>8} {'TTFT p50/p99 ms':>16} {'TPOT p50/p99':>13} {'ITL p50/p99':>12}"
  print(f"{head} {'ITL/TPOT':>9}")
  for text in args.caps.split(","):
    cap = None if text == "none" else int(text)
    r = simulate(burst, cap, StepModel())
    print(
      f"{text:>6} {r['tok_s']:>8.0f} {r['ttft_p50']:>7.0f}/{r['ttft_p99']:<8.0f} "
      f"{r['tpot_p50']:>6.1f}/{r['tpot_p99']:<6.1f} {r['itl_p50']:>5.1f}/{r['itl_p99']:<6.1f} "
      f"{r['itl_p50'] / r['tpot_p50']:>9.2f}"
    )


if __name__ == "__main__":
  main()
