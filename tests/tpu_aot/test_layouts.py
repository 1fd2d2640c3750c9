"""`jaxserve compile-tpu --layouts`: data parallel x tensor parallel layouts of a v5e-8, each
replica's decode step compiled with libtpu and its roofline throughput (tpu_aot/layouts.py,
roofline.py), through the real command on a checkpoint directory holding only a config.json.

To keep CI fast the model is one Llama 3.1 8B layer with a 32,000-token vocabulary, and only the
decode step's programs compile (`--programs decode`: 2 per layout, about 30 s for the three
layouts). The whole 8B model's table, from `--programs largest`, is in docs/SCALE_OUT.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import platform
from pathlib import Path

import pytest
import transformers

from jaxserve.cli import main as cli_main
from jaxserve.tpu_aot.chips import get_chip
from tests.tpu_aot.conftest import RESULT_CACHE

pytestmark = pytest.mark.skipif(
  not (platform.system() == "Linux" and platform.machine() == "x86_64"),
  reason="libtpu is published for Linux x86-64 only",
)

V5E_8 = str(Path(__file__).resolve().parents[2] / "configs" / "v5e-8.yaml")
LAYOUTS = ("dp8tp1", "dp4tp2", "dp1tp8")
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 8, 128, 32_000
CONTEXT, MAX_SEQS, PAGE = 512, 16, 32


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict[str, dict], str]:
  """The command's JSON per layout and its printed table."""
  checkpoint = tmp_path_factory.mktemp("llama-1-layer")
  transformers.LlamaConfig(
    hidden_size=HIDDEN,
    intermediate_size=INTER,
    num_hidden_layers=1,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    vocab_size=VOCAB,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
  ).to_json_file(checkpoint / "config.json")
  out = checkpoint / "layouts.json"
  argv = ["compile-tpu", "--config", V5E_8, "--model", str(checkpoint), "--no-progress"]
  argv += ["--layouts", ",".join(LAYOUTS), "--programs", "decode", "--jobs", "2"]
  argv += ["--decode-context", str(CONTEXT), "--out", str(out), "--max-model-len", "2048"]
  argv += ["--set", f"scheduler.max_num_seqs={MAX_SEQS}", "--set", "dtype=bfloat16"]
  argv += ["--set", "scheduler.max_num_batched_tokens=32", "--result-cache", str(RESULT_CACHE)]
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    assert cli_main(argv) == 0
  return {entry["layout"]: entry for entry in json.loads(out.read_text())}, printed.getvalue()


def _weights_per_chip(tp: int) -> int:
  """One layer and both vocabulary matrices split tp ways, the norms whole, bfloat16."""
  layer = 2 * HIDDEN * HEADS * HEAD_DIM + 2 * HIDDEN * KV_HEADS * HEAD_DIM + 3 * HIDDEN * INTER
  return 2 * ((layer + 2 * VOCAB * HIDDEN) // tp + 3 * HIDDEN)


def test_every_layout_fits_with_its_decode_step_compiled(run):
  layouts, printed = run
  assert list(layouts) == list(LAYOUTS)
  for name, entry in layouts.items():
    report = entry["report"]
    assert report["fits"] and report["topology"] == "v5e:2x4", name
    assert report["tensor_parallel_size"] == entry["tensor_parallel_size"]
    names = {p["name"] for p in report["programs"]}
    assert names == {"forward[16x16]", "sampler[16] greedy"}, name
    assert abs(report["memory"]["weights"] - _weights_per_chip(entry["tensor_parallel_size"])) < (
      0.001 * report["memory"]["weights"]
    )
    assert name in printed
  assert "tok/s/rep" in printed


def test_the_roofline_from_the_compiled_costs(run):
  """Throughput = replicas x batch / max(bytes / 819 GB/s, FLOPs / 197 TFLOP/s), where the
  bytes are XLA's count of the compiled programs (at least the chip's weights) plus the KV pages
  the attention reads (batch x context tokens of this chip's kv heads), or at the floor the
  chip's weights once plus those KV reads."""
  chip = get_chip("v5e")
  for name, entry in run[0].items():
    decode, memory = entry["decode"], entry["report"]["memory"]
    tp, dp = entry["tensor_parallel_size"], entry["data_parallel_size"]
    assert decode["batch"] == MAX_SEQS and decode["context"] == CONTEXT
    assert decode["program_bytes"] >= memory["weights"]
    kv_per_token_per_chip = 2 * (KV_HEADS // tp or 1) * HEAD_DIM * 2  # one layer, K and V
    assert memory["page_bytes"] == PAGE * kv_per_token_per_chip
    assert decode["kv_bytes"] == MAX_SEQS * CONTEXT * kv_per_token_per_chip
    assert decode["attention_flops"] == 4 * MAX_SEQS * CONTEXT * (HEADS // tp) * HEAD_DIM
    step = max(
      (decode["program_bytes"] + decode["kv_bytes"]) / chip.hbm_bytes_per_s,
      (decode["program_flops"] + decode["attention_flops"]) / chip.peak_flops,
    )
    assert decode["step_seconds"] == pytest.approx(step)
    assert decode["tokens_per_s"] == pytest.approx(dp * MAX_SEQS / step)
    assert decode["bound"] == "memory", name  # 16 sequences: the weights' reads dominate
    # the floor: the chip's weights read once and the KV reads
    assert decode["weight_bytes"] == memory["weights"]
    floor = (memory["weights"] + decode["kv_bytes"]) / chip.hbm_bytes_per_s
    assert decode["ideal_step_seconds"] == pytest.approx(floor) and floor < step
    assert decode["ideal_tokens_per_s"] == pytest.approx(dp * MAX_SEQS / floor)


def test_data_parallel_decodes_more_than_one_sharded_replica(run):
  """Decode is memory bound: eight replicas each read their own weights and pages at once,
  one tp=8 replica reads an eighth of them 8 times faster but decodes one batch."""
  layouts = run[0]
  total = {name: layouts[name]["decode"]["tokens_per_s"] for name in LAYOUTS}
  replica = {name: layouts[name]["decode"]["tokens_per_s_per_replica"] for name in LAYOUTS}
  assert total["dp8tp1"] > total["dp4tp2"] > total["dp1tp8"]
  assert replica["dp8tp1"] < replica["dp4tp2"] < replica["dp1tp8"]
