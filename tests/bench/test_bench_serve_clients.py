"""`jaxserve bench serve` from several client processes, its own CPU, and the bottleneck warning,
against a real uvicorn server over a small tiny-random engine."""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import sys

import pytest

from jaxserve.bench.arrivals import arrival_gaps, send_offsets
from jaxserve.bench.client_processes import INTERLEAVE_S, plan_clients, send_schedule
from jaxserve.bench.datasets import random_requests
from jaxserve.bench.serve_client import ServeBenchConfig
from jaxserve.cli import main as jaxserve_main

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 16, 16, 12


def _bench(url: str, out_dir, *flags: str) -> dict:
  code = jaxserve_main(
    [
      "bench",
      "serve",
      "--base-url",
      url,
      "--num-prompts",
      str(NUM_PROMPTS),
      "--random-input-len",
      str(INPUT_LEN),
      "--random-output-len",
      str(OUTPUT_LEN),
      "--ignore-eos",
      "--seed",
      "5",
      "--disable-tqdm",
      "--save-result",
      "--result-dir",
      str(out_dir),
      *flags,
    ]
  )
  assert code == 0
  (run,) = json.loads((out_dir / "bench_serve.json").read_text())["runs"]
  return run


def test_two_client_processes_measure_what_one_does(server_url, tmp_path, capsys):
  one = _bench(server_url, tmp_path / "one", "--client-processes", "1")
  two = _bench(server_url, tmp_path / "two", "--client-processes", "2", "--request-rate", "40")
  table = capsys.readouterr().out
  assert "Client processes:                        1 (--client-processes 1)" in table
  assert "Client processes:                        2 (--client-processes 2)" in table
  for row in ("Client CPU time (s):", "Client chunk gaps under 1 ms:", "  client 1: 8 requests"):
    assert row in table
  for run, processes in ((one, 1), (two, 2)):
    metrics, client = run["metrics"], run["client"]
    assert metrics["completed"] == NUM_PROMPTS and metrics["failed"] == 0
    assert metrics["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert [r["output_tokens"] for r in run["requests"]] == [OUTPUT_LEN] * NUM_PROMPTS
    for record in run["requests"]:
      assert 0 < record["ttft"] <= record["e2e"] < metrics["duration_s"]
      assert len(record["itls"]) == OUTPUT_LEN - 1  # a chunk per step, a token each
      assert sum(record["itls"]) == pytest.approx(record["e2e"] - record["ttft"], abs=1e-6)
    assert metrics["output_throughput"] == pytest.approx(
      metrics["total_output_tokens"] / metrics["duration_s"]
    )
    assert 0 < metrics["tpot"]["median_ms"] <= metrics["e2e"]["percentiles_ms"]["p99"]
    assert client["processes"] == processes == len(client["per_process"])
    assert [p["requests"] for p in client["per_process"]] == [NUM_PROMPTS // processes] * processes
    for usage in client["per_process"]:
      assert usage["cpu_s"] > 0 and 0 < usage["cpu_share"] <= os.cpu_count()
      assert usage["gaps"] == NUM_PROMPTS // processes * (OUTPUT_LEN - 1)
      assert 0 <= usage["small_gap_fraction"] <= 1
    assert client["cpu_s"] == pytest.approx(sum(p["cpu_s"] for p in client["per_process"]))
  # The same workload, merged back in request order.
  assert [r["prompt_len"] for r in one["requests"]] == [r["prompt_len"] for r in two["requests"]]
  # Two processes follow one schedule from one start: none sends before its arrival time.
  offsets = send_offsets(arrival_gaps(NUM_PROMPTS, 40.0, 1.0, seed=5))
  for record, offset in zip(two["requests"], offsets, strict=True):
    assert record["start_time"] >= offset - 1e-3


def test_several_processes_send_a_burst_in_request_order():
  """At rate inf one process's share must not reach the server first and fill its batch."""
  inf = ServeBenchConfig("http://127.0.0.1:1", "m", request_rate=math.inf)
  assert send_schedule(inf, 4, 1) == [0.0] * 4  # one process: every request at once
  assert send_schedule(inf, 4, 2) == [0.0, INTERLEAVE_S, 2 * INTERLEAVE_S, 3 * INTERLEAVE_S]
  rate = ServeBenchConfig("http://127.0.0.1:1", "m", request_rate=40.0, seed=5)
  offsets = send_offsets(arrival_gaps(NUM_PROMPTS, 40.0, 1.0, seed=5)).tolist()
  assert send_schedule(rate, NUM_PROMPTS, 2) == offsets  # a finite rate: the arrival schedule


def test_plan_clients_follows_streams_rate_and_cores():
  burst = random_requests(1000, 8, 256, seed=0)
  assert plan_clients(None, burst, math.inf, None, cores=26).processes == 8  # 1000 / 128
  assert plan_clients(None, burst, math.inf, None, cores=4).processes == 2  # half the cores
  assert plan_clients(None, burst, math.inf, 64, cores=26).processes == 1
  assert plan_clients(None, burst, 16.0, None, cores=26).processes == 2  # 4096 chunks/s
  assert plan_clients(None, burst, 100.0, None, cores=26).processes == 7  # chunks bound
  assert plan_clients(None, burst[:500], 100.0, None, cores=26).processes == 4  # streams bound
  plan = plan_clients(None, burst, 100.0, None, cores=26)
  assert plan.reason == (
    "auto: one per 128 streams open at once (1000), one per 4000 chunks/s (about 25600), "
    "at most half of 26 cores"
  )
  assert plan_clients(3, burst, math.inf, 2, cores=26).processes == 2  # one stream each at most
  assert plan_clients(8, burst, math.inf, None, cores=2).processes == 8  # given: it wins
  with pytest.raises(ValueError, match="client_processes"):
    plan_clients(0, burst, math.inf, None, cores=2)


ATTEMPTS = 3  # of the starved run (see the test)
BUSY_LOOPS = 4  # nice-0 busy loops on the client's core
STARVED_NICE = 19  # the client's share of its core: 15 / (15 + 4 x 1024 + others' weights)
WARM, GO = "warm", "go"
RUN_TIMEOUT_S = 120


def _starved_run(server_url: str) -> tuple[list[str], dict]:
  """One bench serve run from a client process pinned to a core beside BUSY_LOOPS busy loops, at
  nice STARVED_NICE: its report lines and its JSON result.

  The same workload runs first at full speed in that process, before the loops start (the server
  compiles its programs for those shapes, the client makes its lazy imports and first connection),
  so what the starved run waits for is a CPU, not the server. The loops' weight dominates the core's
  run queue, so the client's share (about 0.36% of the core alone, less beside other runnable tasks:
  starved well below a server slowed by a loaded machine) and the run's length hardly depend on what
  else the machine runs (a lone loop at nice 5 left a nice-19 client 4.3% alone but 0.3% on a busy
  machine: runs past 120 s)."""
  cpu = {sorted(os.sched_getaffinity(0))[-1]}
  code = (
    "import contextlib, io, json, os, sys\n"
    "from jaxserve.bench.bench_serve import ReportOptions, run_one_rate\n"
    "from jaxserve.bench.datasets import random_requests\n"
    "from jaxserve.bench.serve_client import ServeBenchConfig\n"
    "requests = random_requests(8, 8, 16, seed=0, token_ids=range(256))\n"
    f"config = ServeBenchConfig({server_url!r}, 'tiny-random', ignore_eos=True)\n"
    "options = ReportOptions((50.0, 99.0), ('ttft', 'tpot', 'itl'), None)\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"  # its report: not the starved run's
    "  run_one_rate(config, requests, options, client_processes=1)\n"  # at full speed
    f"print({WARM!r}, flush=True)\n"
    f"assert sys.stdin.readline().strip() == {GO!r}\n"  # the loops run
    f"os.sched_setaffinity(0, {cpu!r})\n"
    f"os.nice({STARVED_NICE})\n"
    "result = run_one_rate(config, requests, options, client_processes=1)\n"
    "print(json.dumps({'client': result['client'], 'metrics': result['metrics']}), flush=True)\n"
    "os._exit(0)\n"  # no slow interpreter shutdown at a low priority
  )
  client = subprocess.Popen(
    [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
  )
  busy = []
  try:
    assert _line_within(client, RUN_TIMEOUT_S) == WARM  # its only line until it reads GO
    loop = f"import os\nos.sched_setaffinity(0, {cpu!r})\nprint({WARM!r}, flush=True)\n"
    loop += "while True: pass\n"
    for _ in range(BUSY_LOOPS):
      busy.append(subprocess.Popen([sys.executable, "-c", loop], stdout=subprocess.PIPE, text=True))
    for process in busy:  # each spinning on the client's core
      assert _line_within(process, RUN_TIMEOUT_S) == WARM
    out, _ = client.communicate(GO + "\n", timeout=RUN_TIMEOUT_S)
  finally:
    for process in [*busy, client]:
      process.kill()
      process.wait()
  assert client.returncode == 0
  *report, last = out.strip().splitlines()
  return report, json.loads(last)


def _line_within(process: subprocess.Popen, timeout_s: float) -> str:
  """process's next stdout line (stripped; "" at its end; its only line in flight), or
  TimeoutError after timeout_s."""
  ready, _, _ = select.select([process.stdout], [], [], timeout_s)
  if not ready:
    raise TimeoutError(f"no line from the client process in {timeout_s} s")
  return process.stdout.readline().strip()


def test_a_client_without_cpu_is_reported_as_the_bottleneck(server_url):
  """A client process that gets little CPU (a small share of one core beside busy loops) is
  runnable all the time it has chunks to read: bench serve's run warns and says so. Up to ATTEMPTS
  runs, in case the server, which shares the machine's cores with everything else, was still
  slower than the starved client (it then rightly reports no bottleneck)."""
  reports = []
  for _ in range(ATTEMPTS):
    report, result = _starved_run(server_url)
    reports.append("\n".join(report))
    if any(line.startswith("WARNING: client process 0 was busy") for line in report):
      break
  else:
    raise AssertionError("no bottleneck warning in any run:\n" + "\n\n".join(reports))
  client = result["client"]
  assert client["bottleneck"] and client["per_process"][0]["bottleneck"]
  assert client["per_process"][0]["busy_share"] >= 0.9
  assert result["metrics"]["completed"] == 8
