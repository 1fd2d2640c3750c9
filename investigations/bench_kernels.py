"""Benchmarks the GPU ragged paged-attention kernel against the HBM copy ceiling, the XLA
gather-then-attend reference and JAX's bundled Pallas GPU paged_attention.

Every kernel's output is first checked against the reference on fresh random inputs. Timing runs
a jitted loop of `--inner` calls (each call reads a different set of pages, so data never sits in
L2) `--reps` times and takes the median per call. The loop body also slices the page table and
reduces the output (a few small kernels per call); `--harness unrolled` instead times one
program of `--inner` independent calls and nothing else, each with its own query array and its
own ordering of the pages, and `--harness marginal` the difference between such programs of
n and 3n calls divided by 2n: what one more call back to back costs, without the program's
fixed dispatch and synchronization (which a model step pays once for all its layers).
Effective bandwidth counts the K and V bytes the batch actually attends:
sum(seq_lens) * num_kv_heads * head_dim * 2 * itemsize. `--prefill NUMxLEN` adds prompt
batches, reported in attention TFLOP/s as well. `--kv-dtype float8_e4m3fn|int8` stores the pages
8-bit (the KV cache's --kv-cache-dtype) for the same batches. The baselines are in
attention_baselines.py, the timing harnesses in kernel_timing.py, the record and table in
attention_report.py.

  python -m investigations.bench_kernels                 # on a GPU; writes out/bench_kernels.json
  python -m investigations.bench_kernels --smoke         # tiny sizes, interpret mode, any backend
  # --tiles block_kv:num_warps:num_stages,...
  python -m investigations.bench_kernels --tiles 64:4:3,128:4:3,32:4:2
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

import jax
import jax.numpy as jnp

from investigations.attention_baselines import (
  bundled_paged_attention,
  reference_bytes,
  sub_batch_args,
)
from investigations.attention_report import (
  CaseResult,
  attention_flops,
  max_abs_error,
  print_table,
)
from investigations.kernel_timing import (
  Batch,
  Shape,
  copy_bandwidth,
  device_us_per_call,
  make_batch,
  read_bandwidth,
  time_per_call,
)
from pallas_kernels.ragged_paged_attention.gpu.attention import ragged_paged_attention
from pallas_kernels.ragged_paged_attention.reference import ragged_paged_attention_reference

L2_ROTATION_BYTES = 256 * 2**20  # rotate page sets until this many KV bytes are touched
REFERENCE_MEMORY_FRACTION = 0.35


def run_case(
  name: str,
  batch: Batch,
  *,
  shape: Shape,
  context: int,
  opts,
  copy_bps: float | None,
  memory_budget: int | None,
) -> CaseResult:
  result = CaseResult(
    name=name,
    kind="decode" if batch.is_decode else "mixed",
    batch=int(batch.num_seqs[0]),
    context=context,
    num_tokens=int(batch.q.shape[0]),
    kv_bytes=batch.kv_bytes,
  )
  sm_scale = shape.head_dim**-0.5
  interpret = opts.smoke
  fns = {}
  for tile in opts.tiles:
    label = "ours" if tile is None else "ours[" + ":".join(map(str, tile)) + "]"
    tile_kw = (  # a tile may give the first parameters only (block_kv:num_warps:num_stages)
      {}
      if tile is None
      else dict(
        zip(("block_kv", "num_warps", "num_stages", "num_kv_splits", "block_q"), tile, strict=False)
      )
    )
    fns[label] = functools.partial(
      ragged_paged_attention, sm_scale=sm_scale, interpret=interpret, **tile_kw
    )
  if batch.is_decode and shape.pages_dtype == jnp.dtype(shape.dtype):  # it takes no 8-bit pages
    pages_per_seq = batch.block_tables[0].shape[1]
    for k_splits, ppcb in opts.bundled_configs:
      if pages_per_seq % k_splits or (pages_per_seq // k_splits) % min(
        ppcb, pages_per_seq // k_splits
      ):
        result.notes.append(
          f"bundled {k_splits}x{ppcb}: pages_per_seq {pages_per_seq} not divisible"
        )
        continue
      label = "bundled" if len(opts.bundled_configs) == 1 else f"bundled[{k_splits}x{ppcb}]"
      fns[label] = bundled_paged_attention(shape, sm_scale, k_splits, ppcb, interpret)

  num_check = min(int(batch.num_seqs[0]), opts.check_seqs)
  check_args = sub_batch_args(batch, num_check)
  expected = jax.jit(functools.partial(ragged_paged_attention_reference, sm_scale=sm_scale))(
    *check_args
  )
  for label, fn in list(fns.items()):
    try:  # the full batch (the timed configuration), checked on its first sequences
      actual = fn(*batch.args())[: expected.shape[0]]
      result.max_abs_error[label] = max_abs_error(actual, expected)
    except Exception as exc:  # keep the table when one kernel fails
      result.notes.append(f"{label} failed: {type(exc).__name__}: {exc}"[:500])
      del fns[label]
  ref_bytes = reference_bytes(batch.q.shape[0], batch)
  if memory_budget is None or ref_bytes <= memory_budget:
    fns["xla"] = functools.partial(ragged_paged_attention_reference, sm_scale=sm_scale)
  else:
    result.notes.append(f"xla reference not timed: needs ~{ref_bytes / 2**30:.1f} GiB")

  if opts.smoke:  # exercise the timing path once; interpret-mode timings mean nothing
    fns = {label: fn for label, fn in fns.items() if label == "ours" and batch.is_decode}
  for label, fn in fns.items():
    try:
      seconds = time_per_call(fn, batch, inner=opts.inner, reps=opts.reps, harness=opts.harness)
    except Exception as exc:
      result.notes.append(f"{label} timing failed: {type(exc).__name__}: {exc}"[:500])
      continue
    result.time_us[label] = seconds * 1e6
    result.kv_gbps[label] = batch.kv_bytes / seconds / 1e9
    result.tflops[label] = attention_flops(batch) / seconds / 1e12
    if copy_bps:
      result.pct_of_copy[label] = 100.0 * batch.kv_bytes / seconds / copy_bps
    if opts.device_time:
      try:
        result.device_us[label] = device_us_per_call(fn, batch, inner=opts.inner)
      except Exception as exc:
        result.notes.append(f"{label} trace failed: {type(exc).__name__}: {exc}"[:500])
  ours = min((t for k, t in result.time_us.items() if k.startswith("ours")), default=None)
  bundled = min((t for k, t in result.time_us.items() if k.startswith("bundled")), default=None)
  if ours and bundled:
    result.speedup_vs_bundled = bundled / ours
  if ours and "xla" in result.time_us:
    result.speedup_vs_xla = result.time_us["xla"] / ours
  return result


def parse_tiles(text: str) -> list[tuple[int, ...] | None]:
  """'default,64:4:3,64:4:3:4' -> [None, (64, 4, 3), (64, 4, 3, 4)]:
  block_kv:num_warps:num_stages[:num_kv_splits[:block_q]]."""
  tiles = []
  for item in text.split(","):
    tiles.append(None if item == "default" else tuple(int(v) for v in item.split(":")))
  return tiles


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--smoke",
    action="store_true",
    help="tiny sizes in interpret mode (any backend); timings meaningless",
  )
  parser.add_argument("--out", default="out/bench_kernels.json")
  parser.add_argument("--batches", default="8,64,256")
  parser.add_argument("--contexts", default="512,2048,8192")
  parser.add_argument("--no-mixed", action="store_true", help="skip the prefill+decode batch")
  parser.add_argument(
    "--tiles",
    default="default",
    help="our tilings: 'default' or "
    "block_kv:num_warps:num_stages[:num_kv_splits[:block_q]], comma list",
  )
  parser.add_argument(
    "--head-dim",
    type=int,
    default=128,
    help="head_dim (32 q heads, 8 kv heads; 64 is Llama-3.2-1B's)",
  )
  parser.add_argument(
    "--kv-heads",
    type=int,
    default=8,
    help="KV heads beside the 32 q heads (4 is Qwen3-30B-A3B's: 8 q heads a KV head)",
  )
  parser.add_argument(
    "--prefill",
    default="",
    help="prefill cases NUMxLEN (NUM prompts of LEN tokens from an empty "
    "cache), comma list, e.g. 16x512: the engine's prefill step",
  )
  parser.add_argument(
    "--bundled-configs",
    default="16x8",
    help="bundled op k_splits x pages_per_compute_block, comma list",
  )
  parser.add_argument(
    "--kv-dtype",
    default="",
    choices=("", "float8_e4m3fn", "int8"),
    help="the pages' dtype (default: q's, bfloat16): 8-bit pages hold the random K / V at scale 1 "
    "(kv_quant.py); JAX's bundled kernel is then left out (it reads no 8-bit pages)",
  )
  parser.add_argument("--inner", type=int, default=20, help="calls per timed jitted program")
  parser.add_argument(
    "--harness",
    choices=("loop", "unrolled", "marginal"),
    default="loop",
    help="calls in a fori_loop (default), unrolled with nothing else timed, "
    "or marginal: (time of 3n unrolled calls - time of n) / 2n",
  )
  parser.add_argument(
    "--device-time",
    action="store_true",
    help="also trace each timed program and report its kernels' device time "
    "per call (the 'dev us' column)",
  )
  parser.add_argument("--reps", type=int, default=7, help="timed loops (median taken)")
  parser.add_argument(
    "--check-seqs", type=int, default=16, help="sequences checked against the reference per case"
  )
  parser.add_argument("--copy-bytes", type=int, default=2 * 2**30)
  opts = parser.parse_args(argv)
  opts.tiles = parse_tiles(opts.tiles)
  opts.bundled_configs = [
    tuple(int(v) for v in c.split("x")) for c in opts.bundled_configs.split(",")
  ]
  if opts.smoke:
    opts.batches, opts.contexts, opts.inner, opts.reps = "2", "32", 1, 1
    opts.copy_bytes, opts.bundled_configs = 2**20, [(1, 2)]
  return opts


def memory_limit() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("bytes_limit")


def case_specs(opts, shape: Shape) -> list[tuple[str, int, list[int], list[int]]]:
  """(name, context, q_lens, seq_lens) of every case."""
  specs = []
  for batch in (int(b) for b in opts.batches.split(",")):
    for context in (int(c) for c in opts.contexts.split(",")):
      specs.append((f"decode_b{batch}_ctx{context}", context, [1] * batch, [context] * batch))
  if not opts.no_mixed:
    if opts.smoke:
      chunk, context, num_decode, num_prefill = 8, 32, 2, 1
    else:
      chunk, context, num_decode, num_prefill = 256, 2048, 62, 2
    specs.append(
      (
        f"mixed_{num_prefill}x{chunk}prefill_{num_decode}decode_ctx{context}",
        context,
        [chunk] * num_prefill + [1] * num_decode,
        [context] * (num_prefill + num_decode),
      )
    )
  for item in filter(None, opts.prefill.split(",")):
    num, length = (int(v) for v in item.split("x"))
    specs.append((f"prefill_{num}x{length}", length, [length] * num, [length] * num))
  return specs


def main(argv: list[str] | None = None) -> int:
  opts = parse_args(argv)
  shape = (
    Shape(num_q_heads=8, num_kv_heads=2, head_dim=64)
    if opts.smoke
    else Shape(head_dim=opts.head_dim, num_kv_heads=opts.kv_heads)
  )
  shape = dataclasses.replace(shape, kv_dtype=opts.kv_dtype)
  device = jax.devices()[0]
  print(
    f"device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}, shape {shape}"
  )
  limit = memory_limit()
  copy_bps = read_bps = None
  try:
    copy_bps = copy_bandwidth(opts.copy_bytes, inner=opts.inner, reps=opts.reps)
    read_bps = read_bandwidth(opts.copy_bytes, inner=opts.inner, reps=opts.reps)
  except Exception:
    traceback.print_exc()
  results = []
  kv_bytes_per_token = shape.num_kv_heads * shape.head_dim * 2 * shape.pages_dtype.itemsize
  for name, context, q_lens, seq_lens in case_specs(opts, shape):
    result = CaseResult(
      name=name, kind="", batch=len(q_lens), context=context, num_tokens=sum(q_lens)
    )
    try:
      case_bytes = sum(seq_lens) * kv_bytes_per_token
      num_rotations = max(1, min(8, math.ceil(L2_ROTATION_BYTES / case_bytes)))
      if limit is not None and case_bytes * num_rotations > limit // 2:
        result.error = f"skipped: KV pool {case_bytes / 2**30:.1f} GiB does not fit"
      else:
        batch = make_batch(
          name, shape, q_lens, seq_lens, seed=len(results), num_rotations=num_rotations
        )
        budget = None if limit is None else int(limit * REFERENCE_MEMORY_FRACTION)
        result = run_case(
          name,
          batch,
          shape=shape,
          context=context,
          opts=opts,
          copy_bps=copy_bps,
          memory_budget=budget,
        )
        del batch
    except Exception as exc:
      traceback.print_exc()
      result.error = f"{type(exc).__name__}: {exc}"[:1000]
    results.append(result)
    print_table([result], None)
    sys.stdout.flush()
  print_table(results, copy_bps)
  if read_bps:
    print(
      f"HBM read ceiling: {read_bps / 1e9:.0f} GB/s (a reduction that only reads; "
      f"{100 * read_bps / copy_bps:.1f}% of the copy ceiling)"
    )
  out = Path(opts.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(
    json.dumps(
      {
        "device": device.device_kind,
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "smoke": opts.smoke,
        "shape": asdict(shape),
        "copy_gbps": None if copy_bps is None else copy_bps / 1e9,
        "read_gbps": None if read_bps is None else read_bps / 1e9,
        "cases": [asdict(r) for r in results],
      },
      indent=2,
    )
  )
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
