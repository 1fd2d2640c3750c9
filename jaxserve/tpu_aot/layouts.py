"""Data parallel x tensor parallel layouts of one TPU slice, side by side (`compile-tpu --layouts`).

A layout `dpNtpM` serves the slice's N x M chips as N replicas of the model, each sharded over M
chips (tensor_parallel_size M; replicas share nothing, each its own engine). Every layout of one
run must use the same chips (v5e-8: dp8tp1, dp4tp2, dp2tp4, dp1tp8). For each, build.py compiles
one replica's programs on the slice's topology (its mesh: the first M chips) and plans its
per-chip HBM (weights, KV pool, step transient, program code: memory.py), and roofline.py turns
the compiled decode step's cost into an expected decode throughput of the replica and of the N
together. A layout whose weights do not fit a chip, or whose programs do not compile, is
reported as such, without a throughput.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from jaxserve.tpu_aot.build import BuildReport, BuildRequest, build
from jaxserve.tpu_aot.chips import GIB
from jaxserve.tpu_aot.report import report_json
from jaxserve.tpu_aot.roofline import DecodeStep, Roofline, decode_step

_LAYOUT = re.compile(r"^dp(\d+)tp(\d+)$")


@dataclass(frozen=True)
class Layout:
  data_parallel_size: int
  tensor_parallel_size: int

  @property
  def name(self) -> str:
    return f"dp{self.data_parallel_size}tp{self.tensor_parallel_size}"

  @property
  def num_chips(self) -> int:
    return self.data_parallel_size * self.tensor_parallel_size


def parse_layouts(text: str) -> tuple[Layout, ...]:
  """ "dp8tp1,dp4tp2,dp1tp8" -> the layouts; ValueError naming --layouts for a bad name or
  layouts of different chip counts."""
  layouts = []
  for word in text.split(","):
    match = _LAYOUT.match(word.strip())
    if not match or 0 in (int(match[1]), int(match[2])):
      raise ValueError(f"--layouts: {word.strip()!r} is not dpNtpM (e.g. dp4tp2)")
    layouts.append(Layout(int(match[1]), int(match[2])))
  chips = sorted({layout.num_chips for layout in layouts})
  if len(chips) > 1:
    raise ValueError(f"--layouts: every layout must use the slice's chips, got {chips} chips")
  return tuple(layouts)


@dataclass(frozen=True)
class LayoutPlan:
  layout: Layout
  report: BuildReport
  step: DecodeStep | None  # None when it does not fit or its decode step did not compile

  @property
  def roofline(self) -> Roofline | None:
    if self.step is None or not self.report.fits:
      return None
    return Roofline(self.report.request.chip, self.step, self.layout.data_parallel_size)


def plan_layouts(request: BuildRequest, layouts: tuple[Layout, ...]) -> list[LayoutPlan]:
  """Builds each layout from `request` (its config's tensor_parallel_size replaced by the
  layout's, on a slice of the layout's chips; request.decode_context > 0)."""
  if request.decode_context < 1:
    raise ValueError("--decode-context: must be a positive number of tokens")
  plans = []
  for layout in layouts:
    config = request.config.replace(tensor_parallel_size=layout.tensor_parallel_size)
    report = build(replace(request, config=config, slice_chips=layout.num_chips))
    step = None
    if report.memory is not None:
      step = decode_step(
        config, report.request.model_config, report.memory, report.results, request.decode_context
      )
    plans.append(LayoutPlan(layout, report, step))
  return plans


def format_layouts(plans: list[LayoutPlan]) -> str:
  """One row per layout: per-chip HBM plan, decode step and expected throughput, each decode
  figure from XLA's bytes, then from the floor (roofline.py)."""
  first = plans[0].report
  lines = [
    f"layouts of {first.topology} for {first.request.model_name}, decode at "
    f"{first.request.decode_context} tokens of context; roofline per chip: max(bytes / HBM "
    "bandwidth, FLOPs / bf16 peak), bytes as XLA counts them - or at the floor, the weights "
    "once + the KV reads",
    f"{'layout':<8} {'weights':>8} {'KV pool':>8} {'total':>8} {'usable':>8} {'seqs':>5} "
    f"{'batch':>5} {'XLA GB':>7} {'floor GB':>8} {'GFLOP':>6} {'step ms':>12} {'bound':>7} "
    f"{'tok/s/replica':>13} {'tok/s':>13}",
  ]
  for plan in plans:
    lines.append(_row(plan))
    lines += [f"  {problem}" for problem in plan.report.problems]
  return "\n".join(lines)


def _row(plan: LayoutPlan) -> str:
  memory, roof = plan.report.memory, plan.roofline
  cells = [f"{plan.layout.name:<8}"]
  if memory is None:
    cells.append(f"{'(does not fit, below)':>41}")
  else:
    sizes = (memory.weights, memory.pool, memory.total, memory.chip.usable_bytes)
    cells += [f"{size / GIB:>7.2f}G" for size in sizes] + [f"{memory.full_length_sequences:>5}"]
  if roof is None:
    cells.append("  no decode estimate" + (": does not fit" if plan.report.problems else ""))
    return " ".join(cells)
  step, floor_replica = roof.step, roof.ideal_tokens_per_s / roof.replicas
  cells += [
    f"{step.batch:>5}",
    f"{step.bytes / 1e9:>7.2f}",
    f"{step.ideal_bytes / 1e9:>8.2f}",
    f"{step.flops / 1e9:>6.0f}",
    f"{roof.step_seconds * 1e3:>5.2f} - {roof.ideal_step_seconds * 1e3:<4.2f}",
    f"{roof.bound:>7}",
    f"{roof.tokens_per_s_per_replica:>6.0f}-{floor_replica:<6.0f}",
    f"{roof.tokens_per_s:>6.0f}-{roof.ideal_tokens_per_s:<6.0f}",
  ]
  return " ".join(cells)


def layouts_json(plans: list[LayoutPlan]) -> list[dict]:
  return [
    {
      "layout": plan.layout.name,
      "data_parallel_size": plan.layout.data_parallel_size,
      "tensor_parallel_size": plan.layout.tensor_parallel_size,
      "report": report_json(plan.report),
      "decode": None if plan.roofline is None else _roofline_json(plan.roofline),
    }
    for plan in plans
  ]


def _roofline_json(roof: Roofline) -> dict:
  step = roof.step
  return {
    "context": step.context,
    "batch": step.batch,
    "bucket": [step.bucket.num_seqs, step.bucket.num_tokens],
    "program_bytes": step.program_bytes,
    "kv_bytes": step.kv_bytes,
    "program_flops": step.program_flops,
    "attention_flops": step.attention_flops,
    "step_seconds": roof.step_seconds,
    "bound": roof.bound,
    "tokens_per_s_per_replica": roof.tokens_per_s_per_replica,
    "tokens_per_s": roof.tokens_per_s,
    "weight_bytes": step.weight_bytes,
    "ideal_step_seconds": roof.ideal_step_seconds,
    "ideal_tokens_per_s": roof.ideal_tokens_per_s,
  }
