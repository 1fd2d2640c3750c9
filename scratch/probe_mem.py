import sys, time, json, gc
from jaxserve.platforms import prepare_jax_process
prepare_jax_process(0.92)
import jax, jax.numpy as jnp
from jaxserve.config import load_config
cfg = load_config("configs/h100.yaml", ["model=/tmp/llama8b", "max_model_len=2048"])
GiB = 2**30
def st(tag):
  s = jax.devices()[0].memory_stats()
  print(tag, {k: round(s[k]/GiB, 3) for k in ("bytes_limit","bytes_in_use","largest_free_block_bytes","peak_bytes_in_use") if k in s}, flush=True)
st("start")
pre = float(sys.argv[1]) if len(sys.argv) > 1 else 0
pool = None
if pre:
  n_layers = 32; per = int(pre * GiB / 64)
  pool = [jnp.zeros((per // 2,), jnp.bfloat16) for _ in range(64)]
  jax.block_until_ready(pool); st(f"after pool {pre} GiB")
from jaxserve.parallel.placement import load_placement
t = time.time(); p = load_placement(cfg); jax.block_until_ready(p.model.params); print("load s", time.time()-t)
wb = sum(x.nbytes for x in jax.tree_util.tree_leaves(p.model.params)); print("weights GiB", wb/GiB)
st("after load")
time.sleep(2); gc.collect(); st("after gc")
