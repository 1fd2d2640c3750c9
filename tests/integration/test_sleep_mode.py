"""Sleep mode offline (LLM.sleep / LLM.wake_up, engine/sleep_mode.py, device/sleep_mode.py): level
1 frees the weights' and the KV pool's device memory, wake puts them back with their shardings,
greedy tokens are the same after as before, nothing compiles, no KV page leaks; the state
machine's refusals name their field."""

from __future__ import annotations

import jax
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.entrypoints.llm import LLM
from tests.integration.engine_helpers import small_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 9, 14, 3, 7, 21, 8], [100, 101, 102], list(range(40, 75))]


def live_bytes() -> int:
  return sum(a.nbytes for a in jax.live_arrays())


def tree_bytes(tree) -> int:
  return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def llm():
  config = small_config(seq_buckets=(8,), token_buckets=(64,), num_pages=64, enable_sleep_mode=True)
  return LLM(config.model, config=config, show_progress=False)


def greedy(llm: LLM) -> list[list[int]]:
  return [r.outputs[0].token_ids for r in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_sleep_frees_the_weights_and_pool_and_wake_restores_them_without_compiling(llm):
  before = greedy(llm)
  runner = llm.engine.runner
  shardings = [leaf.sharding for leaf in jax.tree.leaves(runner.params)]
  weights, pool = tree_bytes(runner.params), tree_bytes(runner.kv_pages)
  compiled = llm.engine.ledger.num_compilations
  awake_bytes = live_bytes()
  old_leaf = jax.tree.leaves(runner.params)[0]
  llm.sleep(level=1)
  assert llm.engine.is_sleeping
  assert old_leaf.is_deleted()
  assert runner.params is None and runner.kv_pages is None
  assert awake_bytes - live_bytes() >= weights + pool
  llm.wake_up()
  assert not llm.engine.is_sleeping
  assert [leaf.sharding for leaf in jax.tree.leaves(runner.params)] == shardings
  assert live_bytes() == awake_bytes
  assert greedy(llm) == before
  assert llm.engine.ledger.num_compilations == compiled
  allocator = llm.engine.allocator
  assert allocator.num_used_pages == 0
  allocator.check_invariants()


def test_sleep_resets_the_prefix_cache_and_the_allocator(llm):
  greedy(llm)
  assert llm.engine.allocator.num_cached_pages > 0  # the prompts' full pages were cached
  llm.sleep()
  allocator = llm.engine.allocator
  assert allocator.num_cached_pages == 0
  assert allocator.num_free_pages == allocator.num_usable_pages
  allocator.check_invariants()
  llm.wake_up()


def test_sleep_aborts_running_requests_and_waiting_ones_wait_for_wake(llm):
  engine = llm.engine
  running = engine.add_request([1, 2, 3, 4], GREEDY)
  engine.step()
  engine.step()
  outputs = engine.sleep()
  assert [(o.request_id, o.finish_reason) for o in outputs] == [(running, "abort")]
  assert engine.allocator.num_used_pages == 0
  held = engine.add_request([7, 8, 9], GREEDY)  # accepted while asleep: it waits
  assert engine.step() == [] and not engine.core.can_step()
  assert engine.stats().num_waiting == 1
  engine.wake_up()
  finished = []
  while engine.has_unfinished_requests():
    finished += [o for o in engine.step() if o.finished]
  assert [(o.request_id, len(o.token_ids)) for o in finished] == [(held, 12)]
  assert engine.allocator.num_used_pages == 0


def test_the_state_machine(llm):
  llm.wake_up()  # awake: nothing to do
  assert not llm.engine.is_sleeping
  with pytest.raises(ValueError, match="^level: "):
    llm.sleep(level=2)
  with pytest.raises(ValueError, match="^level: "):
    llm.sleep(level=0)
  with pytest.raises(ValueError, match="^mode: "):
    llm.sleep(mode="wait")
  assert not llm.engine.is_sleeping
  llm.sleep()
  llm.sleep()  # asleep: nothing more to free
  with pytest.raises(RuntimeError, match="sleeping"):
    llm.generate([[1, 2]], GREEDY, use_tqdm=False)
  with pytest.raises(ValueError, match="^tags: "):
    llm.wake_up(["optimizer"])
  llm.wake_up(["weights"])  # the pool is still away
  assert llm.engine.is_sleeping and llm.engine.runner.kv_pages is None
  llm.wake_up(["kv_cache"])
  assert not llm.engine.is_sleeping
  assert len(greedy(llm)) == len(PROMPTS)


def test_an_engine_without_sleep_mode_refuses_naming_the_flag():
  config = small_config(seq_buckets=(8,), token_buckets=(64,), num_pages=16)
  llm = LLM(config.model, config=config, show_progress=False)
  with pytest.raises(ValueError, match="^enable_sleep_mode: "):
    llm.sleep()
  with pytest.raises(ValueError, match="^enable_sleep_mode: "):
    llm.wake_up()


def test_sliding_window_groups_sleep_mid_generation(hf_checkpoint):
  """Gemma 3's window groups hold pages of their own: a sleep in the middle of a generation frees
  every page and wakes to the same tokens."""
  config = small_config(
    str(hf_checkpoint("gemma3")),
    seq_buckets=(8,),
    token_buckets=(64,),
    num_pages=64,
    max_model_len=256,
    enable_sleep_mode=True,
  )
  llm = LLM(config.model, config=config, show_progress=False)
  long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
  prompt = list(range(3, 60))
  before = llm.generate([prompt], long, use_tqdm=False)[0].outputs[0].token_ids
  engine = llm.engine
  engine.add_request(prompt, long)
  for _ in range(4):
    engine.step()
  assert engine.allocator.num_used_pages > 0
  engine.sleep()
  assert engine.allocator.num_used_pages == 0
  engine.allocator.check_invariants()
  engine.wake_up()
  assert llm.generate([prompt], long, use_tqdm=False)[0].outputs[0].token_ids == before
  assert engine.allocator.num_used_pages == 0
