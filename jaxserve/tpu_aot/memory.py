"""Per-chip memory of a compiled TPU server, and whether it fits the chip's HBM.

A chip holds, while the server runs (all per chip, as XLA's memory_analysis reports them for an
SPMD program):

  weights          its shards of the params (the partition rules' layout)
  KV pool          num_pages pages of its kv heads, sized as the engine sizes it on a TPU
                   (step_programs.pool_pages): cache.memory_fraction of the chip's memory, less
                   the weights and the loader's slack, the allocator's headroom and 10% kept
                   for the (unmeasured) sharded step scratch, unless cache.num_pages /
                   cache.memory_bytes fix it
  step transient   the largest over the step programs of temporaries + outputs not aliased to
                   inputs + arguments other than the weights and the pool (step inputs, logits):
                   what one dispatch needs beyond what the server holds anyway
  program code     the generated code of every program warmup compiles, all loaded at once (a
                   warm server keeps every bucket's executable); when only some programs were
                   compiled, each other program is counted at the largest compiled one of its kind

weights + KV pool + step transient + program code must not exceed the HBM XLA may use on the chip
(TpuChip.usable_bytes, which the pool is sized from too). A config that does not fit gets one
message per cause, naming what does not fit and by how much, and for the total the largest
cache.memory_fraction that would fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from jaxserve.tpu_aot.chips import GIB, TpuChip
from jaxserve.tpu_aot.cost import ProgramCost
from jaxserve.tpu_aot.step_programs import ProgramId


@dataclass(frozen=True)
class ProgramMemory:
  """Compiled.memory_analysis() of one program, per chip."""

  arguments: int
  outputs: int
  aliased: int
  temporaries: int
  code: int

  @classmethod
  def of(cls, analysis) -> ProgramMemory:
    return cls(
      int(analysis.argument_size_in_bytes),
      int(analysis.output_size_in_bytes),
      int(analysis.alias_size_in_bytes),
      int(analysis.temp_size_in_bytes),
      int(analysis.generated_code_size_in_bytes),
    )

  def transient(self, resident_bytes: int) -> int:
    """Bytes a dispatch needs beyond the resident weights and pool it reads."""
    return self.temporaries + self.outputs - self.aliased + max(self.arguments - resident_bytes, 0)


@dataclass(frozen=True)
class ProgramResult:
  id: ProgramId
  lower_seconds: float
  compile_seconds: float
  resident_bytes: int
  memory: ProgramMemory | None  # None when it did not compile
  error: str | None  # the compiler's message when it did not compile
  cost: ProgramCost | None = None  # XLA's FLOPs and bytes, None when it did not compile
  cached: bool = False  # the compile's result came from the result cache (result_cache.py)


@dataclass(frozen=True)
class ServerMemory:
  """The whole server on one chip."""

  chip: TpuChip
  weights: int
  page_bytes: int  # per chip, one page
  num_pages: int  # null page included
  page_size: int
  max_model_len: int
  largest_transient: int
  largest_transient_program: str
  code: int
  code_estimated: bool

  @property
  def pool(self) -> int:
    return self.num_pages * self.page_bytes

  @property
  def total(self) -> int:
    return self.weights + self.pool + self.largest_transient + self.code

  @property
  def headroom(self) -> int:
    return self.chip.usable_bytes - self.total

  @property
  def token_capacity(self) -> int:
    return (self.num_pages - 1) * self.page_size

  @property
  def full_length_sequences(self) -> int:
    return (self.num_pages - 1) // math.ceil(self.max_model_len / self.page_size)


def gib(num_bytes: float) -> str:
  return f"{num_bytes / GIB:.2f} GiB"


def weights_misfit(chip: TpuChip, weights: int, what: str) -> str | None:
  if weights < chip.usable_bytes:
    return None
  return (
    f"weights: {what} needs {gib(weights)} per chip, over the {gib(chip.usable_bytes)} "
    f"usable HBM of a {chip.name} chip by {gib(weights - chip.usable_bytes)} before any "
    "KV page"
  )


def server_memory(
  chip: TpuChip,
  weights: int,
  page_bytes: int,
  num_pages: int,
  page_size: int,
  max_model_len: int,
  results: list[ProgramResult],
  all_ids: list[ProgramId],
) -> ServerMemory:
  """Totals over the compiled programs; all_ids is every program warmup compiles."""
  compiled = [r for r in results if r.memory is not None]
  worst = max(compiled, key=lambda r: r.memory.transient(r.resident_bytes), default=None)
  code_by_id = {r.id: r.memory.code for r in compiled}
  largest_of_kind: dict[str, int] = {}
  for r in compiled:
    largest_of_kind[r.id.kind] = max(largest_of_kind.get(r.id.kind, 0), r.memory.code)
  code = sum(code_by_id.get(pid, largest_of_kind.get(pid.kind, 0)) for pid in all_ids)
  return ServerMemory(
    chip,
    weights,
    page_bytes,
    num_pages,
    page_size,
    max_model_len,
    worst.memory.transient(worst.resident_bytes) if worst else 0,
    worst.id.name if worst else "-",
    code,
    any(pid not in code_by_id for pid in all_ids),
  )


def misfits(
  memory: ServerMemory,
  results: list[ProgramResult],
  topology: str,
  pages_at: Callable[[float], int],
) -> list[str]:
  """Why the server does not fit (empty when it does). pages_at(fraction) is the pool's page
  count at that cache.memory_fraction (the engine's sizing), for the advice."""
  messages = [
    f"{r.id.name}: does not compile for {topology}: {r.error}{_smem_hint(r, memory)}"
    for r in results
    if r.error is not None
  ]
  if memory.headroom < 0:
    fixed = memory.chip.usable_bytes - memory.weights - memory.largest_transient - memory.code
    fraction = largest_fitting_fraction(fixed, memory.page_bytes, pages_at)
    advice = (
      f"cache.memory_fraction <= {fraction:.2f} would fit"
      if fraction > 0
      else "no KV pool fits beside them"
    )
    messages.append(
      f"memory: weights {gib(memory.weights)} + KV pool {gib(memory.pool)} ({memory.num_pages} "
      f"pages) + step transient {gib(memory.largest_transient)} "
      f"({memory.largest_transient_program}) + program code {gib(memory.code)} = "
      f"{gib(memory.total)} per chip, over the {gib(memory.chip.usable_bytes)} usable HBM of a "
      f"{memory.chip.name} chip by {gib(-memory.headroom)}; {advice}"
    )
  return messages


def largest_fitting_fraction(
  pool_bytes: int, page_bytes: int, pages_at: Callable[[float], int]
) -> float:
  """The largest cache.memory_fraction, in hundredths, whose pool fits in pool_bytes (0.0 if
  none holds the 2 pages a pool needs)."""
  for hundredths in range(100, 0, -1):
    pages = pages_at(hundredths / 100)
    if pages >= 2 and pages * page_bytes <= pool_bytes:
      return hundredths / 100
  return 0.0


def _smem_hint(result: ProgramResult, memory: ServerMemory) -> str:
  """The TPU attention kernel scalar-prefetches the block tables into SMEM (1 MiB on v5e/v6e)."""
  if "smem" not in (result.error or "").lower() or not result.id.num_seqs:
    return ""
  pages_per_seq = math.ceil(memory.max_model_len / memory.page_size)
  table = result.id.num_seqs * pages_per_seq * 4
  return (
    f" (the attention kernel holds the block tables in SMEM: {result.id.num_seqs} "
    f"sequences x {pages_per_seq} pages of max_model_len {memory.max_model_len} x 4 bytes = "
    f"{table / 2**20:.2f} MiB; lower max_model_len or scheduler.max_num_seqs)"
  )
