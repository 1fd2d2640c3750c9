"""lm-evaluation-harness against a real server: /tokenizer_info through lm-eval's own
RemoteTokenizer, then README's `lm_eval` command (its --model_args as written, the base URL
pointed at the test server) on two tiny local tasks, one generate_until and one
multiple_choice, whose answers are checked against the server's own completions and scores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

lm_eval_utils = pytest.importorskip("lm_eval.utils")

README = Path(__file__).resolve().parents[2] / "README.md"
DOC_URL = "http://localhost:8000"
GEN_DOCS = [
  {"question": "Q: 1+1=", "answer": "2"},
  {"question": "Q: say hi", "answer": "hi"},
  {"question": "Once upon a", "answer": "time"},
]
MC_DOCS = [
  {"question": "The capital of France is", "choices": [" Paris", " Rome", " Oslo"], "answer": 0},
  {"question": "Two plus two is", "choices": [" four", " five"], "answer": 0},
  {"question": "The sky is", "choices": [" blue", " green", " red"], "answer": 0},
]


def test_remote_tokenizer_reads_tokenizer_info(served):
  remote = lm_eval_utils.RemoteTokenizer(f"{served.url}/v1/completions")
  tokenizer = served.tokenizer
  assert remote.eos_token == "</s>" and remote.bos_token == "<s>"
  assert remote.eos_token_id == tokenizer.eos_token_ids[0]
  assert remote.bos_token_id == tokenizer.bos_token_id
  text = "Héllo, world"
  ids = remote.encode(text)
  assert ids == tokenizer.encode(text, add_special_tokens=False)  # no bos: lm-eval adds its own
  assert remote.decode(ids) == text
  messages = [{"role": "user", "content": "Hi!"}]
  assert remote.apply_chat_template(messages, bos_token="<s>") == tokenizer.apply_chat_template(
    messages
  )
  info = remote.tokenizer_info
  assert info["model_max_length"] == served.max_model_len
  assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
  assert info["pad_token"] is None and info["eos_token_ids"] == list(tokenizer.eos_token_ids)
  assert lm_eval_utils.check_remote_tokenizer_support(f"{served.url}/v1/completions")


def _readme_model_args() -> str:
  """--model_args of README's lm_eval command."""
  text = README.read_text().replace("\\\n", " ")
  (command,) = [line for line in text.splitlines() if line.strip().startswith("lm_eval ")]
  return re.search(r"--model_args (\S+)", command).group(1)


def _write_tasks(directory: Path) -> None:
  for name, docs in (("gen", GEN_DOCS), ("mc", MC_DOCS)):
    with open(directory / f"{name}.jsonl", "w") as f:
      f.writelines(json.dumps(doc) + "\n" for doc in docs)
  common = (
    "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {path}\n"
    'test_split: test\ndoc_to_text: "{{{{question}}}}"\n'
  )
  (directory / "gen.yaml").write_text(
    "task: jaxserve_tiny_gen\noutput_type: generate_until\n"
    + common.format(path=directory / "gen.jsonl")
    + 'doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["\\n"]\n'
    "  max_gen_toks: 8\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n"
  )
  (directory / "mc.yaml").write_text(
    "task: jaxserve_tiny_mc\noutput_type: multiple_choice\n"
    + common.format(path=directory / "mc.jsonl")
    + 'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
    "metric_list:\n  - metric: acc\n"
  )


def _samples(out_dir: Path, task: str) -> list[dict]:
  (path,) = out_dir.rglob(f"samples_{task}_*.jsonl")
  return [json.loads(line) for line in path.read_text().splitlines()]


def _score(url: str, ids: list[int]) -> list[float | None]:
  body = {"prompt": ids, "echo": True, "max_tokens": 0, "logprobs": 1}
  response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
  response.raise_for_status()
  return response.json()["choices"][0]["logprobs"]["token_logprobs"]


def test_lm_eval_local_completions_both_output_types(served, tmp_path):
  model_args = _readme_model_args()
  assert "tokenizer_backend=remote" in model_args
  model_args = model_args.replace(DOC_URL, served.url)
  _write_tasks(tmp_path)
  out_dir = tmp_path / "results"
  env = {
    **os.environ,
    "HF_HOME": str(tmp_path / "hf"),
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
  }
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "lm_eval",
      "--model",
      "local-completions",
      "--model_args",
      model_args,
      "--tasks",
      "jaxserve_tiny_gen,jaxserve_tiny_mc",
      "--include_path",
      str(tmp_path),
      "--output_path",
      str(out_dir),
      "--log_samples",
    ],
    capture_output=True,
    text=True,
    timeout=600,
    env=env,
  )
  assert run.returncode == 0, run.stderr[-4000:]
  (results_path,) = out_dir.rglob("results_*.json")
  results = json.loads(results_path.read_text())["results"]
  assert 0.0 <= results["jaxserve_tiny_mc"]["acc,none"] <= 1.0
  assert 0.0 <= results["jaxserve_tiny_gen"]["exact_match,none"] <= 1.0

  tokenizer = served.tokenizer
  generated = _samples(out_dir, "jaxserve_tiny_gen")
  assert len(generated) == len(GEN_DOCS)
  for sample in generated:
    body = {
      "prompt": tokenizer.encode(sample["doc"]["question"], add_special_tokens=False),
      "max_tokens": 8,
      "temperature": 0,
      "stop": ["\n"],
    }
    expected = httpx.post(f"{served.url}/v1/completions", json=body, timeout=60).json()
    assert sample["resps"][0][0] == expected["choices"][0]["text"]

  scored = _samples(out_dir, "jaxserve_tiny_mc")
  assert len(scored) == len(MC_DOCS)
  for sample in scored:
    pairs = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
    assert [c for _, c in pairs] == [" " + choice for choice in sample["doc"]["choices"]]
    for (context, continuation), response in zip(pairs, sample["resps"], strict=True):
      whole = tokenizer.encode(context + continuation, add_special_tokens=False)
      num_context = len(tokenizer.encode(context, add_special_tokens=False))
      logprobs = _score(served.url, whole)  # lm-eval's _encode_pair, then its request
      assert float(response[0][0]) == pytest.approx(sum(logprobs[num_context:]), abs=1e-4)
