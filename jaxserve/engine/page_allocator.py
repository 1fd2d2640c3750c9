"""Host-side allocator of KV cache pages: free list, reference counts, optional prefix cache.

Page 0 is the null page: padding tokens write into it, so it is never handed out. Pages
1 .. num_pages - 1 are usable. Every usable page is in exactly one of three places:

* used: reference count > 0, held by one or more sequences (their block tables);
* free: reference count 0, content meaningless;
* evictable (prefix caching only): reference count 0, but it holds a registered full page whose
  K/V can be reused by a later sequence with the same prefix. Evictable pages count as free:
  `allocate` takes plain free pages first, then evicts the least recently freed cached page and
  drops its hash entry.

Prefix caching. A full page is identified by a chained hash, sha256(parent hash || token ids of
the page), so a page's identity covers the whole prefix before it (a collision-resistant digest,
since a false hit would silently serve wrong K/V). `register_full_pages` records the hashes of a
sequence's full, computed pages; `find_cached_prefix` returns the pages serving the longest run of
matching full-page prefixes and takes a reference on each. Only full pages are ever shared, and a
sequence writes only at positions >= its computed length, i.e. into its own last, partial page,
so shared pages are never written and no copy-on-write is needed. When two sequences computed
the same page independently, the first registered page serves the hash; the other is a plain
page that is freed normally.
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from typing import Iterable, Sequence

NULL_PAGE = 0
_ROOT_HASH = b""


def hash_page(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
  """Chained identity of one full page: its tokens and (through parent_hash) every token before."""
  return hashlib.sha256(parent_hash + array("q", token_ids).tobytes()).digest()


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
    self._free: collections.deque[int] = collections.deque(range(1, num_pages))
    self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
    self._page_hash: dict[int, bytes] = {}  # content hash of each registered full page
    self._cached: dict[bytes, int] = {}  # hash -> the page that serves it

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

  def can_allocate(self, num_pages: int) -> bool:
    return 0 <= num_pages <= self.num_free_pages

  def allocate(self, num_pages: int) -> list[int]:
    """Returns num_pages pages with reference count 1. Callers check `can_allocate` first."""
    if not isinstance(num_pages, int) or num_pages < 0:
      raise ValueError(f"num_pages: must be a non-negative integer, got {num_pages!r}")
    if num_pages > self.num_free_pages:
      raise RuntimeError(
        f"allocate: {num_pages} pages requested but only {self.num_free_pages} are free"
      )
    return [self._take_free_page() for _ in range(num_pages)]

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

  def refcount(self, page_id: int) -> int:
    self._check_page_id(page_id)
    return self._refcounts[page_id]

  def find_cached_prefix(self, token_ids: Sequence[int]) -> list[int]:
    """Pages holding the longest cached run of token_ids' full pages; takes a reference on each.

    The caller decides which tokens may hit (e.g. never the last known token) by what it passes.
    """
    if not self.enable_prefix_caching:
      return []
    page_ids: list[int] = []
    parent = _ROOT_HASH
    for index in range(len(token_ids) // self.page_size):
      parent = hash_page(parent, self._page_tokens(token_ids, index))
      page_id = self._cached.get(parent)
      if page_id is None:
        break
      page_ids.append(page_id)
    for page_id in page_ids:
      self._take_reference(page_id)
    return page_ids

  def register_full_pages(self, token_ids: Sequence[int], page_ids: Sequence[int]) -> None:
    """Records the hashes of the full pages of token_ids (tokens whose K/V are computed).

    page_ids is the sequence's block table. A page's hash is computed once and then trusted, so
    calling this again as the sequence grows only hashes the newly filled pages.
    """
    if not self.enable_prefix_caching:
      return
    num_full = len(token_ids) // self.page_size
    if len(page_ids) < num_full:
      raise ValueError(f"page_ids: {len(page_ids)} pages cannot hold {len(token_ids)} tokens")
    parent = _ROOT_HASH
    for index in range(num_full):
      page_id = page_ids[index]
      page_hash = self._page_hash.get(page_id)  # only usable page ids have hashes
      if (self._refcounts[page_id] if page_hash is not None else self.refcount(page_id)) == 0:
        raise ValueError(f"page_ids: page {page_id} is free and cannot be registered")
      if page_hash is None:
        page_hash = hash_page(parent, self._page_tokens(token_ids, index))
        self._page_hash[page_id] = page_hash
      self._cached.setdefault(page_hash, page_id)
      parent = page_hash

  def check_invariants(self, owners: Iterable[Sequence[int]] | None = None) -> None:
    """Raises AssertionError if the bookkeeping is inconsistent.

    owners, if given, are the block tables of every live sequence: each page's reference count
    must equal the number of times it appears in them.
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
    for page_hash, page_id in self._cached.items():
      _expect(self._page_hash.get(page_id) == page_hash, f"cached page {page_id} hash mismatch")
    _expect(self.enable_prefix_caching or not self._page_hash, "hashes without prefix caching")
    if owners is not None:
      counts = collections.Counter(p for table in owners for p in table)
      _expect(NULL_PAGE not in counts, "a block table holds the null page")
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
    page_hash = self._page_hash.get(page_id)
    return page_hash is not None and self._cached.get(page_hash) == page_id

  def _page_tokens(self, token_ids: Sequence[int], index: int) -> Sequence[int]:
    return token_ids[index * self.page_size : (index + 1) * self.page_size]

  def _check_page_id(self, page_id: int) -> None:
    if not isinstance(page_id, int) or not 1 <= page_id < self.num_pages:
      raise ValueError(f"page_ids: {page_id!r} is not a usable page id (1..{self.num_pages - 1})")


def _expect(condition: bool, message: str) -> None:
  if not condition:
    raise AssertionError(f"PageAllocator invariant: {message}")
