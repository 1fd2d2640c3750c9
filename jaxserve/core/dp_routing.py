"""Which engine core serves an HTTP call when data_parallel_size cores serve one model: THE
routing rule (pure Python, no jax; each API server process holds one PrefixAffinityRouter,
core/dp_client.py).

Load. A core's load is its requests, waiting + running as it last reported them (the EngineStats
every core sends its clients whenever they change, the /metrics channel), plus the requests sent
to it whose add the core has not answered yet, plus its KV cache use (0 to 1: the share of its
pages held), which only tells apart cores with as many requests. An answer arrives in the same
message as the stats that count it, so nothing is counted twice or missed. A core answers adds
after its step, and the other API server processes' unanswered adds are not seen here: this
server counts its own unanswered adds once per API server process (core_load), as if every
server had sent as many. Counted once, a core slow to answer (a longer step) would look less
loaded than it is by every other server's unanswered adds, and a burst spread over several API
servers would pile onto it (tests/core/test_dp_routing.py simulates one: 768 to 232).

Prefix affinity. The prompt's first AFFINITY_PAGES full pages are hashed with the prefix
cache's own chained page hash (engine/page_allocator.extend_page_hashes: a page's hash covers
every token before it), page_size tokens each (the cores' cache.page_size, from CoreInfo). The
router remembers which core each of those hashes last went to (a bounded table, least recently
used out). A call whose prompt shares pages with earlier ones goes where the longest shared
prefix went, so the cached pages there serve it, unless that core is much busier than the least
loaded one: more than AFFINITY_MARGIN requests and AFFINITY_SHARE of the least load above it.
Otherwise (no shared page, a prompt shorter than a page, or the affine core much busier) the
least loaded live core serves it; between equally loaded cores the choice rotates. Either way
the prompt's pages are recorded for the chosen core. Dead cores are never chosen; None when
every core is dead.

One table per API server process: the kernel spreads connections over the API server processes,
so two calls sharing a prefix that reach different API servers may go to different cores (each
still serves them correctly; only the cache hit is lost).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from jaxserve.engine.page_allocator import extend_page_hashes

AFFINITY_PAGES = 32  # the prompt's first pages the table keys on
AFFINITY_ENTRIES = 1 << 16  # page hashes remembered (about 4 MiB)
AFFINITY_MARGIN = 4  # requests the affine core may have above the least loaded one...
AFFINITY_SHARE = 0.25  # ...or this share of the least load, whichever is more


@dataclass(frozen=True)
class CoreLoad:
  """One engine core as the router sees it."""

  alive: bool
  requests: int  # waiting + running (reported) + adds not yet answered (core_load)
  kv_usage: float = 0.0  # share of its KV pages held, 0 to 1

  @property
  def score(self) -> float:
    return self.requests + self.kv_usage


def core_load(
  alive: bool, reported: int, unanswered: int, api_servers: int, kv_usage: float
) -> CoreLoad:
  """A core's load as one API server estimates it: `reported` waiting + running requests, plus
  its own `unanswered` adds counted for each of the `api_servers` processes (at least one)."""
  return CoreLoad(alive, reported + unanswered * max(1, api_servers), kv_usage)


def much_busier(core: CoreLoad, least: CoreLoad) -> bool:
  """Whether `core` is loaded enough above the least loaded core to give up prefix affinity."""
  return core.score - least.score > max(AFFINITY_MARGIN, AFFINITY_SHARE * least.score)


def prompt_page_hashes(prompt_token_ids: Sequence[int], page_size: int) -> list[bytes]:
  """The chained hashes of the prompt's first AFFINITY_PAGES full pages (the prefix cache's)."""
  hashes: list[bytes] = []
  extend_page_hashes(hashes, prompt_token_ids[: AFFINITY_PAGES * page_size], page_size)
  return hashes


class PrefixAffinityRouter:
  """Chooses a core per HTTP call and remembers where each prompt prefix went."""

  def __init__(self, page_size: int, capacity: int = AFFINITY_ENTRIES):
    self._page_size = page_size
    self._capacity = capacity
    self._table: OrderedDict[bytes, int] = OrderedDict()  # page hash -> core index
    self._next = 0  # where the rotation among equally loaded cores starts

  def choose(self, prompt_token_ids: Sequence[int], loads: Sequence[CoreLoad]) -> int | None:
    """The core to serve a call whose (first) prompt is `prompt_token_ids`; None if all dead."""
    live = [i for i, load in enumerate(loads) if load.alive]
    if not live:
      return None
    least = self._least_loaded(live, loads)
    hashes = prompt_page_hashes(prompt_token_ids, self._page_size)
    affine = self._affine(hashes, loads)
    if affine is not None and not much_busier(loads[affine], loads[least]):
      chosen = affine
    else:
      chosen = least
      self._next = (least + 1) % len(loads)
    self._remember(hashes, chosen)
    return chosen

  def _least_loaded(self, live: list[int], loads: Sequence[CoreLoad]) -> int:
    lowest = min(loads[i].score for i in live)
    tied = [i for i in live if loads[i].score == lowest]
    return min(tied, key=lambda i: (i - self._next) % len(loads))

  def _affine(self, hashes: list[bytes], loads: Sequence[CoreLoad]) -> int | None:
    """The live core the longest recorded prefix of `hashes` went to."""
    for page_hash in reversed(hashes):
      core = self._table.get(page_hash)
      if core is not None and core < len(loads) and loads[core].alive:
        return core
    return None

  def _remember(self, hashes: list[bytes], core: int) -> None:
    table = self._table
    for page_hash in hashes:
      table[page_hash] = core
      table.move_to_end(page_hash)
    while len(table) > self._capacity:
      table.popitem(last=False)
