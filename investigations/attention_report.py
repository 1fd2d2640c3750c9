"""investigations/bench_kernels.py's results: one case's record (CaseResult: per kernel label, the
error against the reference, time, device time, KV bandwidth, share of the copy ceiling,
attention TFLOP/s, and the speedups over JAX's bundled op and the XLA reference) and the table
it prints, and the two measures it records beside the times (attention FLOPs of a batch, the
largest error against the reference)."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from investigations.kernel_timing import Batch


@dataclass
class CaseResult:
  name: str
  kind: str
  batch: int
  context: int
  num_tokens: int
  kv_bytes: int = 0
  max_abs_error: dict[str, float] = field(default_factory=dict)
  time_us: dict[str, float] = field(default_factory=dict)
  device_us: dict[str, float] = field(default_factory=dict)  # --device-time: kernels only
  kv_gbps: dict[str, float] = field(default_factory=dict)
  pct_of_copy: dict[str, float] = field(default_factory=dict)
  tflops: dict[str, float] = field(default_factory=dict)  # attention FLOPs / time (prefill)
  speedup_vs_bundled: float | None = None
  speedup_vs_xla: float | None = None
  notes: list[str] = field(default_factory=list)
  error: str | None = None


def _device_pct(result: CaseResult, label: str, copy_bps: float | None) -> float:
  device_us = result.device_us.get(label)
  if not device_us or not copy_bps:
    return float("nan")
  return 100.0 * result.kv_bytes / (device_us * 1e-6) / copy_bps


def print_table(results: list[CaseResult], copy_bps: float | None) -> None:
  if copy_bps:
    print(f"\nHBM copy ceiling: {copy_bps / 1e9:.0f} GB/s (read + write)")
  header = (
    f"{'case':44s} {'kernel':18s} {'us':>10s} {'KV GB/s':>9s} {'%copy':>6s} "
    f"{'max err':>9s} {'dev us':>8s} {'dev %copy':>9s}"
  )
  print(header)
  print("-" * len(header))
  for r in results:
    if r.error:
      print(f"{r.name:44s} ERROR {r.error[:120]}")
      continue
    for label in sorted(set(r.time_us) | set(r.max_abs_error)):
      print(
        f"{r.name:44s} {label:18s} {r.time_us.get(label, float('nan')):10.1f} "
        f"{r.kv_gbps.get(label, float('nan')):9.1f} {r.pct_of_copy.get(label, float('nan')):6.1f} "
        f"{r.max_abs_error.get(label, float('nan')):9.2e} "
        f"{r.device_us.get(label, float('nan')):8.1f} {_device_pct(r, label, copy_bps):9.1f}"
      )
    ratios = []
    if r.speedup_vs_bundled:
      ratios.append(f"vs bundled {r.speedup_vs_bundled:.2f}x")
    if r.speedup_vs_xla:
      ratios.append(f"vs xla {r.speedup_vs_xla:.2f}x")
    if ratios:
      print(f"{'':44s} ours speedup: {', '.join(ratios)}")
    if not r.kind == "decode" and r.tflops:
      print(
        f"{'':44s} attention TFLOP/s: "
        + ", ".join(f"{label} {value:.1f}" for label, value in sorted(r.tflops.items()))
      )
    for note in r.notes:
      print(f"{'':44s} note: {note}")


def attention_flops(batch: Batch) -> int:
  """2 matmuls x 2 FLOPs per (query, visible key) pair, per q head and head dim (causal)."""
  qsl = np.asarray(batch.query_start_loc)
  q_lens = np.diff(qsl)[: int(batch.num_seqs[0])].astype(np.int64)
  seq_lens = np.asarray(batch.seq_lens)[: q_lens.size].astype(np.int64)
  pairs = q_lens * (seq_lens - q_lens) + q_lens * (q_lens + 1) // 2
  num_q_heads, head_dim = batch.q.shape[1:]
  return int(4 * num_q_heads * head_dim * pairs.sum())


def max_abs_error(actual: jax.Array, expected: jax.Array) -> float:
  return float(jnp.max(jnp.abs(actual.astype(jnp.float32) - expected.astype(jnp.float32))))
