"""The gated MLP every dense family shares: down(act(gate(x)) * up(x)), with the family's
activation (`DecoderBlocks.activation`, models/layers/decoder.py: SiLU for the Llama family and
Qwen, tanh GELU for Gemma).

Params (H hidden, I intermediate): {gate,up}_proj/kernel [H, I], down_proj/kernel [I, H]; with
`fused_projections` gate/up are one gate_up_proj/kernel [H, 2*I], split after its GEMM. Each GEMM
is models/layers/attention.py's `projection`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxserve.models.invariant_dense import DenseBackend
from jaxserve.models.layers.attention import projection
from jaxserve.models.model_config import ModelConfig

Activation = Callable[[jax.Array], jax.Array]


def gelu_tanh(x: jax.Array) -> jax.Array:
  """GELU, tanh approximation (transformers' gelu_pytorch_tanh)."""
  return nn.gelu(x, approximate=True)


class MLP(nn.Module):
  config: ModelConfig
  activation: Activation
  dense: DenseBackend | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.config
    if cfg.fused_projections:
      gate_up = projection(cfg, self.dense, 2 * cfg.intermediate_size, "column", "gate_up_proj")(
        x
      )  # [T, 2I]
      gate, up = jnp.split(gate_up, 2, axis=1)  # [T, I] each
    else:
      gate = projection(cfg, self.dense, cfg.intermediate_size, "column", "gate_proj")(x)
      up = projection(cfg, self.dense, cfg.intermediate_size, "column", "up_proj")(x)
    down = projection(cfg, self.dense, cfg.hidden_size, "row", "down_proj")
    return down(self.activation(gate) * up)  # [T, H]
