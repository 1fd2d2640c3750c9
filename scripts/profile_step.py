"""Where a decode step's device time goes: the whole jitted step against its parts (model
forward, logits, sampler), timed on the same inputs for one bucket.

    python scripts/profile_step.py --model /path/to/ckpt --num-seqs 256 --context 576
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from jaxserve.cli import add_engine_args, engine_config_from_args
from jaxserve.engine.factory import build_engine
from jaxserve.runtime.packing import pack
from jaxserve.runtime.sampler import sample
from jaxserve.sampling_params import SamplingParams


def timed(fn, *args, reps: int = 20) -> float:
  jax.block_until_ready(fn(*args))
  samples = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    samples.append(time.perf_counter() - start)
  return 1e3 * statistics.median(samples)


def timed_forward(fn, runner, inputs, reps: int = 20) -> float:
  """Times fn(kv_pages, inputs) -> (hidden, kv_pages), threading the donated pages through."""
  hidden, runner.kv_pages = fn(runner.kv_pages, inputs)
  jax.block_until_ready(hidden)
  samples = []
  for _ in range(reps):
    start = time.perf_counter()
    hidden, runner.kv_pages = fn(runner.kv_pages, inputs)
    jax.block_until_ready(hidden)
    samples.append(time.perf_counter() - start)
  return 1e3 * statistics.median(samples)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_engine_args(parser)
  parser.add_argument("--num-seqs", type=int, default=256)
  parser.add_argument("--context", type=int, default=576)
  args = parser.parse_args()
  engine = build_engine(engine_config_from_args(args), show_progress=False)
  rng = np.random.default_rng(0)
  params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
  for i in range(args.num_seqs):
    engine.add_request(rng.integers(0, min(engine.vocab_size, 1000), args.context).tolist(), params, request_id=f"p{i}")
  while engine.scheduler.num_waiting or any(  # run prefill until everyone decodes
      len(engine._requests[r].output_token_ids) == 0 for r in engine._requests):
    engine.step()
  runner = engine.runner
  batch = engine.scheduler.schedule()
  inputs = runner.prepare(batch, engine._requests)
  model = runner.model
  compute_logits = type(model).compute_logits
  variables = {"params": runner.params}
  print(f"bucket {inputs.bucket}, {batch.num_seqs} seqs, {batch.num_tokens} tokens")

  def forward(kv, inp):
    return model.apply(variables, inp.token_ids, inp.positions, kv, inp.slot_mapping,
                       inp.metadata)

  device_inputs = jax.device_put(inputs)
  hidden, runner.kv_pages = jax.jit(forward, donate_argnums=0)(runner.kv_pages, device_inputs)
  last = hidden[device_inputs.logits_indices]
  logits = jax.jit(lambda h: model.apply(variables, h, method=compute_logits))(last)
  rows = [
      ("whole step (packed inputs, donated pages)", None),
      ("model forward (donated pages)", timed_forward(jax.jit(forward, donate_argnums=0),
                                                      runner, device_inputs)),
      ("logits (lm_head)", timed(jax.jit(lambda h: model.apply(variables, h,
                                                               method=compute_logits)), last)),
      ("sampler", timed(jax.jit(sample), logits, device_inputs.sampling)),
      ("pack + transfer", timed(lambda: jax.device_put(pack(inputs)))),
  ]
  samples = []
  for _ in range(20):
    start = time.perf_counter()
    runner.execute(inputs)
    samples.append(time.perf_counter() - start)
  rows[0] = (rows[0][0], 1e3 * statistics.median(samples))
  kv_bytes = sum(k.nbytes + v.nbytes for k, v in runner.kv_pages)
  print(f"KV pool {kv_bytes / 2**30:.1f} GiB")
  for name, ms in rows:
    print(f"{name:44s} {ms:8.2f} ms")


if __name__ == "__main__":
  main()
