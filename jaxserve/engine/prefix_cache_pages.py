"""The scheduler's prefix-cache page bookkeeping (engine/scheduler.py composes one). Pure Python,
no jax.

With prefix caching an admitted request first takes the cached full pages of its known tokens,
never covering the last one (a token must be computed for logits to exist), and none at all
when it asks for prompt_logprobs (those need the prompt's logits). Full pages are registered in
the cache as they are computed (at the next `schedule()`) and when a request finishes normally;
an admitted request's full pages are registered as soon as it is admitted, before the step that
computes them runs, so the requests admitted after it in the same step (the n choices of one
prompt, a burst of requests sharing a system prompt) take them as a hit instead of computing
them again. That is safe because every layer writes a step's K/V before any query of the step
reads the pages, and a step, once scheduled, always runs. The last, partial page is never
shared: each such request computes the tokens past the shared full pages (fewer than a page)
into a page of its own, so no page is written by two sequences and none needs copying. Each
admission that looked the cache up counts its known tokens as queried and the tokens its
cached pages cover as hits (`prefix_cache_queries`, `prefix_cache_hits`: vLLM's prefix cache
counters, in tokens); a look-up whose admission fails is not counted, the one that admits the
request is.

Contracts. `PrefixCachePages` keeps, per request id, how many of its leading full pages are
registered and its chained page hashes (engine/page_allocator.py, extended as needed); the page
work itself is engine/kv_groups.py's, across every KV group. With prefix caching disabled it
takes and registers nothing and counts nothing, but `release` still frees the request's pages:
it is the one way the scheduler releases a request's pages, so the registered count is
forgotten with them. `take_cached_prefix` sets the request's num_computed_tokens to the hit;
`count_lookup` is called only once the admission that looked up succeeded.
"""

from __future__ import annotations

from collections.abc import Iterable

from .kv_groups import KVGroupPages
from .page_allocator import extend_page_hashes
from .request import Request


class PrefixCachePages:
  """Which of each request's full pages are in the prefix cache, and the cache's counters."""

  def __init__(self, pages: KVGroupPages, enabled: bool) -> None:
    self.enabled = enabled
    self.page_size = pages.page_size
    self._pages = pages
    self._num_registered_pages: dict[str, int] = {}
    self._page_hashes: dict[str, list[bytes]] = {}  # request id -> chained hashes of its pages
    self._queries = 0
    self._hits = 0

  @property
  def queries(self) -> int:
    """Known tokens of the admissions that looked the prefix cache up."""
    return self._queries

  @property
  def hits(self) -> int:
    """Tokens of those admissions that cached pages covered."""
    return self._hits

  def take_cached_prefix(self, request: Request) -> bool:
    """Takes the request's cached full pages; False if it may not read the cache."""
    if not self.enabled or request.sampling_params.prompt_logprobs is not None:
      return False
    hashes = self._hashes(request, (request.num_tokens - 1) // self.page_size)
    num_hit = self._pages.take_cached_prefix(request, hashes)
    request.num_computed_tokens = num_hit * self.page_size
    self._num_registered_pages[request.request_id] = num_hit
    return True

  def count_lookup(self, request: Request) -> None:
    """Counts the look-up of a request just admitted: its known tokens, its cached ones."""
    self._queries += request.num_tokens
    self._hits += request.num_computed_tokens

  def register_computed(self, running: Iterable[Request]) -> None:
    """Registers the full pages the last step computed. A running request can have a newly
    filled page only once its computed tokens reach the end of the page after its registered
    ones; the others cost one comparison."""
    if not self.enabled:
      return
    registered, page_size = self._num_registered_pages, self.page_size
    for request in running:
      if request.num_computed_tokens >= (registered.get(request.request_id, 0) + 1) * page_size:
        self.register(request)

  def register(self, request: Request, end: int | None = None) -> None:
    """Registers the request's full pages below `end` (default: its computed tokens)."""
    if not self.enabled:
      return
    computed = request.num_computed_tokens if end is None else end
    num_written = min(
      computed, request.num_tokens, len(request.page_ids) * self.page_size
    )  # a burst may run past its pages
    num_full = num_written // self.page_size
    first = self._num_registered_pages.get(request.request_id, 0)
    if num_full <= first:
      return
    self._pages.register(request, self._hashes(request, num_full), first)
    self._num_registered_pages[request.request_id] = num_full

  def release(self, request: Request) -> None:
    """Frees the request's pages in every group; none of them is registered by it any more."""
    self._pages.release(request)
    self._num_registered_pages.pop(request.request_id, None)

  def forget(self, request: Request) -> None:
    """Drops the page hashes of a request that left the scheduler."""
    self._page_hashes.pop(request.request_id, None)

  def _hashes(self, request: Request, num_pages: int) -> list[bytes]:
    """The chained hashes of the request's first num_pages pages (kept, extended as needed)."""
    hashes = self._page_hashes.setdefault(request.request_id, [])
    if len(hashes) < num_pages:
      num_tokens = num_pages * self.page_size
      extend_page_hashes(hashes, request.all_token_ids[:num_tokens], self.page_size)
    return hashes[:num_pages]
