"""The data parallel routing rule (core/dp_routing.py), pure Python: least load, prefix
affinity on the prefix cache's page hashes, the margin that gives affinity up, dead cores, and
a burst spread over several API servers whose adds two cores answer only after their steps."""

from __future__ import annotations

import heapq

import pytest

from jaxserve.core.dp_routing import (
  AFFINITY_MARGIN,
  AFFINITY_PAGES,
  CoreLoad,
  PrefixAffinityRouter,
  core_load,
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


def simulate_burst(api_servers: int, step_s: list[float], count_as: int) -> list[int]:
  """1,000 adds with distinct prompts, spread evenly over 0.5 s and over `api_servers` API
  servers, each with its own router, to cores that step every step_s[c] seconds as core/loop.py
  does: at a step's start a core takes the adds received since the last one, and at its end
  answers them with stats that count them, to every server. Each server estimates a core's
  load with core_load(..., count_as, ...). Returns the adds each core got."""
  cores, total, window = len(step_s), 1000, 0.5
  routers = [PrefixAffinityRouter(PAGE) for _ in range(api_servers)]
  reported = [[0] * cores for _ in range(api_servers)]
  unanswered = [[0] * cores for _ in range(api_servers)]
  received: list[list[int]] = [[] for _ in range(cores)]  # senders, since the last step began
  stepping: list[list[int]] = [[] for _ in range(cores)]  # taken at the last step's start
  counted, got = [0] * cores, [0] * cores
  events = [(i * window / total, "add", i) for i in range(total)]
  events += [(step_s[c], "step", c) for c in range(cores)]
  heapq.heapify(events)
  while events:
    now, kind, index = heapq.heappop(events)
    if kind == "add":
      server = index % api_servers
      loads = [
        core_load(True, reported[server][c], unanswered[server][c], count_as, 0.0)
        for c in range(cores)
      ]
      core = routers[server].choose([index] * 2 * PAGE, loads)
      unanswered[server][core] += 1
      received[core].append(server)
      got[core] += 1
      continue
    for server in stepping[index]:  # the step that ends now answers the adds it took
      unanswered[server][index] -= 1
    counted[index] += len(stepping[index])
    for server in range(api_servers):
      reported[server][index] = counted[index]
    stepping[index], received[index] = received[index], []
    if now < window or stepping[index]:
      heapq.heappush(events, (now + step_s[index], "step", index))
  return got


@pytest.mark.parametrize("step_s", [[0.09, 0.09], [0.3, 0.09], [0.05, 0.09]])
def test_a_burst_over_four_api_servers_is_split_evenly(step_s):
  got = simulate_burst(4, step_s, count_as=4)
  assert max(abs(n - 500) for n in got) <= 4, got


def test_counting_unanswered_adds_once_piles_a_burst_onto_the_slower_core():
  """Why core_load counts them once per API server: otherwise every server sees the core that
  answers later as less loaded by the other servers' unanswered adds."""
  got = simulate_burst(4, [0.3, 0.09], count_as=1)
  assert got[0] > 650, got
  assert simulate_burst(1, [0.3, 0.09], count_as=1) in ([500, 500], [501, 499], [499, 501])
