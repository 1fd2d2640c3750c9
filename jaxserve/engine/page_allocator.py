"""Host-side allocator of KV cache pages: free list, reference counts, optional prefix cache.

Page 0 is the null page: padding tokens write into it, and a sliding-window group's block table
holds it where a page fell out of the window, so it is never handed out. Pages 1 .. num_pages - 1
are usable. Every usable page is in exactly one of three places:

* used: reference count > 0, held by one or more sequences (their block tables);
* free: reference count 0, content meaningless;
* evictable (prefix caching only): reference count 0, but it holds a registered full page whose
  K/V can be reused by a later sequence with the same prefix. Evictable pages count as free:
  `allocate` takes plain free pages first, then evicts the least recently freed cached page and
  drops its hash entry.

KV groups (messages/kv_layout.py): one pool serves every group, and a page belongs to the group
that allocated it until it is allocated again (`allocate(n, group)`): a page of group g is only
ever in group g's block tables and only ever serves group g's prefix cache.

Prefix caching. A full page is identified by a chained hash, sha256(parent hash || token ids of
the page) (`hash_page`, chained by `extend_page_hashes`), so a page's identity covers the whole
prefix before it (a collision-resistant digest, since a false hit would silently serve wrong
K/V). The cache maps (group, hash) to the page serving it: `register` records a held page,
`cached_page` looks one up, `share` takes references on the pages of a hit (engine/kv_groups.py
decides which). Only full pages are ever shared, and a sequence writes only at positions >= its
computed length, i.e. into its own last, partial page, so shared pages are never written and no
copy-on-write is needed. When two sequences computed the same page independently, the first
registered page serves the hash; the other is a plain page that is freed normally.
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from collections.abc import Iterable, Sequence

NULL_PAGE = 0
_ROOT_HASH = b""


def hash_page(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
  """Chained identity of one full page: its tokens and (through parent_hash) every token before."""
  return hashlib.sha256(parent_hash + array("q", token_ids).tobytes()).digest()


def extend_page_hashes(hashes: list[bytes], token_ids: Sequence[int], page_size: int) -> None:
  """Appends to `hashes` (the chained hashes of token_ids' first pages) those of token_ids' other
  full pages."""
  parent = hashes[-1] if hashes else _ROOT_HASH
  for index in range(len(hashes), len(token_ids) // page_size):
    parent = hash_page(parent, token_ids[index * page_size : (index + 1) * page_size])
    hashes.append(parent)


class PageAllocator:
  """Hands out KV cache pages with reference counts; see the module docstring."""

  def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool = False) -> None:
    if not isinstance(num_pages, int) or num_pages < 2:
      raise ValueError(
        f"num_pages: must be an integer >= 2 (page 0 is the null page), got {num_pages!r}"
      )
    if not isinstance(page_size, int) or page_size < 1:
      raise ValueError(f"page_size: must be a positive integer, got {page_size!r}")
    self.num_pages = num_pages
    self.page_size = page_size
    self.enable_prefix_caching = enable_prefix_caching
    self._refcounts = [0] * num_pages
    self._group = [0] * num_pages  # the KV group each page was last allocated to
    self._free: collections.deque[int] = collections.deque(range(1, num_pages))
    self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
    self._page_hash: dict[int, tuple[int, bytes]] = {}  # (group, hash) of each registered page
    self._cached: dict[tuple[int, bytes], int] = {}  # (group, hash) -> the page that serves it

  @property
  def num_usable_pages(self) -> int:
    return self.num_pages - 1

  @property
  def num_free_pages(self) -> int:
    """Pages `allocate` can hand out, evictable cached pages included."""
    return len(self._free) + len(self._evictable)

  @property
  def num_used_pages(self) -> int:
    return self.num_usable_pages - self.num_free_pages

  @property
  def num_cached_pages(self) -> int:
    """Pages registered in the prefix cache, in use or evictable."""
    return len(self._cached)

  def num_used_pages_in(self, group: int) -> int:
    """Pages of KV group `group` held by sequences (counted over the pool: for tests and
    statistics, not the scheduling path)."""
    refcounts, groups = self._refcounts, self._group
    return sum(1 for p in range(1, self.num_pages) if refcounts[p] and groups[p] == group)

  def can_allocate(self, num_pages: int) -> bool:
    return 0 <= num_pages <= self.num_free_pages

  def allocate(self, num_pages: int, group: int = 0) -> list[int]:
    """Returns num_pages pages of KV group `group` with reference count 1. Callers check
    `can_allocate` first."""
    if not isinstance(num_pages, int) or num_pages < 0:
      raise ValueError(f"num_pages: must be a non-negative integer, got {num_pages!r}")
    if num_pages > self.num_free_pages:
      raise RuntimeError(
        f"allocate: {num_pages} pages requested but only {self.num_free_pages} are free"
      )
    page_ids = [self._take_free_page() for _ in range(num_pages)]
    if group:
      for page_id in page_ids:
        self._group[page_id] = group
    return page_ids

  def free(self, page_ids: Iterable[int]) -> None:
    """Drops one reference per listed page; a page returns to the pool at 0 references.

    Cached pages become evictable in the order given: pass a sequence's pages tail first so
    that its prefix pages, the most shareable, are evicted last.
    """
    page_ids = list(page_ids)
    for page_id, count in collections.Counter(page_ids).items():
      if not (isinstance(page_id, int) and NULL_PAGE < page_id < self.num_pages):
        self._check_page_id(page_id)
      if self._refcounts[page_id] < count:
        raise ValueError(
          f"page_ids: page {page_id} freed {count} time(s) but holds "
          f"{self._refcounts[page_id]} reference(s)"
        )
    for page_id in page_ids:
      self._refcounts[page_id] -= 1
      if self._refcounts[page_id] == 0:
        self._release(page_id)

  def reset(self) -> None:
    """Every usable page free and no hash cached: the pool's content is gone (sleep mode
    discarded it). Refused while a sequence holds a page (its block table would dangle)."""
    if self.num_used_pages:
      raise RuntimeError(f"reset: {self.num_used_pages} pages are held by sequences")
    self._refcounts = [0] * self.num_pages
    self._group = [0] * self.num_pages
    self._free = collections.deque(range(1, self.num_pages))
    self._evictable.clear()
    self._page_hash.clear()
    self._cached.clear()

  def refcount(self, page_id: int) -> int:
    self._check_page_id(page_id)
    return self._refcounts[page_id]

  def group_of(self, page_id: int) -> int:
    """The KV group page_id was last allocated to."""
    self._check_page_id(page_id)
    return self._group[page_id]

  def cached_page(self, group: int, page_hash: bytes) -> int | None:
    """The page of `group` registered under page_hash (in use or evictable), if any; takes no
    reference (`share` does)."""
    return self._cached.get((group, page_hash))

  def share(self, page_ids: Iterable[int]) -> None:
    """Takes one more reference on each listed page: cached pages found by `cached_page` (an
    evictable one leaves the evictable pool)."""
    for page_id in page_ids:
      self._take_reference(page_id)

  def register(self, group: int, page_hash: bytes, page_id: int) -> None:
    """Records that page_id, a held page of `group`, holds the full page whose chained hash is
    page_hash. A page's hash is set once and then trusted; when another page already serves the
    hash, page_id stays a plain page. A no-op without prefix caching."""
    if not self.enable_prefix_caching:
      return
    if self.refcount(page_id) == 0:
      raise ValueError(f"page_ids: page {page_id} is free and cannot be registered")
    if self._group[page_id] != group:
      raise ValueError(
        f"page_ids: page {page_id} belongs to KV group {self._group[page_id]}, not {group}"
      )
    key = self._page_hash.get(page_id)
    if key is None:
      key = self._page_hash[page_id] = (group, page_hash)
    self._cached.setdefault(key, page_id)

  def check_invariants(
    self,
    owners: Iterable[Sequence[int]] | None = None,
    window_owners: Sequence[Iterable[Sequence[int]]] = (),
  ) -> None:
    """Raises AssertionError if the bookkeeping is inconsistent.

    owners, if given, are the block tables of group 0 of every live sequence, and
    window_owners[k] those of group k + 1 (the null page marks a page released from a window):
    each page's reference count must equal the number of times it appears in them, and each
    must sit in its own group's tables.
    """
    _expect(self._refcounts[NULL_PAGE] == 0, "the null page has references")
    free, evictable = list(self._free), list(self._evictable)
    _expect(len(set(free)) == len(free), "a page is twice in the free list")
    _expect(not set(free) & set(evictable), "a page is both free and evictable")
    _expect(NULL_PAGE not in free and NULL_PAGE not in evictable, "the null page is in the pool")
    idle = set(free) | set(evictable)
    for page_id in range(1, self.num_pages):
      in_use = self._refcounts[page_id] > 0
      _expect(self._refcounts[page_id] >= 0, f"page {page_id} has a negative reference count")
      _expect(in_use != (page_id in idle), f"page {page_id} is neither used nor free, or both")
    for page_id in free:
      _expect(page_id not in self._page_hash, f"free page {page_id} still has a hash")
    for page_id in evictable:
      _expect(self._is_cached(page_id), f"evictable page {page_id} serves no hash")
    for key, page_id in self._cached.items():
      _expect(self._page_hash.get(page_id) == key, f"cached page {page_id} hash mismatch")
      _expect(self._group[page_id] == key[0], f"cached page {page_id} serves another group")
    _expect(self.enable_prefix_caching or not self._page_hash, "hashes without prefix caching")
    if owners is not None:
      self._check_owners(owners, window_owners)

  def _check_owners(
    self, owners: Iterable[Sequence[int]], window_owners: Sequence[Iterable[Sequence[int]]]
  ) -> None:
    counts: collections.Counter[int] = collections.Counter()
    for group, tables in enumerate([owners, *window_owners]):
      group_counts = collections.Counter(p for table in tables for p in table)
      if group == 0:
        _expect(NULL_PAGE not in group_counts, "a block table of group 0 holds the null page")
      group_counts.pop(NULL_PAGE, None)
      for page_id in group_counts:
        _expect(self._group[page_id] == group, f"page {page_id} is held outside its KV group")
      counts += group_counts
    for page_id in range(1, self.num_pages):
      _expect(
        counts.get(page_id, 0) == self._refcounts[page_id],
        f"page {page_id}: {counts.get(page_id, 0)} owners but "
        f"{self._refcounts[page_id]} references",
      )

  def _take_free_page(self) -> int:
    if self._free:
      page_id = self._free.popleft()
    else:
      page_id, _ = self._evictable.popitem(last=False)
      del self._cached[self._page_hash.pop(page_id)]
    self._refcounts[page_id] = 1
    self._group[page_id] = 0
    return page_id

  def _take_reference(self, page_id: int) -> None:
    if self._refcounts[page_id] == 0:
      del self._evictable[page_id]
    self._refcounts[page_id] += 1

  def _release(self, page_id: int) -> None:
    if self._is_cached(page_id):
      self._evictable[page_id] = None
    else:
      self._page_hash.pop(page_id, None)
      self._free.append(page_id)

  def _is_cached(self, page_id: int) -> bool:
    key = self._page_hash.get(page_id)
    return key is not None and self._cached.get(key) == page_id

  def _check_page_id(self, page_id: int) -> None:
    if not isinstance(page_id, int) or not 1 <= page_id < self.num_pages:
      raise ValueError(f"page_ids: {page_id!r} is not a usable page id (1..{self.num_pages - 1})")


def _expect(condition: bool, message: str) -> None:
  if not condition:
    raise AssertionError(f"PageAllocator invariant: {message}")
