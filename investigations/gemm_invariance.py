"""Is a bfloat16 GEMM's result independent of how tensor parallelism splits it?

    python -m investigations.gemm_invariance --out out/gemm_invariance.json

For bf16 x [M, K] and w [K, N] at Llama-3.1-8B projection shapes, on the default device:

  column    jnp.dot(x, w)[:, :N/2] == jnp.dot(x, w[:, :N/2]) (bf16 out, as nn.Dense), and with
            --f32-columns the same with float32 output: does the column-parallel half (what one
            of two devices computes) equal the unsharded result's columns?
  row       the row-parallel contraction as 2 K-groups with float32 partials, summed and rounded
            once (models/invariant_dense.py row_group_partials): the unsharded formulation (one
            batched einsum over both groups) against the tp=2 one (each group's dot alone, as
            each device runs it, then a + b). Also the plain bf16 row split (round each half, add
            in bf16) against the unsharded bf16 dot, the numerics without
            tp_invariant_reductions.

Each entry is the number of differing elements (0: bitwise equal). Every formulation is its own
jitted function, as in a real step. Prints a table and writes JSON to --out.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.tools.json_file import write_json

SHAPES = {
  "qkv": (4096, 6144),
  "gate_up": (4096, 28672),
  "gate": (4096, 14336),
  "down": (14336, 4096),
}
GPU_M = (1, 8, 128, 256, 4096)
CPU_M = (1, 8, 128)


@jax.jit
def dot_bf16(x, w):
  return jnp.dot(x, w)


@jax.jit
def dot_f32(x, w):
  return jnp.dot(x, w, preferred_element_type=jnp.float32)


@jax.jit
def grouped_unsharded(x, w):
  """Both K-groups in one einsum, float32 partials summed, rounded once (tp = 1)."""
  m, k = x.shape
  partials = jnp.einsum(
    "mgk,gkn->gmn",
    x.reshape(m, 2, k // 2),
    w.reshape(2, k // 2, -1),
    preferred_element_type=jnp.float32,
  )  # [2, M, N]
  return jnp.sum(partials, axis=0).astype(jnp.bfloat16)


@jax.jit
def add_f32_round(a, b):
  return (a + b).astype(jnp.bfloat16)


@jax.jit
def add_bf16(a, b):
  return a + b


def num_diff(a: jax.Array, b: jax.Array) -> int:
  a, b = np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32))
  return int(np.sum((a != b) & ~(np.isnan(a) & np.isnan(b))))


def check(m: int, k: int, n: int, seed: int, f32_columns: bool) -> dict:
  kx, kw = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(kx, (m, k), jnp.bfloat16)
  w = (jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
  half_n, half_k = n // 2, k // 2
  w_left = w[:, :half_n]
  column_bf16 = num_diff(dot_bf16(x, w)[:, :half_n], dot_bf16(x, w_left))
  column_f32 = num_diff(dot_f32(x, w)[:, :half_n], dot_f32(x, w_left)) if f32_columns else None
  x0, x1, w0, w1 = x[:, :half_k], x[:, half_k:], w[:half_k], w[half_k:]
  grouped_tp2 = add_f32_round(dot_f32(x0, w0), dot_f32(x1, w1))
  grouped_tp2_swapped = add_f32_round(dot_f32(x1, w1), dot_f32(x0, w0))  # the other rank's sum
  row_grouped = num_diff(grouped_unsharded(x, w), grouped_tp2)
  row_grouped_ranks = num_diff(grouped_tp2, grouped_tp2_swapped)
  row_plain = num_diff(dot_bf16(x, w), add_bf16(dot_bf16(x0, w0), dot_bf16(x1, w1)))
  return {
    "M": m,
    "K": k,
    "N": n,
    "num_elements_column": m * half_n,
    "num_elements_row": m * n,
    "column_bf16_diff": column_bf16,
    "column_f32_diff": column_f32,
    "row_grouped_diff": row_grouped,
    "row_grouped_rank_diff": row_grouped_ranks,
    "row_plain_bf16_diff": row_plain,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="out/gemm_invariance.json")
  parser.add_argument(
    "--m", default=None, help=f"comma-separated M values (default {GPU_M} on GPU, {CPU_M} on CPU)"
  )
  parser.add_argument(
    "--shapes", default="qkv,gate_up,down", help=f"comma-separated names from {sorted(SHAPES)}"
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--f32-columns",
    action="store_true",
    help="also compare float32-output columns (two more GEMMs per shape)",
  )
  args = parser.parse_args()
  on_cpu = jax.default_backend() == "cpu"
  ms = [int(v) for v in args.m.split(",")] if args.m else (CPU_M if on_cpu else GPU_M)
  names = args.shapes.split(",")
  unknown = [s for s in names if s not in SHAPES]
  if unknown:
    raise ValueError(f"--shapes: unknown {unknown} (known: {sorted(SHAPES)})")
  start = time.perf_counter()
  rows = []
  for name in names:
    k, n = SHAPES[name]
    for m in ms:
      rows.append({"shape": name, **check(m, k, n, args.seed, args.f32_columns)})
  seconds = time.perf_counter() - start
  device = jax.devices()[0]
  result = {
    "device": device.device_kind,
    "platform": device.platform,
    "jax": jax.__version__,
    "seconds": round(seconds, 1),
    "rows": rows,
  }
  out = write_json(args.out, result)
  print(
    f"{device.device_kind} ({device.platform}), jax {jax.__version__}: differing elements "
    "(0 = bitwise equal)"
  )
  print(
    f"{'shape':>8} {'M':>5} {'K':>6} {'N':>6} {'col bf16':>9} {'col f32':>8} "
    f"{'row grouped':>12} {'ranks':>6} {'row plain bf16':>15}"
  )
  for r in rows:
    print(
      f"{r['shape']:>8} {r['M']:>5} {r['K']:>6} {r['N']:>6} {r['column_bf16_diff']:>9} "
      f"{'-' if r['column_f32_diff'] is None else r['column_f32_diff']:>8} "
      f"{r['row_grouped_diff']:>12} "
      f"{r['row_grouped_rank_diff']:>6} {r['row_plain_bf16_diff']:>15}"
    )
  print(f"{seconds:.1f} s; wrote {out}")


if __name__ == "__main__":
  main()
