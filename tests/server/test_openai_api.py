"""The API through the official openai client and raw httpx against a real uvicorn server."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.entrypoints.llm import LLM
from tests.server.server_helpers import scrape_metrics, server_engine_config, wait_for_idle

MODEL = "tiny-random"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def client(served):
  with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0) as c:
    yield c


def _chat_prompt_ids(served, messages=MESSAGES) -> list[int]:
  return served.tokenizer.encode_chat(messages)


def test_completion_streamed_equals_non_streamed_and_usage_counts(served, client):
  prompt = "The quick brown fox"
  full = client.completions.create(
    model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
  )
  choice = full.choices[0]
  assert choice.finish_reason == "length"
  assert full.usage.prompt_tokens == len(served.tokenizer.encode(prompt))
  assert full.usage.completion_tokens == 12
  assert full.usage.total_tokens == full.usage.prompt_tokens + 12
  chunks = list(
    client.completions.create(
      model=MODEL,
      prompt=prompt,
      max_tokens=12,
      temperature=0,
      stream=True,
      stream_options={"include_usage": True},
      extra_body={"ignore_eos": True},
    )
  )
  text_chunks = [c for c in chunks if c.choices]
  assert "".join(c.choices[0].text for c in text_chunks) == choice.text
  assert text_chunks[-1].choices[0].finish_reason == "length"
  assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
  assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_streamed_equals_non_streamed_and_usage_counts(served, client):
  full = client.chat.completions.create(
    model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0
  )
  message = full.choices[0].message
  assert message.role == "assistant"
  assert full.usage.prompt_tokens == len(_chat_prompt_ids(served))
  assert 1 <= full.usage.completion_tokens <= 10
  chunks = list(
    client.chat.completions.create(
      model=MODEL,
      messages=MESSAGES,
      max_tokens=10,
      temperature=0,
      stream=True,
      stream_options={"include_usage": True},
    )
  )
  assert chunks[0].choices[0].delta.role == "assistant"
  text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
  assert text == message.content
  finishes = [
    c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
  ]
  assert finishes == [full.choices[0].finish_reason]
  assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_chat_default_max_tokens_fills_the_context(served, client):
  reply = client.chat.completions.create(
    model=MODEL, messages=MESSAGES, temperature=0, extra_body={"ignore_eos": True}
  )
  assert reply.choices[0].finish_reason == "length"
  assert reply.usage.total_tokens == served.max_model_len
  capped = client.chat.completions.create(
    model=MODEL,
    messages=MESSAGES,
    temperature=0,
    max_completion_tokens=3,
    extra_body={"ignore_eos": True},
  )
  assert capped.usage.completion_tokens == 3


def test_n_with_seed_expands_into_seeded_children(client):
  prompt = "Once upon a time"
  kwargs = dict(model=MODEL, max_tokens=8, temperature=1.0, extra_body={"ignore_eos": True})
  both = client.completions.create(prompt=prompt, n=2, seed=11, **kwargs)
  assert [c.index for c in both.choices] == [0, 1]
  assert both.usage.completion_tokens == 16
  first = client.completions.create(prompt=prompt, seed=11, **kwargs).choices[0].text
  second = client.completions.create(prompt=prompt, seed=12, **kwargs).choices[0].text
  assert [c.text for c in both.choices] == [first, second]


def test_batch_and_token_id_prompts(served, client):
  ids = served.tokenizer.encode("abc")
  batch = client.completions.create(
    model=MODEL, prompt=["abc", "xyz"], max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
  )
  single = client.completions.create(
    model=MODEL, prompt=ids, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
  )
  lists = client.completions.create(
    model=MODEL, prompt=[ids, ids], max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
  )
  assert len(batch.choices) == 2 and batch.usage.prompt_tokens == 8
  assert batch.choices[0].text == single.choices[0].text
  assert [c.text for c in lists.choices] == [single.choices[0].text] * 2


def test_stop_strings_and_stop_token_ids(served, client):
  base = client.completions.create(
    model=MODEL, prompt="stop test", max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
  )
  text = base.choices[0].text
  # tiny-random writes mostly stray bytes; stop on its first printable ASCII character
  stop = next(c for c in text[1:] if c.isascii() and c.isprintable())
  stopped = client.completions.create(
    model=MODEL,
    prompt="stop test",
    max_tokens=16,
    temperature=0,
    stop=[stop],
    extra_body={"ignore_eos": True},
  )
  assert stopped.choices[0].text == text[: text.find(stop)]
  assert stopped.choices[0].finish_reason == "stop"
  stop_id = served.tokenizer.encode(stop, add_special_tokens=False)[0]
  by_id = client.completions.create(
    model=MODEL,
    prompt="stop test",
    max_tokens=16,
    temperature=0,
    extra_body={"stop_token_ids": [stop_id], "ignore_eos": True},
  )
  assert by_id.choices[0].finish_reason == "stop"
  assert by_id.choices[0].text == text[: text.find(stop)]
  assert by_id.usage.completion_tokens < 16


def test_completion_logprobs_shape(client):
  reply = client.completions.create(
    model=MODEL,
    prompt="log",
    max_tokens=5,
    temperature=0,
    logprobs=3,
    extra_body={"ignore_eos": True},
  )
  logprobs = reply.choices[0].logprobs
  assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 5
  assert "".join(logprobs.tokens) == reply.choices[0].text or "\ufffd" in reply.choices[0].text
  for value, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
    assert value <= 0 and 1 <= len(top) <= 3
    assert math.isclose(value, max(top.values()), rel_tol=1e-5)  # greedy picks the top token
  assert logprobs.text_offset == sorted(logprobs.text_offset)


def test_chat_logprobs_shape(client):
  reply = client.chat.completions.create(
    model=MODEL,
    messages=MESSAGES,
    max_tokens=4,
    temperature=0,
    logprobs=True,
    top_logprobs=2,
    extra_body={"ignore_eos": True},
  )
  content = reply.choices[0].logprobs.content
  assert len(content) == 4
  for entry in content:
    assert entry.bytes == list(entry.token.encode("utf-8"))
    assert len(entry.top_logprobs) == 2
    assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, rel_tol=1e-5)


def test_scoring_with_echo_matches_offline_prompt_logprobs(served):
  prompt = "Scoring this prompt, token by token."
  response = httpx.post(
    f"{served.url}/v1/completions",
    timeout=30,
    json={
      "model": MODEL,
      "prompt": prompt,
      "echo": True,
      "max_tokens": 0,
      "logprobs": 1,
      "temperature": 0,
    },
  )
  assert response.status_code == 200, response.text
  body = response.json()
  choice = body["choices"][0]
  assert choice["text"] == prompt and choice["finish_reason"] == "length"
  assert body["usage"]["completion_tokens"] == 0
  logprobs = choice["logprobs"]
  ids = served.tokenizer.encode(prompt)
  assert logprobs["tokens"] == served.tokenizer.convert_ids_to_tokens(ids)
  assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None

  llm = LLM(MODEL, config=server_engine_config(), show_progress=False)
  offline = llm.generate(
    [prompt], SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0), use_tqdm=False
  )[0]
  expected = [None] + [entry.logprob for entry in offline.prompt_logprobs[1:]]
  assert len(expected) == len(ids)
  assert logprobs["token_logprobs"][0] is None
  for got, want in zip(logprobs["token_logprobs"][1:], expected[1:], strict=True):
    assert math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-4)
  # lm-evaluation-harness asks for max_tokens 1 and drops the last entry itself.
  one = httpx.post(
    f"{served.url}/v1/completions",
    timeout=30,
    json={
      "model": MODEL,
      "prompt": prompt,
      "echo": True,
      "max_tokens": 1,
      "logprobs": 1,
      "temperature": 0,
    },
  ).json()["choices"][0]["logprobs"]
  assert len(one["token_logprobs"]) == len(ids) + 1
  assert one["token_logprobs"][:-1] == logprobs["token_logprobs"]


def test_tokenize_detokenize_round_trip(served):
  text = "héllo wörld"
  tokens = httpx.post(f"{served.url}/tokenize", json={"prompt": text}).json()
  assert tokens["tokens"] == served.tokenizer.encode(text)
  assert tokens["count"] == len(tokens["tokens"])
  assert tokens["max_model_len"] == served.max_model_len
  back = httpx.post(f"{served.url}/detokenize", json={"tokens": tokens["tokens"]}).json()
  assert back["prompt"] == text
  chat = httpx.post(f"{served.url}/tokenize", json={"messages": MESSAGES}).json()
  assert chat["tokens"] == _chat_prompt_ids(served)


def test_models_health_and_metrics(served, client):
  assert [m.id for m in client.models.list().data] == [MODEL]
  assert httpx.get(f"{served.url}/health").status_code == 200
  client.completions.create(
    model=MODEL, prompt="count me", max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
  )
  values = wait_for_idle(served.url)
  assert values["jaxserve_kv_pages_total"] == served.server.state.engine.stats.num_total_pages
  assert values["jaxserve_xla_compilations_total"] >= 1
  # the engine was warmed up fully: every planned step program is compiled
  assert values["jaxserve_step_programs_compiled"] == values["jaxserve_step_programs_total"] > 0
  assert values["jaxserve_step_programs_compile_seconds"] > 0  # when the last one finished
  assert values["jaxserve_device_memory_used_bytes"] == 0  # the CPU reports no statistics
  assert values["jaxserve_generation_tokens_total"] >= 3
  assert values["jaxserve_prompt_tokens_total"] >= len(served.tokenizer.encode("count me"))
  assert values["jaxserve_time_to_first_token_seconds_count"] >= 1
  assert values["jaxserve_inter_token_latency_seconds_count"] >= 2
  assert values["jaxserve_request_output_gap_seconds_count"] >= 1  # the handler's clock
  assert values["jaxserve_e2e_request_latency_seconds_count"] >= 1
  assert "jaxserve_preemptions_total" in values


def test_served_model_name_and_unknown_model(served):
  response = httpx.post(
    f"{served.url}/v1/completions", json={"model": "gpt-4", "prompt": "x", "max_tokens": 1}
  )
  assert response.status_code == 404
  assert response.json()["error"]["param"] == "model"
  assert response.json()["error"]["code"] == "model_not_found"
  assert json.loads(response.text)["error"]["type"] == "invalid_request_error"
  assert scrape_metrics(served.url)  # still serving
