"""Warmup: compiles, before the first request, every program a step can need.

warmup_plan lists them: every bucket's forward, every sampler mode per sequence bucket, prompt
logprobs per token bucket and, with decode bursts, the burst program for every bucket a
decode-only batch can take in the two sampler modes a burst allows (greedy, random). warmup runs
each once on padding inputs (device/lowering.py), through the runner, so the programs are the very
ones serving will call (and a multi-host job's other hosts compile them too). After it, no batch
the scheduler can produce triggers a compilation (the compile ledger counts any).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tqdm.auto import tqdm

from jaxserve.device.lowering import dummy_inputs
from jaxserve.device.model_runner import ModelRunner
from jaxserve.device.sampler import SamplerMode
from jaxserve.messages.buckets import Bucket, BucketSet
from jaxserve.messages.scheduled_batch import ScheduledBatch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmupRun:
  """One program to compile: a bucket, a sampler mode, prompt logprobs on or off, and the
  number of decode steps (> 1: the burst program)."""

  bucket: Bucket
  mode: SamplerMode
  prompt_logprobs: bool = False
  num_steps: int = 1


def single_step_runs(buckets: BucketSet) -> list[WarmupRun]:
  """Every bucket's forward, every sampler mode per sequence bucket, prompt logprobs per token
  bucket."""
  all_buckets = buckets.all()
  runs = [WarmupRun(bucket, SamplerMode()) for bucket in all_buckets]
  for num_seqs in buckets.seq_buckets:
    bucket = min((b for b in all_buckets if b.num_seqs == num_seqs), key=lambda b: b.num_tokens)
    runs += [WarmupRun(bucket, mode) for mode in SamplerMode.all() if mode != SamplerMode()]
  for num_tokens in buckets.token_buckets:
    bucket = min((b for b in all_buckets if b.num_tokens == num_tokens), key=lambda b: b.num_seqs)
    runs.append(WarmupRun(bucket, SamplerMode(), True))
  return runs


def burst_buckets(buckets: BucketSet) -> list[Bucket]:
  """Every bucket a decode-only batch (as many tokens as sequences) can take."""
  return sorted({buckets.pick(n, n) for n in buckets.seq_buckets})


def warmup_plan(buckets: BucketSet, burst_steps: int) -> list[WarmupRun]:
  bursts = (
    []
    if burst_steps == 1
    else [
      WarmupRun(bucket, mode, False, burst_steps)
      for bucket in burst_buckets(buckets)
      for mode in (SamplerMode(), SamplerMode(random=True))
    ]
  )
  return single_step_runs(buckets) + bursts


def warmup(runner: ModelRunner, show_progress: bool = True) -> float:
  """Compiles every program of warmup_plan through `runner`; returns the seconds it took."""
  plan = warmup_plan(runner.buckets, runner.burst_steps)
  num_bursts = sum(run.num_steps > 1 for run in plan)
  logger.info(
    "warmup: compiling %d buckets (%s), %d sampler modes per sequence bucket and "
    "prompt logprobs per token bucket: %d programs",
    len(runner.buckets.all()),
    runner.buckets.describe(),
    len(SamplerMode.all()),
    len(plan) - num_bursts,
  )
  if num_bursts:
    logger.info("warmup: %d decode-burst programs of %d steps", num_bursts, runner.burst_steps)
  start = time.perf_counter()
  with tqdm(
    total=len(plan), desc="compiling", unit="program", disable=not show_progress
  ) as progress:
    for run in plan:
      inputs = dummy_inputs(runner, run.bucket, run.mode, run.prompt_logprobs)
      runner.execute(inputs, ScheduledBatch(num_steps=run.num_steps))
      progress.update()
  seconds = time.perf_counter() - start
  logger.info("warmup: compiled in %.1f s", seconds)
  return seconds
