"""The experts of one mixture-of-experts layer at decode batch sizes: models/grouped_matmul.py
(the assignments sorted by expert, then grouped matmuls: jax.lax.ragged_dot or the Pallas
kernel of pallas_kernels/grouped_matmul) against two dense references, with the bytes of expert
weights each reads per second.

Per batch of T tokens, each routed to `top_k` distinct random experts (a fresh routing per
layer), the rows time, per layer:

  ragged_dot        one grouped matmul, the gate projection [E, H, I], on rows already sorted
                    (XLA's kernel alone)
  pallas            the same product on the same sorted rows through the Pallas kernel (default
                    tiling; interpret mode off GPUs)
  expert_ffn        the whole routed SwiGLU FFN as the model runs it (sort, gather, the grouped
                    matmuls grouped_matmul dispatches on this platform, kernel "auto": on a
                    GPU the Pallas kernel with gate/up fused, else ragged_dot; inverse
                    permutation, weighted sum)
  expert_ffn_ragged the same FFN through ragged_dot (kernel "ragged_dot")
  expert_ffn_routed with --fused: the FFN through the routing kernel and the Pallas products that
                    gather their rows by token and scatter them to their assignments, weighted
                    (kernel "pallas": 3 kernels and the sum over k; "auto" on a GPU)
  expert_ffn_sorted with --fused: the FFN through XLA's sort, the row copy, the Pallas products
                    on sorted rows and the inverse permutation (kernel "pallas_sorted": the path
                    "auto" took before the routing kernel), for old against new side by side
  dense_all         every token through every expert (einsum over [E, H, I]), then the routing
                    weights: reads each expert once, E / top_k times the FLOPs
  per_token_gather  each assignment's expert weights gathered ([T, K, H, I]) and applied token by
                    token: what a loop over the tokens' experts would read (skipped above
                    --gather-limit-gib of gathered weights)

--fp8 channel|block runs the same on fp8 experts (models/fp8_experts.py: the bf16 draws quantized
per channel or per 128 x 128 block; W8A8, the Pallas fp8 kernel of
pallas_kernels/grouped_matmul/fp8.py on GPUs): ragged_dot, pallas, expert_ffn and
expert_ffn_ragged take the fp8 experts, and their "GB/s" counts the e4m3 bytes (and scales) the
batch touches, so the columns compare with a bf16 run's as bytes per second (fp8 reads half the
bytes: at the same GB/s it takes half the time). dense_all and per_token_gather stay the bf16
references, on the fp8 weights dequantized; the errors against them include the activations'
quantization.

--tilings "BM,BN,BK,S,W,P;..." also times the Pallas kernel with each given tiling (block_m,
block_n, block_k, num_splits, num_warps, num_stages), on the gate product and on the fused
gate/up SwiGLU, into the row's "pallas_tilings" (a tiling that does not divide the shape, or does
not compile, records its error). --ffn-tilings "GATE_UP/DOWN;..." times the routed FFN (as
expert_ffn_routed) with each pair of tilings for its two products, into "routed_tilings", on
bfloat16 or (--fp8) fp8 experts. The programs are investigations/grouped_matmul_programs.py's.

Each timed program runs its layer on LAYERS distinct weight copies back to back (so weights come
from HBM, not L2) and INNER programs are dispatched before one sync. "GB/s" is the weight bytes of
the experts the batch touches (every distinct routed expert: three [H, I] matrices, one for
ragged_dot and pallas) per second, beside the device's copy bandwidth (read + write of a large
array). A column whose program fails (XLA's dense ragged_dot can run out of memory at prefill
sizes) records its error and the others still run. The timed programs' own first-layer outputs
are checked: expert_ffn's and expert_ffn_ragged's against dense_all's, and pallas's against
ragged_dot's. Programs are built once per function (and tiling) and reused across batches and
calls, so a shape compiles once per process. Prints a table; --out writes JSON; --smoke runs tiny
shapes (CPU, the kernel in interpret mode).

    python -m investigations.bench_grouped_matmul --batches 1,64,256
    python -m investigations.bench_grouped_matmul --batches 1,8,64,256,512 --fused
    python -m investigations.bench_grouped_matmul --batches 1 \
      --ffn-tilings "16,64,128,4,4,4/16,64,128,2,4,4;16,32,128,2,4,3/16,64,64,1,4,3"
    python -m investigations.bench_grouped_matmul --batches 1,8192 --tilings "16,32,64,8,4,4"
    python -m investigations.bench_grouped_matmul --batches 1,64,256 --fp8 block
    python -m investigations.bench_grouped_matmul --batches 1,8 --fp8 block \
      --ffn-tilings "16,128,128,1,4,3/16,64,128,1,4,4"
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np

from investigations.grouped_matmul_programs import (
  dense_all,
  ffn_program,
  ffn_ragged,
  ffn_routed,
  ffn_sorted,
  gate_program,
  parse_ffn_tilings,
  parse_tilings,
  per_token_gather,
  routed_program,
  sorted_rows,
  tiled_programs,
  tiling_label,
)
from investigations.kernel_timing import copy_bandwidth
from jaxserve.bench.timing import seconds_per_call
from jaxserve.models.fp8_experts import Fp8Weights, quantize_experts
from jaxserve.models.grouped_matmul import expert_ffn

KINDS = (
  "ragged_dot",
  "pallas",
  "expert_ffn",
  "expert_ffn_ragged",
  "dense_all",
  "per_token_gather",
)
FUSED_KINDS = ("expert_ffn_routed", "expert_ffn_sorted")  # with --fused


@dataclass(frozen=True)
class Shape:
  """One layer's experts (Qwen3-30B-A3B's by default)."""

  num_experts: int = 128
  hidden: int = 2048
  inter: int = 768
  top_k: int = 8
  fp8: str = "none"  # "channel" / "block": fp8 experts (--fp8)

  @property
  def expert_bytes(self) -> int:
    """One expert's three matrices: bfloat16, or e4m3 with their float32 scales."""
    matrix = self.hidden * self.inter
    if self.fp8 == "none":
      return 3 * matrix * 2
    scales = (2 * self.inter + self.hidden) if self.fp8 == "channel" else 3 * matrix // 128**2
    return 3 * matrix + 4 * scales


SMOKE = Shape(num_experts=8, hidden=64, inter=32, top_k=2)  # K, N multiples of 16: the kernel
SMOKE_FP8 = Shape(num_experts=8, hidden=256, inter=128, top_k=2)  # whole 128-blocks


def _routing(rng: np.random.Generator, shape: Shape, layers: int, tokens: int):
  """(expert_ids int32[L, T, K] distinct per token, weights float32[L, T, K] summing to one)."""
  scores = rng.random((layers, tokens, shape.num_experts))
  ids = np.argsort(scores, axis=-1)[..., : shape.top_k].astype(np.int32)
  weights = rng.random((layers, tokens, shape.top_k)).astype(np.float32)
  return jnp.asarray(ids), jnp.asarray(weights / weights.sum(-1, keepdims=True))


@functools.cache
def _experts(shape: Shape, layers: int) -> list[tuple[jax.Array, ...]]:
  """`layers` copies of a layer's experts, drawn on the device (host draws of 4.8 G normals took
  longer than the timings) and shared by every batch."""
  e, h, i = shape.num_experts, shape.hidden, shape.inter
  keys = iter(jax.random.split(jax.random.PRNGKey(0), 3 * layers))

  def draw(*dims: int) -> jax.Array:
    return _normal(next(keys), dims)

  return [(draw(e, h, i), draw(e, h, i), draw(e, i, h)) for _ in range(layers)]


@functools.partial(jax.jit, static_argnums=1)
def _normal(key: jax.Array, dims: tuple[int, ...]) -> jax.Array:
  return (0.02 * jax.random.normal(key, dims, jnp.float32)).astype(jnp.bfloat16)


@functools.partial(jax.jit, static_argnames=("blocks",))
def _fp8(experts: tuple[jax.Array, ...], blocks: bool) -> tuple[tuple, tuple]:
  """A layer's bf16 experts -> (their Fp8Weights, the same dequantized to bf16 [E, in, out])."""
  quantized = tuple(quantize_experts(w, blocks) for w in experts)

  def dequantized(q: Fp8Weights) -> jax.Array:
    s = (
      q.scale[:, :, None]
      if q.scale.ndim == 2
      else jnp.repeat(jnp.repeat(q.scale, 128, axis=1), 128, axis=2)
    )
    return jnp.swapaxes(q.weight.astype(jnp.float32) * s, 1, 2).astype(jnp.bfloat16)

  return quantized, tuple(dequantized(q) for q in quantized)


def _time_us(program, *args, layers: int, inner: int, reps: int) -> float:
  return 1e6 * seconds_per_call(program, *args, inner=inner, reps=reps) / layers


def bench_batch(shape: Shape, tokens: int, args: argparse.Namespace, copy_gbps: float) -> dict:
  rng = np.random.default_rng(tokens)
  experts = references = _experts(shape, args.layers)
  if shape.fp8 != "none":  # the routed FFN on fp8 experts, the dense references on their twins
    pairs = [_fp8(layer, shape.fp8 == "block") for layer in experts]
    experts, references = [p[0] for p in pairs], [p[1] for p in pairs]
  ids, weights = _routing(rng, shape, args.layers, tokens)
  x = jnp.asarray(rng.standard_normal((tokens, shape.hidden), dtype=np.float32), jnp.bfloat16)
  touched = float(np.mean([len(np.unique(np.asarray(layer))) for layer in ids]))
  timing = dict(layers=args.layers, inner=args.inner, reps=args.reps)
  row: dict = {"tokens": tokens, "experts_touched": touched}
  first_layer: dict[str, np.ndarray] = {}  # each timed column's first-layer output

  def add(name: str, weight_bytes: float, program, *program_args, into: dict = row) -> None:
    if args.columns and into is row and name not in args.columns and name != "dense_all":
      return
    try:
      us = _time_us(program, *program_args, **timing)
    except Exception as e:  # noqa: BLE001 - e.g. XLA's dense ragged_dot out of memory
      print(f"batch {tokens} {name}: {type(e).__name__}: {e}", file=sys.stderr)
      into[name] = {"error": f"{type(e).__name__}: {str(e)[:1000]}"}
      return
    into[name] = {"us": us, "gb_per_s": weight_bytes / us / 1e3}
    print(f"batch {tokens} {name}: {us:.1f} us, {weight_bytes / us / 1e3:.0f} GB/s", flush=True)
    if into is row:
      first_layer[name] = np.asarray(program(*program_args)[0], np.float32)

  # the kernels alone: their rows sorted beforehand
  rows, sizes = sorted_rows(x, ids, shape.num_experts)
  for kind, kernel in (("ragged_dot", "ragged_dot"), ("pallas", "pallas")):
    add(kind, touched * shape.expert_bytes / 3, gate_program(kernel), rows, sizes, experts)
  for tiling in getattr(args, "tilings", None) or []:
    swept = row.setdefault("pallas_tilings", {})
    for name, (program, matrices) in tiled_programs(tiling).items():
      label = f"{name} {tiling_label(tiling)}"
      weight_bytes = touched * shape.expert_bytes / 3 * matrices
      add(label, weight_bytes, program, rows, sizes, experts, into=swept)
  ffn_bytes = touched * shape.expert_bytes
  add("expert_ffn", ffn_bytes, ffn_program(expert_ffn), x, ids, weights, experts)
  add("expert_ffn_ragged", ffn_bytes, ffn_program(ffn_ragged), x, ids, weights, experts)
  if getattr(args, "fused", False):
    add("expert_ffn_routed", ffn_bytes, ffn_program(ffn_routed), x, ids, weights, experts)
    add("expert_ffn_sorted", ffn_bytes, ffn_program(ffn_sorted), x, ids, weights, experts)
  for tilings in getattr(args, "ffn_tilings", None) or []:
    swept = row.setdefault("routed_tilings", {})
    label = " / ".join(tiling_label(t) for t in tilings)
    add(label, ffn_bytes, routed_program(tilings), x, ids, weights, experts, into=swept)
  bf16_bytes = 3 * shape.hidden * shape.inter * 2  # the references' experts are bf16
  dense_bytes = shape.num_experts * bf16_bytes
  add("dense_all", dense_bytes, ffn_program(dense_all), x, ids, weights, references)
  gathered = tokens * shape.top_k * bf16_bytes
  if gathered <= args.gather_limit_gib * 2**30:
    program = ffn_program(per_token_gather)
    add("per_token_gather", gathered, program, x, ids, weights, references)
  row.update(_errors(first_layer, live=int(np.sum(np.asarray(sizes[0])))))
  row["copy_gb_per_s"] = copy_gbps
  return row


def _max_error(got: np.ndarray | None, want: np.ndarray | None) -> float | None:
  """None when a column failed (its timing entry holds the error)."""
  return None if got is None or want is None else float(np.max(np.abs(got - want)))


def _errors(first_layer: dict[str, np.ndarray], live: int) -> dict:
  """The first layer's FFNs against dense_all, and the kernel's gate product against ragged_dot's
  on the groups' `live` rows (past them ragged_dot's rows are unspecified)."""
  want = first_layer.get("dense_all")
  gates = {k: first_layer[k][:live] for k in ("pallas", "ragged_dot") if k in first_layer}
  return {
    "max_abs_error_vs_dense": _max_error(first_layer.get("expert_ffn"), want),
    "ragged_max_abs_error_vs_dense": _max_error(first_layer.get("expert_ffn_ragged"), want),
    **{
      f"{kind}_max_abs_error_vs_dense": _max_error(first_layer[kind], want)
      for kind in FUSED_KINDS
      if kind in first_layer
    },
    "pallas_max_abs_error_vs_ragged": _max_error(gates.get("pallas"), gates.get("ragged_dot")),
  }


def _cell(entry: dict | None) -> str:
  if entry is None:
    return f"{'-':>28}"
  if "error" in entry:
    return f"{'error':>28}"
  return f"{entry['us']:>16.1f} / {entry['gb_per_s']:>8.0f}"


def _table(rows: list[dict]) -> str:
  kinds = KINDS + tuple(k for k in FUSED_KINDS if any(k in row for row in rows))
  header = f"{'batch':>6}{'experts':>9}" + "".join(f"{k + ' us / GB/s':>28}" for k in kinds)
  lines = [header]
  for row in rows:
    cells = "".join(_cell(row.get(k)) for k in kinds)
    lines.append(f"{row['tokens']:>6}{row['experts_touched']:>9.1f}{cells}")
  return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batches", default="1,64,256", help="decode batch sizes (tokens)")
  parser.add_argument("--layers", type=int, default=8, help="distinct weight copies per program")
  parser.add_argument("--inner", type=int, default=10, help="programs per sync")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--gather-limit-gib", type=float, default=16.0)
  parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU)")
  parser.add_argument(
    "--tilings", type=parse_tilings, help='Pallas tilings to sweep: "BM,BN,BK,S,W,P;..."'
  )
  parser.add_argument(
    "--fp8",
    choices=("none", "channel", "block"),
    default="none",
    help="fp8 experts: per-channel or 128 x 128 block scales (W8A8)",
  )
  parser.add_argument(
    "--fused",
    action="store_true",
    help="also time the FFN through the routing kernel and through the sorted rows (Pallas)",
  )
  parser.add_argument(
    "--ffn-tilings",
    type=parse_ffn_tilings,
    help='routed FFN tilings to sweep: "GATE_UP/DOWN;..." each "BM,BN,BK,S,W,P" (one BM)',
  )
  parser.add_argument(
    "--columns",
    type=lambda text: set(text.split(",")),
    help="time only these columns (comma-separated; dense_all always, the reference)",
  )
  parser.add_argument("--out", help="write the rows as JSON to this file")
  return parser.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  shape = dataclasses.replace(
    (SMOKE_FP8 if args.fp8 != "none" else SMOKE) if args.smoke else Shape(), fp8=args.fp8
  )
  copy_bytes = 2**20 if args.smoke else 4 * 2**30
  copy_gbps = copy_bandwidth(copy_bytes, inner=args.inner, reps=args.reps) / 1e9
  rows = [bench_batch(shape, int(t), args, copy_gbps) for t in args.batches.split(",")]
  print(f"{jax.devices()[0].device_kind}: copy bandwidth {copy_gbps:.0f} GB/s, {asdict(shape)}")
  print(_table(rows))
  for row in rows:
    for label, entry in row.get("pallas_tilings", {}).items():
      cell = entry.get("error", "")[:80] or f"{entry['us']:.1f} us {entry['gb_per_s']:.0f} GB/s"
      print(f"batch {row['tokens']:>6} pallas {label}: {cell}")
    for label, entry in row.get("routed_tilings", {}).items():
      cell = entry.get("error", "")[:80] or f"{entry['us']:.1f} us {entry['gb_per_s']:.0f} GB/s"
      print(f"batch {row['tokens']:>6} routed FFN {label}: {cell}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"device": jax.devices()[0].device_kind, "shape": asdict(shape), "rows": rows}, f)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
