"""The TPU server compiled for real TPU topologies with libtpu, no TPU needed (jaxserve.tpu_aot).

libtpu comes with the test extra on Linux x86-64 (pyproject.toml), so there these tests run and
fail, never skip, without it. Within the CI budget of a 2-core machine they compile: every step
program (every bucket's forward, every sampler mode, prompt logprobs, decode bursts) of a tp=8
v5e-8 server with a small scheduler for Llama 3.2 1B cut to 2 layers and a 1,024-token
vocabulary (every kind of program; the forward's compile time grows with the layers and the
random sampling programs' with the vocabulary: at 32,000 tokens the small server took twice the
CPU); the shipped v5e-8 config's largest bucket for Llama 3.1 8B cut to 2 layers (its whole 128k
vocabulary: its forward, prompt logprobs and the greedy and fullest sampler modes, the sorts of a
real vocabulary: `--programs largest`), whose per-chip memory is
checked against a hand computation, and the whole 32-layer server's plan (no compile);
and a config whose weights alone overflow a chip (the message for a total over HBM is checked in
test_tpu_aot_units.py). Quantized servers: the memory plans of Llama 3.1 70B with int8
projections and int8 KV pages on v5e-8 and of 8B on one v5e chip (configs/v5e-1.yaml), each
against a hand count of its 8-bit kernels, float32 scales and pages, and the largest forward of
the 70B shape cut to 2 layers with both int8, compiled for v5e:2x4 and for one chip. The full
program sets of the shipped configs, and the full 70B and 8B quantized servers, are compiled by
`jaxserve compile-tpu` and recorded in docs/SCALE_OUT.md.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from jaxserve.cli import main as cli_main
from jaxserve.config.loader import load_config
from jaxserve.models.named_shapes import named_model_config
from jaxserve.tpu_aot.build import (
  BuildReport,
  BuildRequest,
  build,
  compile_programs,
  largest_of_each_kind,
)
from jaxserve.tpu_aot.chips import GIB, get_chip, topology_devices
from jaxserve.tpu_aot.result_cache import CompileResultCache
from jaxserve.tpu_aot.step_programs import ServerShape, pool_pages, server_shape, step_programs
from tests.tpu_aot.conftest import RESULT_CACHE

pytestmark = pytest.mark.skipif(
  not (platform.system() == "Linux" and platform.machine() == "x86_64"),
  reason="libtpu is published for Linux x86-64 only",
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
V5E_8, V5E_1 = str(CONFIGS / "v5e-8.yaml"), str(CONFIGS / "v5e-1.yaml")
JOBS = 2  # programs compiled at once (the CI machine's cores)


def _build(shape: str, overrides: list[str], selection: str, **model_changes) -> BuildReport:
  config = load_config(V5E_8, overrides)
  return build(
    BuildRequest(
      config,
      named_model_config(shape).replace(**model_changes),
      shape,
      get_chip("v5e"),
      selection,
      JOBS,
      show_progress=False,
      result_cache=RESULT_CACHE,
    )
  )


def test_every_program_of_a_small_server_compiles_for_v5e_2x4():
  # Decode bursts on: their loop keeps copies of the KV pool (3 on this libtpu), so the process
  # is held at a fifth of the chip; at the shipped 0.95 a burst program does not fit.
  report = _build(
    "llama-3.2-1b",
    [
      "scheduler.max_num_seqs=8",
      "scheduler.max_num_batched_tokens=32",
      "scheduler.num_scheduler_steps=4",
      "max_model_len=2048",
      "cache.memory_fraction=0.2",
    ],
    "all",
    num_layers=2,
    vocab_size=1024,  # the 8B test below compiles the sampler over a real vocabulary
  )
  assert report.topology == "v5e:2x4"
  modes = ["greedy", "penalties+top", "random", "random+penalties+top"]  # SamplerMode.all()
  expected = {
    "forward[8x8]",
    "forward[8x16]",
    "forward[8x32]",
    "prompt_logprobs[8]",
    "prompt_logprobs[16]",
    "prompt_logprobs[32]",
    "burst[8x8] greedy",
    "burst[8x8] random",
  } | {f"sampler[8] {m}" for m in modes}
  assert {r.id.name for r in report.results} == expected
  assert report.num_programs == len(report.results) == len(expected)
  assert [r.error for r in report.results if r.error] == []
  assert report.fits, report.problems
  assert not report.memory.code_estimated and report.memory.headroom > 0


CUT_LAYERS = 2  # the compiled 8B server's layers (its forward compiles in a third of 32's time)


@pytest.fixture(scope="module")
def v5e_8b() -> BuildReport:
  """The shipped v5e-8 config's largest bucket of Llama 3.1 8B with its layers cut to
  CUT_LAYERS (everything else whole: 128k vocabulary, 128 x 1024 bucket); the 32-layer server's
  plan is test_the_whole_8b_server_fits_a_v5e_8, its full compile a documented command."""
  return _build("llama-3.1-8b", [], "largest", num_layers=CUT_LAYERS)


def _weights_per_chip_8b_tp8(layers: int = CUT_LAYERS) -> int:
  """Llama 3.1 8B in bfloat16 over 8 chips, from the architecture: every projection and both
  vocabulary matrices split 8 ways, the RMSNorm scales replicated."""
  hidden, inter, heads, kv_heads, head_dim, vocab = 4096, 14336, 32, 8, 128, 128256
  attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o; k, v
  mlp = 3 * hidden * inter
  sharded = layers * (attention + mlp) + 2 * vocab * hidden
  replicated = (2 * layers + 1) * hidden
  return 2 * (sharded // 8 + replicated)


def test_the_8b_servers_largest_bucket_compiles_for_v5e_2x4(v5e_8b):
  names = {r.id.name for r in v5e_8b.results}
  assert {
    "forward[128x1024]",
    "prompt_logprobs[1024]",
    "sampler[128] greedy",
    "sampler[128] random+penalties+top",
  } <= names
  assert len(names) == 4 and [r.error for r in v5e_8b.results if r.error] == []


def test_the_8b_server_fits_a_v5e_chip_with_the_hand_computed_weights(v5e_8b):
  memory, hand = v5e_8b.memory, _weights_per_chip_8b_tp8()
  assert v5e_8b.fits, v5e_8b.problems
  assert abs(memory.weights - hand) <= 0.01 * hand
  assert memory.total <= get_chip("v5e").usable_bytes < 16 * GIB
  # The pool the engine would allocate on the chip: the config's 0.95 of the chip's memory (all
  # of it is the TPU client's limit), less the weights and the streaming loader's slack (25% of
  # them: sharded weights are streamed), the allocator's headroom (2% of that share, at least
  # 0.5 GiB) and a tenth of the rest for the sharded step's unmeasured scratch, in pages holding
  # one kv head per chip: the layers x K,V x 32 tokens x 128 dims x 2 bytes.
  page = CUT_LAYERS * 2 * 32 * 128 * 2
  assert memory.page_bytes == page
  share = int(0.95 * get_chip("v5e").usable_bytes)
  slack = int(0.25 * memory.weights)
  budget = share - memory.weights - slack - max(GIB // 2, int(0.02 * share))
  assert memory.num_pages == (budget - int(0.1 * budget)) // page
  # The compiler's own count of the forward's arguments: the weights and the pool, plus the
  # step inputs (under 1%).
  forward = next(r for r in v5e_8b.results if r.id.kind == "forward")
  assert 0 <= forward.memory.arguments - (hand + memory.pool) <= 0.01 * hand


def test_the_whole_8b_server_fits_a_v5e_8():
  """The 32-layer server's plan (no compile): the hand-computed weights, the pool sized as
  above, and full-length sequences of the config's 32768 tokens in it."""
  server, pages = _plan(V5E_8, [], "llama-3.1-8b")
  hand = _weights_per_chip_8b_tp8(32)
  page = 32 * 2 * 32 * 128 * 2
  assert server.weight_bytes_per_chip == hand and server.page_bytes_per_chip == page
  assert pages == _hand_pages(hand, page)
  assert (pages - 1) * 32 // 32768 >= 8


def test_weights_over_hbm_fail_with_the_message(capsys):
  code = cli_main(
    ["compile-tpu", "--config", V5E_8, "--model-shape", "llama-3.1-70b", "--no-progress"]
  )
  err = capsys.readouterr().err
  assert code == 1
  assert (
    "does not fit: weights: llama-3.1-70b at tensor_parallel_size 8 needs 16.43 GiB per "
    "chip, over the 15.75 GiB usable HBM of a v5e chip by 0.68 GiB"
  ) in err


# Quantized servers: 8-bit kernels with float32 scales, 8-bit KV pages.


def _plan(config_path: str, overrides: list[str], shape: str) -> tuple[ServerShape, int]:
  """The server's weights per chip and its pool's pages, as build() sizes them (no compile)."""
  config = load_config(config_path, overrides)
  model = named_model_config(shape).replace(quantization=config.quantization)
  chip = get_chip("v5e")
  server = server_shape(config, model, topology_devices(chip.topology(config.tensor_parallel_size)))
  return server, pool_pages(server, chip.usable_bytes)


def _hand_pages(weights: int, page_bytes: int) -> int:
  """The pool as the engine sizes it on a v5e chip (the 8B test above spells it out): 0.95 of
  the chip, less the weights, the streaming loader's slack (a quarter of them) and the
  allocator's headroom, less a tenth for the unmeasured step scratch, in pages."""
  share = int(0.95 * get_chip("v5e").usable_bytes)
  budget = share - weights - int(0.25 * weights) - max(GIB // 2, int(0.02 * share))
  return (budget - int(0.1 * budget)) // page_bytes


def test_the_70b_int8_server_fits_a_v5e_8_with_int8_kv():
  """Llama 3.1 70B with int8 projections: 8.47 GiB per chip of v5e-8 (bfloat16's 16.43 GiB does
  not fit, test_weights_over_hbm_fail_with_the_message), with an int8 KV pool holding 5
  sequences of the config's 32768 tokens."""
  hidden, inter, layers, heads, kv_heads, head_dim, vocab = 8192, 28672, 80, 64, 8, 128, 128256
  q, kv = heads * head_dim, kv_heads * head_dim
  kernels = layers * (2 * hidden * q + 2 * hidden * kv + 3 * hidden * inter)  # int8, all split
  split_scales = layers * (q + 2 * kv + 2 * inter)  # q/k/v, gate/up: float32, split
  whole_scales = layers * 2 * hidden  # o, down: float32 on every chip
  vocab_weights = 2 * vocab * hidden  # embedding, lm_head: bfloat16, split
  norms = (2 * layers + 1) * hidden  # bfloat16, on every chip
  hand = (kernels + 4 * split_scales + 2 * vocab_weights) // 8 + 4 * whole_scales + 2 * norms
  server, pages = _plan(V5E_8, ["quantization=int8", "cache.kv_cache_dtype=int8"], "llama-3.1-70b")
  assert server.weight_bytes_per_chip == hand
  assert 8.4 * GIB < hand < 8.5 * GIB
  page = layers * 2 * 32 * head_dim * 1  # one kv head per chip, K and V, int8
  assert server.page_bytes_per_chip == page
  assert pages == _hand_pages(hand, page)
  assert (pages - 1) * 32 // 32768 == 5  # full-length sequences
  bf16_kv, bf16_pages = _plan(V5E_8, ["quantization=int8"], "llama-3.1-70b")
  assert bf16_kv.page_bytes_per_chip == 2 * page and bf16_pages == _hand_pages(hand, 2 * page)


def test_the_8b_int8_server_fits_one_v5e_chip():
  """configs/v5e-1.yaml: Llama 3.1 8B, int8 projections and KV pages, on one chip (bfloat16
  would need 14.96 GiB of weights alone)."""
  server, pages = _plan(V5E_1, [], "llama-3.1-8b")
  hidden, inter, layers, heads, kv_heads, head_dim, vocab = 4096, 14336, 32, 32, 8, 128, 128256
  q, kv = heads * head_dim, kv_heads * head_dim
  outs = layers * (q + 2 * kv + hidden + 2 * inter + hidden)  # every projection's out channels
  kernels = layers * (2 * hidden * q + 2 * hidden * kv + 3 * hidden * inter)
  hand = kernels + 4 * outs + 2 * vocab * hidden * 2 + (2 * layers + 1) * hidden * 2
  assert server.num_chips == 1 and server.weight_bytes_per_chip == hand
  page = layers * 2 * 32 * kv_heads * head_dim  # all 8 kv heads, int8
  assert server.page_bytes_per_chip == page and pages == _hand_pages(hand, page)
  assert (pages - 1) * 32 // 8192 == 6  # sequences of the config's 8192 tokens


@pytest.mark.parametrize("config_path", [V5E_8, V5E_1], ids=["v5e-8", "one-v5e-chip"])
def test_a_layer_cut_70b_int8_forward_with_int8_kv_compiles(config_path):
  """Two layers of the 70B shape, int8 projections, int8 KV pages read and written by the Pallas
  TPU kernels: the largest bucket's forward compiles, sharded over v5e:2x4 and on one chip (the
  sampler programs do not see the weights; the tests above compile them)."""
  config = load_config(
    config_path,
    [
      "quantization=int8",
      "cache.kv_cache_dtype=int8",
      "scheduler.max_num_seqs=8",
      "scheduler.max_num_batched_tokens=32",
      "max_model_len=2048",
    ],
  )
  model = named_model_config("llama-3.1-70b").replace(
    num_layers=2, vocab_size=32_000, quantization="int8"
  )
  chip = get_chip("v5e")
  server = server_shape(config, model, topology_devices(chip.topology(config.tensor_parallel_size)))
  pages = pool_pages(server, chip.usable_bytes)
  forwards = [p for p in step_programs(server, pages) if p.id.kind == "forward"]
  target = chip.topology(config.tensor_parallel_size)
  (forward,) = compile_programs(
    largest_of_each_kind(forwards), JOBS, False, CompileResultCache(RESULT_CACHE), target
  )
  assert forward.id.name == "forward[8x32]" and forward.error is None, forward.error
  # The compiler's own count of the forward's arguments: the int8 kernels, float32 scales and
  # int8 pool the plan counted (server_shape, pool_pages), plus the step inputs.
  resident = server.weight_bytes_per_chip + pages * server.page_bytes_per_chip
  assert 0 <= forward.memory.arguments - resident <= 2**20
  assert forward.memory.temporaries + forward.memory.code < GIB
