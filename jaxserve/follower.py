"""The worker loop of a multi-host job: every process but 0 runs process 0's steps.

A worker builds the same device side as process 0 (its shards of the params and KV pages, the
same jitted step) but no scheduler, tokenizer or HTTP server. It takes process 0's KV pool size,
then receives each step's inputs and runs the step, warmup included, until process 0 stops.
"""
from __future__ import annotations

import logging

from jaxserve.config import EngineConfig
from jaxserve.assembly import build_runner, enable_compilation_cache
from jaxserve.parallel.multihost import StepSubscriber, replicated_constant
from jaxserve.parallel.sharded_runner import ShardedModelRunner

logger = logging.getLogger(__name__)


def run_worker(config: EngineConfig) -> int:
  """Follows process 0 step by step; returns the exit status (0 once process 0 stops)."""
  enable_compilation_cache(config.compilation_cache_dir)
  subscriber = StepSubscriber()
  runner = build_runner(config, agree_num_pages=subscriber.agree_num_pages).runner
  if not isinstance(runner, ShardedModelRunner):
    raise ValueError("distributed: a worker needs a multi-process mesh")
  like = runner.dummy_inputs(runner.buckets.all()[0])
  constant = replicated_constant(runner.replicated)
  logger.info("worker: following process 0's steps")
  num_steps = 0
  while (inputs := subscriber.receive(like, constant)) is not None:
    runner.execute(inputs)
    num_steps += 1
  logger.info("worker: process 0 stopped after %d steps", num_steps)
  return 0
