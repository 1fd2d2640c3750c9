"""Runs tests/parallel/mesh/ in a subprocess that sees 8 CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before jax starts)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import jax
import pytest

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


@pytest.mark.skipif(jax.device_count() >= 8, reason="the mesh tests run in this process")
def test_mesh_tests_pass_on_8_cpu_devices(tmp_path):
  env = dict(os.environ)
  flag = "--xla_force_host_platform_device_count=8"
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
  env["JAX_PLATFORMS"] = "cpu"
  report = tmp_path / "mesh.xml"
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      "-p",
      "no:cacheprovider",
      "-n",
      "0",  # one process: it owns the 8 host devices (no xdist workers inside)
      f"--junitxml={report}",
      "tests/parallel/mesh",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=TIMEOUT_S,
  )
  assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
  suite = ElementTree.parse(report).getroot().find("testsuite")
  assert int(suite.get("tests")) >= 5 and int(suite.get("skipped")) == 0, result.stdout[-2000:]
