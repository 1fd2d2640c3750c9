"""The decoder's layers as one jitted program each layer calls (models/layers/decoder.py, "one
program a layer") against the unrolled stack: the same step traced, lowered and compiled both
ways on the same engine and batch, with its device time. What the per-layer program buys is
host time before a program can run (trace and lowering hold the GIL); what it must not cost is
device time (XLA inlines the calls, so the compiled step should be the same).

    python -m investigations.layer_programs --model /path/to/ckpt --num-seqs 256 --context 1024

prints two rows per variant, alternating (and --out writes them as JSON); --phase prefill times the
first prefill step of those prompts instead of a decode step.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time
from unittest import mock

import jax

from investigations.profile_step import profiled_batch, timed_forward
from jaxserve.config.cli_args import add_engine_args
from jaxserve.models.layers.decoder import CausalLM

VARIANTS = ("unrolled", "per_layer")


def variant(name: str) -> contextlib.AbstractContextManager:
  """The decoder's layer functions as `name` makes them: the bound layers inline (unrolled) or
  the shipped per-layer programs."""
  if name == "unrolled":
    return mock.patch.object(CausalLM, "_layer_fns", lambda self: list(self.layers))
  return contextlib.nullcontext()


def measure(runner, inputs, name: str, reps: int) -> dict:
  """Trace, lower and compile seconds of the forward step in variant `name`, and its device
  milliseconds (median of `reps`, donated pages)."""
  model = runner.model
  jax.clear_caches()  # no trace of an earlier step or variant reused
  with variant(name):

    @functools.partial(jax.jit, donate_argnums=1)
    def forward(params, kv, inp):
      return model.apply(
        {"params": params}, inp.token_ids, inp.positions, kv, inp.slot_mapping, inp.metadata
      )

    start = time.perf_counter()
    traced = forward.trace(runner.params, runner.kv_pages, inputs)
    traced_at = time.perf_counter()
    lowered = traced.lower()
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
  ms = timed_forward(functools.partial(compiled, runner.params), runner, inputs, reps=reps)
  memory = compiled.memory_analysis()
  return {
    "variant": name,
    "trace_s": traced_at - start,
    "lower_s": lowered_at - traced_at,
    "compile_s": compiled_at - lowered_at,
    "device_ms": ms,
    "hlo_chars": len(lowered.as_text()),
    "temp_bytes": None if memory is None else int(memory.temp_size_in_bytes),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_engine_args(parser)
  parser.add_argument("--num-seqs", type=int, default=256)
  parser.add_argument("--context", type=int, default=1024)
  parser.add_argument("--phase", choices=("decode", "prefill"), default="decode")
  parser.add_argument("--reps", type=int, default=30)
  parser.add_argument("--out", help="write the JSON rows here")
  args = parser.parse_args()
  engine, inputs, batch = profiled_batch(args, args.num_seqs, args.context, args.phase)
  inputs = jax.device_put(inputs)
  rows = [measure(engine.runner, inputs, name, args.reps) for name in VARIANTS * 2]
  for row in rows:
    print(
      f"{args.phase} {batch.num_seqs} x {args.context} ({batch.num_tokens} tokens) "
      f"{row['variant']:9s}: trace {row['trace_s']:.2f} s, lower {row['lower_s']:.2f} s, "
      f"compile {row['compile_s']:.2f} s, device {row['device_ms']:.3f} ms, "
      f"HLO {row['hlo_chars']:,} chars, temp {row['temp_bytes']}"
    )
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"num_seqs": batch.num_seqs, "phase": args.phase, "rows": rows}, f, indent=2)


if __name__ == "__main__":
  main()
