"""The component checks of bench/batch_invariance.py: which part of a step changes a token's bits
with the batch, measured on the device itself with the model's shapes (random values).

  gemm       each projection of one layer (q/k/v, o, gate/up, down; and the logits, float32
             out) for the rows of the config's token buckets (the logits: its sequence buckets):
             do the first T rows of the largest bucket's result equal the T-row result bitwise?
             For several formulations: `dot` (one XLA dot, the step's usual options),
             `row_tiles_R` (tiles of R rows, models/batch_invariant_dense.py), `batched_R` (the
             same tiles as one batched GEMM against the broadcast weight), `pallas_*` (the
             fixed-tile kernel, blocks MxNxK, warps, stages), `configured` (what the config's
             step runs); with each one's median time per bucket.
  rmsnorm    the model's RMSNorm as configured (fixed-order with batch_invariant) over the rows
             of each token bucket.
  attention  the configured attention backend (with batch_invariant's fixed tiles when on), one
             probe sequence: its prefill in one chunk against chunks of 16 / 64 / 128 tokens and
             inside a mixed batch; its decode token alone against inside a decode batch of the
             largest sequence bucket and inside a mixed batch.
  sampler    XLA's logsumexp and argmax, and the configured greedy kernel, over the rows of each
             sequence bucket.

Every entry counts differing rows (0: bitwise equal).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.bench.timing import median_ms
from jaxserve.config import EngineConfig
from jaxserve.device.sampler import xla_greedy
from jaxserve.device.step_options import step_compiler_options, step_greedy
from jaxserve.messages.buckets import BucketSet
from jaxserve.models.batch_invariant_dense import pallas_matmul, row_tiled_matmul
from jaxserve.models.builtin import builtin_config, is_builtin
from jaxserve.models.layers.norms import RMSNorm
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.registry import checkpoint_dir, model_path
from jaxserve.models.weights import load_hf_config
from jaxserve.parallel.placement import attention_for, dense_for

TILE_ROWS = (128, 256)
PALLAS_TILES = (((64, 128, 64), 4, 3), ((128, 128, 64), 8, 3), ((64, 256, 64), 8, 3))


def model_config_of(config: EngineConfig) -> ModelConfig:
  if is_builtin(config.model):
    return builtin_config(config.model, config.dtype)
  return load_hf_config(checkpoint_dir(model_path(config)), config.dtype)


def differing_rows(a: jax.Array, b: jax.Array) -> int:
  """Rows of a and b (same shape) that differ in any bit."""
  a, b = np.asarray(a), np.asarray(b)
  a = a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32).reshape(a.shape[0], -1)
  b = b.view(np.uint16 if b.dtype.itemsize == 2 else np.uint32).reshape(b.shape[0], -1)
  return int(np.sum(np.any(a != b, axis=1)))


def rows_check(fn: Callable, x: jax.Array, counts: tuple[int, ...], timed: bool) -> dict:
  """fn over x[:T] for each T in counts against the first T rows of fn(x[:max])."""
  full = fn(x[: max(counts)])
  entry = {"differing_rows": {}, "ms": {}}
  for count in counts:
    part = fn(x[:count])
    entry["differing_rows"][count] = differing_rows(part, full[:count])
    if timed:
      entry["ms"][count] = median_ms(fn, x[:count])
  return entry


def batched_tiles(x: jax.Array, w: jax.Array, out_dtype, rows: int) -> jax.Array:
  """x [T, K] @ w [K, N] as one batched GEMM of [rows, K] tiles against w broadcast (XLA can
  fold the broadcast into a stride-0 batched cuBLAS call): invariant if the library's choice
  does not follow the batch count."""
  num_tiles = -(-x.shape[0] // rows)
  tiles = jnp.pad(x, ((0, num_tiles * rows - x.shape[0]), (0, 0))).reshape(
    num_tiles, rows, x.shape[1]
  )  # [n, R, K]
  weights = jnp.broadcast_to(w, (num_tiles, *w.shape))  # [n, K, N]
  out = jnp.einsum("trk,tkn->trn", tiles, weights, preferred_element_type=out_dtype)
  return out.reshape(num_tiles * rows, -1)[: x.shape[0]]


def gemm_formulations(config: EngineConfig) -> dict[str, tuple[Callable, dict | None]]:
  """name -> (matmul(x, w, out_dtype), XLA options)."""
  plain = step_compiler_options(config.replace(batch_invariant=False))
  fixed = step_compiler_options(config.replace(batch_invariant=True))
  forms = {"dot": (lambda x, w, dt: jnp.dot(x, w, preferred_element_type=dt), plain)}
  for rows in TILE_ROWS:
    forms[f"row_tiles_{rows}"] = (
      lambda x, w, dt, rows=rows: row_tiled_matmul(x, w, dt, rows),
      fixed,
    )
  for rows in TILE_ROWS:
    forms[f"batched_{rows}"] = (lambda x, w, dt, rows=rows: batched_tiles(x, w, dt, rows), fixed)
  for blocks, warps, stages in PALLAS_TILES:
    name = "pallas_" + "x".join(map(str, blocks)) + f"_w{warps}s{stages}"
    forms[name] = (
      functools.partial(pallas_matmul, blocks=blocks, num_warps=warps, num_stages=stages),
      fixed,
    )
  dense = dense_for(config)
  if dense is not None and dense.logits is not None:
    forms["configured"] = (
      lambda x, w, dt: dense.logits(x, w, False) if dt == jnp.float32 else dense.column(x, w),
      step_compiler_options(config),
    )
  return forms


def gemm_checks(
  config: EngineConfig, model: ModelConfig, buckets: BucketSet, timed: bool, all_forms: bool = True
) -> dict:
  """Every formulation of gemm_formulations, or (all_forms False) the configured one alone."""
  dtype = jnp.dtype(model.dtype)
  h, d = model.hidden_size, model.head_dim
  shapes = {
    "qkv": (h, (model.num_q_heads + 2 * model.num_kv_heads) * d, dtype),
    "o": (model.num_q_heads * d, h, dtype),
    "gate_up": (h, 2 * model.intermediate_size, dtype),
    "down": (model.intermediate_size, h, dtype),
    "logits": (h, model.vocab_size, jnp.float32),
  }
  forms = gemm_formulations(config)
  if not all_forms:
    forms = {k: v for k, v in forms.items() if k == "configured"}
  results = {}
  keys = jax.random.split(jax.random.key(0), 2 * len(shapes))
  for i, (name, (k, n, out_dtype)) in enumerate(shapes.items()):
    counts = buckets.seq_buckets if name == "logits" else buckets.token_buckets
    x = jax.random.normal(keys[2 * i], (max(counts), k), jnp.float32).astype(dtype)
    w = (0.02 * jax.random.normal(keys[2 * i + 1], (k, n), jnp.float32)).astype(dtype)
    for form, (matmul, options) in forms.items():
      fn = jax.jit(
        lambda x, w, matmul=matmul, out_dtype=out_dtype: matmul(x, w, out_dtype),
        compiler_options=options,
      )
      try:
        results[f"{name}/{form}"] = rows_check(lambda x, fn=fn, w=w: fn(x, w), x, counts, timed)
      except Exception as err:  # a formulation that does not compile here is reported, not fatal
        results[f"{name}/{form}"] = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
  return results


def norm_check(config: EngineConfig, model: ModelConfig, buckets: BucketSet) -> dict:
  dtype = jnp.dtype(model.dtype)
  norm = RMSNorm(model.rms_norm_eps, dtype, config.batch_invariant)  # as the model builds it
  x = jax.random.normal(
    jax.random.key(1), (max(buckets.token_buckets), model.hidden_size), jnp.float32
  ).astype(dtype)
  scale = {
    "params": {
      "scale": (1 + 0.1 * jax.random.normal(jax.random.key(2), (model.hidden_size,))).astype(dtype)
    }
  }
  fn = jax.jit(lambda x: norm.apply(scale, x), compiler_options=step_compiler_options(config))
  return {"rmsnorm": rows_check(fn, x, buckets.token_buckets, timed=False)}


def sampler_checks(config: EngineConfig, model: ModelConfig, buckets: BucketSet) -> dict:
  logits = 4 * jax.random.normal(
    jax.random.key(3), (max(buckets.seq_buckets), model.vocab_size), jnp.float32
  )
  banned = jnp.full((logits.shape[0], 1), -1, jnp.int32)
  options = step_compiler_options(config)
  results = {}
  for name, greedy in (("xla", xla_greedy), ("configured", step_greedy(config, sharded=False))):
    fn = jax.jit(
      lambda x, greedy=greedy: jnp.stack(
        [a.astype(jnp.float32) for a in greedy(x, banned[: x.shape[0]])], axis=1
      ),
      compiler_options=options,
    )  # [S, 2]
    results[f"greedy/{name}"] = rows_check(fn, logits, buckets.seq_buckets, timed=False)
  return results


def run_components(config: EngineConfig, timed: bool = True, all_forms: bool = True) -> dict:
  """Every component check for `config` on the default device (all_forms False: of the GEMM
  formulations the configured step's alone); prints a table, returns it."""
  from jaxserve.bench.invariance_attention import attention_checks

  model = model_config_of(config)
  buckets = BucketSet.from_config(config.scheduler)
  checks = {
    "gemm": lambda: gemm_checks(config, model, buckets, timed, all_forms),
    "rmsnorm": lambda: norm_check(config, model, buckets),
    "attention": lambda: attention_checks(config, model, buckets, attention_for(config), timed),
    "sampler": lambda: sampler_checks(config, model, buckets),
  }
  results = {}
  for name, check in checks.items():
    try:
      results.update(check())
    except Exception as err:  # a diagnostic: report the failing check, run the others
      results[name] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
  print_components(results)
  return results


def print_components(results: dict) -> None:
  print(
    "component checks: differing rows per bucket against the largest bucket's first rows "
    "(0 = bitwise equal); ms: median time per bucket"
  )
  for name, entry in results.items():
    if "error" in entry:
      print(f"{name:<34} {entry['error']}")
      continue
    rows = " ".join(f"{k}:{v}" for k, v in entry["differing_rows"].items())
    print(f"{name:<34} rows {rows}")
    if entry.get("ms"):
      print(f"{name:<34} ms   " + " ".join(f"{k}:{v}" for k, v in entry["ms"].items()))
