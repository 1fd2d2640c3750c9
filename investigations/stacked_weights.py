"""Whether a step's weights should be one array per kind stacked over the layers, rather than one
array per layer: what each form costs the host to dispatch and the device to run.

A step program's dispatch costs the host microseconds per input buffer (each is checked and held
while the program runs): a 48-layer model with 6 weight arrays a layer and 2 KV arrays passes
~400 buffers (`python -m investigations.profile_step` on a 48-layer tiny Llama: 4.1 ms of
dispatch behind a running step on a 2-core CPU against 0.6 ms with 2 layers; Qwen3-30B-A3B on an
H200's host: 3.4 ms, against a device step of ~5 ms for one sequence). Stacked, the weights are
a few buffers, but each layer then reads a slice of a stacked array, which a compiler may copy
before a GEMM (every weight read twice and written once a step) instead of reading it in place.

Three forms of one chain of L layers, x <- x + silu(x @ up[l]) @ down[l] (the same math):

  separate  2L arrays, up [K, N] and down [N, K] a layer (as the model's params are today)
  static    two stacked arrays [L, K, N] and [L, N, K], layer l a static slice (a Python loop
            over the layers, as the decoder is written)
  scan      the stacked arrays under lax.scan (a dynamic slice a layer)

Each form: the host's seconds to dispatch one step while the device runs the step before, the
step's wall time back to back (median), its output against `separate`'s, and the optimized HLO's
copies and slices that produce a layer's weight shape (a copy a layer means the weights are read
twice). Then the KV pool, which a step donates and gets back: 2L arrays (a layer's K or V each,
as today) against one [2L, P, D] array, each step writing one token a layer: the host's seconds
to dispatch (a donated buffer costs more than a read-only one) and the step's.

  python -m investigations.stacked_weights                    # on a GPU: a 48-layer chain
  python -m investigations.stacked_weights --smoke            # tiny sizes, any backend
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.bench.timing import seconds_per_call


def _layer(x: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
  h = jnp.dot(x, up, preferred_element_type=jnp.float32)  # [M, N]
  return x + jnp.dot(jax.nn.silu(h).astype(x.dtype), down).astype(x.dtype)  # [M, K]


def separate(x: jax.Array, ups: list[jax.Array], downs: list[jax.Array]) -> jax.Array:
  for up, down in zip(ups, downs, strict=True):
    x = _layer(x, up, down)
  return x


def static(x: jax.Array, ups: jax.Array, downs: jax.Array) -> jax.Array:
  for layer in range(ups.shape[0]):
    x = _layer(x, ups[layer], downs[layer])
  return x


def scan(x: jax.Array, ups: jax.Array, downs: jax.Array) -> jax.Array:
  return jax.lax.scan(lambda x, w: (_layer(x, *w), None), x, (ups, downs))[0]


def kv_separate(pages: tuple[jax.Array, ...], value: jax.Array) -> tuple[jax.Array, ...]:
  return tuple(p.at[0].set(value) for p in pages)  # each layer's K or V: one new token


def kv_stacked(pages: jax.Array, value: jax.Array) -> jax.Array:
  return pages.at[:, 0].set(value)  # [2L, P, D]: every layer's K and V at once


def donated_dispatch_seconds(fn, pages, value: jax.Array, reps: int = 30) -> tuple[float, float]:
  """(median seconds for a call that donates `pages` to return, median step seconds): the
  pages passed back in each call, as a step's KV pool is."""
  pages = fn(pages, value)
  jax.block_until_ready(pages)
  dispatch, step = [], []
  for _ in range(reps):
    start = time.perf_counter()
    pages = fn(pages, value)
    dispatch.append(time.perf_counter() - start)
    jax.block_until_ready(pages)
    step.append(time.perf_counter() - start)
  return statistics.median(dispatch), statistics.median(step)


def measure_kv(args: argparse.Namespace) -> list[dict]:
  """A step's KV pool donated as 2L arrays [P, D] (one a layer's K or V) or as one [2L, P, D]."""
  arrays, pages, width = 2 * args.layers, args.kv_pages, args.k
  value = jnp.ones((width,), jnp.bfloat16)
  forms = {
    "kv separate": (
      jax.jit(kv_separate, donate_argnums=0),
      tuple(jnp.zeros((pages, width), jnp.bfloat16) for _ in range(arrays)),
    ),
    "kv stacked": (
      jax.jit(kv_stacked, donate_argnums=0),
      jnp.zeros((arrays, pages, width), jnp.bfloat16),
    ),
  }
  rows = []
  for name, (fn, pool) in forms.items():
    buffers = len(jax.tree_util.tree_leaves(pool))
    dispatch_s, step_s = donated_dispatch_seconds(fn, pool, value)
    rows.append(
      {
        "form": name,
        "input_buffers": buffers,
        "dispatch_us": 1e6 * dispatch_s,
        "step_us": 1e6 * step_s,
      }
    )
  return rows


def dispatch_seconds(fn, *args, reps: int = 30) -> float:
  """Median seconds for a call to return while the device still runs the calls before it."""
  out = fn(*args)
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    out = fn(*args)
    times.append(time.perf_counter() - start)
  jax.block_until_ready(out)
  return statistics.median(times)


def weight_copies(fn, args, k: int, n: int) -> dict[str, int]:
  """The optimized HLO's copy / slice / dynamic-slice instructions (outside fusions' bodies as
  well) whose result has a layer's weight shape [K, N] or [N, K]."""
  text = fn.lower(*args).compile().as_text()
  shapes = (rf"\[{k},{n}\]", rf"\[{n},{k}\]")
  counts = {}
  for op in ("copy", "slice", "dynamic-slice"):
    pattern = rf"= \w+(?:{'|'.join(shapes)})\S* {op}\("
    counts[op] = len(re.findall(pattern, text))
  counts["fusions_of_weight_shape"] = len(
    re.findall(rf"= \w+(?:{'|'.join(shapes)})\S* fusion\(", text)
  )
  return counts


def measure(args: argparse.Namespace) -> list[dict]:
  layers, m, k, n = args.layers, args.m, args.k, args.n
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  scale = 1.0 / np.sqrt(k)
  stacked_up = (scale * jax.random.normal(keys[0], (layers, k, n))).astype(jnp.bfloat16)
  stacked_down = (scale * jax.random.normal(keys[1], (layers, n, k))).astype(jnp.bfloat16)
  x = jax.random.normal(keys[2], (m, k)).astype(jnp.bfloat16)
  ups = [jnp.array(stacked_up[i]) for i in range(layers)]  # its own buffer a layer
  downs = [jnp.array(stacked_down[i]) for i in range(layers)]
  forms = {
    "separate": (jax.jit(separate), (x, ups, downs)),
    "static": (jax.jit(static), (x, stacked_up, stacked_down)),
    "scan": (jax.jit(scan), (x, stacked_up, stacked_down)),
  }
  want = np.asarray(forms["separate"][0](*forms["separate"][1]), np.float32)
  rows = []
  for name, (fn, fn_args) in forms.items():
    got = np.asarray(fn(*fn_args), np.float32)
    step_s = seconds_per_call(fn, *fn_args, inner=args.inner, reps=args.reps)
    rows.append(
      {
        "form": name,
        "input_buffers": len(jax.tree_util.tree_leaves(fn_args)),
        "dispatch_us": 1e6 * dispatch_seconds(fn, *fn_args),
        "step_us": 1e6 * step_s,
        "weight_gb_per_s": (stacked_up.nbytes + stacked_down.nbytes) / step_s / 1e9,
        "max_abs_diff_vs_separate": float(np.max(np.abs(got - want))),
        "hlo": weight_copies(fn, fn_args, k, n),
      }
    )
  return rows


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--layers", type=int, default=48)
  parser.add_argument("--m", type=int, default=8, help="rows (tokens) a step")
  parser.add_argument("--k", type=int, default=2048, help="the residual width")
  parser.add_argument("--n", type=int, default=6144, help="the inner width")
  parser.add_argument("--kv-pages", type=int, default=4096, help="rows of each KV array")
  parser.add_argument("--inner", type=int, default=20, help="steps a timing")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--smoke", action="store_true", help="tiny sizes (any backend)")
  parser.add_argument("--out", help="write the rows as JSON here")
  args = parser.parse_args(argv)
  if args.smoke:
    args.layers, args.k, args.n, args.inner, args.reps, args.kv_pages = 4, 32, 64, 2, 2, 16
  rows = measure(args)
  kv_rows = measure_kv(args)
  print(f"{jax.devices()[0].device_kind}: {args.layers} layers, M {args.m}, K {args.k}, N {args.n}")
  for r in rows:
    print(
      f"{r['form']:>9}: {r['input_buffers']:4d} buffers, dispatch {r['dispatch_us']:8.1f} us, "
      f"step {r['step_us']:9.1f} us ({r['weight_gb_per_s']:7.0f} GB/s of weights), "
      f"max diff {r['max_abs_diff_vs_separate']:.2e}, HLO {r['hlo']}"
    )
  for r in kv_rows:
    print(
      f"{r['form']:>12}: {r['input_buffers']:4d} donated buffers, dispatch "
      f"{r['dispatch_us']:8.1f} us, step {r['step_us']:8.1f} us"
    )
  if args.out:
    with open(args.out, "w") as f:
      result = {"device": jax.devices()[0].device_kind, "args": vars(args), "rows": rows}
      json.dump({**result, "kv_rows": kv_rows}, f)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
