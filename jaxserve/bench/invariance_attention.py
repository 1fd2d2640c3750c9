"""The attention check of bench/invariance_components.py: one probe sequence's attention output,
bitwise, alone and in company, through the configured backend with the model's head shapes.

A KV pool of random pages holds the probe's K/V (PROBE_LEN tokens) and the others'. Cases, each
padded to the buckets the engine would pick:

  prefill/chunk_C    the probe's prompt in chunks of C tokens (one step each, seq_len growing),
                     against the whole prompt in one step;
  prefill/mixed      the whole prompt after a decode batch of others, in the largest bucket;
  decode/batch       the probe's last token among decodes filling the largest sequence bucket,
                     against the same token alone;
  decode/mixed       the same token in a step that also prefills other prompts;
  decode_vs_prefill_row  the decode token's row against the same position's row in the
                     prefill (a preempted request recomputes its generated tokens as prompt).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.attention.backends import AttentionBackend, pallas_gpu
from jaxserve.attention.capabilities import BackendKind
from jaxserve.bench.timing import median_ms
from jaxserve.config import EngineConfig
from jaxserve.device.step_options import step_compiler_options
from jaxserve.messages.buckets import BucketSet
from jaxserve.models.model_config import ModelConfig

PROBE_LEN = 300
CHUNKS = (16, 64, 128)
OTHER_LEN = 200
FIXED_ROWS = (16, 64)


class PagePool:
  """Random K/V pages as a pool of one slot [1, KV, P, page, D] (kv_slot int32[1], 0) and the
  page ids each sequence owns."""

  def __init__(self, model: ModelConfig, page_size: int, lengths: list[int], seed: int = 0):
    self.page_size = page_size
    rng = np.random.default_rng(seed)
    self.pages, next_page = [], 1
    for length in lengths:
      count = -(-length // page_size)
      self.pages.append(list(range(next_page, next_page + count)))
      next_page += count
    shape = (1, model.num_kv_heads, next_page, page_size, model.head_dim)
    dtype = jnp.dtype(model.dtype)
    self.k = jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
    self.v = jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
    self.kv_slot = jnp.zeros((1,), jnp.int32)


def step_arrays(
  pool: PagePool, seqs: list[tuple[int, int, int]], num_tokens: int, num_slots: int, width: int
):
  """seqs: (sequence index in the pool, query length, seq_len after the step) -> the metadata
  arrays (block_tables, seq_lens, query_start_loc, num_seqs) of a padded step."""
  tables = np.zeros((num_slots, width), np.int32)
  seq_lens = np.zeros((num_slots,), np.int32)
  starts = np.zeros((num_slots + 1,), np.int32)
  for slot, (seq, q_len, seq_len) in enumerate(seqs):
    pages = pool.pages[seq]
    tables[slot, : len(pages)] = pages
    seq_lens[slot] = seq_len
    starts[slot + 1] = starts[slot] + q_len
  starts[len(seqs) + 1 :] = starts[len(seqs)]
  if starts[len(seqs)] > num_tokens:
    raise ValueError(f"attention check: {starts[len(seqs)]} tokens exceed the bucket {num_tokens}")
  return (
    jnp.asarray(tables),
    jnp.asarray(seq_lens),
    jnp.asarray(starts),
    jnp.asarray([len(seqs)], jnp.int32),
  )


class Harness:
  """Runs the backend over steps built from (seq, q_len, seq_len) lists and per-seq queries."""

  def __init__(
    self,
    config: EngineConfig,
    model: ModelConfig,
    buckets: BucketSet,
    backend: AttentionBackend,
    pool: PagePool,
    queries: list[jax.Array],
  ):
    self.buckets, self.pool, self.queries = buckets, pool, queries
    self.width = max(len(p) for p in pool.pages)
    sm_scale = model.head_dim**-0.5
    self.attend = jax.jit(
      lambda q, k, v, *meta: backend.attend(q, k, v, *meta, sm_scale=sm_scale),
      compiler_options=step_compiler_options(config),
    )

  def run(
    self,
    seqs: list[tuple[int, int, int]],
    num_tokens: int | None = None,
    num_slots: int | None = None,
    timings: dict | None = None,
    label: str = "",
  ) -> list[jax.Array]:
    """Each sequence's output rows [q_len, Q, D] (its queries: the q_len before seq_len); with
    `timings`, the step's median milliseconds go to timings[label]."""
    total = sum(q_len for _, q_len, _ in seqs)
    bucket = self.buckets.pick(num_slots or len(seqs), num_tokens or total)
    rows = [self.queries[seq][seq_len - q_len : seq_len] for seq, q_len, seq_len in seqs]
    q = jnp.concatenate(rows, axis=0)
    q = jnp.pad(q, ((0, bucket.num_tokens - total), (0, 0), (0, 0)))  # [T, Q, D]
    meta = step_arrays(self.pool, seqs, bucket.num_tokens, bucket.num_seqs, self.width)
    pool = (self.pool.k, self.pool.v, self.pool.kv_slot)
    out = np.asarray(self.attend(q, *pool, *meta))
    if timings is not None:
      timings[label] = median_ms(self.attend, q, *pool, *meta)
    starts = np.cumsum([0] + [q_len for _, q_len, _ in seqs])
    return [out[starts[i] : starts[i + 1]] for i in range(len(seqs))]


def _diff(a: np.ndarray, b: np.ndarray) -> int:
  a = a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32).reshape(a.shape[0], -1)
  b = b.view(np.uint16 if b.dtype.itemsize == 2 else np.uint32).reshape(b.shape[0], -1)
  return int(np.sum(np.any(a != b, axis=1)))


def attention_checks(
  config: EngineConfig,
  model: ModelConfig,
  buckets: BucketSet,
  backend: AttentionBackend,
  timed: bool = True,
) -> dict:
  """The cases for `backend` ("attention/..."), and on GPUs also for the Pallas kernel with
  every tile fixed at R query rows per program ("attention_rows_R/..."), R in FIXED_ROWS, with
  the time of a full decode step and of a full mixed prefill step ("ms")."""
  variants = {"attention": backend}
  if backend.capabilities.kind is BackendKind.PALLAS_GPU:
    kernel = pallas_gpu(interpret=jax.default_backend() != "gpu")
    padded_group = 1 << (model.num_q_heads // model.num_kv_heads - 1).bit_length()
    for rows in FIXED_ROWS:
      variants[f"attention_rows_{rows}"] = kernel.replace(
        name=f"{kernel.name} ({rows} rows)",
        attend=functools.partial(
          kernel.attend,
          num_kv_splits=1,
          block_q=max(1, rows // padded_group),
          block_kv=32 if model.head_dim > 128 else 64,
        ),
        capabilities=kernel.capabilities.replace(kv_split=False, tile_invariant=True),
      )
  results = {}
  for prefix, variant in variants.items():
    try:
      results.update(
        {
          f"{prefix}/{k}": v
          for k, v in backend_checks(
            config, model, buckets, variant, timed and jax.default_backend() == "gpu"
          ).items()
        }
      )
    except Exception as err:  # a diagnostic: report the failing variant, run the others
      results[prefix] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
  return results


def backend_checks(
  config: EngineConfig,
  model: ModelConfig,
  buckets: BucketSet,
  backend: AttentionBackend,
  timed: bool,
) -> dict:
  max_tokens, max_seqs = buckets.token_buckets[-1], buckets.seq_buckets[-1]
  probe_len = min(PROBE_LEN, max_tokens)
  num_others = max_seqs - 1
  lengths = [probe_len] + [OTHER_LEN] * num_others
  pool = PagePool(model, config.cache.page_size, lengths)
  rng = np.random.default_rng(1)
  queries = [
    jnp.asarray(
      rng.standard_normal((n, model.num_q_heads, model.head_dim), np.float32),
      jnp.dtype(model.dtype),
    )
    for n in lengths
  ]
  harness = Harness(config, model, buckets, backend, pool, queries)
  whole = harness.run([(0, probe_len, probe_len)])[0]
  results = {}
  for chunk in CHUNKS:
    if chunk >= probe_len or chunk > max_tokens:
      continue
    parts = [
      harness.run([(0, min(chunk, probe_len - s), min(s + chunk, probe_len))])[0]
      for s in range(0, probe_len, chunk)
    ]
    results[f"prefill/chunk_{chunk}"] = _diff(np.concatenate(parts), whole)
  decodes = [(i, 1, OTHER_LEN) for i in range(1, num_others + 1)]
  room = max_tokens - probe_len
  results["prefill/mixed"] = _diff(
    harness.run(
      decodes[: max(0, min(len(decodes), room, max_seqs - 1))] + [(0, probe_len, probe_len)],
      max_tokens,
    )[-1],
    whole,
  )
  alone = harness.run([(0, 1, probe_len)])[0]
  timings = {} if timed else None
  results["decode/batch"] = _diff(
    harness.run([(0, 1, probe_len)] + decodes, timings=timings, label="decode_batch")[0], alone
  )
  prefills = [(i, OTHER_LEN, OTHER_LEN) for i in range(1, num_others + 1)]
  fit = max(0, min(max_seqs - 1, (max_tokens - 1) // OTHER_LEN))
  results["decode/mixed"] = _diff(
    harness.run(
      [(0, 1, probe_len)] + prefills[:fit], max_tokens, timings=timings, label="prefill_batch"
    )[0],
    alone,
  )
  results["decode_vs_prefill_row"] = _diff(alone, whole[-1:])
  entries = {name: {"differing_rows": {"-": value}} for name, value in results.items()}
  if timings:
    entries["ms"] = {"differing_rows": {}, "ms": timings}
  return entries
