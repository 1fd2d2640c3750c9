"""What each instruction of a compiled XLA module is: its opcode, result shape and the JAX op it
came from (the `op_name` metadata, e.g. `jit(forward)/.../self_attn/q_proj/dot_general`).

A device trace names kernels after XLA's instructions (`loop_add_fusion.3`, or on GPUs a
library kernel whose event carries the instruction as `hlo_op`); joining the two says which
projection, norm or copy a kernel is. `instructions(hlo_text)` parses `compiled.as_text()`;
`describe(name, table)` finds an instruction by a trace name, also in the spellings GPU kernel
names use (`loop_add_fusion_3` for `loop_add_fusion.3`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

INSTRUCTION = re.compile(
  r"^\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = (?P<shape>.+?) (?P<opcode>[a-z][\w\-]*)\("
)
OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')
LAYOUT = re.compile(r"\{[^{}]*\}")


@dataclass(frozen=True)
class HloInstruction:
  name: str
  opcode: str
  shape: str  # result shape without layouts, e.g. bf16[512,3072]
  op_name: str  # the JAX op path from the metadata ("" when none)

  def summary(self) -> str:
    return f"{self.opcode} {self.shape} {self.op_name}".strip()


def instructions(hlo_texts: str | Iterable[str]) -> dict[str, HloInstruction]:
  """Every instruction of the module(s), by name (fused computations' bodies included)."""
  texts = [hlo_texts] if isinstance(hlo_texts, str) else list(hlo_texts)
  table: dict[str, HloInstruction] = {}
  for text in texts:
    for line in text.splitlines():
      match = INSTRUCTION.match(line)
      if not match:
        continue
      op_name = OP_NAME.search(line)
      table[match["name"]] = HloInstruction(
        match["name"],
        match["opcode"],
        LAYOUT.sub("", match["shape"]),
        op_name["op_name"] if op_name else "",
      )
  return table


def describe(name: str, table: dict[str, HloInstruction]) -> HloInstruction | None:
  """The instruction a trace event name refers to, trying `a_b_3` as `a_b.3` too."""
  if name in table:
    return table[name]
  dotted = re.sub(r"_(\d+)$", r".\1", name)
  return table.get(dotted)
