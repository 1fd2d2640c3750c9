"""A top-k / top-p / min-p filter without a sort, against the sampler's sorting one.

The sampler's `_filter_top_k_top_p_min_p` sorts every row of the vocabulary (f32[S, V]) to find
two thresholds: the k-th largest logit and the smallest logit the top-p mass keeps. libtpu
compiles that sort slowly (6-10 s for [8, V], each random-sampling program a TPU server compiles
at start; docs/PERFORMANCE.md, "CPU figures"). This finds the same two thresholds by
bisection over the float32 order, 32 steps each, every step one masked count or sum over the row:

- k-th largest: the largest t with count(x >= t) >= k;
- top-p: the smallest kept value v with mass(x > v) < top_p, the mass of the top-k-kept softmax.

The kept set then is every logit at or above the largest threshold, as in the sampler (ties
with a threshold stay, every logit tied with the k-th counts in top-p's normalizer, and top_p 1
keeps everything top-k keeps). What can differ from the sort is rounding: the top-p mass is
summed in vocabulary order rather than in sorted order, so a row whose boundary mass is within
rounding of top_p may keep a different set.

    python -m investigations.sampling_filter_threshold --agree        # CPU: kept sets compared
    python -m investigations.sampling_filter_threshold --tpu-compile  # libtpu compile, v5e chip
    python -m investigations.sampling_filter_threshold --time         # run time on this device

Nothing in jaxserve uses it; it is the measurement for deciding whether the sampler should.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.device.sampler import _filter_top_k_top_p_min_p

SIGN = np.uint32(0x80000000)
STEPS = 32  # bisection steps: the uint32 order has 2**32 keys


def ordered_keys(x: jax.Array) -> jax.Array:
  """f32[...] -> u32[...] with the floats' order (no NaNs; -0.0 is +0.0, as it compares): flip
  negatives, set positives' sign."""
  bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, 0.0, x), jnp.uint32)
  return jnp.where((bits & SIGN) != 0, ~bits, bits | SIGN)


def key_to_float(key: jax.Array) -> jax.Array:
  bits = jnp.where((key & SIGN) != 0, key & ~SIGN, ~key)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _bisect(lo: jax.Array, hi: jax.Array, pred) -> jax.Array:
  """u32[S] lo (pred false or the sentinel below the range), hi (pred true) -> the smallest key
  in (lo, hi] where the monotone pred holds."""

  def step(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    ok = pred(mid) & (hi - lo > 1)
    return jnp.where(ok, lo, jnp.where(hi - lo > 1, mid, lo)), jnp.where(ok, mid, hi)

  return jax.lax.fori_loop(0, STEPS, step, (lo, hi))[1]


def threshold_filter(scaled: jax.Array, top_k, top_p, min_p) -> jax.Array:
  """scaled f32[S, V]; top_k i32[S] (0: off), top_p f32[S], min_p f32[S] -> f32[S, V] with the
  filtered-out logits at -inf."""
  vocab = scaled.shape[-1]
  keys = ordered_keys(scaled)  # u32[S, V]
  k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
  low, high = keys.min(-1), keys.max(-1)
  # the k-th largest: the largest t with count(keys >= t) >= k, i.e. one below the smallest t
  # with count(keys >= t) < k
  few = _bisect(low, high + 1, lambda t: jnp.sum(keys >= t[:, None], -1) < k)
  kth = few - 1  # u32[S]
  kept = keys >= kth[:, None]
  masked = jnp.where(kept, scaled, -jnp.inf)
  weights = jnp.exp(masked - masked.max(-1, keepdims=True))  # f32[S, V]
  total = weights.sum(-1)

  def mass_below_p(t):
    return jnp.sum(jnp.where(keys > t[:, None], weights, 0.0), -1) < top_p * total

  top_p_key = jnp.where(top_p >= 1.0, kth, _bisect(kth - 1, high, mass_below_p))
  top_max = scaled.max(-1)
  min_p_logit = jnp.where(min_p > 0, top_max + jnp.log(jnp.maximum(min_p, 1e-38)), -jnp.inf)
  threshold = jnp.maximum(jnp.maximum(key_to_float(kth), key_to_float(top_p_key)), min_p_logit)
  return jnp.where(scaled >= threshold[:, None], scaled, -jnp.inf)


def sorting_filter(scaled: jax.Array, top_k, top_p, min_p) -> jax.Array:
  return _filter_top_k_top_p_min_p(scaled, SimpleNamespace(top_k=top_k, top_p=top_p, min_p=min_p))


def _draw(rng: np.random.Generator, rows: int, vocab: int):
  scale = rng.choice([0.5, 1.0, 3.0, 8.0], rows)[:, None]  # flat to peaked distributions
  logits = (rng.standard_normal((rows, vocab)) * scale).astype(np.float32)
  logits[: rows // 4] = np.round(logits[: rows // 4])  # a quarter with many ties
  top_k = rng.choice([0, 1, 5, 50, 1000], rows).astype(np.int32)
  top_p = rng.choice([1.0, 0.95, 0.9, 0.5, 0.1], rows).astype(np.float32)
  min_p = rng.choice([0.0, 0.0, 0.05], rows).astype(np.float32)
  return jnp.asarray(logits), jnp.asarray(top_k), jnp.asarray(top_p), jnp.asarray(min_p)


def agree(batches: int, rows: int, vocab: int) -> None:
  rng = np.random.default_rng(0)
  differ = total = extra = missing = 0
  ours, theirs = jax.jit(threshold_filter), jax.jit(sorting_filter)
  for _ in range(batches):
    args = _draw(rng, rows, vocab)
    a = np.isfinite(np.asarray(ours(*args)))
    b = np.isfinite(np.asarray(theirs(*args)))
    rows_differ = (a != b).any(-1)
    differ += int(rows_differ.sum())
    total += rows
    extra += int((a & ~b).sum())
    missing += int((~a & b).sum())
  print(
    f"{differ} of {total} rows keep a different set (V = {vocab}); tokens kept only by the "
    f"threshold search: {extra}, only by the sort: {missing}"
  )


def tpu_compile(vocabs: list[int]) -> None:
  from jax.sharding import SingleDeviceSharding

  from jaxserve.tpu_aot.chips import topology_devices

  jax.config.update("jax_enable_compilation_cache", False)
  sharding = SingleDeviceSharding(topology_devices("v5e:1x1")[0])
  for vocab in vocabs:
    x = jax.ShapeDtypeStruct((8, vocab), jnp.float32, sharding=sharding)
    i = jax.ShapeDtypeStruct((8,), jnp.int32, sharding=sharding)
    f = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding)
    for name, fn in (("sort", sorting_filter), ("threshold search", threshold_filter)):
      start = time.perf_counter()
      jax.jit(fn).trace(x, i, f, f).lower().compile()
      seconds = time.perf_counter() - start
      print(f"V = {vocab:>6} {name:<16} lower + compile for v5e {seconds:5.1f} s")


def time_filters(rows: int, vocab: int, repeats: int) -> None:
  args = _draw(np.random.default_rng(1), rows, vocab)
  for name, fn in (("sort", sorting_filter), ("threshold search", threshold_filter)):
    compiled = jax.jit(fn).lower(*args).compile()
    compiled(*args).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
      out = compiled(*args)
    out.block_until_ready()
    ms = 1e3 * (time.perf_counter() - start) / repeats
    print(f"{jax.devices()[0].device_kind}: [{rows}, {vocab}] {name:<16} {ms:8.3f} ms")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--agree", action="store_true")
  parser.add_argument("--tpu-compile", action="store_true")
  parser.add_argument("--time", action="store_true")
  parser.add_argument("--rows", type=int, default=256)
  parser.add_argument("--vocab", type=int, default=128_256)
  args = parser.parse_args()
  if args.agree:
    agree(batches=8, rows=64, vocab=4096)
  if args.tpu_compile:
    tpu_compile([8_192, 32_000, 128_256])
  if args.time:
    time_filters(args.rows, args.vocab, repeats=20)


if __name__ == "__main__":
  main()
