"""The blocked XLA attention path (the CPU engine's) against the dense pure-jnp reference."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from jaxserve.attention.backends import get_attention_backend
from jaxserve.attention.capabilities import BackendKind
from jaxserve.attention.xla import ragged_paged_attention_xla
from pallas_kernels.ragged_paged_attention.reference import ragged_paged_attention_reference
from pallas_kernels.ragged_paged_attention.testing import attention_args, make_random_case

CASES = [
  # (q_lens, kv_lens, page_size, num_q_heads, num_kv_heads, sliding_window, soft_cap)
  ([1, 1, 1], [1, 16, 17], 16, 4, 2, None, None),  # decode: 1, a full page, one past
  ([5, 0, 1, 20], [5, 9, 40, 33], 16, 8, 2, None, None),  # mixed prefill + decode, empty query
  ([7, 1], [70, 129], 16, 4, 1, 24, None),  # MQA with a sliding window
  ([3, 1], [50, 31], 32, 4, 4, None, 5.0),  # soft-cap, page 32
]


@pytest.mark.parametrize("fixed_order", [False, True])
@pytest.mark.parametrize(
  "q_lens, kv_lens, page_size, num_q_heads, num_kv_heads, window, cap", CASES
)
def test_matches_reference(
  q_lens, kv_lens, page_size, num_q_heads, num_kv_heads, window, cap, fixed_order
):
  rng = np.random.default_rng(len(q_lens) * 7 + page_size)
  case = make_random_case(
    rng,
    num_seqs=len(q_lens) + 2,
    q_lens=q_lens,
    kv_lens=kv_lens,
    num_q_heads=num_q_heads,
    num_kv_heads=num_kv_heads,
    head_dim=64,
    page_size=page_size,
    pages_per_seq=12,
  )
  kwargs = dict(sm_scale=0.125, sliding_window=window, soft_cap=cap)
  ours = jax.jit(
    functools.partial(
      ragged_paged_attention_xla, pages_per_block=2, fixed_order=fixed_order, **kwargs
    )
  )(*attention_args(case))
  expected = ragged_paged_attention_reference(*attention_args(case), **kwargs)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), atol=2e-5, rtol=2e-5)
  assert np.all(np.asarray(ours)[sum(q_lens) :] == 0), "padding tokens must produce zeros"


def test_bad_shapes_raise_value_error():
  rng = np.random.default_rng(0)
  case = make_random_case(
    rng,
    num_seqs=2,
    q_lens=[1],
    kv_lens=[3],
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=64,
    page_size=16,
  )
  args = list(attention_args(case))
  args[4] = args[4][:1]  # seq_lens of the wrong length
  with pytest.raises(ValueError, match="seq_lens"):
    ragged_paged_attention_xla(*args, sm_scale=1.0)


def test_auto_backend_picks_by_platform():
  assert get_attention_backend("auto", platform="cpu").capabilities.kind is BackendKind.XLA
  assert get_attention_backend("auto", platform="gpu").capabilities.kind is BackendKind.PALLAS_GPU
  assert get_attention_backend("auto", platform="tpu").capabilities.kind is BackendKind.PALLAS_TPU
  with pytest.raises(ValueError, match="attention_backend"):
    get_attention_backend("nope")
