"""scripts/launch_tpu_vm.sh against a fake `gcloud` on PATH that records its arguments: the
commands are the Cloud TPU documentation's for single-host and multi-host slices, --dry-run only
prints them, --delete tears down, and a failing gcloud call stops the script with its error."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "launch_tpu_vm.sh"
FAKE_GCLOUD = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["GCLOUD_LOG"], "a") as log:
  log.write(json.dumps(args) + "\\n")
fail_on = os.environ.get("GCLOUD_FAIL_ON")
if fail_on and fail_on in " ".join(args):
  sys.stderr.write("ERROR: (gcloud.compute.tpus) RESOURCE_EXHAUSTED: no capacity in zone\\n")
  sys.exit(1)
formats = {"--format=value(state)": "READY", "--format=value(state.state)": "ACTIVE",
           "--format=value(networkEndpoints[0].accessConfig.externalIp)": "203.0.113.7"}
for arg in args:
  if arg in formats:
    print(formats[arg])
"""


def _run(
  tmp_path: Path, *args: str, fail_on: str | None = None
) -> tuple[subprocess.CompletedProcess, list]:
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  gcloud = bin_dir / "gcloud"
  gcloud.write_text(FAKE_GCLOUD)
  gcloud.chmod(0o755)
  log = tmp_path / "gcloud.log"
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", GCLOUD_LOG=str(log))
  if fail_on:
    env["GCLOUD_FAIL_ON"] = fail_on
  result = subprocess.run(
    ["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
  )
  calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
  return result, calls


def _ssh_commands(calls: list) -> list[str]:
  return [
    next(a for a in call if a.startswith("--command="))
    for call in calls
    if call[:4] == ["compute", "tpus", "tpu-vm", "ssh"]
  ]


def test_single_host_v5e(tmp_path):
  result, calls = _run(
    tmp_path,
    "--name",
    "serve-1",
    "--zone",
    "us-west4-a",
    "--accelerator-type",
    "v5litepod-8",
    "--project",
    "my-project",
  )
  assert result.returncode == 0, result.stderr
  common = ["--zone=us-west4-a", "--project=my-project"]
  assert calls[0] == [
    "compute",
    "tpus",
    "tpu-vm",
    "create",
    "serve-1",
    *common,
    "--accelerator-type=v5litepod-8",
    "--version=v2-alpha-tpuv5-lite",
  ]
  assert calls[1] == [
    "compute",
    "tpus",
    "tpu-vm",
    "describe",
    "serve-1",
    *common,
    "--format=value(state)",
  ]
  scp = calls[2]
  assert scp[:4] == ["compute", "tpus", "tpu-vm", "scp"] and scp[5:] == [
    "serve-1:jaxserve.tar.gz",
    *common,
    "--worker=all",
  ]
  install, serve, health = _ssh_commands(calls)
  assert all(call[4] == "serve-1" for call in calls if call[3] == "ssh")
  assert "pip install -q -U 'jax[tpu]'" in install and "pip install -q -e ~/jaxserve" in install
  assert "jaxserve.cli serve --model tiny-random --tensor-parallel-size 8" in serve
  assert "--config ~/jaxserve/configs/v5e-8.yaml" in serve and "--distributed" not in serve
  assert health == "--command=curl -sf http://localhost:8000/health"
  ssh_workers = [
    next(a for a in call if a.startswith("--worker=")) for call in calls if call[3] == "ssh"
  ]
  assert ssh_workers == ["--worker=all", "--worker=all", "--worker=0"]
  assert "http://203.0.113.7:8000" in result.stdout


@pytest.mark.parametrize(
  "accelerator, version, chips",
  [
    ("v5litepod-16", "v2-alpha-tpuv5-lite", 16),
    ("v4-32", "tpu-ubuntu2204-base", 16),
    ("v6e-16", "v2-alpha-tpuv6e", 16),
  ],
)
def test_multi_host_queued_spot(tmp_path, accelerator, version, chips):
  result, calls = _run(
    tmp_path,
    "--name",
    "pod",
    "--zone",
    "us-central2-b",
    "--accelerator-type",
    accelerator,
    "--queued",
    "--spot",
    "--model",
    "/data/llama",
    "--setup",
    "gcloud storage cp -r gs://bucket/llama /data/",
  )
  assert result.returncode == 0, result.stderr
  assert calls[0] == [
    "compute",
    "tpus",
    "queued-resources",
    "create",
    "pod",
    "--node-id=pod",
    "--zone=us-central2-b",
    f"--accelerator-type={accelerator}",
    f"--runtime-version={version}",
    "--spot",
  ]
  assert calls[1] == [
    "compute",
    "tpus",
    "queued-resources",
    "describe",
    "pod",
    "--zone=us-central2-b",
    "--format=value(state.state)",
  ]
  assert all("--worker=all" in call for call in calls if call[3] == "scp")
  install, setup, serve, _ = _ssh_commands(calls)
  assert setup == "--command=gcloud storage cp -r gs://bucket/llama /data/"
  assert f"--model /data/llama --tensor-parallel-size {chips}" in serve
  assert serve.count("--distributed") == 1


def test_dry_run_prints_without_running(tmp_path):
  result, calls = _run(
    tmp_path,
    "--name",
    "serve-1",
    "--zone",
    "us-east5-b",
    "--accelerator-type",
    "v6e-8",
    "--reserved",
    "--dry-run",
  )
  assert result.returncode == 0, result.stderr
  assert calls == []
  lines = [line for line in result.stdout.splitlines() if line.startswith("gcloud ")]
  assert lines[0] == (
    "gcloud compute tpus tpu-vm create serve-1 --zone=us-east5-b "
    "--accelerator-type=v6e-8 --version=v2-alpha-tpuv6e --reserved"
  )
  assert any("tpu-vm scp" in line and "--worker=all" in line for line in lines)
  assert sum("tpu-vm ssh" in line and "--worker=all" in line for line in lines) == 2
  assert any("configs/v6e-8.yaml" in line for line in lines)


@pytest.mark.parametrize(
  "queued, expected",
  [
    (False, ["compute", "tpus", "tpu-vm", "delete", "pod", "--zone=z1", "--quiet"]),
    (
      True,
      ["compute", "tpus", "queued-resources", "delete", "pod", "--zone=z1", "--force", "--quiet"],
    ),
  ],
)
def test_delete_tears_down(tmp_path, queued, expected):
  result, calls = _run(
    tmp_path, "--name", "pod", "--zone", "z1", "--delete", *(["--queued"] if queued else [])
  )
  assert result.returncode == 0, result.stderr
  assert calls == [expected]


def test_failing_gcloud_call_stops_the_script(tmp_path):
  result, calls = _run(
    tmp_path,
    "--name",
    "serve-1",
    "--zone",
    "us-west4-a",
    "--accelerator-type",
    "v5litepod-8",
    fail_on="tpu-vm create",
  )
  assert result.returncode != 0
  assert "RESOURCE_EXHAUSTED: no capacity in zone" in result.stderr
  assert "launch_tpu_vm.sh: error: command failed with exit status 1" in result.stderr
  assert len(calls) == 1 and calls[0][3] == "create"
