"""The engine core's end of its ZeroMQ connections: a fresh ipc:// address (a Unix socket in
the temporary directory) and the ROUTER socket bound there, which CoreLoop (core/loop.py)
serves, in the engine core process or on a thread of the serving process.

No high-water marks: a ROUTER drops what a slow peer cannot take, which would lose a stream's
tokens; a client's backlog is bounded by its own requests instead.
"""

from __future__ import annotations

import os
import tempfile
import uuid

import zmq


def core_address() -> str:
  return f"ipc://{tempfile.gettempdir()}/jaxserve-core-{uuid.uuid4().hex[:12]}"


def bind_router(context: zmq.Context, address: str) -> zmq.Socket:
  """The core's ROUTER socket, bound at `address`."""
  socket = context.socket(zmq.ROUTER)
  try:
    socket.setsockopt(zmq.LINGER, 1000)
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.bind(address)
  except BaseException:
    socket.close()
    raise
  return socket


def remove_address(address: str) -> None:
  """Deletes an ipc:// address's socket file (nothing for other transports)."""
  if address.startswith("ipc://"):
    try:
      os.unlink(address[len("ipc://") :])
    except OSError:
      pass
