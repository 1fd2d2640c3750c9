"""`jaxserve eval` and `jaxserve bench` with --quantization.

Perplexity: a tiny trained checkpoint (tests/tools/trained_checkpoint.py: trained on Python's
documentation, saved in bfloat16) scored on `jaxserve eval`'s perplexity data
(jaxserve/tools/data/short_texts_ppl.jsonl) in bfloat16 and in each scheme, quantized as it
loads, through the command a user runs. The bfloat16 figure is checked against transformers on
the same checkpoint and token ids (float32 arithmetic), the trained model against what its
training text's token frequencies alone score (and the uniform distribution's perplexity, the
vocabulary size), and each scheme against bfloat16."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import transformers

from jaxserve.cli import main as jaxserve_main
from jaxserve.models.registry import load_model_tokenizer
from jaxserve.tools.eval_tasks import load_task_file
from tests.tools.tool_helpers import SMALL_ENGINE_ARGS
from tests.tools.trained_checkpoint import CONFIG, train_tiny_llama, training_tokens

TASK = "jaxserve/tools/data/short_texts_ppl.jsonl"
# The largest relative perplexity change of each scheme against bfloat16. Measured on CPU with
# JAX 0.10.2: fp8 -0.28%, fp8_w8a16 -0.03%, int8 -0.02%, int8_w8a8 -0.08% (bfloat16 14.89).
MAX_CHANGE = {"fp8": 0.02, "fp8_w8a16": 0.02, "int8": 0.01, "int8_w8a8": 0.01}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  return train_tiny_llama(tmp_path_factory.mktemp("trained") / "tiny-llama")


def _eval_perplexity(model: str, quantization: str, out_dir) -> dict:
  argv = ["eval", "--model", model, "--tasks", TASK, "--quantization", quantization]
  assert jaxserve_main([*argv, *SMALL_ENGINE_ARGS, "--out-dir", str(out_dir)]) == 0
  report = json.loads((out_dir / "eval.json").read_text())
  assert report["quantization"] == quantization
  return report["tasks"]["short_texts_ppl"]["perplexity"]


def _unigram_perplexity(tokenizer) -> float:
  """The perplexity of the training text's token frequencies (add-one smoothed): what a model
  that learned nothing but them scores."""
  counts = np.bincount(training_tokens(), minlength=CONFIG.vocab_size) + 1.0
  logprobs = np.log(counts / counts.sum())
  scored = [i for e in load_task_file(TASK).examples for i in tokenizer.encode(e.text)[1:]]
  return math.exp(-logprobs[scored].mean())


def _transformers_perplexity(model_dir) -> tuple[float, int]:
  """exp(-mean logprob) of every token after the first, as the eval scores them."""
  model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
  tokenizer = load_model_tokenizer(str(model_dir))
  total, count = 0.0, 0
  for example in load_task_file(TASK).examples:
    ids = torch.tensor([tokenizer.encode(example.text)])
    with torch.no_grad():
      logprobs = torch.log_softmax(model(ids).logits[0, :-1], dim=-1)
    total += float(logprobs.gather(1, ids[0, 1:, None]).sum())
    count += ids.shape[1] - 1
  return math.exp(-total / count), count


def test_perplexity_of_each_scheme_against_bfloat16(trained, tmp_path):
  results = {q: _eval_perplexity(str(trained), q, tmp_path / q) for q in ("none", *MAX_CHANGE)}
  bf16 = results["none"]["perplexity"]
  reference, count = _transformers_perplexity(trained)
  print(f"\nperplexity on {TASK} ({count} tokens): transformers float32 {reference:.3f}")
  for name, result in results.items():
    change = result["perplexity"] / bf16 - 1
    print(f"  {name:<10} {result['perplexity']:.3f} ({100 * change:+.2f}% against bfloat16)")
  assert all(result["num_tokens"] == count for result in results.values())
  assert bf16 == pytest.approx(reference, rel=5e-3)
  unigram = _unigram_perplexity(load_model_tokenizer(str(trained)))
  print(f"  token frequencies of the training text {unigram:.3f}, uniform {CONFIG.vocab_size}")
  assert bf16 < 0.8 * unigram < CONFIG.vocab_size
  for name, bound in MAX_CHANGE.items():
    assert abs(results[name]["perplexity"] / bf16 - 1) <= bound, name


def test_bench_throughput_runs_quantized(tmp_path):
  out = tmp_path / "throughput.json"
  argv = ["bench", "throughput", *SMALL_ENGINE_ARGS, "--quantization", "int8"]
  argv += ["--kv-cache-dtype", "int8", "--num-prompts", "8", "--input-len", "24"]
  assert jaxserve_main([*argv, "--output-len", "8", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert (result["quantization"], result["kv_cache_dtype"]) == ("int8", "int8")
  ours = result["jaxserve"]
  assert ours["output_tokens"] == 8 * 8 and ours["all_outputs_full_length"]
  assert ours["compilations_after_warmup"] == 0
  assert ours["output_tokens_per_s"] == pytest.approx(ours["output_tokens"] / ours["elapsed_s"])
