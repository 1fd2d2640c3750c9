"""One engine per process: quantization x kv dtype on a checkpoint; greedy tokens, pool pages."""

import json
import sys
import time

from jaxserve.assembly import build_engine
from jaxserve.config import load_config
from jaxserve.sampling_params import SamplingParams

model, quant, kv, out = sys.argv[1:5]
backend = sys.argv[5] if len(sys.argv) > 5 else "pallas_gpu"
cfg = load_config(
  "configs/h100-offline.yaml",
  [
    f"model={model}",
    f"quantization={quant}",
    f"cache.kv_cache_dtype={kv}",
    "max_model_len=512",
    "scheduler.max_num_seqs=64",
    "scheduler.max_num_batched_tokens=2048",
    "scheduler.seq_buckets=[64]",
    "scheduler.token_buckets=[2048]",
    "scheduler.num_scheduler_steps=1",
    "compilation_cache_dir=null",
    f"attention_backend={backend}",
  ],
)
t = time.perf_counter()
engine = build_engine(cfg, show_progress=False)
build_s = time.perf_counter() - t
import numpy as np

rng = np.random.default_rng(0)
for i in range(16):
  engine.add_request(
    rng.integers(100, 30000, 64).tolist(),
    SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True),
    request_id=str(i),
  )
done = {}
t = time.perf_counter()
while engine.has_unfinished_requests():
  for o in engine.step():
    if o.finished:
      done[o.request_id] = list(o.token_ids)
gen_s = time.perf_counter() - t
res = dict(
  quant=quant,
  kv=kv,
  backend=backend,
  build_s=round(build_s, 1),
  gen_s=round(gen_s, 2),
  num_pages=engine.allocator.num_usable_pages,
  tokens={k: done[k] for k in sorted(done)},
)
json.dump(res, open(out, "w"))
print(
  quant,
  kv,
  backend,
  "build",
  res["build_s"],
  "gen",
  res["gen_s"],
  "pages",
  res["num_pages"],
  "first",
  done["0"][:8],
)
