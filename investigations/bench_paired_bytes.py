"""Times investigations/attention_paired_bytes.py's kernel beside the production GPU attention
kernel (pallas_kernels/ragged_paged_attention/gpu) on 8-bit pages, side by side at each decode
batch on fresh random pages: the production kernel (MMAs in q's bfloat16), the production kernel
on q cast to float16 (its MMAs in float16), and the paired kernel with bfloat16 and float16
MMAs; each column's us, TB/s of K/V attended and max |difference| from the production output.

  python -m investigations.bench_paired_bytes --batches 512,64,8 --context 1500
  python -m investigations.bench_paired_bytes --pages int8
  python -m investigations.bench_paired_bytes --smoke     # tiny, interpret mode, any backend
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

from investigations.attention_paired_bytes import as_pairs, paired_attention
from jaxserve.bench.timing import seconds_per_call
from pallas_kernels.ragged_paged_attention.gpu.attention import ragged_paged_attention
from pallas_kernels.ragged_paged_attention.gpu.tiling import (
  choose_tiling,
  has_large_smem,
  num_cores,
)


def random_batch(
  num_seqs: int,
  context: int,
  *,
  kv_heads: int,
  q_heads: int,
  head_dim: int,
  page_size: int,
  dtype8,
  seed: int = 0,
):
  """A decode step of num_seqs sequences of `context` cached tokens over shuffled pages."""
  rng = np.random.default_rng(seed)
  pages_per_seq = -(-context // page_size)
  num_pages = num_seqs * pages_per_seq
  tables = rng.permutation(num_pages).reshape(num_seqs, pages_per_seq).astype(np.int32)
  shape = (kv_heads, num_pages, page_size, head_dim)
  k, v = (jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype8) for _ in range(2))
  q = jnp.asarray(rng.standard_normal((num_seqs, q_heads, head_dim), np.float32), jnp.bfloat16)
  seq_lens = jnp.full((num_seqs,), context, jnp.int32)
  qsl = jnp.arange(num_seqs + 1, dtype=jnp.int32)
  return q, k, v, jnp.asarray(tables), seq_lens, qsl, jnp.asarray([num_seqs], jnp.int32)


def compare(num_seqs: int, context: int, args: argparse.Namespace) -> dict:
  """At one batch, side by side: the production kernel (MMAs in q's bfloat16), the production
  kernel on q cast to float16 (its MMAs then in float16: one hardware conversion from e4m3, no
  float16 -> bfloat16 step), and the paired variant with bfloat16 and float16 MMAs. Each
  column's max |difference| from the production output, us, and TB/s of K/V attended."""
  dtype8 = jnp.dtype(args.pages)
  q, k, v, tables, seq_lens, qsl, n = random_batch(
    num_seqs,
    context,
    kv_heads=args.kv_heads,
    q_heads=args.q_heads,
    head_dim=args.head_dim,
    page_size=args.page_size,
    dtype8=dtype8,
  )
  interpret = jax.default_backend() != "gpu"
  tiling = choose_tiling(
    num_seqs,
    num_seqs,
    args.q_heads,
    args.kv_heads,
    args.head_dim,
    max_kv_len=context,
    page_itemsize=1,
    num_cores=num_cores(),
    large_smem=has_large_smem(),
    num_kv_splits=1,
  )
  sm_scale = args.head_dim**-0.5
  production = jax.jit(
    functools.partial(
      ragged_paged_attention,
      sm_scale=sm_scale,
      block_q=tiling.block_q,
      block_kv=tiling.block_kv,
      num_warps=tiling.num_warps,
      num_stages=tiling.num_stages,
      num_kv_splits=1,
      interpret=interpret,
    )
  )
  pairs = (as_pairs(k), as_pairs(v))
  pool = (k[None], v[None], jnp.zeros((1,), jnp.int32))  # the production's pool of one slot
  columns = {
    "production": (production, q, pool),
    "production_f16": (production, q.astype(jnp.float16), pool),
  }
  for mma in ("bfloat16", "float16"):
    fn = functools.partial(
      paired_attention,
      tiling=tiling,
      dtype8=dtype8,
      mma_dtype=jnp.dtype(mma),
      sm_scale=sm_scale,
      interpret=interpret,
    )
    columns["paired" if mma == "bfloat16" else "paired_f16"] = (fn, q, pairs)
  kv_bytes = 2 * num_seqs * context * args.kv_heads * args.head_dim
  row: dict = {"num_seqs": num_seqs, "context": context, "pages": str(dtype8)}
  want = production(q, *pool, tables, seq_lens, qsl, n).astype(jnp.float32)
  for name, (fn, q_in, pages) in columns.items():
    got = fn(q_in, *pages, tables, seq_lens, qsl, n).astype(jnp.float32)
    s = seconds_per_call(
      fn, q_in, *pages, tables, seq_lens, qsl, n, inner=args.inner, reps=args.reps
    )
    row[name] = {
      "us": 1e6 * s,
      "tb_per_s": kv_bytes / s / 1e12,
      "max_abs_diff": float(jnp.max(jnp.abs(got - want))),
    }
    print(
      f"{num_seqs} x {context} {dtype8} {name}: {1e6 * s:.1f} us, "
      f"{kv_bytes / s / 1e12:.2f} TB/s, max |diff| {row[name]['max_abs_diff']:.2e}",
      flush=True,
    )
  return row


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batches", default="512,64")
  parser.add_argument("--context", type=int, default=1500)
  parser.add_argument("--pages", choices=("float8_e4m3fn", "int8"), default="float8_e4m3fn")
  parser.add_argument("--kv-heads", type=int, default=8)
  parser.add_argument("--q-heads", type=int, default=32)
  parser.add_argument("--head-dim", type=int, default=128)
  parser.add_argument("--page-size", type=int, default=16)
  parser.add_argument("--inner", type=int, default=10)
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--smoke", action="store_true", help="tiny shapes, interpret mode")
  parser.add_argument("--out")
  args = parser.parse_args(argv)
  if args.smoke:
    args.batches, args.context, args.kv_heads, args.q_heads = "3", 40, 2, 4
    args.head_dim, args.inner, args.reps = 64, 1, 1
  rows = [compare(int(b), args.context, args) for b in args.batches.split(",")]
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"device": jax.devices()[0].device_kind, "rows": rows}, f)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
