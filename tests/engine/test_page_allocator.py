"""PageAllocator: free list, reference counts, pages of KV groups, prefix cache with LRU
eviction keyed by (group, chained hash)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jaxserve.engine.page_allocator import PageAllocator, extend_page_hashes, hash_page


def register_full_pages(allocator: PageAllocator, tokens, pages, group: int = 0) -> None:
  """Registers the full pages of `tokens` held in `pages` (a block table), as the scheduler does."""
  hashes: list[bytes] = []
  extend_page_hashes(hashes, tokens, allocator.page_size)
  for page_hash, page_id in zip(hashes, pages, strict=False):  # a partial last page has no hash
    allocator.register(group, page_hash, page_id)


def find_cached_prefix(allocator: PageAllocator, tokens, group: int = 0) -> list[int]:
  """The pages of the longest cached run of `tokens`' full pages in `group`, shared."""
  hashes: list[bytes] = []
  extend_page_hashes(hashes, tokens, allocator.page_size)
  pages = []
  for page_hash in hashes:
    page_id = allocator.cached_page(group, page_hash)
    if page_id is None:
      break
    pages.append(page_id)
  allocator.share(pages)
  return pages


def test_null_page_never_handed_out():
  allocator = PageAllocator(num_pages=5, page_size=4)
  assert allocator.num_usable_pages == 4
  pages = allocator.allocate(4)
  assert sorted(pages) == [1, 2, 3, 4]
  assert allocator.num_free_pages == 0 and allocator.num_used_pages == 4
  assert not allocator.can_allocate(1)
  assert allocator.can_allocate(0)
  with pytest.raises(RuntimeError, match="1 pages requested"):
    allocator.allocate(1)
  allocator.check_invariants(owners=[pages])


def test_free_returns_pages_and_double_free_raises():
  allocator = PageAllocator(num_pages=4, page_size=2)
  pages = allocator.allocate(2)
  assert [allocator.refcount(p) for p in pages] == [1, 1]
  allocator.free(pages)
  assert allocator.num_free_pages == 3 and allocator.num_used_pages == 0
  with pytest.raises(ValueError, match="page_ids"):
    allocator.free([pages[0]])
  with pytest.raises(ValueError, match="page_ids"):
    allocator.free([0])
  with pytest.raises(ValueError, match="page_ids"):
    allocator.free([4])
  allocator.check_invariants(owners=[])


def test_free_validates_before_mutating():
  allocator = PageAllocator(num_pages=4, page_size=2)
  [page] = allocator.allocate(1)
  with pytest.raises(ValueError, match=f"page {page} freed 2 time"):
    allocator.free([page, page])
  assert allocator.refcount(page) == 1
  allocator.check_invariants(owners=[[page]])


def test_constructor_validation():
  with pytest.raises(ValueError, match="num_pages"):
    PageAllocator(num_pages=1, page_size=4)
  with pytest.raises(ValueError, match="page_size"):
    PageAllocator(num_pages=4, page_size=0)
  with pytest.raises(ValueError, match="num_pages"):
    PageAllocator(num_pages=4, page_size=2).allocate(-1)


def test_check_invariants_detects_wrong_owners():
  allocator = PageAllocator(num_pages=4, page_size=2)
  pages = allocator.allocate(2)
  with pytest.raises(AssertionError, match="owners"):
    allocator.check_invariants(owners=[pages[:1]])
  with pytest.raises(AssertionError, match="null page"):
    allocator.check_invariants(owners=[pages + [0]])


def test_prefix_caching_disabled_is_a_no_op():
  allocator = PageAllocator(num_pages=4, page_size=2)
  pages = allocator.allocate(2)
  register_full_pages(allocator, [1, 2, 3, 4], pages)
  assert find_cached_prefix(allocator, [1, 2, 3, 4]) == []
  assert allocator.num_cached_pages == 0
  allocator.free(pages)
  allocator.check_invariants(owners=[])


def test_find_cached_prefix_shares_longest_matching_run():
  allocator = PageAllocator(num_pages=8, page_size=4, enable_prefix_caching=True)
  tokens = list(range(100, 110))  # two full pages and a partial one
  pages = allocator.allocate(3)
  register_full_pages(allocator, tokens, pages)
  assert allocator.num_cached_pages == 2
  assert find_cached_prefix(allocator, tokens) == pages[:2]
  assert [allocator.refcount(p) for p in pages] == [2, 2, 1]
  # Second page differs: only the first is shared.
  assert find_cached_prefix(allocator, tokens[:4] + [0, 0, 0, 0]) == pages[:1]
  # Same second page after a different first page: the chained hash misses.
  assert find_cached_prefix(allocator, [0, 0, 0, 0] + tokens[4:8]) == []
  # Fewer tokens than a full page: nothing to share.
  assert find_cached_prefix(allocator, tokens[:3]) == []
  allocator.check_invariants(owners=[pages, pages[:2], pages[:1]])


def test_chained_hash_depends_on_parent():
  assert hash_page(b"", [1, 2]) != hash_page(hash_page(b"", [0, 0]), [1, 2])
  assert hash_page(b"", [1, 2]) == hash_page(b"", (1, 2))
  assert hash_page(b"", [1, 2]) != hash_page(b"", [2, 1])


def test_freed_cached_pages_stay_reusable_until_evicted_lru():
  allocator = PageAllocator(num_pages=5, page_size=2, enable_prefix_caching=True)
  seq_a, seq_b = [1, 2, 3, 4], [5, 6, 7, 8]
  pages_a, pages_b = allocator.allocate(2), allocator.allocate(2)
  register_full_pages(allocator, seq_a, pages_a)
  register_full_pages(allocator, seq_b, pages_b)
  allocator.free(reversed(pages_a))  # a's tail page is evicted before its head
  allocator.free(reversed(pages_b))
  assert allocator.num_free_pages == 4 and allocator.num_used_pages == 0
  assert allocator.num_cached_pages == 4
  # A hit pulls the pages out of the evictable pool.
  assert find_cached_prefix(allocator, seq_b) == pages_b
  assert allocator.num_free_pages == 2
  allocator.free(reversed(pages_b))
  # Eviction order: least recently freed first, i.e. a's tail, then a's head.
  assert allocator.allocate(1) == [pages_a[1]]
  assert find_cached_prefix(allocator, seq_a) == pages_a[:1]
  allocator.check_invariants(owners=[[pages_a[1]], pages_a[:1]])
  assert allocator.num_cached_pages == 3


def test_allocate_prefers_uncached_free_pages():
  allocator = PageAllocator(num_pages=4, page_size=2, enable_prefix_caching=True)
  [cached] = allocator.allocate(1)
  register_full_pages(allocator, [7, 7], [cached])
  allocator.free([cached])
  fresh = allocator.allocate(2)
  assert cached not in fresh
  assert find_cached_prefix(allocator, [7, 7]) == [cached]
  allocator.check_invariants(owners=[fresh, [cached]])


def test_duplicate_page_content_first_registration_serves():
  allocator = PageAllocator(num_pages=3, page_size=2, enable_prefix_caching=True)
  [first], [second] = allocator.allocate(1), allocator.allocate(1)
  register_full_pages(allocator, [3, 4], [first])
  register_full_pages(allocator, [3, 4], [second])
  assert allocator.num_cached_pages == 1
  allocator.free([second])  # not the serving page: back to the plain free list
  allocator.check_invariants(owners=[[first]])
  allocator.free([first])
  assert allocator.allocate(1) == [second]  # plain free pages go first
  assert find_cached_prefix(allocator, [3, 4]) == [first]
  allocator.check_invariants(owners=[[second], [first]])


def test_register_rejects_free_pages_and_other_groups_pages():
  allocator = PageAllocator(num_pages=4, page_size=2, enable_prefix_caching=True)
  with pytest.raises(ValueError, match="page_ids: page 1 is free"):
    register_full_pages(allocator, [1, 2], [1])
  pages = allocator.allocate(1, group=1)
  with pytest.raises(ValueError, match="page_ids: page .* belongs to KV group 1"):
    register_full_pages(allocator, [1, 2], pages, group=0)


def test_groups_own_their_pages_and_cache():
  """A page belongs to the group that allocated it: it serves only that group's prefix cache,
  may sit only in that group's tables, and is counted in that group until allocated again."""
  allocator = PageAllocator(num_pages=6, page_size=2, enable_prefix_caching=True)
  tokens = [5, 6, 7, 8]
  full, sliding = allocator.allocate(2), allocator.allocate(2, group=1)
  assert [allocator.group_of(p) for p in full + sliding] == [0, 0, 1, 1]
  assert (allocator.num_used_pages_in(0), allocator.num_used_pages_in(1)) == (2, 2)
  register_full_pages(allocator, tokens, full)
  register_full_pages(allocator, tokens, sliding, group=1)
  assert allocator.num_cached_pages == 4
  # same tokens, two groups: two cache entries, each group's own page
  assert find_cached_prefix(allocator, tokens) == full
  assert find_cached_prefix(allocator, tokens, group=1) == sliding
  assert find_cached_prefix(allocator, tokens, group=2) == []
  # a window table holds the null page where a page was released
  allocator.free([sliding[0]] * 2)
  allocator.check_invariants(owners=[full, full], window_owners=[[[0, sliding[1]]] * 2])
  with pytest.raises(AssertionError, match="outside its KV group"):
    allocator.check_invariants(owners=[full, full, [sliding[1]]], window_owners=[[[0]]])
  allocator.free(full * 2 + [sliding[1]] * 2)
  assert allocator.num_used_pages_in(1) == 0
  # evicted and allocated again, a page joins its new group
  fresh = allocator.allocate(5)
  assert allocator.num_used_pages_in(0) == 5 and allocator.num_cached_pages == 0
  allocator.check_invariants(owners=[fresh])


def test_reset_forgets_every_cached_page_and_refuses_while_pages_are_held():
  alloc = PageAllocator(num_pages=6, page_size=2, enable_prefix_caching=True)
  pages = alloc.allocate(3, group=1)
  alloc.register(1, hash_page(b"", [1, 2]), pages[0])
  with pytest.raises(RuntimeError, match="3 pages are held"):
    alloc.reset()
  alloc.free(pages)
  assert alloc.num_cached_pages == 1
  alloc.reset()
  assert alloc.num_cached_pages == 0 and alloc.cached_page(1, hash_page(b"", [1, 2])) is None
  assert alloc.num_free_pages == alloc.num_usable_pages == 5
  assert sorted(alloc.allocate(5)) == [1, 2, 3, 4, 5]
  alloc.check_invariants()


def test_module_imports_no_jax():
  code = (
    "import sys; import jaxserve.engine.page_allocator, jaxserve.engine.scheduler; "
    "bad = [m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib'))]; "
    "assert not bad, bad"
  )
  subprocess.run([sys.executable, "-c", code], check=True)
