"""The top-k router kernel (pallas_kernels/moe_router/gpu.py) against hand-computed values and its
pure-jnp reference (XLA's softmax and lax.top_k): renormalized or not, ties, E not a power of two,
token counts across blocks; its shape checks; its lowering for CUDA; models/layers/moe.route
choosing it for CUDA only. Compiled on a GPU, in Pallas interpret mode elsewhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxserve.models.layers.moe import route
from pallas_kernels.moe_router.gpu import top_k_route
from pallas_kernels.moe_router.reference import top_k_route_reference
from tests.pallas_kernels.test_gpu_lowering import _custom_call_targets, _lower_for_cuda

INTERPRET = jax.default_backend() != "gpu"


def test_hand_computed():
  """Logits log(1, 2, 3, 4) and a tie: probabilities 0.1 0.2 0.3 0.4; top 2 = experts 3, 2;
  renormalized 4/7, 3/7. Row 1 ties experts 0 and 2 (0.4 each): the lower id first."""
  logits = jnp.log(jnp.array([[1.0, 2.0, 3.0, 4.0], [4.0, 1.0, 4.0, 1.0]], jnp.float32))
  weights, ids = top_k_route(logits, 2, False, interpret=INTERPRET)
  assert np.asarray(ids).tolist() == [[3, 2], [0, 2]]
  np.testing.assert_allclose(np.asarray(weights), [[0.4, 0.3], [0.4, 0.4]], rtol=1e-6)
  weights, _ = top_k_route(logits, 2, True, interpret=INTERPRET)
  np.testing.assert_allclose(np.asarray(weights), [[4 / 7, 3 / 7], [0.5, 0.5]], rtol=1e-6)


@pytest.mark.parametrize(
  "tokens,experts,top_k,renormalize,dtype",
  [
    (1, 128, 8, True, jnp.bfloat16),  # Qwen3-30B-A3B, one token
    (37, 8, 2, True, jnp.float32),  # Mixtral, past two blocks of 16 tokens
    (5, 60, 4, False, jnp.float32),  # Qwen1.5-MoE's 60 experts: padded to 64
    (16, 16, 16, True, jnp.float16),  # K = E
  ],
)
def test_random_sweep_against_reference(tokens, experts, top_k, renormalize, dtype):
  rng = np.random.default_rng(tokens * experts)
  logits = jnp.asarray(rng.standard_normal((tokens, experts)) * 3, jnp.float32).astype(dtype)
  weights, ids = top_k_route(logits, top_k, renormalize, interpret=INTERPRET)
  want_weights, want_ids = top_k_route_reference(logits, top_k, renormalize)
  assert weights.dtype == jnp.float32 and ids.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
  np.testing.assert_allclose(np.asarray(weights), np.asarray(want_weights), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize(
  "logits,top_k,field",
  [
    (jnp.zeros((4,), jnp.float32), 2, "logits: expected"),
    (jnp.zeros((4, 8), jnp.int32), 2, "logits: expected"),
    (jnp.zeros((4, 8), jnp.float32), 9, "top_k: expected 1..8"),
    (jnp.zeros((4, 8), jnp.float32), 0, "top_k: expected 1..8"),
  ],
)
def test_bad_arguments_raise_value_errors(logits, top_k, field):
  with pytest.raises(ValueError, match="top_k_route: " + field):
    top_k_route(logits, top_k, True, interpret=True)


def test_route_lowers_to_the_kernel_for_cuda_only():
  """One Triton call and no TopK for CUDA; XLA's top_k elsewhere (on a CPU its result equals the
  reference; on a GPU the kernel's float32 weights agree to 1e-5)."""
  logits = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16)
  text = _lower_for_cuda(lambda x: route(x, 8, True), logits)
  assert _custom_call_targets(text) == {"__gpu$xla.gpu.triton"}
  assert 'name = "moe_router"' in text and "top_k" not in text.lower()
  x = jax.random.normal(jax.random.PRNGKey(0), (6, 16))
  (weights, ids), (want_weights, want_ids) = route(x, 4, True), top_k_route_reference(x, 4, True)
  np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
  np.testing.assert_allclose(np.asarray(weights), np.asarray(want_weights), rtol=1e-5, atol=1e-6)
