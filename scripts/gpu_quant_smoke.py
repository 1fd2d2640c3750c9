"""One engine of a (quantization, KV dtype, attention backend) on a checkpoint, for
scripts/gpu_quant.sh: builds it, generates 64 greedy tokens for 16 random prompts and writes the
tokens, the build and generate times and the pool's page count to a JSON file.

    python scripts/gpu_quant_smoke.py CHECKPOINT QUANTIZATION KV_DTYPE OUT.json [BACKEND]
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.composition.assembly import build_engine
from jaxserve.config.loader import load_config


def main() -> None:
  model, quant, kv, out = sys.argv[1:5]
  backend = sys.argv[5] if len(sys.argv) > 5 else "pallas_gpu"
  overrides = [
    f"model={model}",
    f"quantization={quant}",
    f"cache.kv_cache_dtype={kv}",
    f"attention_backend={backend}",
    "max_model_len=512",
    "scheduler.max_num_seqs=64",
    "scheduler.max_num_batched_tokens=2048",
    "scheduler.seq_buckets=[64]",
    "scheduler.token_buckets=[2048]",
    "scheduler.num_scheduler_steps=1",
    "compilation_cache_dir=null",
  ]
  start = time.perf_counter()
  engine = build_engine(load_config("configs/h100-offline.yaml", overrides), show_progress=False)
  build_s = time.perf_counter() - start
  rng = np.random.default_rng(0)
  greedy = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
  for i in range(16):
    engine.add_request(rng.integers(100, 30000, 64).tolist(), greedy, request_id=str(i))
  done = {}
  start = time.perf_counter()
  while engine.has_unfinished_requests():
    for output in engine.step():
      if output.finished:
        done[output.request_id] = list(output.token_ids)
  result = {
    "quant": quant,
    "kv": kv,
    "backend": backend,
    "build_s": round(build_s, 1),
    "gen_s": round(time.perf_counter() - start, 2),
    "num_pages": engine.allocator.num_usable_pages,
    "tokens": {k: done[k] for k in sorted(done)},
  }
  with open(out, "w") as f:
    json.dump(result, f)
  print(quant, kv, backend, "build", result["build_s"], "gen", result["gen_s"])
  print("  pages", result["num_pages"], "first tokens", done["0"][:8])


if __name__ == "__main__":
  main()
