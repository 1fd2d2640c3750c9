"""`jaxserve eval`: score JSONL task files (eval_tasks.py) through LLM.generate.

Every example becomes one or more engine queries, all submitted in one `generate` call:
* generate: the prompt, greedy, max_tokens from the example; scored by exact / contains match.
* multiple_choice: one query per choice, prompt = tokens(context) + tokens(choice) (the choice
  encoded without special tokens), max_tokens 1 and prompt_logprobs; the choice's score is the sum
  of its tokens' logprobs. acc takes the best sum, acc_norm the best sum per character of the choice
  (lm-eval's definitions).
* perplexity: prompt_logprobs of the text; perplexity = exp(-mean token logprob), pooled over
  every scored token of the file (the first token, having no context, is not scored).
With a transformers reference (eval_parity.py) the same token ids run through the HF model too.
Writes eval.json and eval.md (and eval.png with --plot) to the output directory.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.tools.eval_tasks import (
  GenerateExample,
  MultipleChoiceExample,
  PerplexityExample,
  TaskFile,
  load_task_file,
  resolve_task_paths,
)


@dataclass
class Query:
  """One engine request of one example; `first_scored` is the first prompt position scored."""

  task: str
  example_index: int
  choice_index: int | None
  prompt_ids: list[int]
  params: SamplingParams
  first_scored: int = 0
  output_ids: list[int] = field(default_factory=list)
  output_text: str = ""
  scored_logprobs: list[float] = field(default_factory=list)


def build_queries(tokenizer, tasks: Sequence[TaskFile]) -> list[Query]:
  greedy = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
  queries = []
  for task in tasks:
    for i, example in enumerate(task.examples):
      if isinstance(example, GenerateExample):
        queries.append(
          Query(
            task.name,
            i,
            None,
            tokenizer.encode(example.prompt),
            SamplingParams(temperature=0.0, max_tokens=example.max_tokens),
          )
        )
      elif isinstance(example, MultipleChoiceExample):
        context_ids = tokenizer.encode(example.context)
        for c, choice in enumerate(example.choices):
          choice_ids = tokenizer.encode(choice, add_special_tokens=False)
          queries.append(
            Query(task.name, i, c, context_ids + choice_ids, greedy, first_scored=len(context_ids))
          )
      else:
        queries.append(
          Query(task.name, i, None, tokenizer.encode(example.text), greedy, first_scored=1)
        )
  return queries


def run_queries(llm, queries: list[Query], use_tqdm: bool = True) -> None:
  """Runs every query through llm.generate and fills in its outputs and scored logprobs."""
  results = llm.generate(
    [q.prompt_ids for q in queries], [q.params for q in queries], use_tqdm=use_tqdm
  )
  for query, result in zip(queries, results, strict=True):
    completion = result.outputs[0]
    query.output_ids, query.output_text = list(completion.token_ids), completion.text
    if query.params.prompt_logprobs is not None:
      entries = result.prompt_logprobs[query.first_scored :]
      query.scored_logprobs = [entry.logprob for entry in entries]


def score_task(task: TaskFile, queries: Sequence[Query]) -> tuple[dict, list[dict]]:
  """Aggregate metrics per example type, and one record per example."""
  by_example: dict[int, list[Query]] = {}
  for query in queries:
    by_example.setdefault(query.example_index, []).append(query)
  records = [
    _score_example(task.name, i, example, by_example[i]) for i, example in enumerate(task.examples)
  ]
  metrics: dict = {}
  generate = [r for r in records if r["type"] == "generate"]
  if generate:
    metrics["generate"] = {
      "num_examples": len(generate),
      "accuracy": sum(r["correct"] for r in generate) / len(generate),
    }
  choice = [r for r in records if r["type"] == "multiple_choice"]
  if choice:
    metrics["multiple_choice"] = {
      "num_examples": len(choice),
      "acc": sum(r["correct"] for r in choice) / len(choice),
      "acc_norm": sum(r["correct_norm"] for r in choice) / len(choice),
    }
  texts = [r for r in records if r["type"] == "perplexity"]
  if texts:
    num_tokens = sum(r["num_tokens"] for r in texts)
    total = sum(r["sum_logprob"] for r in texts)
    metrics["perplexity"] = {
      "num_texts": len(texts),
      "num_tokens": num_tokens,
      "mean_logprob": total / num_tokens,
      "perplexity": math.exp(-total / num_tokens),
    }
  return metrics, records


def _score_example(task: str, index: int, example, queries: list[Query]) -> dict:
  base = {"task": task, "index": index}
  if isinstance(example, GenerateExample):
    text = queries[0].output_text
    correct = (
      text.strip() == example.answer.strip() if example.match == "exact" else example.answer in text
    )
    return {
      **base,
      "type": "generate",
      "answer": example.answer,
      "output": text,
      "correct": bool(correct),
      "output_ids": queries[0].output_ids,
    }
  if isinstance(example, MultipleChoiceExample):
    sums = [sum(q.scored_logprobs) for q in sorted(queries, key=lambda q: q.choice_index)]
    normed = [s / len(c) for s, c in zip(sums, example.choices, strict=True)]
    pred, pred_norm = _argmax(sums), _argmax(normed)
    return {
      **base,
      "type": "multiple_choice",
      "label": example.label,
      "choice_logprobs": sums,
      "pred": pred,
      "pred_norm": pred_norm,
      "correct": pred == example.label,
      "correct_norm": pred_norm == example.label,
    }
  assert isinstance(example, PerplexityExample)
  logprobs = queries[0].scored_logprobs
  return {
    **base,
    "type": "perplexity",
    "num_tokens": len(logprobs),
    "sum_logprob": sum(logprobs),
    "perplexity": math.exp(-sum(logprobs) / max(len(logprobs), 1)),
  }


def _argmax(values: Sequence[float]) -> int:
  return max(range(len(values)), key=lambda i: values[i])


def evaluate(
  llm, tasks: Sequence[TaskFile], hf_model_dir: str | None = None, use_tqdm: bool = True
) -> dict:
  """Scores `tasks` with `llm` (and, given a transformers checkpoint, checks parity)."""
  start = time.perf_counter()
  queries = build_queries(llm.tokenizer, tasks)
  run_queries(llm, queries, use_tqdm)
  from jaxserve.tools.kv_plan import model_config_for

  quantization = model_config_for(llm.config).quantization
  report: dict = {"model": llm.config.model, "quantization": quantization, "tasks": {}}
  report["examples"] = []
  for task in tasks:
    metrics, records = score_task(task, [q for q in queries if q.task == task.name])
    report["tasks"][task.name] = metrics
    report["examples"].extend(records)
  if hf_model_dir is not None:
    from jaxserve.tools.eval_parity import hf_parity

    report["parity"] = hf_parity(
      hf_model_dir, queries, llm.engine.eos_token_ids, model_config_for(llm.config).dtype, use_tqdm
    )
  report["elapsed_s"] = time.perf_counter() - start
  return report


def markdown_summary(report: dict) -> str:
  lines = [
    f"# Eval: {report['model']}"
    + ("" if report.get("quantization", "none") == "none" else f" ({report['quantization']})"),
    "",
    "| task | type | examples | metric | value |",
    "|---|---|---|---|---|",
  ]
  for task, metrics in report["tasks"].items():
    for kind, values in metrics.items():
      count = values.get("num_examples", values.get("num_texts"))
      for name, value in values.items():
        if name not in ("num_examples", "num_texts"):
          lines.append(f"| {task} | {kind} | {count} | {name} | {_fmt(value)} |")
  parity = report.get("parity")
  if parity:
    lines += [
      "",
      "## Parity with transformers",
      "",
      "| greedy sequences identical | greedy tokens agreeing | max abs logprob diff "
      "| scored tokens |",
      "|---|---|---|---|",
      f"| {100 * parity['sequence_agreement']:.1f}% ({parity['num_sequences']}) "
      f"| {100 * parity['token_agreement']:.1f}% ({parity['num_tokens']}) "
      f"| {parity['max_abs_logprob_diff']:.2e} | {parity['num_scored_tokens']} |",
    ]
  return "\n".join(lines) + "\n"


def _fmt(value) -> str:
  return f"{value:.4f}" if isinstance(value, float) else str(value)


def write_report(report: dict, out_dir: Path, plot: bool = False) -> list[Path]:
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = [out_dir / "eval.json", out_dir / "eval.md"]
  paths[0].write_text(json.dumps(report, indent=2))
  paths[1].write_text(markdown_summary(report))
  if plot:
    from jaxserve.tools.plots import metric_bars

    scores = {
      f"{task}/{name}": value
      for task, metrics in report["tasks"].items()
      for kind, values in metrics.items()
      for name, value in values.items()
      if name in ("accuracy", "acc", "acc_norm")
    }
    if scores:
      paths.append(
        metric_bars(scores, out_dir / "eval.png", title=report["model"], ylabel="accuracy")
      )
  return paths


def main(args) -> int:
  from jaxserve.config.cli_args import engine_config_from_args
  from jaxserve.entrypoints.llm import LLM

  config = engine_config_from_args(args)
  tasks = [load_task_file(path, args.limit) for path in resolve_task_paths(args.tasks)]
  llm = LLM(config.model, config=config)
  with tempfile.TemporaryDirectory(prefix="jaxserve-eval-") as scratch:
    hf_dir = None
    if args.parity_hf:  # a tiny-random export goes to a scratch directory unless --out-dir
      hf_dir = _hf_checkpoint_for(config.model, Path(args.out_dir or scratch))
    report = evaluate(llm, tasks, hf_dir)
  print(markdown_summary(report))
  if args.out_dir:
    for path in write_report(report, Path(args.out_dir), args.plot):
      print(f"wrote {path}")
  return 0


def _hf_checkpoint_for(model: str, out_dir: Path) -> str:
  from jaxserve.models.tiny_random import TINY_RANDOM_NAME

  if model == TINY_RANDOM_NAME:
    from jaxserve.tools.export_hf import export_tiny_random_hf

    return str(export_tiny_random_hf(out_dir / "tiny-random-hf"))
  if not (Path(model) / "config.json").is_file():
    raise ValueError(
      f"model: --parity-hf needs tiny-random or a Hugging Face checkpoint directory, got {model!r}"
    )
  return model
