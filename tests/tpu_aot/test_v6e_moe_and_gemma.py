"""Qwen3-30B-A3B with expert parallelism and Gemma 3 27B on a v6e-8 (configs/v6e-8.yaml), built
as jaxserve.tpu_aot builds them: the whole 48- and 62-layer servers' memory plans (no compile)
against hand counts of their per-chip weights and pages, and the forward of each shape cut to
2 layers (one sliding and one global layer for Gemma) and a 32,000-token vocabulary, compiled for
v6e:2x4 (the experts' grouped matmuls through XLA's TPU ragged dot; Gemma's windows and
soft-capping through the Pallas TPU attention kernel). The full programs are compiled by
`jaxserve compile-tpu` and recorded in docs/SCALE_OUT.md.
"""

from __future__ import annotations

import platform
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxserve.config.loader import load_config
from jaxserve.models.grouped_matmul import grouped_matmul
from jaxserve.models.named_shapes import named_model_config
from jaxserve.tpu_aot.build import compile_programs, largest_of_each_kind
from jaxserve.tpu_aot.chips import GIB, get_chip, topology_devices
from jaxserve.tpu_aot.result_cache import CompileResultCache
from jaxserve.tpu_aot.step_programs import ServerShape, pool_pages, server_shape, step_programs
from tests.tpu_aot.conftest import RESULT_CACHE

pytestmark = pytest.mark.skipif(
  not (platform.system() == "Linux" and platform.machine() == "x86_64"),
  reason="libtpu is published for Linux x86-64 only",
)

V6E_8 = str(Path(__file__).resolve().parents[2] / "configs" / "v6e-8.yaml")
EXPERT_PARALLEL = ["enable_expert_parallel=true"]
SMALL_SCHEDULER = [
  "scheduler.max_num_seqs=8",
  "scheduler.max_num_batched_tokens=32",
  "max_model_len=2048",
]
CHIPS, MAX_MODEL_LEN, PAGE = 8, 16384, 32  # the shipped v6e-8 config's


def _server(shape: str, overrides: list[str], **model_changes) -> tuple[ServerShape, int]:
  config = load_config(V6E_8, overrides)
  model = named_model_config(shape).replace(**model_changes)
  chip = get_chip("v6e")
  server = server_shape(config, model, topology_devices(chip.topology(CHIPS)))
  return server, pool_pages(server, chip.usable_bytes)


def _hand_pages(weights: int, page_bytes: int) -> int:
  """The pool as the engine sizes it on a v6e chip (tests/tpu_aot/test_compile_tpu.py spells it
  out): 0.95 of the chip, less the weights, the streaming loader's slack (a quarter of them) and
  the allocator's headroom, less a tenth for the unmeasured step scratch, in pages."""
  share = int(0.95 * get_chip("v6e").usable_bytes)
  budget = share - weights - int(0.25 * weights) - max(GIB // 2, int(0.02 * share))
  return (budget - int(0.1 * budget)) // page_bytes


def test_the_qwen3_moe_server_fits_a_v6e_8_with_expert_parallelism():
  """48 layers, 128 experts of 2048 x 768: 16 whole experts per chip, attention split by head
  (its 4 kv heads each repeated on 2 chips, one per chip), in bfloat16."""
  server, pages = _server("qwen3-30b-a3b", EXPERT_PARALLEL)
  hidden, layers, vocab, head_dim = 2048, 48, 151936, 128
  split = (
    layers
    * (
      2 * hidden * 32 * head_dim  # q, o
      + 2 * hidden * CHIPS * head_dim  # k, v: 8 (repeated) kv heads
      + 128 * 3 * hidden * 768  # the experts
    )
    + 2 * vocab * hidden
  )  # embedding, lm_head
  whole = layers * (2 * hidden + 2 * head_dim + hidden * 128) + hidden  # norms, router
  hand = 2 * (split // CHIPS + whole)
  assert server.weight_bytes_per_chip == hand
  assert 7.1 * GIB < hand < 7.2 * GIB
  page = layers * 2 * PAGE * head_dim * 2  # one kv head per chip, K and V
  assert server.page_bytes_per_chip == page and pages == _hand_pages(hand, page)
  assert (pages - 1) * PAGE // MAX_MODEL_LEN == 48  # full-length sequences (page 0 is null)
  experts = server.placement.model.params["layers_0"]["mlp"]["experts"]["gate_proj"]
  assert experts.sharding.spec == P("model", None, None)
  assert experts.sharding.shard_shape(experts.shape) == (16, hidden, 768)


def test_the_gemma3_27b_server_fits_a_v6e_8():
  """62 layers, 32 q and 16 kv heads of 128 (2 kv heads per chip), tied embeddings. KV groups
  (models/kv_layout.py): the 10 global layers are one group and the 52 sliding ones 6 more
  (8 slots padded), so a page holds 10 layers' K and V; a 16384-token sequence holds every page
  of the global group and, per sliding group, the pages its 1024-token window sees."""
  server, pages = _server("gemma-3-27b", [])
  hidden, layers, vocab, head_dim = 5376, 62, 262208, 128
  split = layers * (2 * hidden * 32 * head_dim + 2 * hidden * 16 * head_dim + 3 * hidden * 21504)
  split += vocab * hidden  # the tied embedding
  whole = layers * (4 * hidden + 2 * head_dim) + hidden  # Gemma's four norms, q/k norms
  hand = 2 * (split // CHIPS + whole)
  assert server.weight_bytes_per_chip == hand
  assert 6.2 * GIB < hand < 6.4 * GIB
  slots = 10  # layers a page holds: the global layers' count
  page = slots * 2 * PAGE * 2 * head_dim * 2
  assert server.page_bytes_per_chip == page and pages == _hand_pages(hand, page)
  per_sequence = MAX_MODEL_LEN // PAGE + 6 * (-(-1023 // PAGE) + 1)  # 512 + 6 x 33 pages
  assert (pages - 1) // per_sequence == 88  # 19 without window freeing


@pytest.mark.parametrize(
  "shape, overrides",
  [("qwen3-30b-a3b", EXPERT_PARALLEL), ("gemma-3-27b", [])],
  ids=["qwen3-moe-ep8", "gemma3-27b"],
)
def test_a_layer_cut_forward_compiles_for_v6e_2x4(shape, overrides):
  layer_types = named_model_config(shape).layer_types[4:6]  # Gemma: a sliding, then a global
  server, pages = _server(
    shape, overrides + SMALL_SCHEDULER, num_layers=2, vocab_size=32_000, layer_types=layer_types
  )
  forwards = [p for p in step_programs(server, pages) if p.id.kind == "forward"]
  target = get_chip("v6e").topology(CHIPS)
  (forward,) = compile_programs(
    largest_of_each_kind(forwards), 1, False, CompileResultCache(RESULT_CACHE), target
  )
  assert forward.id.name == "forward[8x32]" and forward.error is None, forward.error
  # The compiler's own count of the forward's arguments: the weights and pool the plan counted,
  # plus the step inputs.
  resident = server.weight_bytes_per_chip + pages * server.page_bytes_per_chip
  assert 0 <= forward.memory.arguments - resident <= 2**20
  assert forward.memory.temporaries + forward.memory.code < GIB


def test_ragged_dot_compiles_to_a_tpu_grouped_matmul_kernel():
  """models/grouped_matmul.py's one op on TPU: XLA lowers jax.lax.ragged_dot to libtpu's Mosaic
  kernels (a metadata kernel tiling the groups, then the grouped matmul over row tiles), not to a
  dense product over every group, so no Pallas grouped matmul of our own is needed there."""
  (device,) = topology_devices("v6e:1x1")
  whole = NamedSharding(Mesh(np.array([device]), ("model",)), P())
  rows, weights, groups = (
    jax.ShapeDtypeStruct(shape, dtype, sharding=whole)
    for shape, dtype in (
      ((2048, 2048), jnp.bfloat16),  # [M, K]: 256 tokens x top-8, hidden 2048
      ((128, 2048, 768), jnp.bfloat16),  # [E, K, N]: Qwen3-30B-A3B's gate_proj
      ((128,), jnp.int32),
    )
  )
  compiled = jax.jit(grouped_matmul).lower(rows, weights, groups).compile()
  text = compiled.as_text()
  assert 'custom_call_target="tpu_custom_call"' in text
  assert "ragged-dot-metadata" in text and "ragged_dot_tiling" in text
  assert compiled.memory_analysis().temp_size_in_bytes < 2**20  # no [E, M, N] dense product
