"""The data parallel routing rule (core/dp_routing.py), pure Python: least load, prefix
affinity on the prefix cache's page hashes, the margin that gives affinity up, dead cores."""

from __future__ import annotations

import pytest

from jaxserve.core.dp_routing import (
  AFFINITY_MARGIN,
  AFFINITY_PAGES,
  CoreLoad,
  PrefixAffinityRouter,
  much_busier,
  prompt_page_hashes,
)
from jaxserve.engine.page_allocator import extend_page_hashes

PAGE = 4
IDLE = [CoreLoad(True, 0), CoreLoad(True, 0)]


def prompt(head: int, length: int = 3 * PAGE, tail: int = 0) -> list[int]:
  return [head] * (length - 1) + [1000 + tail]


def test_the_page_hashes_are_the_prefix_caches():
  tokens = list(range(10 * PAGE + 3))
  expected: list[bytes] = []
  extend_page_hashes(expected, tokens, PAGE)
  assert prompt_page_hashes(tokens, PAGE) == expected  # full pages only
  long = list(range((AFFINITY_PAGES + 5) * PAGE))
  assert len(prompt_page_hashes(long, PAGE)) == AFFINITY_PAGES


def test_least_load_then_rotation_among_equals():
  router = PrefixAffinityRouter(PAGE)
  loads = [CoreLoad(True, 5), CoreLoad(True, 2, 0.5), CoreLoad(True, 2, 0.1)]
  assert router.choose([1, 2], loads) == 2  # fewest requests, then less KV held
  assert [router.choose([n], IDLE) for n in range(4)] == [0, 1, 0, 1]


def test_a_shared_prefix_goes_where_it_went_before():
  router = PrefixAffinityRouter(PAGE)
  assert router.choose(prompt(7), IDLE) == 0
  assert router.choose(prompt(8), IDLE) == 1
  # on load alone the rotation would give 0 next; the prefix of 8 went to 1
  assert router.choose(prompt(8, tail=1), IDLE) == 1
  assert router.choose(prompt(7, tail=2), [CoreLoad(True, 3), CoreLoad(True, 0)]) == 0
  # a longer prompt sharing the first pages follows them too
  assert router.choose(prompt(8, length=6 * PAGE), IDLE) == 1


def test_the_longest_shared_prefix_wins():
  router = PrefixAffinityRouter(PAGE)
  shared = [5] * (2 * PAGE)
  assert router.choose(shared + [6] * PAGE, IDLE) == 0
  busy = [CoreLoad(True, AFFINITY_MARGIN + 1), CoreLoad(True, 0)]
  assert router.choose(shared + [9] * PAGE, busy) == 1  # the shared pages now point at 1
  assert router.choose(shared + [9] * PAGE + [1], IDLE) == 1
  assert router.choose(shared + [6] * PAGE + [1], IDLE) == 0  # its 3rd page went to 0


def test_affinity_gives_way_when_its_core_is_much_busier():
  router = PrefixAffinityRouter(PAGE)
  assert router.choose(prompt(7), IDLE) == 0
  busy = [CoreLoad(True, AFFINITY_MARGIN), CoreLoad(True, 0)]
  assert router.choose(prompt(7, tail=1), busy) == 0  # within the margin
  busier = [CoreLoad(True, AFFINITY_MARGIN + 1), CoreLoad(True, 0)]
  assert router.choose(prompt(7, tail=2), busier) == 1
  assert router.choose(prompt(7, tail=3), IDLE) == 1  # the prefix now lives on core 1


@pytest.mark.parametrize(
  "core,least,busier",
  [(5, 0, True), (4, 0, False), (120, 100, False), (126, 100, True)],
)
def test_much_busier_is_a_margin_or_a_share_of_the_least_load(core, least, busier):
  assert much_busier(CoreLoad(True, core), CoreLoad(True, least)) is busier


def test_dead_cores_are_never_chosen():
  router = PrefixAffinityRouter(PAGE)
  assert router.choose(prompt(7), IDLE) == 0
  one_dead = [CoreLoad(False, 0), CoreLoad(True, 50)]
  assert router.choose(prompt(7, tail=1), one_dead) == 1
  assert [router.choose([n], one_dead) for n in range(3)] == [1, 1, 1]
  assert router.choose(prompt(7), [CoreLoad(False, 0), CoreLoad(False, 0)]) is None


def test_the_table_forgets_the_least_recently_used_prefixes():
  router = PrefixAffinityRouter(PAGE, capacity=3)
  assert router.choose(prompt(7), IDLE) == 0  # 3 page hashes
  assert router.choose(prompt(8), IDLE) == 1  # 3 more: 7's are forgotten
  assert router.choose(prompt(7, tail=1), IDLE) == 0  # by rotation, not affinity
  assert router.choose(prompt(7, tail=2), [CoreLoad(True, 1), CoreLoad(True, 0)]) == 0
