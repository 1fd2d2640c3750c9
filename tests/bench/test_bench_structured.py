"""bench_structured on CPU: a random-weight checkpoint served with the synthetic byte-level BPE
tokenizer, every request under the JSON schema vs none, on one engine; and the runs it refuses or
warns about instead of printing a ratio that measured nothing (a tokenizer that cannot write the
JSON, an output budget too short for any document, requests all cut by max_tokens)."""

from __future__ import annotations

import json

import pytest

from jaxserve.bench import bench_structured
from jaxserve.bench.structured_workload import check_workload
from jaxserve.bench.vocab_tokenizer import write_vocab_tokenizer
from jaxserve.structured import GrammarCompiler, build_llg_tokenizer
from jaxserve.tokenizer import byte_level_tokenizer
from jaxserve.tokenizer.tokenizer import load_tokenizer_dir
from tests.tools.tool_helpers import SMALL_ENGINE_ARGS


def test_json_schema_vs_unconstrained_on_one_engine(hf_checkpoint, tmp_path, capsys):
  out = tmp_path / "structured.json"
  code = bench_structured.main(
    [
      *SMALL_ENGINE_ARGS,
      "--model",
      str(hf_checkpoint("qwen2")),
      "--synthetic-bpe-vocab",
      "400",
      "--concurrency",
      "2",
      "4",
      "--input-len",
      "8",
      "--output-len",
      "160",
      "--out",
      str(out),
    ]
  )
  assert code == 0
  result = json.loads(out.read_text())
  assert result["tokenizer_vocab"] == 402 and result["vocab_size"] == 512
  assert 0 < result["minimal_document_tokens"] < 160
  assert [row["concurrency"] for row in result["results"]] == [2, 4]
  printed = capsys.readouterr().out
  for row in result["results"]:
    plain, constrained = row["unconstrained"], row["json_schema"]
    assert sum(constrained["finish_reasons"].values()) == row["concurrency"]
    assert set(constrained["finish_reasons"]) <= {"stop", "length"}
    assert 0 < constrained["valid_documents"] <= constrained["finish_reasons"].get("stop", 0)
    # each unconstrained twin writes as many tokens as its constrained request did
    assert plain["tokens_per_request"] == constrained["tokens_per_request"]
    assert plain["masked_steps"] == 0 and constrained["masked_steps"] > 0
    assert plain["compilations"] == constrained["compilations"] == 0
    assert row["throughput_ratio"] == (
      constrained["output_tokens_per_s"] / plain["output_tokens_per_s"]
    )
    words = ", ".join(f"{k}: {v}" for k, v in sorted(constrained["finish_reasons"].items()))
    assert f"concurrency {row['concurrency']}:" in printed and f"(finish {words})" in printed
  assert "FinishReason" not in printed


def test_requests_all_cut_by_max_tokens_warn_and_exit_nonzero(capsys):
  """tiny-random's byte tokenizer can write the JSON, but greedy decoding writes documents of
  ~200 bytes: 110 tokens hold the smallest document (104) and none that it writes."""
  code = bench_structured.main(
    [*SMALL_ENGINE_ARGS, "--concurrency", "2", "--input-len", "8", "--output-len", "110"]
  )
  captured = capsys.readouterr()
  assert code == 1
  assert "valid documents 0 of 2 (finish length: 2)" in captured.out
  assert "WARNING: bench structured: at concurrency 2 only 0 of 2" in captured.err


def test_workloads_that_cannot_write_a_document_are_refused(tmp_path):
  byte = byte_level_tokenizer()
  byte_compiler = GrammarCompiler(*build_llg_tokenizer(byte, 512))
  assert check_workload(byte, byte_compiler, 256) == 104  # one token per byte
  with pytest.raises(ValueError, match=r"output_len: 32 tokens are fewer .* \(104 with this"):
    check_workload(byte, byte_compiler, 32)
  write_vocab_tokenizer(tmp_path, 1024, 1, [2])  # a random checkpoint's word-level tokenizer
  words = load_tokenizer_dir(tmp_path)
  with pytest.raises(ValueError, match="tokenizer: cannot write the schema's JSON"):
    check_workload(words, GrammarCompiler(*build_llg_tokenizer(words, 1024)), 256)


def test_the_module_refuses_in_one_line(capsys):
  """`python -m jaxserve.bench.bench_structured` with the old default of 32 output tokens on
  tiny-random: exit 2 and the reason, not a ratio."""
  code = bench_structured.main([*SMALL_ENGINE_ARGS, "--concurrency", "2", "--output-len", "32"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and err[-1].startswith("bench_structured: error: output_len: 32 tokens")
