"""Faults of the multi-process server, on real `jaxserve serve` processes (a supervisor, an engine
core process, two API server processes on one port): the core killed mid-stream ends every open
stream with an error event and [DONE], /health turns 503 and the supervisor exits non-zero with
the core's end; an API server process killed mid-stream has its requests aborted in the core (its
KV pages come back) while the other process keeps serving (and the dead one is restarted:
tests/server/test_api_restarts.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading

import httpx

from tests.server.serve_process import ServeProcess
from tests.server.server_helpers import scrape_metrics, wait_for_idle
from tests.server.test_drain import _write_config


class Supervisor(ServeProcess):
  """`jaxserve serve --api-server-count 2`, its engine core and API server pids."""

  def __init__(self, tmp_path):
    config_path = str(tmp_path / "server.yaml")
    _write_config(config_path, drain_timeout_s=5, warmup="lazy")
    super().__init__(config_path, ["--api-server-count", "2"], api_servers=2)
    pids = self.logged_pids(r"engine core pid (\d+), API server pids (\d+),(\d+)")
    self.core_pid, *self.api_pids = pids

  def kill(self) -> None:
    restarted = re.findall(r"restarted API server process \d+: pid (\d+)", self.output)
    self.kill_all([self.core_pid, *self.api_pids, *map(int, restarted)])


class Stream(threading.Thread):
  """A long streamed completion; `lines` as they come, `port` the client's local port."""

  def __init__(self, url: str, tag: int):
    super().__init__(daemon=True)
    self.url, self.tag = url, tag
    self.lines: list[str] = []
    self.started = threading.Event()
    self.port: int | None = None
    self.error: Exception | None = None

  def run(self) -> None:
    body = {
      "prompt": f"fault {self.tag}",
      "max_tokens": 230,
      "temperature": 0,
      "ignore_eos": True,
      "stream": True,
    }
    try:
      with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=60) as response:
        stream = response.extensions["network_stream"]
        self.port = stream.get_extra_info("socket").getsockname()[1]
        for line in response.iter_lines():
          if line:
            self.lines.append(line)
            self.started.set()
    except httpx.HTTPError as err:  # the API process serving it was killed
      self.error = err
      self.started.set()


def _owner_of(local_port: int, server_port: int, pids: list[int]) -> int:
  """The pid among `pids` holding the server side of the TCP connection from local_port."""
  inodes = set()
  with open("/proc/net/tcp") as table:
    for row in table.readlines()[1:]:
      fields = row.split()
      local, remote = fields[1], fields[2]
      if (
        int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == local_port
      ):
        inodes.add(fields[9])
  for pid in pids:
    for fd in os.listdir(f"/proc/{pid}/fd"):
      try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
      except OSError:
        continue
      if target.startswith("socket:[") and target[8:-1] in inodes:
        return pid
  raise AssertionError(f"no API server process holds the connection from port {local_port}")


def test_killing_the_core_ends_every_stream_and_the_supervisor_fails(tmp_path):
  supervisor = Supervisor(tmp_path)
  try:
    streams = [Stream(supervisor.url, i) for i in range(4)]
    for stream in streams:
      stream.start()
    assert all(s.started.wait(30) for s in streams)
    os.kill(supervisor.core_pid, signal.SIGKILL)
    for stream in streams:
      stream.join(30)
    health = httpx.get(f"{supervisor.url}/health", timeout=5)
    assert health.status_code == 503 and health.json()["status"] == "engine stopped"
    code = supervisor.wait()
  finally:
    supervisor.kill()
  assert code != 0, supervisor.output
  assert "the engine core process died" in supervisor.output
  for stream in streams:
    assert stream.error is None and stream.lines[-1] == "data: [DONE]"
    error = json.loads(stream.lines[-2][6:])["error"]
    assert error["code"] == "internal_error" and "engine core" in error["message"]
    assert json.loads(stream.lines[-3][6:])["choices"][0]["finish_reason"] is None


def test_killing_an_api_process_aborts_its_requests_and_the_other_keeps_serving(tmp_path):
  supervisor = Supervisor(tmp_path)
  try:
    streams = _streams_on_every_api_process(supervisor)
    assert scrape_metrics(supervisor.url)["jaxserve_api_servers"] == 2
    victim = supervisor.api_pids[0]  # api-0
    victims = [s for s in streams if _owner(s, supervisor) == victim]
    os.kill(victim, signal.SIGKILL)
    for stream in streams:
      stream.join(60)
    for stream in streams:
      if stream not in victims:  # the survivor's streams run to the end
        assert stream.error is None and stream.lines[-1] == "data: [DONE]"
    idle = wait_for_idle(supervisor.url)
    assert idle["jaxserve_kv_pages_used"] == 0 and idle["jaxserve_num_requests_running"] == 0
    response = httpx.post(
      f"{supervisor.url}/v1/completions", timeout=30, json={"prompt": "still here", "max_tokens": 4}
    )
    assert response.status_code == 200
    assert httpx.get(f"{supervisor.url}/health").status_code == 200
    assert scrape_metrics(supervisor.url)["jaxserve_kv_pages_used"] == 0
    supervisor.process.send_signal(signal.SIGTERM)
    code = supervisor.wait()
  finally:
    supervisor.kill()
  output = supervisor.output
  cut = [s for s in victims if s.error is not None]  # running when their process died
  assert cut, "every stream of the killed process had finished"
  aborted = re.search(r"client api-0 disconnected: aborted its (\d+) request", output)
  assert aborted and int(aborted.group(1)) >= len(cut), output
  assert code == 0, output  # the dead process was restarted (tests/server/test_api_restarts.py)


_owners: dict[int, int] = {}


def _streams_on_every_api_process(supervisor: Supervisor) -> list[Stream]:
  """Started streams, one new connection each, until every API process serves one of them."""
  streams: list[Stream] = []
  while not {_owner(s, supervisor) for s in streams} >= set(supervisor.api_pids):
    assert len(streams) < 40, "every connection went to one API server process"
    stream = Stream(supervisor.url, len(streams))
    stream.start()
    assert stream.started.wait(30) and stream.port is not None
    streams.append(stream)
  return streams


def _owner(stream: Stream, supervisor: Supervisor) -> int:
  if stream.port not in _owners:
    _owners[stream.port] = _owner_of(stream.port, supervisor.port, supervisor.api_pids)
  return _owners[stream.port]


def test_every_scrape_counts_the_requests_of_every_api_process(tmp_path):
  """Two API server processes share the port: whichever answers /metrics reports the request
  counters and histograms of both (server/metrics.py: prometheus_client's multi-process mode in
  the supervisor's directory), here after streams served by each of them."""
  supervisor = Supervisor(tmp_path)
  try:
    streams = _streams_on_every_api_process(supervisor)
    for stream in streams:
      stream.join(60)
      assert stream.error is None and stream.lines[-1] == "data: [DONE]"
    wait_for_idle(supervisor.url)
    length = "vllm:request_success_total{engine=0,finished_reason=length,model_name=tiny-random}"
    for _ in range(8):  # new connections: both processes answer some of them
      values = scrape_metrics(supervisor.url)
      assert values["jaxserve_generation_tokens_total"] == 230 * len(streams)
      assert values["vllm:generation_tokens_total{engine=0,model_name=tiny-random}"] == (
        230 * len(streams)
      )
      assert values["jaxserve_e2e_request_latency_seconds_count"] == len(streams)
      assert values[length] == len(streams)
      # each API server process times its garbage collections (runtime/gc_pauses.py)
      assert values["jaxserve_api_server_gc_pause_seconds_count{generation=0}"] > 0
    supervisor.process.send_signal(signal.SIGTERM)
    assert supervisor.wait() == 0, supervisor.output
  finally:
    supervisor.kill()
