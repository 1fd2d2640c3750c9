"""Sliding windows and soft caps in every attention path, as a layer calls them
(`AttentionBackend.attend` with its own window and cap): the XLA path, the GPU kernel (Pallas
interpret mode off a GPU), the TPU kernel (TPU interpret mode off a TPU) and the reference.

Hand-computed cases pin the semantics (a query at position p sees p - window + 1 .. p) with
windows that start inside a page, in decode, in a chunk of a prompt whose start is cached and in a
first prefill chunk; pages outside a window hold junk that would show if read. A seeded sweep
compares each path with the pure-jnp reference over random ragged batches, windows and caps."""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import pytest

from jaxserve.attention.backends import REFERENCE, XLA, AttentionBackend, pallas_gpu, pallas_tpu
from pallas_kernels.ragged_paged_attention.testing import attention_args, make_random_case

PAGE, DIM = 16, 64  # the kernels' smallest page and head_dim
JUNK = 1e4
BACKENDS = {
  "reference": lambda: REFERENCE,
  "xla": lambda: XLA,
  "pallas_gpu": lambda: pallas_gpu(interpret=jax.default_backend() != "gpu"),
  "pallas_tpu": lambda: pallas_tpu(interpret=jax.default_backend() != "tpu"),
}


def _attend(backend: AttentionBackend, args, **kwargs) -> np.ndarray:
  return np.asarray(jax.jit(functools.partial(backend.attend, **kwargs))(*args))


def _hand_batch(seqs: list[tuple[int, int, dict[int, tuple[float, float]]]]):
  """One kv head, one q head, queries e0. seqs: (query tokens, seq_len, {position: (score,
  value)}) each: cached position p holds key score * e0 and value value * e1, by default score
  0 and value p. Pages are laid out backwards (never the null page); every other page row holds
  JUNK, which would show if read."""
  pages_per_seq = max(-(-seq_len // PAGE) for _, seq_len, _ in seqs)
  num_pages = 1 + pages_per_seq * len(seqs)
  k_pages = np.full((1, num_pages, PAGE, DIM), JUNK, np.float32)
  v_pages = np.full((1, num_pages, PAGE, DIM), JUNK, np.float32)
  tables = np.zeros((len(seqs), pages_per_seq), np.int32)
  for s, (_, seq_len, special) in enumerate(seqs):
    for p in range(seq_len):
      page = num_pages - 1 - (s * pages_per_seq + p // PAGE)
      tables[s, p // PAGE] = page
      score, value = special.get(p, (0.0, float(p)))
      k_pages[0, page, p % PAGE] = v_pages[0, page, p % PAGE] = 0.0
      k_pages[0, page, p % PAGE, 0], v_pages[0, page, p % PAGE, 1] = score, value
  q_lens = [q_len for q_len, _, _ in seqs]
  q = np.zeros((sum(q_lens) + 1, 1, DIM), np.float32)  # one padding token
  q[:, 0, 0] = 1.0
  seq_lens = np.asarray([seq_len for _, seq_len, _ in seqs], np.int32)
  starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
  num_seqs = np.asarray([len(seqs)], np.int32)
  pools = (k_pages[None], v_pages[None], np.zeros((1,), np.int32))  # one slot, kv_slot 0
  arrays = (q, *pools, tables, seq_lens, starts, num_seqs)
  return tuple(jax.numpy.asarray(a) for a in arrays)


def _mean_seen(position: int, window: int) -> float:
  """The mean of the positions a query at `position` sees (values equal positions)."""
  return float(np.mean(np.arange(max(0, position - window + 1), position + 1)))


@pytest.mark.parametrize("name", BACKENDS)
def test_windows_and_soft_cap_by_hand(name):
  """Window 21, cap 2. A decode at 39, a chunk at 30..34 over a prompt cached to 29 and a first
  chunk at 0..23: every key scores 0 (the cap keeps 0), so a token averages the positions it
  sees, from 19, 10..14 and 0..3 on: the window starts inside a page. A decode at 40 whose
  position 19 (outside) scores 100 with value 1000 and 39 scores 10 with value 1, the other 20
  it sees value 0: weights e^(2 tanh 5) and 1."""
  window, cap = 21, 2.0
  capped = {19: (100.0, 1000.0), 39: (10.0, 1.0)} | {
    p: (0.0, 0.0) for p in range(20, 41) if p != 39
  }
  seqs = [(1, 40, {}), (5, 35, {}), (24, 24, {}), (1, 41, capped)]
  out = _attend(
    BACKENDS[name](), _hand_batch(seqs), sm_scale=1.0, sliding_window=window, soft_cap=cap
  )
  positions = [39] + list(range(30, 35)) + list(range(24))
  want = [_mean_seen(p, window) for p in positions]
  weight = math.exp(cap * math.tanh(10.0 / cap))
  want.append(weight / (weight + 20.0))
  np.testing.assert_allclose(out[: len(want), 0, 1], want, rtol=1e-5)
  assert np.all(out[len(want) :] == 0), "padding tokens produce zeros"


def _sweep_case(seed: int):
  """A ragged batch: two decodes (one past the window, one inside it), a chunk over a cached
  prefix, a first prefill chunk; a window not a multiple of the page; a cap or none."""
  rng = np.random.default_rng(seed)
  window = int(rng.choice([w for w in range(3, 48) if w % PAGE]))
  chunk = int(rng.integers(2, 17))
  prefill = int(rng.integers(5, 41))
  kv_lens = [int(rng.integers(window + 1, 96)), int(rng.integers(1, window + 1))]
  kv_lens += [chunk + int(rng.integers(1, 60)), prefill]
  case = make_random_case(
    rng,
    num_seqs=6,
    q_lens=[1, 1, chunk, prefill],
    kv_lens=kv_lens,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=DIM,
    page_size=PAGE,
    pages_per_seq=8,
  )
  cap = None if seed % 2 else float(rng.uniform(1.0, 5.0))
  return case, dict(sm_scale=DIM**-0.5, sliding_window=window, soft_cap=cap)


@functools.cache
def _sweep_expected(seed: int) -> np.ndarray:
  case, kwargs = _sweep_case(seed)
  return _attend(REFERENCE, attention_args(case), **kwargs)


@pytest.mark.parametrize("name", ["xla", "pallas_gpu", "pallas_tpu"])
def test_sweep_matches_the_reference(name):
  for seed in (0, 1):
    case, kwargs = _sweep_case(seed)
    got = _attend(BACKENDS[name](), attention_args(case), **kwargs)
    want = _sweep_expected(seed)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5, err_msg=f"{seed}: {kwargs}")


@pytest.mark.parametrize("name", ["xla", "pallas_gpu", "pallas_tpu"])
def test_pages_before_the_window_may_be_the_null_page(name):
  """The contract window-aware page freeing relies on: a block-table entry of a page that lies
  wholly before the window of every query of its sequence may be the null page (whatever finite
  values it holds): the output is bitwise the same. (The reference reads every entry and masks
  what lies outside the window.)"""
  window = 19
  case = make_random_case(
    np.random.default_rng(7),
    num_seqs=6,
    q_lens=[1, 7, 1],
    kv_lens=[90, 70, 10],
    num_q_heads=2,
    num_kv_heads=1,
    head_dim=DIM,
    page_size=PAGE,
    pages_per_seq=8,
  )
  kwargs = dict(sm_scale=DIM**-0.5, sliding_window=window, soft_cap=4.0)
  tables = np.asarray(case["block_tables"]).copy()
  q_lens = np.diff(np.asarray(case["query_start_loc"]))
  first_positions = np.asarray(case["seq_lens"]) - q_lens
  for seq, first in enumerate(first_positions[: int(case["num_seqs"][0])]):
    before = max(0, first - window + 1) // PAGE  # pages wholly before the first query's window
    tables[seq, :before] = 0
  assert (tables == 0).sum() > (np.asarray(case["block_tables"]) == 0).sum(), "nothing freed"
  junk = np.asarray(case["k_pool"]).copy()
  junk[:, :, 0] = JUNK
  freed = {**case, "block_tables": jax.numpy.asarray(tables), "k_pool": jax.numpy.asarray(junk)}
  attend = jax.jit(functools.partial(BACKENDS[name]().attend, **kwargs))  # one compile
  kept = np.asarray(attend(*attention_args({**case, "k_pool": freed["k_pool"]})))
  got = np.asarray(attend(*attention_args(freed)))
  np.testing.assert_array_equal(got.view(np.uint32), kept.view(np.uint32))
