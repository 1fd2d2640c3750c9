"""Step inputs as bytes, so host 0 can hand each step to the other hosts.

A StepInputs pytree always has the same structure; only its leaves travel, as msgpack records of
(dtype, shape, raw bytes). Device-resident leaves (the runner's cached all -1 penalty history)
are sent as a (dtype, shape, fill value) record instead of their contents, and the receiver turns
such a record back into its own cached device constant, so no step moves that history.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import msgpack
import numpy as np

from jaxserve.device.step_inputs import StepInputs

ConstantFn = Callable[[tuple[int, ...], np.dtype, int], jax.Array]


class StepEncoder:
  """Encodes StepInputs; remembers the fill value of each device constant it has seen."""

  def __init__(self) -> None:
    self._fills: dict[int, tuple[jax.Array, int]] = {}

  def encode(self, inputs: StepInputs) -> bytes:
    return msgpack.packb([self._leaf(x) for x in jax.tree_util.tree_leaves(inputs)])

  def _leaf(self, x) -> list:
    if isinstance(x, jax.Array):
      return ["fill", np.dtype(x.dtype).str, list(x.shape), self._fill(x)]
    array = np.asarray(x)
    return ["raw", array.dtype.str, list(array.shape), array.tobytes()]

  def _fill(self, x: jax.Array) -> int:
    if id(x) not in self._fills:
      host = np.asarray(x)
      if host.size and not (host == host.flat[0]).all():
        raise ValueError("step inputs: a device-resident leaf must be constant-filled")
      self._fills[id(x)] = (x, int(host.flat[0]) if host.size else 0)  # keeps x alive: stable id
    return self._fills[id(x)][1]


def decode_step_inputs(data: bytes, like: StepInputs, constant: ConstantFn) -> StepInputs:
  """Rebuilds StepInputs with the structure of `like`; fill records come from `constant`."""
  leaves = []
  for kind, dtype, shape, payload in msgpack.unpackb(data):
    dtype, shape = np.dtype(dtype), tuple(shape)
    if kind == "fill":
      leaves.append(constant(shape, dtype, payload))
    else:
      leaves.append(np.frombuffer(payload, dtype).reshape(shape))
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
