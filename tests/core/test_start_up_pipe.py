"""The engine core's start-up pipe carries typed messages: CoreReady once it serves, CoreFailure
before it exits non-zero. A bad setting (a ValueError in the child) comes back as a ValueError,
any other failure as a CoreStartError, and a failure after CoreReady is the handle's error()."""

from __future__ import annotations

import multiprocessing

import pytest

from jaxserve.core.process import CoreFailure, CoreHandle, CoreStartError, start_core_process
from tests.integration.engine_helpers import small_config


def test_a_bad_setting_comes_back_as_a_value_error():
  with pytest.raises(ValueError, match="neither 'tiny-random' nor a checkpoint directory"):
    start_core_process(small_config(model="/nonexistent-model"), "WARNING")


def test_any_other_failure_comes_back_as_a_start_error(tmp_path):
  address = f"ipc://{tmp_path}/no-such-dir/core"  # the engine builds, the bind fails
  config = small_config(max_num_seqs=2, max_tokens_per_step=8, seq_buckets=(2,), token_buckets=(8,))
  with pytest.raises(CoreStartError, match="ZMQError"):
    start_core_process(config, "WARNING", address)


def test_the_handle_reads_the_failure_sent_after_the_core_served():
  parent_end, child_end = multiprocessing.Pipe(duplex=False)
  handle = CoreHandle(multiprocessing.current_process(), "ipc://unused", None, parent_end)
  assert handle.error() is None
  child_end.send(CoreFailure("RuntimeError: the step failed"))
  assert handle.error() == "RuntimeError: the step failed"
