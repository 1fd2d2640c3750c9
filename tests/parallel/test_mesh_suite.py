"""Runs tests/parallel/mesh/ in a subprocess that sees 8 CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before jax starts)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


@pytest.mark.skipif(jax.device_count() >= 8, reason="the mesh tests run in this process")
def test_mesh_tests_pass_on_8_cpu_devices():
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"
  result = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/parallel/mesh"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
  assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
  assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
