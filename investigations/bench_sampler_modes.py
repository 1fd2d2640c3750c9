"""What each static sampler mode costs per call (device/sampler.py): the sampler of one decode step
in every SamplerMode, timed on random logits, so a mode stays static (its own compiled program)
only where skipping its work pays.

    python -m investigations.bench_sampler_modes --rows 256 --vocab 128256 --out modes.json

Each mode is jitted alone and timed by wall time per call (median of --reps after a warmup),
with the greedy pick of XLA's reductions; the histories are --history tokens long.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.api.sampling_params import MAX_LOGIT_BIAS
from jaxserve.bench.timing import seconds_per_call
from jaxserve.device.sampler import SamplerMode, sample
from jaxserve.device.sampling_inputs import SamplingInputs
from jaxserve.tools.json_file import write_json

NUM_BANNED = 8


def sampling_inputs(
  rows: int, history: int, vocab: int, rng: np.random.Generator
) -> SamplingInputs:
  """Every row samples (temperature 0.8, top-k 50, top-p 0.9) with penalties and a full history."""
  full = lambda value, dtype: np.full(rows, value, dtype)  # noqa: E731
  ids = lambda: rng.integers(0, vocab, size=(rows, history)).astype(np.int32)  # noqa: E731
  return SamplingInputs(
    temperature=full(0.8, np.float32),
    top_k=full(50, np.int32),
    top_p=full(0.9, np.float32),
    min_p=full(0.0, np.float32),
    seeds=full(1, np.uint32),
    sample_index=full(3, np.int32),
    repetition_penalty=full(1.1, np.float32),
    presence_penalty=full(0.5, np.float32),
    frequency_penalty=full(0.3, np.float32),
    prompt_history=ids(),
    output_history=ids(),
    banned_ids=np.full((rows, NUM_BANNED), -1, np.int32),
    bias_ids=np.full((rows, MAX_LOGIT_BIAS), -1, np.int32),
    bias_values=np.zeros((rows, MAX_LOGIT_BIAS), np.float32),
    bitmask=np.full((rows, -(-vocab // 32)), -1, np.int32),  # every token allowed
    any_random=np.array(True),
    any_penalty=np.array(True),
    want_top_logprobs=np.array(True),
    want_prompt_logprobs=np.array(False),
  )


def time_modes(rows: int, vocab: int, history: int, reps: int) -> list[dict]:
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.standard_normal((rows, vocab), np.float32))  # [S, V]
  inputs = jax.tree.map(jnp.asarray, dataclasses.asdict(sampling_inputs(rows, history, vocab, rng)))
  results = []
  for mode in SamplerMode.all():
    fn = jax.jit(lambda lg, s, mode=mode: sample(lg, SamplingInputs(**s), mode))
    seconds = seconds_per_call(fn, logits, inputs, inner=3, reps=reps)
    results.append({"mode": dataclasses.asdict(mode), "ms": 1e3 * seconds})
  return results


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--vocab", type=int, default=32000)
  parser.add_argument("--history", type=int, default=2048)
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--out", default="out/sampler_modes.json")
  return parser.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  results = time_modes(args.rows, args.vocab, args.history, args.reps)
  greedy = results[0]["ms"]
  for r in results:
    flags = "+".join(k for k, v in r["mode"].items() if v) or "greedy"
    print(f"{flags:<30} {r['ms']:9.3f} ms  ({r['ms'] / greedy:5.1f}x greedy)")
  report = {
    "backend": jax.default_backend(),
    "device": jax.devices()[0].device_kind,
    "rows": args.rows,
    "vocab": args.vocab,
    "history": args.history,
    "modes": results,
  }
  write_json(args.out, report)
  print(json.dumps(report))
  return 0


if __name__ == "__main__":
  sys.exit(main())
