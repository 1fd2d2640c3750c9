"""The projections of a decode step, one shape at a time: the Pallas weight-only kernel
(pallas_kernels/quantized_matmul) against XLA's GEMMs (bfloat16, fp8 W8A8, int8 W8A16) on the
same rows. Each timed program runs the projection on LAYERS distinct weight copies back to back
(so the weights stream from HBM, not L2), and INNER programs are dispatched back to back before
one sync, so the host's dispatch and sync overlap the GPU's work instead of adding to it; a row
gives microseconds per projection and the weight bytes read per second. Two diagnostic rows:
the kernel on bfloat16 weights (no conversion; twice the bytes) and with Tiling.fp8_bits (the
conversion by bit operations). fp8 weights are also timed with quantize_x (the W8A8 kernel: x
quantized in registers, the dot on fp8 operands). --sweep also times a few tilings of the kernel
per shape, for quantize_x too. --ceiling adds what the device gives for the same weight bytes
read by one kernel per projection: XLA's row reduction of the 8-bit weight (a pure stream, no
dot) and cuBLAS's bfloat16 GEMM on a weight of half the rows (the same bytes). --trace adds
each row's device time per projection from a profiler trace (the kernels' own time, the split-K
epilogue included, launch gaps excluded: what a projection costs inside a step's program).
--sweep xt times the quantize_x kernel over block_n, splits and stages, --sweep xp with
persistent programs (Tiling.programs: 1-4 per H100 SM, the default splits and half). Prints a table;
--out writes JSON.

    python -m investigations.bench_quantized_matmul --rows 8 --sweep
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

from investigations.device_trace import capture_trace, summarize_trace, total_device_us
from jaxserve.bench.timing import seconds_per_call
from jaxserve.quantization.matmul import quantized_matmul as xla_quantized_matmul
from jaxserve.quantization.scheme import SCHEMES
from pallas_kernels.quantized_matmul.gpu import (
  X_GROUP,
  Tiling,
  _quantized_matmul,
  default_tiling,
  quantized_matmul,
)
from pallas_kernels.quantized_matmul.reference import (
  quantized_matmul_fp8x_reference,
  quantized_matmul_reference,
)

SHAPES = {  # Llama-3.1-8B's merged projections, [N, K]
  "qkv_proj": (6144, 4096),
  "o_proj": (4096, 4096),
  "gate_up_proj": (28672, 4096),
  "down_proj": (4096, 14336),
}
LAYERS = 16
INNER = 10  # programs dispatched back to back per timing
NO_TRITON_GEMM = {"xla_gpu_enable_triton_gemm": False}  # gpu_gemm: cublas, the engine's default


TRACE_REPS = 3


def _timed_us(fn, x, weights, options=None, *, trace: bool = False) -> tuple[float, float | None]:
  """Microseconds per projection of fn(x, *weight) over the LAYERS weight copies: wall clock,
  and with --trace the kernels' device time (else None)."""

  def run(x, weights):
    return [fn(x, *w) for w in weights]

  compiled = jax.jit(run).lower(x, weights).compile(options)
  seconds = seconds_per_call(compiled, x, weights, inner=INNER, reps=5)
  device_us = None
  if trace:
    logdir = capture_trace(lambda: compiled(x, weights), reps=TRACE_REPS)
    device_us = total_device_us(summarize_trace(logdir)) / (TRACE_REPS * len(weights))
  return 1e6 * seconds / len(weights), device_us


def _weights(rng, n: int, k: int, dtype) -> list[tuple]:
  base = rng.standard_normal((n, k), dtype=np.float32)
  scale = jnp.asarray(rng.random(n, dtype=np.float32) * 0.01 + 1e-3)
  if dtype == jnp.bfloat16:
    w = jnp.asarray(base.T, jnp.bfloat16)  # [K, N], flax's layout
    return [(jnp.array(w, copy=True),) for _ in range(LAYERS)]
  w = jnp.asarray(np.clip(base * 40, -127, 127)).astype(dtype)  # [N, K]
  return [(jnp.array(w, copy=True), scale) for _ in range(LAYERS)]


DTYPES = {jnp.float8_e4m3fn: ("fp8", "fp8_w8a16"), jnp.int8: ("int8", "int8_w8a8")}


def bench_shape(
  name: str,
  rows: int,
  sweep: str | None,
  xla: bool,
  dtypes: list[str],
  ceiling: bool = False,
  trace: bool = False,
) -> list[dict]:
  """Rows of microseconds per projection: XLA's GEMMs (xla), the kernel's default tiling per
  8-bit dtype in dtypes, with sweep a grid of tilings, with ceiling the same bytes streamed."""
  n, k = SHAPES[name]
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((rows, k), dtype=np.float32), jnp.bfloat16)
  results = []
  _timed = functools.partial(_timed_us, trace=trace)

  def add(kind: str, timed: tuple[float, float | None], weight_bytes: int, **extra) -> None:
    us, device_us = timed
    row = dict(shape=name, n=n, k=k, rows=rows, kind=kind, us=round(us, 2))
    row["tb_per_s"] = round(weight_bytes / us / 1e6, 3)
    if device_us is not None:
      row["device_us"] = round(device_us, 2)
      row["device_tb_per_s"] = round(weight_bytes / device_us / 1e6, 3)
    results.append(dict(row, **extra))

  if xla:
    bf16 = _weights(rng, n, k, jnp.bfloat16)
    add("xla bfloat16", _timed(lambda x, w: x @ w, x, bf16, NO_TRITON_GEMM), 2 * n * k)
    bf16 = [(w.T, jnp.ones((n,), jnp.float32)) for (w,) in bf16]  # [N, K] for the kernel
    tiling = default_tiling(n, k)
    fn = lambda x, w, s: _quantized_matmul(
      x, w, s, tiling=tiling, quantize_x=False, interpret=False
    )
    add("pallas bf16 (no convert)", _timed(fn, x, bf16), 2 * n * k)
    del bf16
  if ceiling:
    streamed = _weights(rng, n, k, jnp.int8)
    row_sum = lambda x, w, s: jnp.sum(w.astype(jnp.int32), axis=1)  # [N]: every byte read once
    add("ceiling xla row-sum int8", _timed(row_sum, x, streamed), n * k)
    del streamed
    half = [(w[:, : n // 2],) for (w,) in _weights(rng, n, k, jnp.bfloat16)]  # [K, N/2] bf16
    add("ceiling cublas bf16 N/2", _timed(lambda x, w: x @ w, x, half, NO_TRITON_GEMM), n * k)
    del half
  for dtype, schemes in DTYPES.items():
    if jnp.dtype(dtype).name not in dtypes:
      continue
    weights = _weights(rng, n, k, dtype)
    for scheme in schemes if xla else ():
      fn = lambda x, w, s, scheme=SCHEMES[scheme]: xla_quantized_matmul(x, w, s, scheme)
      add(f"xla {scheme}", _timed(fn, x, weights, NO_TRITON_GEMM), n * k)
    runs = [(default_tiling(n, k), False)]
    if dtype == jnp.float8_e4m3fn:
      runs.append((dataclasses.replace(runs[0][0], fp8_bits=True), False))
      runs.append((default_tiling(n, k, quantize_x=True), True))
    defaults = len(runs)
    if sweep == "all":
      auto = [
        _with_splits(Tiling(bn, bk, 0, warps, 3), n, k)
        for bn in (16, 32, 64)
        for bk in (128, 256, 512)
        for warps in (2, 4)
      ]
      more = [dataclasses.replace(t, num_splits=2 * t.num_splits) for t in auto]
      runs += [(t, False) for t in auto + [t for t in more if k % (t.block_k * t.num_splits) == 0]]
    if sweep == "xt" and dtype == jnp.float8_e4m3fn:
      base = default_tiling(n, k, quantize_x=True)
      grid = [
        Tiling(bn, X_GROUP, splits, 4, 3)
        for bn in (64, 128)
        for splits in (1, 2, 4, 8)
        if n % bn == 0 and k % (X_GROUP * splits) == 0
      ]
      deeper = [dataclasses.replace(base, num_stages=stages) for stages in (4, 5)]
      runs += [(t, True) for t in grid + deeper]
    elif sweep == "xp" and dtype == jnp.float8_e4m3fn:  # persistent programs (tiling.py)
      base = default_tiling(n, k, quantize_x=True)
      persistent = [
        dataclasses.replace(base, num_splits=splits, programs=programs, num_stages=stages)
        for splits in sorted({base.num_splits, max(1, base.num_splits // 2)})
        for programs in (132, 264, 396, 528)
        for stages in (3, 4)
        if k % (X_GROUP * splits) == 0
      ]
      runs += [(t, True) for t in persistent]
    elif sweep and dtype == jnp.float8_e4m3fn:
      x_auto = [_with_splits(Tiling(bn, 128, 0, 4, 3), n, k) for bn in (32, 64, 128)]
      x_more = [dataclasses.replace(t, num_splits=2 * t.num_splits) for t in x_auto]
      runs += [(t, True) for t in x_auto + [t for t in x_more if k % (128 * t.num_splits) == 0]]
    for i, (tiling, quantize_x) in enumerate(runs):
      fn = lambda x, w, s, t=tiling, q=quantize_x: quantized_matmul(x, w, s, tiling=t, quantize_x=q)
      label = f"pallas {jnp.dtype(dtype).name}" + (" bits" if tiling.fp8_bits else "")
      label += " x-fp8" if quantize_x else ""
      label += "" if i < defaults else " sweep"
      tiles = list(tiling.__dict__.values())
      reference = quantized_matmul_fp8x_reference if quantize_x else quantized_matmul_reference
      try:
        error = _relative_error(fn(x, *weights[0]), reference(x, *weights[0]))
        add(label, _timed(fn, x, weights), n * k, tiling=tiles, error=error)
      except jax.errors.JaxRuntimeError as err:  # a tiling past the shared memory, say
        print(f"{name} {tiles}: {str(err).splitlines()[0][:100]}")
    del weights
  return results


def _relative_error(out: jax.Array, reference: jax.Array) -> float:
  """max |out - reference| / max |reference|: a wrong tiling shows, rounding does not."""
  out, reference = np.asarray(out, np.float32), np.asarray(reference, np.float32)
  return float(np.max(np.abs(out - reference)) / np.max(np.abs(reference)))


def _with_splits(tiling: Tiling, n: int, k: int) -> Tiling:
  auto = default_tiling(n, k, tiling.block_n, tiling.block_k)
  if tiling.block_k == 128 and auto.block_k != 128:  # a wide weight halves block_k
    auto = dataclasses.replace(default_tiling(n, k, tiling.block_n, 256), block_k=128)
  return dataclasses.replace(
    tiling, block_n=auto.block_n, block_k=auto.block_k, num_splits=auto.num_splits
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, nargs="+", default=[8])
  parser.add_argument(
    "--sweep",
    nargs="?",
    const="all",
    choices=["all", "x", "xt", "xp"],
    help="time a grid of tilings as well (x: the quantize_x kernel's only; xt: its wider grid; "
    "xp: it with persistent programs, Tiling.programs)",
  )
  parser.add_argument("--no-xla", action="store_true", help="the Pallas kernel's rows only")
  parser.add_argument(
    "--ceiling", action="store_true", help="the same bytes read by a row reduction and cuBLAS"
  )
  parser.add_argument(
    "--dtypes", nargs="+", default=["float8_e4m3fn", "int8"], help="weight dtypes to time"
  )
  parser.add_argument("--trace", action="store_true", help="also each row's traced device time")
  parser.add_argument("--out")
  args = parser.parse_args()
  results = []
  for rows in args.rows:
    for name in SHAPES:
      for r in bench_shape(
        name, rows, args.sweep, not args.no_xla, args.dtypes, args.ceiling, args.trace
      ):
        results.append(r)
        print(
          f"{r['shape']:>13} M={rows:<3} {r['kind']:<22} {r['us']:8.2f} us "
          f"{r['tb_per_s']:6.3f} TB/s device {r.get('device_us', '-')} us "
          f"{r.get('device_tb_per_s', '-')} TB/s {r.get('tiling', '')} {r.get('error', '')}",
          flush=True,
        )
  if args.out:
    with open(args.out, "w") as f:
      json.dump(
        {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "results": results},
        f,
        indent=1,
      )


if __name__ == "__main__":
  main()
