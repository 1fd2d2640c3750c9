"""The TPU server compiled for real TPU topologies with libtpu, no TPU needed (jaxserve.tpu_aot).

libtpu comes with the test extra on Linux x86-64 (pyproject.toml), so there these tests run and
fail, never skip, without it. Within the CI budget of a 2-core machine they compile: every step
program (every bucket's forward, every sampler mode, prompt logprobs, decode bursts) of a tp=8
v5e-8 server with a small scheduler for Llama 3.2 1B cut to 2 layers and a 32,000-token
vocabulary (every kind of program; the forward's compile time grows with the layers and the
sampling programs' sorts with the vocabulary); every program of the shipped v5e-8 config's
largest bucket for Llama 3.1 8B, whose per-chip memory is checked against a hand computation;
and a config whose weights alone overflow a chip (the message for a total over HBM is checked in
test_tpu_aot_units.py). The full program sets of the shipped configs, 70B included, are
compiled by `jaxserve compile-tpu` and recorded in docs/SCALE_OUT.md.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from jaxserve.cli import main as cli_main
from jaxserve.config import load_config
from jaxserve.models.named_shapes import named_model_config
from jaxserve.tpu_aot.build import BuildReport, BuildRequest, build
from jaxserve.tpu_aot.chips import GIB, get_chip

pytestmark = pytest.mark.skipif(
  not (platform.system() == "Linux" and platform.machine() == "x86_64"),
  reason="libtpu is published for Linux x86-64 only",
)

V5E_8 = str(Path(__file__).resolve().parents[2] / "configs" / "v5e-8.yaml")
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
    vocab_size=32_000,
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


@pytest.fixture(scope="module")
def v5e_8b() -> BuildReport:
  return _build("llama-3.1-8b", [], "largest")


def _weights_per_chip_8b_tp8() -> int:
  """Llama 3.1 8B in bfloat16 over 8 chips, from the architecture: every projection and both
  vocabulary matrices split 8 ways, the RMSNorm scales replicated."""
  hidden, inter, layers, heads, kv_heads, head_dim, vocab = 4096, 14336, 32, 32, 8, 128, 128256
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
  assert len(names) == 6 and [r.error for r in v5e_8b.results if r.error] == []


def test_the_8b_server_fits_a_v5e_chip_with_the_hand_computed_weights(v5e_8b):
  memory, hand = v5e_8b.memory, _weights_per_chip_8b_tp8()
  assert v5e_8b.fits, v5e_8b.problems
  assert abs(memory.weights - hand) <= 0.01 * hand
  assert memory.total <= get_chip("v5e").usable_bytes < 16 * GIB
  # The pool the engine would allocate on the chip: the config's 0.95 of the chip's memory (all
  # of it is the TPU client's limit), less the weights and the streaming loader's slack (25% of
  # them: sharded weights are streamed), the allocator's headroom (2% of that share, at least
  # 0.5 GiB) and a tenth of the rest for the sharded step's unmeasured scratch, in pages holding
  # one kv head per chip: 32 layers x K,V x 32 tokens x 128 dims x 2 bytes.
  page = 32 * 2 * 32 * 128 * 2
  assert memory.page_bytes == page
  share = int(0.95 * get_chip("v5e").usable_bytes)
  slack = int(0.25 * memory.weights)
  budget = share - memory.weights - slack - max(GIB // 2, int(0.02 * share))
  assert memory.num_pages == (budget - int(0.1 * budget)) // page
  # The compiler's own count of the forward's arguments: the weights and the pool, plus the
  # step inputs (under 1%).
  forward = next(r for r in v5e_8b.results if r.id.kind == "forward")
  assert 0 <= forward.memory.arguments - (hand + memory.pool) <= 0.01 * hand


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
