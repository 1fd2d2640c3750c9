"""The numbered walk of docs/ARCHITECTURE.md ("One request, from HTTP to the kernel and back")
read as the source files it names, for tests/architecture/measures.py: a step names a file by
its path (server/app.py), by a backticked member of its module (`server/app.build_app`), by a
backticked class or its member (`CoreClient.add`: the one file that defines the class), or by a
bare name (gpu_write.py) in a folder the step named already, else wherever that name is unique.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path

from tests.source_graph import parse

WALK_HEADING = "## One request, from HTTP to the kernel and back"
TO_THE_KERNEL = range(1, 10)  # steps 1 to 9: the handler to the kernel
SOURCES = ("jaxserve", "pallas_kernels")

PATH = re.compile(r"(?<![\w/.`])((?:[\w-]+/)+[\w-]+\.py)")
BARE = re.compile(r"(?<![\w/.`])([\w-]+\.py)\b")
SPAN = re.compile(r"`([^`]+)`")
STEP = re.compile(r"^ ?(\d{1,2})\. ", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Tree:
  """A checkout: its root (jaxserve/, pallas_kernels/ and docs/ under it)."""

  root: Path

  @property
  def package(self) -> Path:
    return self.root / "jaxserve"

  def sources(self) -> list[Path]:
    return [p for s in SOURCES for p in sorted((self.root / s).rglob("*.py"))]

  def relative(self, path: Path) -> str:
    return path.relative_to(self.root).as_posix()


def _class_files(tree: Tree) -> dict[str, set[Path]]:
  found: dict[str, set[Path]] = {}
  for path in tree.sources():
    for node in ast.walk(parse(path)):
      if isinstance(node, ast.ClassDef):
        found.setdefault(node.name, set()).add(path)
  return found


def walk_steps(tree: Tree) -> dict[int, str]:
  """The walk's numbered steps: number -> text."""
  text = (tree.root / "docs" / "ARCHITECTURE.md").read_text()
  section = text.split(WALK_HEADING, 1)[1].split("\n## ", 1)[0]
  marks = list(STEP.finditer(section))
  ends = [m.start() for m in marks[1:]] + [len(section)]
  return {int(m.group(1)): section[m.end() : end] for m, end in zip(marks, ends, strict=True)}


def _module_file(tree: Tree, dotted: str) -> Path | None:
  """`server/app.build_app` or `ragged_paged_attention/gpu.ragged_paged_attention` -> the file
  of its module (relative to the root, jaxserve/ or pallas_kernels/)."""
  module = dotted.split(".", 1)[0]
  for base in (tree.root, tree.package, tree.root / "pallas_kernels"):
    if (base / f"{module}.py").is_file():
      return base / f"{module}.py"
  return None


def step_files(tree: Tree, text: str, classes: dict[str, set[Path]]) -> set[Path]:
  """The source files a step's text names: a path (server/app.py), a backticked module member
  (`server/app.build_app`), a backticked class or its member (`CoreClient.add`: the file that
  defines the class, when one does), a bare file name (gpu_write.py) in a folder the step named
  already, else wherever a file of that name is unique."""
  text = " ".join(text.split())
  found: set[Path] = set()
  for path in PATH.findall(text):
    found.update(
      base / path
      for base in (tree.root, tree.package, tree.root / "pallas_kernels")
      if (base / path).is_file()
    )
  for span in SPAN.findall(text):
    head = re.split(r"[.(\s]", span, maxsplit=1)[0]
    if "/" in span.split(".", 1)[0] and (file := _module_file(tree, span)):
      found.add(file)
    elif re.fullmatch(r"[A-Z]\w*[a-z]\w*", head) and len(classes.get(head, ())) == 1:
      found |= classes[head]
  for name in BARE.findall(PATH.sub("", text)):
    near = [p.parent / name for p in sorted(found) if (p.parent / name).is_file()]
    anywhere = [p for p in tree.sources() if p.name == name]
    found.update(near[:1] or (anywhere if len(anywhere) == 1 else []))
  return found


def walk_files(tree: Tree, steps: Iterable[int] = TO_THE_KERNEL) -> list[str]:
  """The files the walk names in `steps` (step_files of each), relative to the root."""
  classes = _class_files(tree)
  texts = walk_steps(tree)
  named = (p for s in steps for p in step_files(tree, texts.get(s, ""), classes))
  return sorted({tree.relative(p) for p in named})
