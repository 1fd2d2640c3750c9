"""A request's pages in every KV group (messages/kv_layout.py), over one PageAllocator. Pure
Python, no jax.

Block tables. `Request.page_ids` is group 0's table (the layers that see the whole context, or
every layer of a one-kind model); `Request.window_page_ids[k]` is group k + 1's, a sliding group
of window w. All are positional (entry i holds positions [i * P, (i + 1) * P), P the page size)
and equally long; a sliding table holds NULL_PAGE where a page is wholly before the window,
and those entries form a prefix of the table (pages are released from the bottom, and a prefix
hit leaves the entries below its window null), so finding what to release costs one look when
nothing is.

A step whose queries run from position c (the request's num_computed_tokens) to `end` needs group
0's pages for [0, end) and a sliding group's for [max(0, c - w + 1), end): its first query sees
back to c - w + 1, and a chunk longer than the window still writes every position it feeds.

Release. `release_outside_windows`, called before a running request is scheduled, releases the
sliding entries i < (c - w + 1) // P, wholly before the next query's window, and sets them null
(a registered page becomes evictable, not free). The step in flight (async scheduling) may
still read them, but steps run in order on the device, so a page handed out again now is only
written by a later step. `release` frees every held entry of every group, position-major and
tail first (the prefix pages, the most shareable, are evicted last).

Prefix caching. Group g's full page i is cached under (g, hash_i), hash_i the request's chained
hash of its first i + 1 pages (engine/page_allocator.py). A hit of L pages needs group 0's pages
[0, L) and every sliding group's [max(0, L * P - w + 1) // P, L): `take_cached_prefix` finds
group 0's longest cached run, then the largest L within it for which every sliding group has
its window's pages cached (searching down, as vLLM's hybrid KV cache manager does), and takes
references on those; the sliding entries below stay null.
"""

from __future__ import annotations

from collections.abc import Sequence

from .page_allocator import NULL_PAGE, PageAllocator
from .request import Request


class KVGroupPages:
  """The scheduler's page operations on a request, across its KV groups (module docstring).
  `windows` are the sliding groups' windows, group 1 first (empty: one group)."""

  def __init__(self, allocator: PageAllocator, windows: tuple[int, ...]) -> None:
    self.allocator = allocator
    self.page_size = allocator.page_size
    self.windows = windows

  @property
  def num_groups(self) -> int:
    return 1 + len(self.windows)

  def clear(self, request: Request) -> None:
    """Empty tables in every group (a request being admitted, or after `release`)."""
    request.page_ids = []
    request.window_page_ids = [[] for _ in self.windows]

  def num_new_pages(self, request: Request, end: int) -> int:
    """Pages, over all groups, a step feeding positions num_computed_tokens .. end - 1 needs
    beyond those the request holds."""
    num_total = -(-end // self.page_size)
    num_new = max(0, num_total - len(request.page_ids))
    if self.windows:
      start = request.num_computed_tokens
      for window, table in zip(self.windows, request.window_page_ids, strict=True):
        first = max(0, start - window + 1) // self.page_size
        num_new += max(0, num_total - max(len(table), first))
    return num_new

  def allocate(self, request: Request, end: int) -> None:
    """Extends every table to cover `end` (callers checked `num_new_pages` is free)."""
    allocator = self.allocator
    num_total = -(-end // self.page_size)
    request.page_ids.extend(allocator.allocate(max(0, num_total - len(request.page_ids))))
    start = request.num_computed_tokens
    for group, (window, table) in enumerate(
      zip(self.windows, request.window_page_ids, strict=True), 1
    ):
      first = max(0, start - window + 1) // self.page_size
      if first > len(table):
        table.extend([NULL_PAGE] * (first - len(table)))
      table.extend(allocator.allocate(max(0, num_total - len(table)), group))

  def release_outside_windows(self, request: Request) -> None:
    """Releases the sliding entries wholly before the window of a query at num_computed_tokens."""
    start, released = request.num_computed_tokens, []
    for window, table in zip(self.windows, request.window_page_ids, strict=True):
      index = min(max(0, start - window + 1) // self.page_size, len(table)) - 1
      while index >= 0 and table[index] != NULL_PAGE:
        released.append(table[index])
        table[index] = NULL_PAGE
        index -= 1
    if released:
      self.allocator.free(released)

  def release(self, request: Request) -> None:
    """Frees every held page of every group, tail first, and empties the tables."""
    tables = [request.page_ids, *request.window_page_ids]
    if len(tables) == 1:
      self.allocator.free(reversed(request.page_ids))
    else:
      held = (
        page_id
        for index in reversed(range(len(request.page_ids)))
        for table in tables
        if (page_id := table[index]) != NULL_PAGE
      )
      self.allocator.free(held)
    self.clear(request)

  def take_cached_prefix(self, request: Request, hashes: Sequence[bytes]) -> int:
    """Fills the empty tables of `request` with the longest cached prefix that every group can
    serve (module docstring), references taken; returns its length in pages."""
    allocator = self.allocator
    full: list[int] = []
    for page_hash in hashes:
      page_id = allocator.cached_page(0, page_hash)
      if page_id is None:
        break
      full.append(page_id)
    num_hit = self._window_hit(hashes, len(full)) if self.windows else len(full)
    request.page_ids = full[:num_hit]
    allocator.share(request.page_ids)
    for group, (window, table) in enumerate(
      zip(self.windows, request.window_page_ids, strict=True), 1
    ):
      first = max(0, num_hit * self.page_size - window + 1) // self.page_size
      table[:] = [NULL_PAGE] * first
      table.extend(allocator.cached_page(group, hashes[i]) for i in range(first, num_hit))
      allocator.share(table[first:])
    return num_hit

  def register(self, request: Request, hashes: Sequence[bytes], first: int) -> None:
    """Registers the held pages first .. len(hashes) - 1 of every group (full, computed pages
    whose chained hashes are `hashes`)."""
    allocator = self.allocator
    for index in range(first, len(hashes)):
      allocator.register(0, hashes[index], request.page_ids[index])
      for group, table in enumerate(request.window_page_ids, 1):
        if table[index] != NULL_PAGE:
          allocator.register(group, hashes[index], table[index])

  def _window_hit(self, hashes: Sequence[bytes], num_full: int) -> int:
    """The largest L <= num_full such that every sliding group has pages
    [max(0, L * P - w + 1) // P, L) cached."""
    runs = []  # per sliding group: the cached run ending at each page
    for group in range(1, self.num_groups):
      run, length = [], 0
      for index in range(num_full):
        cached = self.allocator.cached_page(group, hashes[index]) is not None
        length = length + 1 if cached else 0
        run.append(length)
      runs.append(run)
    for num_hit in range(num_full, 0, -1):
      end = num_hit * self.page_size
      if all(
        num_hit - max(0, end - window + 1) // self.page_size <= run[num_hit - 1]
        for window, run in zip(self.windows, runs, strict=True)
      ):
        return num_hit
    return 0
