"""Tensor-parallel serving on several GPUs: greedy tokens with tp=N against tp=1, decode step time
at a fixed batch, and the all-reduce time per step measured on its own.

    NCCL_NVLS_ENABLE=0 python -m investigations.bench_tp --model /tmp/llama8b --tp 1,2 --batch 128

The model is any checkpoint directory (e.g. a Llama-3.1-8B-shaped random bfloat16 one built with
jaxserve.bench.random_checkpoint). --tp-invariant turns on EngineConfig.tp_invariant_reductions
(bitwise-equal bfloat16 forwards at tp = 1 and 2). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.composition.assembly import build_engine
from jaxserve.config import CacheConfig, EngineConfig, SchedulerConfig


def engine_config(
  model: str,
  tp: int,
  batch: int,
  context: int,
  decode_steps: int,
  page_size: int = 16,
  dtype: str = "bfloat16",
  tp_invariant: bool = False,
) -> EngineConfig:
  max_len = context + decode_steps + 320  # room for the parity prompts (up to 275 tokens)
  num_pages = batch * (max_len // page_size + 2) + 64
  return EngineConfig(
    model=model,
    dtype=dtype,
    max_model_len=max_len,
    tensor_parallel_size=tp,
    tp_invariant_reductions=tp_invariant,
    cache=CacheConfig(page_size=page_size, num_pages=num_pages),
    scheduler=SchedulerConfig(
      max_num_seqs=batch,
      max_num_batched_tokens=2048,
      enable_prefix_caching=False,
      seq_buckets=tuple(sorted({min(8, batch), batch})),
      token_buckets=(batch, 2048) if batch < 2048 else (batch,),
    ),
  )


def greedy_tokens(
  engine, prompts: list[list[int]], num_new: int
) -> tuple[list[tuple[int, ...]], np.ndarray]:
  """Greedy tokens of each prompt, and the prompt logprobs of all prompts concatenated."""
  params = SamplingParams(temperature=0.0, max_tokens=num_new, ignore_eos=True)
  scoring = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
  for i, prompt in enumerate(prompts):
    engine.add_request(prompt, params, request_id=f"parity-{i}")
    engine.add_request(prompt, scoring, request_id=f"score-{i}")
  done = {}
  while engine.has_unfinished_requests():
    for out in engine.step():
      if out.finished:
        done[out.request_id] = out
  tokens = [done[f"parity-{i}"].token_ids for i in range(len(prompts))]
  logprobs = np.concatenate(
    [[e.logprob for e in done[f"score-{i}"].prompt_logprobs[1:]] for i in range(len(prompts))]
  )
  return tokens, logprobs


def decode_ms_per_step(engine, batch: int, context: int, decode_steps: int, vocab: int) -> float:
  rng = np.random.default_rng(1)
  params = SamplingParams(temperature=0.0, max_tokens=decode_steps + 1, ignore_eos=True)
  for i in range(batch):
    engine.add_request(rng.integers(0, vocab, context).tolist(), params, request_id=f"dec-{i}")
  bucket = (batch, batch)
  before = None
  while engine.has_unfinished_requests():
    engine.step()
    requests = engine.core.requests
    if before is None and requests and all(r.output_token_ids for r in requests.values()):
      before = list(engine.timings.per_bucket.get(bucket, [0, 0.0]))
  steps, seconds = engine.timings.per_bucket[bucket]
  steps, seconds = steps - before[0], seconds - before[1]
  return 1e3 * seconds / steps


def all_reduce_ms(tp: int, batch: int, hidden: int, num_layers: int, reps: int = 20) -> float:
  """Two all-reduces of [batch, hidden] bfloat16 per layer (after attention and after the MLP)."""
  mesh = Mesh(np.array(jax.devices()[:tp]), ("model",))
  x = jax.device_put(jnp.ones((tp * batch, hidden), jnp.bfloat16), NamedSharding(mesh, P("model")))
  reduce = jax.shard_map(
    lambda a: jax.lax.psum(a, "model"), mesh=mesh, in_specs=P("model"), out_specs=P("model")
  )

  @jax.jit
  def loop(x):
    return jax.lax.fori_loop(0, 2 * num_layers, lambda i, y: reduce(y) * 0.5, x)

  loop(x).block_until_ready()
  samples = []
  for _ in range(reps):
    start = time.perf_counter()
    loop(x).block_until_ready()
    samples.append(time.perf_counter() - start)
  return 1e3 * statistics.median(samples)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", required=True)
  parser.add_argument("--tp", default="1,2")
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--context", type=int, default=512)
  parser.add_argument("--decode-steps", type=int, default=32)
  parser.add_argument("--parity-tokens", type=int, default=32)
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  parser.add_argument(
    "--tp-invariant",
    action="store_true",
    help="EngineConfig.tp_invariant_reductions (fixed-order bf16 reductions)",
  )
  parser.add_argument("--skip-decode", action="store_true", help="parity only, no timings")
  parser.add_argument("--out", default="out/bench_tp.json")
  args = parser.parse_args()
  rows, reference, reference_logprobs = [], None, None
  prompts = [np.random.default_rng(i).integers(0, 250, 16 + 37 * i).tolist() for i in range(8)]
  for tp in [int(v) for v in args.tp.split(",")]:
    engine = build_engine(
      engine_config(
        args.model,
        tp,
        args.batch,
        args.context,
        args.decode_steps,
        dtype=args.dtype,
        tp_invariant=args.tp_invariant,
      ),
      show_progress=False,
    )
    tokens, logprobs = greedy_tokens(engine, prompts, args.parity_tokens)
    if reference is None:
      reference, reference_logprobs = tokens, logprobs
    first_diffs = [
      next((j for j, (a, b) in enumerate(zip(t, r, strict=False)) if a != b), None)
      for t, r in zip(tokens, reference, strict=True)
    ]
    model_config = engine.runner.model.config
    row = {
      "tp": tp,
      "device": jax.devices()[0].device_kind,
      "jax": jax.__version__,
      "dtype": args.dtype,
      "tp_invariant_reductions": args.tp_invariant,
      "tokens_equal_tp1": tokens == reference,
      "prompt_logprobs_bitwise_tp1": bool(np.array_equal(logprobs, reference_logprobs)),
      "first_differing_token": first_diffs,
      "max_prompt_logprob_diff_vs_tp1": float(np.abs(logprobs - reference_logprobs).max()),
      "num_compilations": engine.ledger.num_compilations,
      "decode_ms_per_step": (
        None
        if args.skip_decode
        else decode_ms_per_step(
          engine, args.batch, args.context, args.decode_steps, min(1000, model_config.vocab_size)
        )
      ),
      "all_reduce_ms_per_step": (
        all_reduce_ms(tp, args.batch, model_config.hidden_size, model_config.num_layers)
        if tp > 1
        else 0.0
      ),
    }
    rows.append(row)
    del engine
    gc.collect()
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({"batch": args.batch, "context": args.context, "rows": rows}, indent=2))
  print(f"batch {args.batch}, context {args.context}")
  print(
    f"{'tp':>3} {'dtype':>9} {'decode ms/step':>15} {'all-reduce ms/step':>19} "
    f"{'tokens == tp1':>14} {'max logprob diff':>17}"
  )
  for row in rows:
    decode = row["decode_ms_per_step"]
    print(
      f"{row['tp']:>3} {row['dtype']:>9} {'-' if decode is None else f'{decode:.2f}':>15} "
      f"{row['all_reduce_ms_per_step']:>19.2f} {str(row['tokens_equal_tp1']):>14} "
      f"{row['max_prompt_logprob_diff_vs_tp1']:>17.2e}"
    )
    print(f"    first differing token per prompt: {row['first_differing_token']}")
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
