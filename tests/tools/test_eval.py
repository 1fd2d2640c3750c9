"""`jaxserve eval`: the shipped task files on tiny-random, and greedy / logprob parity with
transformers on tiny HF checkpoints."""

from __future__ import annotations

import json
import math

import pytest

from jaxserve.cli import main as jaxserve_main
from jaxserve.models.registry import load_model_tokenizer as load_tokenizer
from jaxserve.tools.eval_tasks import builtin_task_paths, load_task_file
from tests.tools.png_checks import assert_valid_png
from tests.tools.tool_helpers import SMALL_ENGINE_ARGS

BUILTIN = {"arithmetic", "capitals_mc", "short_texts_ppl"}


def _run_eval(model: str, out_dir, *extra: str) -> dict:
  code = jaxserve_main(
    ["eval", "--model", model, *SMALL_ENGINE_ARGS, "--out-dir", str(out_dir), *extra]
  )
  assert code == 0
  return json.loads((out_dir / "eval.json").read_text())


def _check_parity(parity: dict) -> None:
  assert parity["num_sequences"] > 0 and parity["num_scored_tokens"] > 0
  assert parity["sequence_agreement"] == 1.0 and parity["token_agreement"] == 1.0
  assert parity["max_abs_logprob_diff"] < 1e-3


def test_shipped_tasks_on_tiny_random_with_parity(tmp_path):
  assert {p.stem for p in builtin_task_paths()} == BUILTIN
  report = _run_eval("tiny-random", tmp_path, "--tasks", "builtin", "--parity-hf", "--plot")
  tasks = report["tasks"]
  assert set(tasks) == BUILTIN
  examples = {name: [e for e in report["examples"] if e["task"] == name] for name in BUILTIN}
  arithmetic = tasks["arithmetic"]["generate"]
  assert arithmetic["num_examples"] == len(load_task_file(builtin_task_paths()[0]).examples)
  assert arithmetic["accuracy"] == sum(e["correct"] for e in examples["arithmetic"]) / 12
  assert all(1 <= len(e["output_ids"]) <= 4 for e in examples["arithmetic"])
  choice = tasks["capitals_mc"]["multiple_choice"]
  assert 0.0 <= choice["acc"] <= 1.0 and 0.0 <= choice["acc_norm"] <= 1.0
  for e in examples["capitals_mc"]:
    assert len(e["choice_logprobs"]) == 4 and all(lp < 0 for lp in e["choice_logprobs"])
  # Every token after the first is scored: the byte tokenizer gives bos + one token per byte.
  tokenizer = load_tokenizer("tiny-random")
  texts = load_task_file(builtin_task_paths()[2]).examples
  ppl = tasks["short_texts_ppl"]["perplexity"]
  assert ppl["num_tokens"] == sum(len(tokenizer.encode(t.text)) - 1 for t in texts)
  assert ppl["perplexity"] == pytest.approx(math.exp(-ppl["mean_logprob"]))
  assert 1.0 < ppl["perplexity"] < math.inf
  _check_parity(report["parity"])
  markdown = (tmp_path / "eval.md").read_text()
  assert "| capitals_mc | multiple_choice | 12 | acc |" in markdown
  assert "## Parity with transformers" in markdown and "100.0%" in markdown
  assert_valid_png(tmp_path / "eval.png")


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_parity_with_transformers_on_hf_checkpoints(family, hf_checkpoint, tmp_path):
  report = _run_eval(
    str(hf_checkpoint(family)), tmp_path, "--tasks", "builtin", "--limit", "4", "--parity-hf"
  )
  assert report["parity"]["num_sequences"] == 4
  _check_parity(report["parity"])


def test_task_file_errors_name_the_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text(
    '{"type": "perplexity", "text": "fine"}\n'
    '{"type": "multiple_choice", "context": "c", "choices": ["a", "b"], "label": 2}\n'
  )
  with pytest.raises(ValueError, match=r"bad.jsonl:2: label"):
    load_task_file(path)
  path.write_text('{"type": "translate", "text": "x"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:1: type"):
    load_task_file(path)
  assert len(load_task_file(builtin_task_paths()[1], limit=3).examples) == 3
