"""What the engine core hands the API servers that serve it: CoreInfo (the tokenizer and the
model's limits; API servers never load the model) and ApiProcessArgs (an API server's start-up
arguments), and the entry point type of an API server, which `jaxserve serve` gives core/
(core/serve.py): core/ starts the processes and threads, server/ serves HTTP, and core/ never
imports server/.

CoreInfo travels in a file, not as a spawn argument: a large tokenizer would fill the spawn pipe
and make the supervisor's start() of each API process wait for that child's imports (see
docs/DECISIONS.md, "CoreInfo reaches the API servers in a file").
"""

from __future__ import annotations

import pickle
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from jaxserve.config import ServerConfig
from jaxserve.config.generation_config import GenerationDefaults
from jaxserve.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:  # API server processes read CoreInfo without importing the engine
  from jaxserve.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class CoreInfo:
  """What the core tells its parent once it serves. page_size: its KV pages' tokens, the
  block the API servers' prefix-affinity routing hashes (core/dp_routing.py);
  generation_defaults: the model's sampling defaults (jaxserve/config/generation_config.py)."""

  tokenizer: Tokenizer
  model_name: str
  max_model_len: int
  vocab_size: int
  warmup_seconds: float
  page_size: int = 16
  generation_defaults: GenerationDefaults = GenerationDefaults()

  @classmethod
  def of(cls, engine: LLMEngine) -> CoreInfo:
    """What `engine` tells the API servers that serve it."""
    return cls(
      engine.tokenizer,
      engine.model_name,
      engine.max_model_len,
      engine.vocab_size,
      engine.warmup_seconds,
      engine.allocator.page_size,
      engine.generation_defaults,
    )


def write_core_info(info: CoreInfo, path: Path) -> None:
  path.write_bytes(pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL))


def read_core_info(path: Path) -> CoreInfo:
  """write_core_info's file (written by a process of the same user)."""
  return pickle.loads(path.read_bytes())


@dataclass(frozen=True)
class ApiProcessArgs:
  """One API server: its settings, the CoreInfo file, the core's address, the listening socket
  it accepts from (None: it binds server.host:port itself), its index, the log level, its
  generation (0 for the first process of the index, k for its k-th restart; the client identity
  is api_identity(index, generation)), the directory the API servers of one supervisor share
  their request metrics in (None: one API server, its metrics its own; server/metrics.py) and
  the addresses of the other engine cores when data_parallel_size > 1 (core_address is core
  0's; the API server routes among them all, core/dp_client.py)."""

  server_config: ServerConfig
  info_path: str
  core_address: str
  sock: socket.socket | None
  index: int
  log_level: str
  generation: int = 0
  metrics_dir: str | None = None
  other_core_addresses: tuple[str, ...] = ()

  @property
  def core_addresses(self) -> tuple[str, ...]:
    """Every engine core's address, by engine index."""
    return (self.core_address,) + self.other_core_addresses

  @property
  def identity(self) -> str:
    return api_identity(self.index, self.generation)


def api_identity(index: int, generation: int = 0) -> str:
  """API server `index`'s client identity at the core (the supervisor's ClientGone names it):
  api-{index}, and api-{index}.{generation} for a restarted one, so the core never mistakes a
  late message of the dead process for one of its successor."""
  return f"api-{index}" if generation == 0 else f"api-{index}.{generation}"


ApiServerEntry = Callable[[ApiProcessArgs], None]  # serves until drained (server/api_process.py)
