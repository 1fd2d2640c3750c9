"""Eval task files: JSONL, one example per line, each with a "type".

  {"type": "generate", "prompt": str, "answer": str, "match": "exact" | "contains",
   "max_tokens": int}
      greedy completion; "exact" compares the stripped completion with the stripped answer,
      "contains" looks for the answer in the completion.
  {"type": "multiple_choice", "context": str, "choices": [str, ...], "label": int}
      each choice is scored by the summed logprob of its tokens after the context.
  {"type": "perplexity", "text": str}
      token-level perplexity of the text.

A file may mix types. Errors name the file, the line and the field. The shipped tasks live in
data/ next to this module (`builtin_task_paths`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MATCH_MODES = ("exact", "contains")
DATA_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True)
class GenerateExample:
  prompt: str
  answer: str
  match: str = "contains"
  max_tokens: int = 16


@dataclass(frozen=True)
class MultipleChoiceExample:
  context: str
  choices: tuple[str, ...]
  label: int


@dataclass(frozen=True)
class PerplexityExample:
  text: str


Example = GenerateExample | MultipleChoiceExample | PerplexityExample


@dataclass(frozen=True)
class TaskFile:
  name: str
  path: Path
  examples: tuple[Example, ...]


def builtin_task_paths() -> list[Path]:
  return sorted(DATA_DIR.glob("*.jsonl"))


def resolve_task_paths(spec: str) -> list[Path]:
  """`builtin` or a comma-separated list of JSONL files."""
  if spec.strip() == "builtin":
    return builtin_task_paths()
  paths = [Path(item.strip()) for item in spec.split(",") if item.strip()]
  if not paths:
    raise ValueError("tasks: no task files given")
  return paths


def load_task_file(path: str | Path, limit: int | None = None) -> TaskFile:
  path = Path(path)
  if not path.is_file():
    raise ValueError(f"tasks: file not found: {path}")
  examples = []
  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
    if not line.strip():
      continue
    where = f"{path}:{number}"
    try:
      record = json.loads(line)
    except json.JSONDecodeError as err:
      raise ValueError(f"{where}: invalid JSON: {err}") from err
    examples.append(parse_example(record, where))
    if limit is not None and len(examples) >= limit:
      break
  if not examples:
    raise ValueError(f"{path}: no examples")
  return TaskFile(path.stem, path, tuple(examples))


def parse_example(record: object, where: str) -> Example:
  if not isinstance(record, dict):
    raise ValueError(f"{where}: expected a JSON object")
  kind = record.get("type")
  if kind == "generate":
    example = GenerateExample(
      _text(record, "prompt", where),
      _text(record, "answer", where),
      record.get("match", "contains"),
      record.get("max_tokens", 16),
    )
    _expect(example.match in MATCH_MODES, where, "match", f"must be one of {MATCH_MODES}")
    _expect(
      isinstance(example.max_tokens, int) and example.max_tokens >= 1,
      where,
      "max_tokens",
      "must be an integer >= 1",
    )
    return example
  if kind == "multiple_choice":
    choices = record.get("choices")
    _expect(
      isinstance(choices, list)
      and len(choices) >= 2
      and all(isinstance(c, str) and c for c in choices),
      where,
      "choices",
      "must be a list of at least two non-empty strings",
    )
    label = record.get("label")
    _expect(
      isinstance(label, int) and 0 <= label < len(choices),
      where,
      "label",
      f"must be an index into choices (0..{len(choices) - 1})",
    )
    return MultipleChoiceExample(_text(record, "context", where), tuple(choices), label)
  if kind == "perplexity":
    return PerplexityExample(_text(record, "text", where))
  raise ValueError(f"{where}: type: must be generate, multiple_choice or perplexity, got {kind!r}")


def _text(record: dict, name: str, where: str) -> str:
  value = record.get(name)
  _expect(isinstance(value, str) and value != "", where, name, "must be a non-empty string")
  return value


def _expect(condition: bool, where: str, name: str, message: str) -> None:
  if not condition:
    raise ValueError(f"{where}: {name}: {message}")
