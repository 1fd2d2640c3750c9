"""The follower entry of a multi-host job: every process but 0 runs process 0's steps.

A follower builds the same device side as process 0 through the composition root (its shards of
the params and KV pages, the same step programs: jaxserve/assembly.build_device) but no
scheduler, tokenizer or HTTP server. It takes process 0's KV pool size, then receives each step's
inputs and runs the step, warmup included, until process 0 stops.
"""

from __future__ import annotations

import logging

from jaxserve.composition.assembly import build_device, enable_compilation_cache
from jaxserve.config import EngineConfig
from jaxserve.device.lowering import dummy_inputs
from jaxserve.parallel.multihost import StepSubscriber, replicated_constant

logger = logging.getLogger(__name__)


def run_follower(config: EngineConfig) -> int:
  """Follows process 0 step by step; returns the exit status (0 once process 0 stops)."""
  enable_compilation_cache(config.compilation_cache_dir)
  subscriber = StepSubscriber()
  runner = build_device(config, agree_num_pages=subscriber.agree_num_pages).runner
  shardings = runner.programs.shardings
  if shardings is None:
    raise ValueError("distributed: a worker needs a multi-process mesh")
  like = dummy_inputs(runner, runner.buckets.all()[0])
  constant = replicated_constant(shardings.replicated)
  logger.info("worker: following process 0's steps")
  num_steps = 0
  while (inputs := subscriber.receive(like, constant)) is not None:
    runner.execute(inputs)
    num_steps += 1
  logger.info("worker: process 0 stopped after %d steps", num_steps)
  return 0
