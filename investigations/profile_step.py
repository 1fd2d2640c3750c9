"""Where a step's device time goes: the whole jitted step against its parts (model forward,
logits, sampler), timed on the same inputs for one bucket: a decode step of --num-seqs sequences
at --context tokens, or with --phase prefill the first prefill step of those prompts. With
--trace-top N it also profiles ~10 executions of the whole jitted step and prints the N kernels
(CPU: XLA ops) that take most device time (investigations/device_trace.py); --trace-ops adds
the top XLA instructions with their shapes and JAX op paths (investigations/hlo_ops.py), with
GPU command buffers off so each kernel is traced under its own instruction. The
results print as JSON at the end and go to --out when given.

    python -m investigations.profile_step --model /path/to/ckpt --num-seqs 256 --context 576 \
        --trace-top 25
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import time

import jax
import numpy as np

from investigations.device_trace import (
  capture_trace,
  kernel_table_json,
  print_kernel_table,
  summarize_trace,
  total_device_us,
)
from investigations.hlo_ops import describe, instructions
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.bench.timing import median_seconds
from jaxserve.composition.assembly import build_engine
from jaxserve.config.cli_args import add_engine_args, engine_config_from_args
from jaxserve.device.lowering import lower_step
from jaxserve.device.packing import pack
from jaxserve.device.sampler import SamplerMode, sample


def timed(fn, *args, reps: int = 20, **kwargs) -> float:
  return 1e3 * median_seconds(functools.partial(fn, **kwargs), *args, reps=reps)


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


def profiled_batch(args: argparse.Namespace, num_seqs: int, context: int, phase: str):
  """(engine, step inputs, batch): an engine of the command line's config (programs compiled
  lazily, on first use) holding `num_seqs` random prompts of `context` tokens, and its next step:
  the first prefill step, or (decode) a decode step of every sequence once all are prefilled."""
  engine = build_engine(engine_config_from_args(args), show_progress=False, default_warmup="lazy")
  engine.async_scheduling = False  # no step in flight when the batch below is taken
  rng = np.random.default_rng(0)
  params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
  for i in range(num_seqs):
    prompt = rng.integers(0, min(engine.vocab_size, 1000), context).tolist()
    engine.add_request(prompt, params, request_id=f"p{i}")
  while phase == "decode" and (
    engine.scheduler.num_waiting
    or any(  # prefill everyone
      len(engine.core.requests[r].output_token_ids) == 0 for r in engine.core.requests
    )
  ):
    engine.step()
  batch = engine.scheduler.schedule()
  inputs = engine.runner.prepare(batch)
  print(f"bucket {inputs.bucket}, {batch.num_seqs} seqs, {batch.num_tokens} tokens")
  if phase == "decode" and batch.num_seqs < num_seqs:
    print(
      f"WARNING: the step holds {batch.num_seqs} of the {num_seqs} sequences asked for "
      "(the KV pool or the scheduler's limits held the rest back): compare profiles only at "
      "equal num_seqs"
    )
  return engine, inputs, batch


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_engine_args(parser)
  parser.add_argument("--num-seqs", type=int, default=256)
  parser.add_argument("--context", type=int, default=576)
  parser.add_argument("--phase", choices=("decode", "prefill"), default="decode")
  parser.add_argument(
    "--trace-top",
    type=int,
    default=0,
    metavar="N",
    help="also profile the whole step and print its N most expensive kernels",
  )
  parser.add_argument("--trace-dir", help="where the profile goes (default: a temporary dir)")
  parser.add_argument("--trace-reps", type=int, default=10)
  parser.add_argument(
    "--trace-by-family",
    action="store_true",
    help="add up kernels that differ only in XLA's numeric suffix",
  )
  parser.add_argument(
    "--trace-ops",
    action="store_true",
    help="also list the top XLA instructions of the traced step with their "
    "shape and the JAX op they come from (e.g. .../q_proj/dot_general)",
  )
  parser.add_argument("--out", help="write the JSON results here")
  args = parser.parse_args()
  if args.trace_ops:
    # A GPU command buffer (CUDA graph) runs many instructions as one traced event; without
    # them every kernel is traced under its own instruction (the step runs a little slower).
    os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="
    ).strip()
  engine, inputs, batch = profiled_batch(args, args.num_seqs, args.context, args.phase)
  runner = engine.runner
  model = runner.model
  compute_logits = type(model).compute_logits
  params = runner.params  # an argument, never a closure: captured weights become constants

  @functools.partial(jax.jit, donate_argnums=1)
  def forward(params, kv, inp):
    hidden, kv = model.apply(
      {"params": params}, inp.token_ids, inp.positions, kv, inp.slot_mapping, inp.metadata
    )
    return hidden, kv

  @jax.jit
  def logits_fn(params, h):
    return model.apply({"params": params}, h, method=compute_logits)

  device_inputs = jax.device_put(inputs)
  hidden, runner.kv_pages = forward(params, runner.kv_pages, device_inputs)
  last = hidden[device_inputs.logits_indices]
  logits = logits_fn(params, last)
  rows = [
    ("whole step (packed inputs, donated pages)", None),
    (
      "model forward (donated pages)",
      timed_forward(functools.partial(forward, params), runner, device_inputs),
    ),
    ("logits (lm_head)", timed(logits_fn, params, last)),
    (
      "sampler",
      timed(
        jax.jit(sample, static_argnames="mode"),
        logits,
        device_inputs.sampling,
        mode=SamplerMode.of(inputs.sampling),
      ),
    ),
    ("pack + transfer", timed(lambda: jax.device_put(pack(inputs)))),
  ]
  samples, dispatch = [], []
  for _ in range(20):
    start = time.perf_counter()
    handle = runner.dispatch(inputs)
    dispatch.append(time.perf_counter() - start)
    runner.fetch(handle)
    samples.append(time.perf_counter() - start)
  rows[0] = (rows[0][0], 1e3 * statistics.median(samples))
  rows.append(("host time to dispatch the step (idle device)", 1e3 * statistics.median(dispatch)))
  behind = []  # dispatching while the step before still runs, as async scheduling does
  handle = runner.dispatch(inputs)
  for _ in range(20):
    start = time.perf_counter()
    next_handle = runner.dispatch(inputs)
    behind.append(time.perf_counter() - start)
    runner.fetch(handle)
    handle = next_handle
  runner.fetch(handle)
  rows.append(("host time to dispatch behind a running step", 1e3 * statistics.median(behind)))
  kv_bytes = sum(pool.nbytes for pool in jax.tree.leaves(runner.kv_pages))  # every group's K, V
  print(f"KV pool {kv_bytes / 2**30:.1f} GiB")
  for name, ms in rows:
    print(f"{name:44s} {ms:8.2f} ms")
  result = {
    "bucket": dataclasses.asdict(inputs.bucket),
    "num_seqs": batch.num_seqs,
    "asked_num_seqs": args.num_seqs,
    "num_tokens": batch.num_tokens,
    "kv_pool_bytes": kv_bytes,
    "parts_ms": {name: ms for name, ms in rows},
    "backend": jax.default_backend(),
  }
  if args.trace_top > 0:
    result["trace"] = trace_step(
      runner, inputs, args.trace_top, args.trace_dir, args.trace_reps, args.trace_by_family
    )
    if args.trace_ops:
      result["trace_ops"] = trace_ops(
        runner, inputs, result["trace"]["logdir"], args.trace_top, args.trace_reps
      )
  text = json.dumps(result, indent=2)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")


def trace_step(runner, inputs, top: int, trace_dir: str | None, reps: int, by_family: bool) -> dict:
  """Profiles `reps` executions of the runner's jitted step on these inputs (pages donated and
  threaded through, as in serving) and prints the top kernels by device time."""

  def one_step():
    return runner.dispatch(inputs).fetch_list()

  logdir = capture_trace(one_step, trace_dir, reps=reps)
  kernels = summarize_trace(logdir, by_family=by_family)
  total_us = total_device_us(kernels)
  print(f"\ndevice time of the whole step, {reps} executions traced ({logdir}):")
  print_kernel_table(kernels, top=top, reps=reps)
  return {
    "logdir": str(logdir),
    "reps": reps,
    "device_us_per_step": total_us / reps,
    "by_family": by_family,
    "num_kernels": len(kernels),
    "kernels": kernel_table_json(kernels, top),
  }


def trace_ops(runner, inputs, logdir: str, top: int, reps: int) -> list[dict]:
  """The traced step's device time per XLA instruction, each described from the compiled
  programs' HLO (opcode, result shape, JAX op path)."""
  table = instructions(program.compile().as_text() for program in lower_step(runner, inputs))
  rows = summarize_trace(logdir, by_op=True)
  print(f"\ntop XLA instructions of the step ({reps} executions):")
  print(f"{'instruction':32s} {'us/exec':>9s} {'share':>6s}  what")
  out = []
  for row in rows[:top]:
    hlo = describe(row.name, table)
    what = hlo.summary() if hlo else "(not in the step's HLO: a library kernel or another program)"
    print(f"{row.name[:32]:32s} {row.total_us / reps:9.1f} {row.share:6.1%}  {what[:110]}")
    out.append(
      {
        "name": row.name,
        "us_per_step": row.total_us / reps,
        "share": row.share,
        "count": row.count,
        "hlo": None if hlo is None else dataclasses.asdict(hlo),
      }
    )
  return out


if __name__ == "__main__":
  main()
