"""Per-request sampling features end to end on the built-in model: stop strings and stop tokens,
max_tokens, min_tokens, logprobs, n with seeds, and the offline API and CLI."""

from __future__ import annotations

import json

import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.cli import main as cli_main
from jaxserve.entrypoints.llm import LLM
from tests.integration.engine_helpers import small_config

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm():
  config = small_config()
  return LLM(config.model, config=config, show_progress=False)


def _greedy(llm, **fields):
  params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True).replace(**fields)
  return llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]


def test_stop_string_truncates_the_text_where_it_first_completes(llm):
  full = _greedy(llm)
  assert full.finish_reason == "length" and len(full.token_ids) == 24
  text = full.text
  stop = next(
    text[i : i + 2]
    for i in range(3, len(text) - 2)
    if text[i : i + 2].isprintable() and text.find(text[i : i + 2]) == i
  )
  out = _greedy(llm, stop=(stop,))
  assert out.finish_reason == "stop" and out.stop_reason == stop
  assert out.text == text[: text.find(stop)]
  kept = _greedy(llm, stop=(stop,), include_stop_str_in_output=True)
  assert kept.text == text[: text.find(stop) + len(stop)]


def test_stop_token_ids_end_generation_at_that_token(llm):
  full = _greedy(llm)
  stop_id = full.token_ids[5]
  first = full.token_ids.index(stop_id)
  out = _greedy(llm, stop_token_ids=(stop_id,))
  assert out.finish_reason == "stop" and out.stop_reason == stop_id
  assert out.token_ids == full.token_ids[: first + 1]


def test_min_tokens_holds_back_stop_tokens(llm):
  full = _greedy(llm)
  stop_id = full.token_ids[1]
  out = _greedy(llm, stop_token_ids=(stop_id,), min_tokens=10)
  assert len(out.token_ids) >= 10
  assert stop_id not in out.token_ids[:10]


@pytest.mark.parametrize("min_tokens", [0, 1, 4])
def test_min_tokens_gives_exactly_that_many_tokens_before_a_forced_eos(llm, min_tokens):
  """eos biased +100 is the pick whenever it is allowed: vLLM's min_tokens bans it for the first
  min_tokens tokens, so exactly that many come before it (and eos ends the output)."""
  (eos,) = llm.tokenizer.eos_token_ids
  params = SamplingParams(
    temperature=0.0, max_tokens=12, min_tokens=min_tokens, logit_bias={eos: 100}
  )
  out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
  assert out.finish_reason == "stop" and out.stop_reason is None
  assert len(out.token_ids) == min_tokens + 1 and out.token_ids[-1] == eos
  assert eos not in out.token_ids[:-1]
  # a stop string inside the first min_tokens tokens' text does not end the request either
  if min_tokens == 4:
    first = llm.tokenizer.decode(out.token_ids[:1])
    stopped = llm.generate([PROMPT], params.replace(stop=(first,)), use_tqdm=False)
    assert stopped[0].outputs[0].token_ids == out.token_ids


def test_logprobs_report_the_sampled_token_among_the_top(llm):
  out = _greedy(llm, logprobs=3, max_tokens=8)
  assert len(out.logprobs) == 8
  for token_id, entry in zip(out.token_ids, out.logprobs, strict=True):
    assert entry.token_id == token_id and len(entry.top) == 3
    assert entry.top[0] == (token_id, pytest.approx(entry.logprob, abs=1e-5))  # greedy = argmax
    assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)


def test_n_samples_with_a_seed_are_distinct_and_reproducible(llm):
  params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
  first = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs
  again = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs
  assert [o.token_ids for o in first] == [o.token_ids for o in again]
  assert len({o.token_ids for o in first}) == 3


def test_generate_cli_prints_json(capsys):
  args = [
    "generate",
    "--prompt",
    PROMPT,
    "--max-tokens",
    "6",
    "--ignore-eos",
    "--json",
    "--log-level",
    "WARNING",
    "--set",
    "max_model_len=512",
    "--set",
    "cache.num_pages=256",
    "--set",
    "scheduler.max_num_seqs=8",
    "--set",
    "scheduler.max_num_batched_tokens=64",
    "--set",
    "scheduler.seq_buckets=[2,8]",
    "--set",
    "scheduler.token_buckets=[8,16,32,64]",
  ]
  assert cli_main(args) == 0
  record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert record["prompt"] == PROMPT and len(record["token_ids"]) == 6
  assert record["finish_reason"] == "length"


def test_cli_reports_bad_input_as_an_error_naming_the_field(capsys):
  assert cli_main(["generate", "--max-tokens", "0", "--log-level", "ERROR"]) == 2
  assert "max_tokens" in capsys.readouterr().err


def test_n_choices_share_the_prompts_cached_pages_and_decode_alike(llm):
  """n = 3 greedy choices of a 40-token prompt (pages of 16): the first computes the prompt,
  the other two take its two full pages in the same step (prefix caching is on), and all three
  decode the tokens one choice decodes alone."""
  prompt = list(range(300, 340))
  params = SamplingParams(n=3, temperature=0.0, max_tokens=8, ignore_eos=True)
  before = llm.engine.stats()
  choices = llm.generate([prompt], params, use_tqdm=False)[0].outputs
  after = llm.engine.stats()
  assert after.num_prefix_cache_queries - before.num_prefix_cache_queries == 3 * 40
  assert after.num_prefix_cache_hits - before.num_prefix_cache_hits == 2 * 32
  assert after.num_used_pages == 0
  alone = llm.generate([prompt], params.replace(n=1), use_tqdm=False)[0].outputs[0]
  assert [c.token_ids for c in choices] == [alone.token_ids] * 3
