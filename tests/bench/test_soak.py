"""The soak (jaxserve/bench/soak.py), 30 s on a real `jaxserve serve` of tiny-random (an engine core
process, two API server processes, a waiting queue of 16, a 2 s stall timeout): 1.5 times the
measured capacity, 10% of calls cancelled mid-stream, 5% bad inputs, a greedy canary every 1.5 s, an
API server process killed every 11 s (twice) and a client that stops reading for 4 s every 12 s
(twice), in four 7.5 s windows. The server
keeps every promise the soak checks: no 5xx or broken connection but those a kill cut, every bad
input a 4xx with OpenAI's error body, every canary the first one's text, KV pages back to 0, no
compilation after warm-up, RSS flat; the median TPOT of the last window within 100% of the first
(past capacity a TTFT is the bounded queue's wait). The p99s are the GPU soak's to hold (within
20%): here the other test worker shares the two cores, and its compilations set the tail
(tests/bench/ test_soak_report.py checks the drift rule at both quantiles on hand-made runs). And
every bad input of the catalogue, each sent once, gets its 4xx with OpenAI's error body."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
import yaml

from jaxserve.bench.soak import SoakPlan, run_soak, served_model
from jaxserve.bench.soak_catalogue import bad_inputs
from jaxserve.bench.soak_client import send
from jaxserve.bench.soak_report import format_rows, problems, summary, window_rows
from tests.server.server_helpers import free_port, serve_process

DURATION_S = 30.0
KILL_EVERY_S = 11.0  # at 11 s and 22 s: each restart (0.5 s later) has 8 s to show in the log


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("soak")
  config = {
    "model": "tiny-random",
    "max_model_len": 256,
    "compilation_cache_dir": os.environ["JAXSERVE_TEST_XLA_CACHE"],
    "cache": {"page_size": 16, "num_pages": 256},
    "scheduler": {
      "max_num_seqs": 16,
      "max_num_batched_tokens": 64,
      "seq_buckets": [16],
      "token_buckets": [64],
    },
    "server": {"max_waiting_requests": 16, "stream_stall_timeout_s": 2},
  }
  (tmp / "server.yaml").write_text(yaml.safe_dump(config))
  argv = ["serve", "--config", str(tmp / "server.yaml"), "--port", str(free_port())]
  argv += ["--api-server-count", "2"]
  with serve_process(argv, tmp / "server.log") as url:
    yield url, tmp / "server.log"


def test_a_30_second_soak_with_kills_breaks_no_promise(soak_server):
  url, log = soak_server
  plan = SoakPlan(
    duration_s=DURATION_S,
    request_rate=None,
    load=1.5,
    capacity_s=5.0,
    capacity_concurrency=16,
    max_tokens=32,
    cancel_share=0.1,
    bad_share=0.05,
    canary_every_s=1.5,
    kill_api_every_s=KILL_EVERY_S,
    window_s=7.5,
    seed=0,
    stall_every_s=12.0,  # at 12 s and 24 s, each held 4 s
    stall_hold_s=4.0,
    client_processes=2,  # as on a GPU, where one process cannot parse the server's chunks
  )
  run = asyncio.run(run_soak(url, plan))
  found = problems(
    run,
    canaries_must_match=True,
    rss_growth=0.2,
    latency_drift=1.0,
    latency_quantile=50,
    overloaded=True,
  )
  totals = summary(run)
  assert found == [], (found, totals, format_rows(window_rows(run)))
  assert totals["kills"] == 2 and log.read_text().count("restarted API server process") == 2
  assert totals["stalled_readers"] == 2 == sum(totals["stalled_reader_statuses"].values())
  assert sum(totals["bad_input_statuses"].values()) == totals["bad_inputs"]
  # 20 canaries are scheduled (one every 1.5 s); past capacity some are turned away with a 429
  # like any call, more of them when the machine is busy (14 answered under a loaded fresh run)
  assert totals["bad_inputs"] > 0 and totals["cancelled"] > 0 and totals["canaries"] >= 8
  assert totals["statuses"].get(429, 0) > 0  # past capacity: the waiting queue turns calls away
  assert totals["kv_pages_used_at_end"] == 0
  assert len(totals["client_cpu_shares"]) == 2 and totals["request_rate"] > 0
  assert "Traceback" not in log.read_text()


def test_every_bad_input_of_the_catalogue_gets_a_4xx_with_an_openai_body(soak_server):
  url, _ = soak_server

  async def send_all():
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
      model = await served_model(client)
      requests = bad_inputs(model)
      return requests, await asyncio.gather(*(send(client, r) for r in requests))

  requests, records = asyncio.run(send_all())
  wrong = [
    (request, record.status, record.error)
    for request, record in zip(requests, records, strict=True)
    if not (400 <= record.status < 500 and record.error_body_ok)
  ]
  assert wrong == []
