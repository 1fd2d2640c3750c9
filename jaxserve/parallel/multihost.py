"""Multi-host serving: joining the jax.distributed job, and handing each step to the other hosts.

Every host runs `jaxserve serve` with the same settings. `initialize_distributed` joins the job
(coordinator address, process count and id from the config, or auto-detected on a Cloud TPU VM).
If the job is not complete within initialization_timeout_s, the process prints which process could
not join which coordinator and exits with JOIN_FAILED_EXIT_CODE; JAX's own deadline is set a little
later so that this message, not a native abort, is what a failing host reports.

jax.distributed.initialize starts JAX's preemption service, whose native notifier replaces the
process's SIGTERM handler and only records the signal (for multihost_utils'
reached_preemption_sync_point, which jaxserve does not use): a SIGTERM during warm-up would be
swallowed and the host would go on to serve. `initialize_distributed` therefore puts the SIGTERM
handler that was in place before back (Python's, the default one: the host exits; `jaxserve
serve` installs its draining handler when it starts serving).

Process 0 runs the HTTP server and the scheduler. Before each step it publishes the step's
fixed-shape inputs in the key-value store of JAX's distributed runtime (the coordination service
that jax.distributed.initialize already runs), under a per-step key; the other processes block on
that key, decode the inputs and call the same jitted step, so the SPMD program runs on every host
with identical arguments. The store is used instead of a device broadcast
(multihost_utils.broadcast_one_to_all) because it needs no extra compiled program, moves the bytes
host to host without a device round trip, and lets the worker learn the bucket shape from the
message itself. The key-value store is reached through jax._src.distributed.global_state.client,
which JAX 0.10 and 0.11 both provide.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import jax
import msgpack
import numpy as np

from jaxserve.config import DistributedConfig
from jaxserve.device.step_inputs import StepInputs
from jaxserve.device.step_programs import constant_array
from jaxserve.parallel.step_codec import ConstantFn, StepEncoder, decode_step_inputs

logger = logging.getLogger(__name__)

JOIN_FAILED_EXIT_CODE = 3
JAX_DEADLINE_MARGIN_S = 30
POLL_TIMEOUT_MS = 60_000
STEP_PREFIX = "jaxserve/step/"
PLAN_KEY = "jaxserve/plan"
STOP = b"stop"


def initialize_distributed(config: DistributedConfig) -> None:
  """Joins the jax.distributed job described by `config` (no-op when it is not active)."""
  if not config.active:
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  timeout = config.initialization_timeout_s
  who = (
    f"process {config.process_id if config.process_id is not None else '(auto)'} of "
    f"{config.num_processes or '(auto)'}"
  )
  where = config.coordinator_address or "(auto-detected coordinator)"
  logger.info("distributed: %s joining %s (timeout %d s)", who, where, timeout)
  joined = threading.Event()

  def give_up() -> None:
    if joined.is_set():
      return
    sys.stderr.write(
      f"jaxserve: error: distributed: {who} could not complete the job at {where} within "
      f"{timeout} s (distributed.initialization_timeout_s). Every host must run `jaxserve "
      f"serve` with the same --coordinator-address and --num-processes and its own "
      f"--process-id, and the coordinator port must be reachable.\n"
    )
    sys.stderr.flush()
    os._exit(JOIN_FAILED_EXIT_CODE)

  watchdog = threading.Timer(timeout, give_up)
  watchdog.daemon = True
  watchdog.start()
  previous_sigterm = signal.getsignal(signal.SIGTERM)
  try:
    jax.distributed.initialize(
      coordinator_address=config.coordinator_address,
      num_processes=config.num_processes,
      process_id=config.process_id,
      initialization_timeout=timeout + JAX_DEADLINE_MARGIN_S,
    )
  except Exception as err:  # a bad address or a rejected registration, before the deadline
    raise ValueError(f"distributed: {who} could not join {where}: {err}") from err
  finally:
    joined.set()
    watchdog.cancel()
  _restore_sigterm(previous_sigterm)
  logger.info(
    "distributed: process %d of %d joined; %d devices in the job (%d local)",
    jax.process_index(),
    jax.process_count(),
    jax.device_count(),
    jax.local_device_count(),
  )


def _restore_sigterm(handler: object) -> None:
  """Re-installs `handler` over the preemption notifier's (see the module docstring)."""
  if threading.current_thread() is threading.main_thread() and handler is not None:
    signal.signal(signal.SIGTERM, handler)


def is_worker() -> bool:
  """True on every process but process 0 of a multi-host job."""
  return jax.process_count() > 1 and jax.process_index() != 0


def _client():
  from jax._src import distributed  # the runtime's key-value store has no public handle

  client = distributed.global_state.client
  if client is None:
    raise ValueError("distributed: jax.distributed is not initialized")
  return client


def _blocking_get(client, key: str) -> bytes:
  """Waits for `key` as long as it takes, in POLL_TIMEOUT_MS slices."""
  while True:
    try:
      return client.blocking_key_value_get_bytes(key, POLL_TIMEOUT_MS)
    except Exception as err:  # the runtime raises on its deadline; anything else propagates
      if "DEADLINE_EXCEEDED" not in str(err).upper():
        raise


class StepPublisher:
  """Process 0's side: publishes the agreed KV pool size and every step's inputs."""

  def __init__(self) -> None:
    self._client = _client()
    self._encoder = StepEncoder()
    self._num_published = 0

  def agree_num_pages(self, num_pages: int) -> int:
    self._client.key_value_set_bytes(PLAN_KEY, msgpack.packb({"num_pages": num_pages}))
    return num_pages

  def publish(self, inputs: StepInputs) -> None:
    self._put(self._encoder.encode(inputs))

  def stop(self) -> None:
    """Tells the workers to leave their loop (after the last step)."""
    self._put(STOP)

  def _put(self, data: bytes) -> None:
    n = self._num_published
    self._client.key_value_set_bytes(f"{STEP_PREFIX}{n}", data)
    if n >= 2:  # step n-2 ran on every host: its collectives could not finish otherwise
      self._client.key_value_delete(f"{STEP_PREFIX}{n - 2}")
    self._num_published += 1


class StepSubscriber:
  """A worker's side: receives the KV pool size and then step after step."""

  def __init__(self) -> None:
    self._client = _client()
    self._num_received = 0

  def agree_num_pages(self, num_pages: int) -> int:
    plan = msgpack.unpackb(_blocking_get(self._client, PLAN_KEY))
    if plan["num_pages"] != num_pages:
      logger.info(
        "KV pool: using process 0's %d pages (this host would fit %d)", plan["num_pages"], num_pages
      )
    return int(plan["num_pages"])

  def receive(self, like: StepInputs, constant: ConstantFn) -> StepInputs | None:
    """The next step's inputs (structured like `like`), or None once process 0 has stopped."""
    data = _blocking_get(self._client, f"{STEP_PREFIX}{self._num_received}")
    self._num_received += 1
    if data == STOP:
      return None
    return decode_step_inputs(data, like, constant)


def replicated_constant(sharding: jax.sharding.Sharding) -> ConstantFn:
  """A cached constant-array factory placing each array with `sharding`."""
  cache: dict[tuple, jax.Array] = {}

  def constant(shape: tuple[int, ...], dtype: np.dtype, value: int) -> jax.Array:
    key = (shape, dtype.str, value)
    if key not in cache:
      cache[key] = constant_array(shape, dtype, value, sharding)
    return cache[key]

  return constant
