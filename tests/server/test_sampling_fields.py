"""logit_bias on a real server (the official openai client, greedy sampling on the built-in
tiny-random model): +100 forces a token, -100 bans one; and the policy for fields jaxserve does
not implement (server/request_fields.py): a 400 naming a field that would change the output,
a warning naming the unknown ones. Bad logit_bias values are in test_bad_input.py."""

from __future__ import annotations

import inspect
import logging
import re

import httpx
import openai
import pytest

from jaxserve.server import chat_prompt, protocol
from jaxserve.server.request_fields import CHAT_FIELDS, COMPLETION_FIELDS

MODEL = "tiny-random"
MESSAGES = [{"role": "user", "content": "Hi there"}]
FORCED = 100


@pytest.fixture(scope="module")
def client(served):
  with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0) as c:
    yield c


def _greedy(client, **kwargs):
  defaults = dict(model=MODEL, prompt="the bias test", max_tokens=6, temperature=0, logprobs=0)
  return client.completions.create(**{**defaults, **kwargs}, extra_body={"ignore_eos": True})


def test_logit_bias_plus_100_forces_a_token(served, client):
  (forced,) = served.tokenizer.convert_ids_to_tokens([FORCED])
  completion = _greedy(client, logit_bias={str(FORCED): 100})
  assert completion.choices[0].logprobs.tokens == [forced] * 6
  chat = client.chat.completions.create(
    model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, logit_bias={str(FORCED): 100}
  )
  assert chat.choices[0].message.content == served.tokenizer.decode([FORCED] * 4)
  sampled = _greedy(client, logit_bias={str(FORCED): 100}, temperature=1.0, seed=7)
  assert sampled.choices[0].logprobs.tokens == [forced] * 6


def test_logit_bias_minus_100_bans_the_greedy_token(served, client):
  plain = _greedy(client).choices[0].logprobs.tokens
  ids: dict[str, list[int]] = {}
  vocab = range(served.tokenizer.vocab_size)
  for i, name in zip(vocab, served.tokenizer.convert_ids_to_tokens(vocab), strict=True):
    ids.setdefault(name, []).append(i)
  # a greedy token whose string names one id (byte tokens may share a string)
  token = next(t for t in plain if len(ids[t]) == 1)
  biased = _greedy(client, logit_bias={str(ids[token][0]): -100}).choices[0].logprobs.tokens
  assert token not in biased and biased != plain
  assert _greedy(client).choices[0].logprobs.tokens == plain  # batch mates unaffected


def test_unsupported_fields_are_refused_and_unknown_ones_warned(served, caplog):
  url = f"{served.url}/v1/completions"
  base = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
  for extra, param in [
    ({"suffix": "end"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"n": 2, "best_of": 3}, "best_of"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
  ]:
    response = httpx.post(url, json={**base, **extra}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
  chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
  for extra, param in [
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"modalities": ["text", "audio"]}, "modalities"),
  ]:
    response = httpx.post(f"{served.url}/v1/chat/completions", json={**chat, **extra}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
  neutral = {"suffix": None, "best_of": 1, "user": "u1", "metadata": {"a": "b"}}
  logger = "jaxserve.server.request_fields"

  def warned() -> list[logging.LogRecord]:  # other loggers (httpx's) may log at the same time
    return [r for r in caplog.records if r.name == logger]

  with caplog.at_level(logging.WARNING, logger=logger):
    assert httpx.post(url, json={**base, **neutral}, timeout=30).status_code == 200
    assert not warned()
    unknown = {"zz_unknown": 1, "temprature": 0.5}
    assert httpx.post(url, json={**base, **unknown}, timeout=30).status_code == 200
  (record,) = warned()
  assert "['temprature', 'zz_unknown']" in record.getMessage()


def test_every_field_the_protocol_reads_is_known_to_the_field_policy():
  """A field protocol.py (or chat_prompt.py, the chat prompt's fields) implements must be in
  request_fields' sets, or it would be warned about as unknown while it works."""
  source = inspect.getsource(protocol) + inspect.getsource(chat_prompt)
  read = set(re.findall(r'body(?:\.get\(|\[|, )"(\w+)"', source))
  read |= set(protocol.SAMPLING_FIELDS) | set(protocol.BOOL_FIELDS)
  assert {"messages", "prompt", "logit_bias", "echo", "tools", "chat_template_kwargs"} <= read
  assert read <= COMPLETION_FIELDS | CHAT_FIELDS, read - (COMPLETION_FIELDS | CHAT_FIELDS)


@pytest.mark.parametrize("min_tokens", [0, 1, 3])
def test_min_tokens_holds_back_a_forced_eos_for_exactly_that_many_tokens(
  served, client, min_tokens
):
  """eos biased +100 wins whenever it is allowed: vLLM's min_tokens bans it (and stop token
  ids) for the first min_tokens tokens, so the reply is exactly that many, then eos."""
  (eos,) = served.tokenizer.eos_token_ids
  chat = client.chat.completions.create(
    model=MODEL,
    messages=MESSAGES,
    temperature=0,
    max_tokens=10,
    logit_bias={str(eos): 100},
    extra_body={"min_tokens": min_tokens},
  )
  assert chat.choices[0].finish_reason == "stop"
  assert chat.usage.completion_tokens == min_tokens + 1  # the eos counts, as in vLLM
  stop_id = FORCED  # a stop token id is banned too: forced, it still waits min_tokens
  completion = client.completions.create(
    model=MODEL,
    prompt="the bias test",
    max_tokens=10,
    temperature=0,
    logit_bias={str(stop_id): 100},
    extra_body={"min_tokens": min_tokens, "stop_token_ids": [stop_id], "ignore_eos": True},
  )
  assert completion.usage.completion_tokens == min_tokens + 1
  assert completion.choices[0].finish_reason == "stop"
