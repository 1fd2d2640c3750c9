"""device_trace: real CPU profiles of small jitted functions, checked against the compiled HLO
(op names) and the wall clock (no double counting of nested ops); the GPU path on a trace laid
out as JAX writes one for a CUDA device (process /device:GPU:0, CUPTI stream threads)."""

from __future__ import annotations

import gzip
import json
import re
import time

import jax
import jax.numpy as jnp
import pytest

from investigations.device_trace import (
  NoDeviceEventsError,
  TraceEvent,
  capture_trace,
  device_trace,
  kernel_family,
  self_times,
  summarize_trace,
)

REPS = 5


def hlo_instruction_line(hlo_text: str, name: str) -> str:
  match = re.search(rf"^\s*(ROOT )?%?{re.escape(name)} = .*$", hlo_text, re.MULTILINE)
  assert match, f"{name} is not an instruction of the compiled module"
  return match.group(0)


def computes_dot(hlo_text: str, name: str) -> bool:
  """Whether instruction `name` is a dot or a fusion whose computation holds one."""
  line = hlo_instruction_line(hlo_text, name)
  if " dot(" in line:
    return True
  called = re.search(r"calls=%?([\w.\-]+)", line)
  if not called:
    return False
  body = re.search(
    rf"^%?{re.escape(called.group(1))} .*?\{{\n(.*?)^\}}", hlo_text, re.MULTILINE | re.DOTALL
  )
  return bool(body) and " dot(" in body.group(1)


def test_cpu_summary_names_the_compiled_ops(tmp_path):
  fn = jax.jit(lambda a, b: jnp.tanh(a @ b) + 1.0)
  a = jnp.linspace(0.0, 1.0, 384 * 384, dtype=jnp.float32).reshape(384, 384)
  hlo_text = fn.lower(a, a).compile().as_text()
  rows = summarize_trace(capture_trace(lambda: fn(a, a), tmp_path, reps=REPS))
  assert rows and all(r.total_us > 0 and r.mean_us > 0 for r in rows)
  assert sum(r.share for r in rows) == pytest.approx(1.0)
  for r in rows:  # every row is an op of this program, run once per execution
    hlo_instruction_line(hlo_text, r.name)
    assert r.count == REPS, r
  assert any(computes_dot(hlo_text, r.name) for r in rows), [r.name for r in rows]


def test_nested_ops_are_not_counted_twice(tmp_path):
  def body(_, x):
    return jnp.tanh(x @ x)

  fn = jax.jit(lambda x: jax.lax.fori_loop(0, 8, body, x))
  x = jnp.eye(256, dtype=jnp.float32)
  jax.block_until_ready(fn(x))
  with device_trace(tmp_path):
    start = time.perf_counter()
    for _ in range(REPS):
      jax.block_until_ready(fn(x))
    wall_us = 1e6 * (time.perf_counter() - start)
  rows = summarize_trace(tmp_path)
  assert any(r.name.startswith("while") for r in rows)  # the loop op itself was traced
  device_us = sum(r.total_us for r in rows)
  assert 0 < device_us <= wall_us  # parent minus children, not both


def test_trace_without_xla_ops_raises(tmp_path):
  with device_trace(tmp_path):
    sum(i * i for i in range(10_000))
  with pytest.raises(NoDeviceEventsError, match="no device events"):
    summarize_trace(tmp_path)


def test_missing_profile_raises(tmp_path):
  with pytest.raises(ValueError, match="no profile under"):
    summarize_trace(tmp_path)


def write_trace(logdir, events: list[dict]) -> None:
  run = logdir / "plugins" / "profile" / "2026_01_01_00_00_00"
  run.mkdir(parents=True)
  with gzip.open(run / "gpu.trace.json.gz", "wt") as f:
    json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)


def test_gpu_trace_counts_stream_kernels_only(tmp_path):
  meta = [
    {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
    {
      "ph": "M",
      "pid": 1,
      "tid": 14,
      "name": "thread_name",
      "args": {"name": "Stream #14(Compute)"},
    },
    {
      "ph": "M",
      "pid": 1,
      "tid": 15,
      "name": "thread_name",
      "args": {"name": "Stream #15(MemcpyD2H)"},
    },
    {"ph": "M", "pid": 701, "name": "process_name", "args": {"name": "/host:CPU"}},
    {"ph": "M", "pid": 701, "tid": 9, "name": "thread_name", "args": {"name": "python3"}},
  ]
  kernel_args = {"hlo_module": "jit_step", "hlo_op": "gemm_fusion_dot.1"}
  events = meta + [
    {
      "ph": "X",
      "pid": 1,
      "tid": 14,
      "ts": 0.0,
      "dur": 30.0,
      "name": "gemm_fusion_dot_1",
      "args": kernel_args,
    },
    {
      "ph": "X",
      "pid": 1,
      "tid": 14,
      "ts": 40.0,
      "dur": 10.0,
      "name": "gemm_fusion_dot_1",
      "args": kernel_args,
    },
    {
      "ph": "X",
      "pid": 1,
      "tid": 14,
      "ts": 55.0,
      "dur": 20.0,
      "name": "gemm_fusion_dot_2",
      "args": kernel_args,
    },
    {"ph": "X", "pid": 1, "tid": 15, "ts": 80.0, "dur": 40.0, "name": "MemcpyD2H"},
    # host-side launch annotations carry hlo_op too: on GPU they are not device time
    {
      "ph": "X",
      "pid": 701,
      "tid": 9,
      "ts": 0.0,
      "dur": 500.0,
      "name": "gemm_fusion_dot.1",
      "args": kernel_args,
    },
  ]
  write_trace(tmp_path, events)
  rows = {r.name: r for r in summarize_trace(tmp_path)}
  assert set(rows) == {"gemm_fusion_dot_1", "gemm_fusion_dot_2", "MemcpyD2H"}
  assert (rows["gemm_fusion_dot_1"].count, rows["gemm_fusion_dot_1"].total_us) == (2, 40.0)
  assert rows["MemcpyD2H"].share == pytest.approx(40.0 / 100.0)
  families = {r.name: r for r in summarize_trace(tmp_path, by_family=True)}
  assert (families["gemm_fusion_dot"].count, families["gemm_fusion_dot"].total_us) == (3, 60.0)
  by_op = {r.name: r for r in summarize_trace(tmp_path, by_op=True)}  # the launching instruction
  assert set(by_op) == {"gemm_fusion_dot.1", "MemcpyD2H"}
  assert (by_op["gemm_fusion_dot.1"].count, by_op["gemm_fusion_dot.1"].total_us) == (3, 60.0)


def test_gpu_trace_without_kernels_raises(tmp_path):
  write_trace(
    tmp_path,
    [
      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
      {"ph": "M", "pid": 701, "name": "process_name", "args": {"name": "/host:CPU"}},
      {
        "ph": "X",
        "pid": 701,
        "tid": 9,
        "ts": 0.0,
        "dur": 5.0,
        "name": "fusion.1",
        "args": {"hlo_op": "fusion.1"},
      },
    ],
  )
  with pytest.raises(NoDeviceEventsError, match="/device:GPU:0"):
    summarize_trace(tmp_path)


def test_self_times_subtracts_direct_children_only():
  def ev(name, start, dur):
    return TraceEvent(name, 0, 0, start, dur, {})

  # while [0, 100) holds body [10, 60) which holds dot [20, 50); then add [100, 105)
  got = dict(
    self_times([ev("add", 100, 5), ev("dot", 20, 30), ev("while", 0, 100), ev("body", 10, 50)])
  )
  assert got == {"while": 50, "body": 20, "dot": 30, "add": 5}


def test_kernel_family():
  assert (
    kernel_family("loop_add_fusion.3") == kernel_family("loop_add_fusion_12") == "loop_add_fusion"
  )
  assert kernel_family("cond.15.clone") == "cond"
  assert kernel_family("MemcpyH2D") == "MemcpyH2D"
