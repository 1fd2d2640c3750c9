"""The weight bytes one decode token reads, against hand counts from the published shapes."""

from __future__ import annotations

import json

from jaxserve.bench.active_weights import active_weight_bytes, main, weight_bytes
from jaxserve.models.named_shapes import named_model_config


def test_a_mixture_of_experts_reads_its_routed_share_of_the_experts():
  """Qwen3-30B-A3B: every weight outside the experts (the embedding by one row), and 8 of each
  layer's 128 experts."""
  hidden, layers, vocab = 2048, 48, 151936
  attention = 2 * hidden * 32 * 128 + 2 * hidden * 4 * 128 + 2 * 128
  per_layer = attention + 2 * hidden + hidden * 128  # norms, router
  dense = layers * per_layer + hidden + vocab * hidden + hidden  # embedding row, lm_head, norm
  experts = layers * 8 * 3 * hidden * 768
  config = named_model_config("qwen3-30b-a3b")
  assert active_weight_bytes(config) == 2 * (dense + experts) == 6_083_739_648
  assert weight_bytes(config) == 2 * 30_532_122_624


def test_a_tied_dense_model_reads_every_weight(capsys):
  """Gemma 3 12B's tied embedding is the output projection: all of it is read."""
  assert main(["gemma-3-12b"]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result["active_weight_bytes"] == result["weight_bytes"] == 2 * 11_766_034_176
  untied = named_model_config("llama-3.1-8b")
  assert weight_bytes(untied) - active_weight_bytes(untied) == 2 * (128256 - 1) * 4096
