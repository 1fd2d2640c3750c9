"""bench_structured on CPU: a random-weight checkpoint served with the synthetic byte-level BPE
tokenizer, every request under the JSON schema vs none, on one engine."""

from __future__ import annotations

import json

from jaxserve.bench import bench_structured
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
      "12",
      "--out",
      str(out),
    ]
  )
  assert code == 0
  result = json.loads(out.read_text())
  assert result["tokenizer_vocab"] == 402 and result["vocab_size"] == 512
  assert [row["concurrency"] for row in result["results"]] == [2, 4]
  for row in result["results"]:
    plain, constrained = row["unconstrained"], row["json_schema"]
    assert plain["output_tokens"] == row["concurrency"] * 12
    assert plain["masked_steps"] == 0 and constrained["masked_steps"] > 0
    assert 0 < constrained["output_tokens"] <= row["concurrency"] * 12
    assert plain["compilations"] == constrained["compilations"] == 0
    assert row["throughput_ratio"] == (
      constrained["output_tokens_per_s"] / plain["output_tokens_per_s"]
    )
  assert "concurrency 4:" in capsys.readouterr().out
