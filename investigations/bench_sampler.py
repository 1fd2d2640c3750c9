"""The greedy sampling reduction over one decode step's logits: XLA's argmax and logsumexp
(device/sampler.py xla_greedy) and the Pallas GPU kernel (pallas_kernels/greedy_sample) over
a sweep of its tiles, each checked against the reference and timed by its kernels'
device time (profiler trace) and by wall time per call.

    python -m investigations.bench_sampler --rows 512 --vocab 128256 --out sampler.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from investigations.device_trace import capture_trace, summarize_trace, total_device_us
from jaxserve.bench.timing import seconds_per_call
from jaxserve.device.sampler import xla_greedy
from pallas_kernels.greedy_sample.gpu import greedy_sample
from pallas_kernels.greedy_sample.reference import greedy_sample_reference


def variants(opts) -> dict:
  out = {"xla": xla_greedy}
  if jax.default_backend() == "gpu":
    for tile in opts.tiles.split(","):
      if tile == "default":
        out["pallas"] = greedy_sample
        continue
      names = ("block_vocab", "num_warps", "num_stages", "num_splits")
      kwargs = dict(zip(names, map(int, tile.split(":")), strict=False))  # the first ones given
      out[f"pallas[{tile}]"] = functools.partial(greedy_sample, **kwargs)
  return out


def time_variant(fn, logits, banned_ids, *, inner: int, reps: int) -> tuple[float, float]:
  """(wall us per call over `inner` back-to-back calls, kernels' device us per call)."""
  jitted = jax.jit(fn)
  wall_us = 1e6 * seconds_per_call(jitted, logits, banned_ids, inner=inner, reps=reps)
  logdir = capture_trace(lambda: jitted(logits, banned_ids), reps=inner)
  return wall_us, total_device_us(summarize_trace(logdir)) / inner


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, default=512)
  parser.add_argument("--vocab", type=int, default=128256)
  parser.add_argument(
    "--tiles",
    default="default,4096:4:2,4096:4:3,2048:4:3,4096:4:1:4,"
    "4096:4:2:4,2048:4:2:8,8192:8:2:2,1024:4:3:8",
    help="Pallas tiles block_vocab:num_warps[:num_stages[:num_splits]], or 'default'",
  )
  parser.add_argument("--inner", type=int, default=20)
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--out", default="bench_sampler.json")
  opts = parser.parse_args(argv)
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(0, 3, size=(opts.rows, opts.vocab)), jnp.float32)
  banned_ids = jnp.asarray(
    np.where(rng.random((opts.rows, 8)) < 0.2, rng.integers(0, opts.vocab, (opts.rows, 8)), -1),
    jnp.int32,
  )
  expected_ids, expected_lse = greedy_sample_reference(logits, banned_ids)
  logits_bytes = logits.size * logits.dtype.itemsize
  print(
    f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}, logits "
    f"f32[{opts.rows}, {opts.vocab}] ({logits_bytes / 1e6:.0f} MB)"
  )
  print(
    f"{'variant':22s} {'wall us':>9s} {'dev us':>9s} {'dev GB/s':>9s} {'ids ok':>7s} "
    f"{'lse err':>9s}"
  )
  rows = []
  for name, fn in variants(opts).items():
    ids, lse = jax.jit(fn)(logits, banned_ids)
    ids_ok = bool(jnp.all(ids == expected_ids))
    lse_err = float(jnp.max(jnp.abs(lse - expected_lse)))
    wall_us, device_us = time_variant(fn, logits, banned_ids, inner=opts.inner, reps=opts.reps)
    gbps = logits_bytes / (device_us * 1e-6) / 1e9 if device_us else float("nan")
    print(
      f"{name:22s} {wall_us:9.1f} {device_us:9.1f} {gbps:9.0f} {str(ids_ok):>7s} {lse_err:9.2e}"
    )
    rows.append(
      {
        "variant": name,
        "wall_us": wall_us,
        "device_us": device_us,
        "device_gbps": gbps,
        "ids_match": ids_ok,
        "max_lse_error": lse_err,
      }
    )
  Path(opts.out).write_text(
    json.dumps(
      {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "rows": opts.rows,
        "vocab": opts.vocab,
        "results": rows,
      },
      indent=2,
    )
  )
  print(f"wrote {opts.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
