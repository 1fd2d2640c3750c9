"""`jaxserve bench serve` against a real uvicorn server over a small tiny-random engine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxserve.bench.arrivals import arrival_gaps, send_offsets
from jaxserve.bench.bench_serve import workload_label
from jaxserve.bench.datasets import load_sharegpt, random_requests
from jaxserve.cli import main as jaxserve_main
from jaxserve.runtime.optional_deps import install_command
from tests.tools.png_checks import assert_valid_png

NUM_PROMPTS = 12
INPUT_LEN, OUTPUT_LEN, RANGE_RATIO = 24, 8, 0.5


def test_bench_serve_at_infinite_and_finite_rates(server_url, tmp_path):
  code = jaxserve_main(
    [
      "bench",
      "serve",
      "--base-url",
      server_url,
      "--num-prompts",
      str(NUM_PROMPTS),
      "--random-input-len",
      str(INPUT_LEN),
      "--random-output-len",
      str(OUTPUT_LEN),
      "--random-range-ratio",
      str(RANGE_RATIO),
      "--ignore-eos",
      "--seed",
      "3",
      "--sweep-rates",
      "inf,20",
      "--out-dir",
      str(tmp_path),
    ]
  )
  assert code == 0
  result = json.loads((tmp_path / "bench_serve.json").read_text())
  assert result["model"] == "tiny-random" and result["length_source"] == "token_ids"
  expected = random_requests(
    NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN, range_ratio=RANGE_RATIO, seed=3, token_ids=range(256)
  )
  assert [run["request_rate"] for run in result["runs"]] == ["inf", 20.0]
  for run in result["runs"]:
    requests, metrics = run["requests"], run["metrics"]
    assert len(requests) == NUM_PROMPTS and metrics["completed"] == NUM_PROMPTS
    assert metrics["failed"] == 0
    for record, sample in zip(requests, expected, strict=True):
      assert record["success"] and record["usage_reported"]
      assert record["prompt_len"] == sample.prompt_len
      assert record["output_tokens"] == sample.expected_output_len  # ignore_eos: all of them
      assert 0 < record["ttft"] <= record["e2e"]
      assert len(record["itls"]) <= record["output_tokens"] - 1  # a chunk holds >= 1 token
      assert sum(record["itls"]) == pytest.approx(record["e2e"] - record["ttft"], abs=1e-6)
    assert metrics["total_output_tokens"] == sum(s.expected_output_len for s in expected)
    assert metrics["total_input_tokens"] == sum(s.prompt_len for s in expected)
    assert metrics["output_throughput"] == pytest.approx(
      metrics["total_output_tokens"] / metrics["duration_s"]
    )
    assert metrics["ttft"]["median_ms"] <= metrics["e2e"]["percentiles_ms"]["p99"]
  # At 20 req/s the last request cannot start before the last scheduled send time.
  finite = result["runs"][1]["requests"]
  last_send = send_offsets(arrival_gaps(NUM_PROMPTS, 20.0, 1.0, seed=3))[-1]
  assert max(r["start_time"] for r in finite) >= last_send - 1e-3
  for name in (
    "latency_cdf_rate_inf.png",
    "latency_cdf_rate_20.0.png",
    "sweep_throughput_latency.png",
  ):
    assert_valid_png(tmp_path / name)


def test_arrival_gaps_have_mean_one_over_rate():
  for burstiness in (1.0, 0.5, 4.0):
    gaps = arrival_gaps(20_000, 8.0, burstiness, seed=0)
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.03)
    # gamma(shape k, scale 1/(rate k)) has variance 1/(k rate^2)
    assert gaps.var() == pytest.approx(1 / (burstiness * 64.0), rel=0.1)
  assert not arrival_gaps(5, math.inf).any()
  np.testing.assert_array_equal(send_offsets(np.array([0.5, 0.25, 1.0])), [0.0, 0.5, 0.75])


def test_sharegpt_loader_takes_first_human_turn(tmp_path):
  data = [
    {
      "conversations": [
        {"from": "human", "value": "what is two plus two"},
        {"from": "gpt", "value": "it is four of course my friend"},
      ]
    },
    {
      "conversations": [
        {"from": "gpt", "value": "no human first"},
        {"from": "human", "value": "late question here ok"},
      ]
    },
    {"conversations": [{"from": "human", "value": "tiny"}, {"from": "gpt", "value": "x"}]},
    {
      "conversations": [
        {"from": "system", "value": "be nice"},
        {"from": "human", "value": "name three primary colours please"},
        {"from": "gpt", "value": "red yellow and blue are the three"},
        {"from": "human", "value": "ignored second question"},
      ]
    },
    {"id": "no conversations"},
  ]
  path = tmp_path / "sharegpt.json"
  path.write_text(json.dumps(data))
  requests = load_sharegpt(path, num_prompts=10)
  by_prompt = {r.prompt: r for r in requests}
  assert set(by_prompt) == {"what is two plus two", "name three primary colours please"}
  assert by_prompt["what is two plus two"].prompt_len == 5
  assert by_prompt["what is two plus two"].expected_output_len == 7
  byte_counts = load_sharegpt(path, num_prompts=10, count_tokens=lambda text: len(text.encode()))
  assert {r.expected_output_len for r in byte_counts} == {30, 33}
  assert len(load_sharegpt(path, num_prompts=1)) == 1
  with pytest.raises(ValueError, match="no usable conversations"):
    load_sharegpt(path, num_prompts=1, min_len=50)


def test_random_lengths_within_range():
  requests = random_requests(200, 100, 20, range_ratio=0.25, seed=1, token_ids=range(10, 20))
  assert {len(r.prompt) for r in requests} <= set(range(75, 126))
  assert all(len(r.prompt) == r.prompt_len for r in requests)
  assert {r.expected_output_len for r in requests} <= set(range(15, 26))
  assert all(10 <= t < 20 for r in requests for t in r.prompt)
  assert len({r.prompt_len for r in requests}) > 20


def test_chat_endpoint_with_vllm_flags(server_url, tmp_path, capsys):
  code = jaxserve_main(
    [
      "bench",
      "serve",
      "--base-url",
      server_url,
      "--dataset-name",
      "random",
      "--endpoint",
      "/v1/chat/completions",
      "--num-prompts",
      "6",
      "--random-input-len",
      "12",
      "--random-output-len",
      "6",
      "--ignore-eos",
      "--percentile-metrics",
      "ttft,tpot,itl,e2el",
      "--metric-percentiles",
      "25,90",
      "--goodput",
      "ttft:600000",
      "tpot:600000",
      "--save-result",
      "--result-dir",
      str(tmp_path),
    ]
  )
  assert code == 0
  table = capsys.readouterr().out
  for row in (
    "P25 TTFT (ms):",
    "P90 TPOT (ms):",
    "P99 ITL (ms):",
    "P50 E2EL (ms):",
    "Request goodput (req/s):",
  ):
    assert row in table
  result = json.loads((tmp_path / "bench_serve.json").read_text())
  assert result["endpoint"] == "/v1/chat/completions" and result["length_source"] == "words"
  assert workload_label(result) == (
    "tiny-random /v1/chat/completions: 6 random prompts, in 12 / out 6 tokens"
  )  # the plots' title
  (run,) = result["runs"]
  metrics = run["metrics"]
  assert metrics["completed"] == 6
  assert all(r["output_tokens"] == 6 and r["usage_reported"] for r in run["requests"])
  assert set(metrics["ttft"]["percentiles_ms"]) == {"p25", "p50", "p90", "p99"}
  # Every request meets 10-minute objectives: goodput is the request throughput.
  assert metrics["request_goodput"] == pytest.approx(metrics["request_throughput"])
  assert_valid_png(tmp_path / "latency_cdf_rate_inf.png")


def test_goodput_counts_only_requests_within_the_objectives(server_url, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  code = jaxserve_main(
    [
      "bench",
      "serve",
      "--base-url",
      server_url,
      "--num-prompts",
      "4",
      "--random-input-len",
      "8",
      "--random-output-len",
      "4",
      "--goodput",
      "ttft:0.000001",
      "--disable-tqdm",
    ]
  )
  assert code == 0
  assert list(tmp_path.iterdir()) == []  # nothing written without --save-result


def test_goodput_and_percentile_flags_are_validated(server_url, capsys):
  for flags, field in (
    (["--goodput", "latency:5"], "goodput"),
    (["--metric-percentiles", "100"], "metric_percentiles"),
    (["--percentile-metrics", "ttft,foo"], "percentile_metrics"),
  ):
    assert jaxserve_main(["bench", "serve", "--base-url", server_url, *flags]) == 2
    assert capsys.readouterr().err.startswith(f"jaxserve bench: error: {field}: ")


def test_server_down_is_one_line(tmp_path):
  from tests.server.server_helpers import free_port

  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "jaxserve.cli",
      "bench",
      "serve",
      "--base-url",
      f"http://127.0.0.1:{free_port()}",
      "--num-prompts",
      "2",
    ],
    capture_output=True,
    text=True,
    timeout=120,
    cwd=tmp_path,
  )
  assert run.returncode == 2
  assert run.stderr.strip().startswith("jaxserve bench: error: base_url: cannot reach a server")
  assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module", ["httpx", "matplotlib"])
def test_missing_bench_extra_is_one_line_before_the_run(module, tmp_path):
  # sys.modules[name] = None makes `import name` raise ImportError, as if it were not installed.
  code = (
    f"import sys; sys.modules[{module!r}] = None; from jaxserve.cli import main; "
    "sys.exit(main(['bench', 'serve', '--base-url', 'http://127.0.0.1:9', "
    "'--save-result']))"
  )
  run = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
  )
  assert run.returncode == 1
  (line,) = run.stderr.strip().splitlines()
  assert line == (
    f"jaxserve bench serve needs {module} "
    f"({'HTTP client' if module == 'httpx' else 'plots'}), which is not installed: "
    'pip install -e ".[bench]"'
  )
  assert list(tmp_path.iterdir()) == []


def test_the_install_hint_is_readmes():
  """One wording for installing an extra: the hint's (optional_deps.install_command), README's."""
  readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
  assert f"`{install_command(['bench'])}`" in readme


@pytest.mark.parametrize(
  "module,argv,reason",
  [
    ("matplotlib", ["eval", "--plot", "--out-dir", "results"], "plots"),
    (
      "torch",
      ["bench", "throughput", "--hf-baseline", "--out", "t.json"],
      "the transformers baseline",
    ),
  ],
)
def test_other_commands_check_their_extra_first(module, argv, reason, tmp_path):
  code = (
    f"import sys; sys.modules[{module!r}] = None; from jaxserve.cli import main; "
    f"sys.exit(main({argv!r}))"
  )
  run = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
  )
  assert run.returncode == 1
  (line,) = run.stderr.strip().splitlines()
  assert line.endswith(
    f'needs {module} ({reason}), which is not installed: pip install -e ".[bench]"'
  )
  assert list(tmp_path.iterdir()) == []
