"""A model's defaults and reasoning, end to end on a scripted checkpoint
(tests/models/scripted_checkpoint.py: greedy decoding after the generation prompt follows
"<think>Let me think.</think>\\n\\nHello there!" to eos; sampling at temperature 1 does not),
through LLM and through real uvicorn servers on 127.0.0.1 with the official openai client:

* its generation_config.json (temperature 0.6, top_k 1, top_p 0.95, max_new_tokens 4) sets the
  defaults of requests that leave a field unset, logged once at start; with generation_config
  "vllm" it does not (LLM.get_default_sampling_params() is SamplingParams()), nor behind an API
  server that an engine with --generation-config vllm feeds;
* reasoning parsers split the think block into reasoning_content, whole and streamed;
  chat_template_kwargs (and the server's default ones) reach the template;
* continue_final_message, chat echo, continuous_usage_stats and /tokenize's return_token_strs,
  the prompts checked against transformers' rendering and tokenizer.

The LLM tests come first: the servers' core thread then takes the same engine over.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import httpx
import openai
import pytest
import transformers

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config.generation_config import GenerationDefaults
from jaxserve.core.in_process import CoreThread
from jaxserve.entrypoints.llm import LLM
from tests.integration.engine_helpers import small_config
from tests.models.scripted_checkpoint import ANSWER, REASONING, build_scripted_checkpoint
from tests.server.server_helpers import core_backend, start_server

GENERATION_CONFIG = {"temperature": 0.6, "top_k": 1, "top_p": 0.95, "max_new_tokens": 4}
MESSAGES = [{"role": "user", "content": "Hi there! What is it?"}]
SCRIPTED = f"<think>{REASONING}</think>\n\n{ANSWER}"
CONTENT = f"\n\n{ANSWER}"  # what follows the think block
GREEDY = dict(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return build_scripted_checkpoint(tmp_path_factory.mktemp("scripted"), GENERATION_CONFIG)


def _llm(checkpoint, **kwargs) -> tuple[LLM, list[str]]:
  """An LLM over the checkpoint and the start-up log of jaxserve.composition.assembly."""
  config = small_config(
    str(checkpoint), max_model_len=256, max_num_seqs=8, seq_buckets=(8,), token_buckets=(64,)
  )
  records: list[logging.LogRecord] = []
  handler = logging.Handler(logging.INFO)
  handler.emit = records.append
  logger = logging.getLogger("jaxserve.composition.assembly")
  level = logger.level
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  try:
    llm = LLM(str(checkpoint), config=config, show_progress=False, **kwargs)
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
  return llm, [r.getMessage() for r in records]


@pytest.fixture(scope="module")
def llm(checkpoint):
  return _llm(checkpoint)


@pytest.fixture(scope="module")
def hf_tokenizer(checkpoint):
  return transformers.AutoTokenizer.from_pretrained(checkpoint)


def _text(result) -> tuple[str, str]:
  return result[0].outputs[0].text, result[0].outputs[0].finish_reason


def test_llm_takes_the_generation_config_defaults_and_logs_them(llm, checkpoint):
  engine, log = llm
  reference = transformers.GenerationConfig.from_pretrained(checkpoint)
  params = engine.get_default_sampling_params()
  assert (params.temperature, params.top_k, params.top_p, params.max_tokens) == (
    reference.temperature,
    reference.top_k,
    reference.top_p,
    reference.max_new_tokens,
  )
  (line,) = [m for m in log if "generation_config.json" in m]
  assert "temperature=0.6, top_p=0.95, top_k=1, max_tokens=4" in line
  assert "--generation-config vllm" in line
  # top_k 1: the scripted reply, cut at max_new_tokens 4
  assert _text(engine.chat(MESSAGES, use_tqdm=False)) == (
    "<think>Let me think.</think>\n\n",
    "length",
  )
  assert _text(engine.chat(MESSAGES, SamplingParams(**GREEDY), use_tqdm=False)) == (
    SCRIPTED,
    "stop",
  )


def test_llm_chat_template_kwargs_and_continue_final_message(llm):
  engine, _ = llm
  params = SamplingParams(**GREEDY)
  off = engine.chat(
    MESSAGES, params, use_tqdm=False, chat_template_kwargs={"enable_thinking": False}
  )
  assert _text(off) == (ANSWER, "stop")
  partial = MESSAGES + [{"role": "assistant", "content": "<think>"}]
  continued = engine.chat(
    partial, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True
  )
  assert _text(continued) == (f"{REASONING}</think>\n\n{ANSWER}", "stop")


def test_llm_with_generation_config_vllm_ignores_the_file(checkpoint):
  engine, log = _llm(checkpoint, generation_config="vllm")
  assert engine.get_default_sampling_params() == SamplingParams()
  assert not [m for m in log if "generation_config.json" in m]
  sampled = SamplingParams(seed=3, ignore_eos=True)
  result = engine.chat(MESSAGES, sampled, use_tqdm=False)[0].outputs[0]
  assert result.finish_reason == "length" and len(result.token_ids) == 16  # SamplingParams' 16
  assert not SCRIPTED.startswith(result.text)  # sampled at temperature 1


@pytest.fixture(scope="module")
def servers(llm):
  """API servers over one core thread: no parser, qwen3, deepseek_r1, qwen3 with thinking off by
  default, and one fed no generation defaults (what an engine with --generation-config vllm
  reports)."""
  core = CoreThread(llm[0].engine).start()
  backend = core_backend(core)
  running = {
    "plain": start_server(backend),
    "qwen3": start_server(backend, reasoning_parser="qwen3"),
    "deepseek_r1": start_server(backend, reasoning_parser="deepseek_r1"),
    "no_thinking": start_server(
      backend, reasoning_parser="qwen3", default_chat_template_kwargs={"enable_thinking": False}
    ),
    "vllm": start_server(dataclasses.replace(backend, generation_defaults=GenerationDefaults())),
  }
  yield running
  for server in running.values():
    server.stop()
  core.stop()


@pytest.fixture(scope="module")
def clients(servers):
  made = {
    name: openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0)
    for name, s in servers.items()
  }
  for name, client in made.items():
    client.model_name = servers[name].state.model_name
  yield made
  for client in made.values():
    client.close()


def _chat(client, **kwargs):
  return client.chat.completions.create(model=client.model_name, **kwargs)


def _message(client, **kwargs) -> dict:
  return _chat(client, messages=MESSAGES, **kwargs).choices[0].message.model_dump()


def _streamed(client, **kwargs) -> tuple[dict[str, str], list]:
  """The joined delta fields of a streamed chat (content, reasoning_content, reasoning) and its
  chunks."""
  chunks = list(_chat(client, stream=True, **{"messages": MESSAGES, **kwargs}))
  joined: dict[str, str] = {}
  for chunk in chunks:
    for choice in chunk.choices:
      for name, value in choice.delta.model_dump().items():
        if name in ("content", "reasoning_content", "reasoning") and value:
          joined[name] = joined.get(name, "") + value
  return joined, chunks


def test_http_requests_take_the_defaults_they_leave_unset(clients):
  chat = _chat(clients["plain"], messages=MESSAGES, n=3)
  assert [c.message.content for c in chat.choices] == ["<think>Let me think.</think>\n\n"] * 3
  assert chat.usage.completion_tokens == 3 * 4 and chat.choices[0].finish_reason == "length"
  # completions: top_k 1 applies; max_tokens keeps its default of 16 (not max_new_tokens)
  model = clients["plain"].model_name
  completion = clients["plain"].completions.create(model=model, prompt="Hi there!\n", n=2)
  assert [c.text for c in completion.choices] == [SCRIPTED] * 2
  # a field the request sets wins: top_k 0 samples the whole vocabulary
  sampled = _chat(
    clients["plain"], messages=MESSAGES, n=3, max_tokens=4, seed=1, extra_body={"top_k": 0}
  )
  assert len({c.message.content for c in sampled.choices}) > 1
  # the API server of an engine started with --generation-config vllm: temperature 1, no cap
  neutral = _chat(clients["vllm"], messages=MESSAGES, n=3, seed=1)
  assert len({c.message.content for c in neutral.choices}) == 3
  assert neutral.usage.completion_tokens > 3 * 4


def test_reasoning_content_whole(clients):
  qwen3 = _message(clients["qwen3"], **GREEDY)
  assert (qwen3["content"], qwen3["reasoning_content"], qwen3["reasoning"]) == (
    CONTENT,
    REASONING,
    REASONING,
  )
  plain = _message(clients["plain"], **GREEDY)
  assert plain["content"] == SCRIPTED and "reasoning_content" not in plain
  dropped = _message(clients["qwen3"], **GREEDY, extra_body={"include_reasoning": False})
  assert dropped["content"] == CONTENT and dropped.get("reasoning_content") is None
  cut = _message(clients["qwen3"], temperature=0, max_tokens=2)  # ends inside the reasoning
  assert (cut["content"], cut["reasoning_content"]) == (None, REASONING)


def test_reasoning_content_streamed(clients):
  joined, chunks = _streamed(clients["qwen3"], **GREEDY)
  assert joined == {"content": CONTENT, "reasoning_content": REASONING, "reasoning": REASONING}
  assert chunks[-1].choices[0].finish_reason == "stop"
  assert _streamed(clients["plain"], **GREEDY)[0] == {"content": SCRIPTED}


def test_chat_template_kwargs_reach_the_template(clients, servers, hf_tokenizer):
  off = {"chat_template_kwargs": {"enable_thinking": False}}
  message = _message(clients["qwen3"], **GREEDY, extra_body=off)
  assert (message["content"], message.get("reasoning_content")) == (ANSWER, None)
  # the server's default kwargs, and a request's own winning over them
  assert _message(clients["no_thinking"], **GREEDY)["content"] == ANSWER
  on = _message(
    clients["no_thinking"], **GREEDY, extra_body={"chat_template_kwargs": {"enable_thinking": True}}
  )
  assert (on["content"], on["reasoning_content"]) == (CONTENT, REASONING)
  # /tokenize renders as transformers does with the same variables
  tokens = httpx.post(f"{servers['qwen3'].url}/tokenize", json={"messages": MESSAGES, **off})
  expected = hf_tokenizer.apply_chat_template(
    MESSAGES, add_generation_prompt=True, enable_thinking=False, return_dict=False
  )
  assert tokens.json()["tokens"] == expected
  bad = httpx.post(
    f"{servers['qwen3'].url}/v1/chat/completions",
    json={"messages": MESSAGES, "chat_template_kwargs": {"messages": []}},
  )
  assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs.messages"


def test_deepseek_r1_reads_reasoning_without_an_opening_tag(clients):
  """think_prefilled opens the tag in the prompt, as DeepSeek-R1's template does: the reply
  has only the closing tag. deepseek_r1 splits it; qwen3 needs the opening tag."""
  prefilled = {"chat_template_kwargs": {"think_prefilled": True}}
  r1 = _message(clients["deepseek_r1"], **GREEDY, extra_body=prefilled)
  assert (r1["content"], r1["reasoning_content"]) == (CONTENT, REASONING)
  joined, _ = _streamed(clients["deepseek_r1"], **GREEDY, extra_body=prefilled)
  assert (joined["content"], joined["reasoning_content"]) == (CONTENT, REASONING)
  qwen3 = _message(clients["qwen3"], **GREEDY, extra_body=prefilled)
  assert (qwen3["content"], qwen3.get("reasoning_content")) == (
    f"{REASONING}</think>{CONTENT}",
    None,
  )


def test_continue_final_message_and_echo(clients, servers, hf_tokenizer):
  partial = MESSAGES + [{"role": "assistant", "content": "<think>"}]
  go_on = {"continue_final_message": True, "add_generation_prompt": False}
  client = clients["plain"]
  continued = _chat(client, messages=partial, **GREEDY, extra_body=go_on)
  assert continued.choices[0].message.content == f"{REASONING}</think>{CONTENT}"
  echoed = _chat(client, messages=partial, **GREEDY, extra_body={**go_on, "echo": True})
  assert echoed.choices[0].message.content == SCRIPTED
  joined, chunks = _streamed(client, **GREEDY, messages=partial, extra_body={**go_on, "echo": True})
  assert joined == {"content": SCRIPTED} and chunks[1].choices[0].delta.content == "<think>"
  # echo repeats the last message only when the reply continues it (vLLM's rule)
  fresh = _chat(client, messages=MESSAGES, **GREEDY, extra_body={"echo": True})
  assert fresh.choices[0].message.content == SCRIPTED
  # the prompt is transformers' continue_final_message rendering
  tokens = httpx.post(f"{servers['plain'].url}/tokenize", json={"messages": partial, **go_on})
  expected = hf_tokenizer.apply_chat_template(
    partial, add_generation_prompt=False, continue_final_message=True, return_dict=False
  )
  assert tokens.json()["tokens"] == expected
  with pytest.raises(openai.BadRequestError) as err:  # a generation prompt would close it
    _chat(client, messages=partial, extra_body={"continue_final_message": True})
  assert err.value.body["param"] == "continue_final_message"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_continuous_usage_stats_put_usage_on_every_chunk(clients, endpoint):
  client = clients["plain"]
  options = {"include_usage": True, "continuous_usage_stats": True}
  if endpoint == "chat":
    chunks = list(_chat(client, messages=MESSAGES, **GREEDY, stream=True, stream_options=options))
  else:
    model = client.model_name
    chunks = list(
      client.completions.create(
        model=model, prompt="Hi there!\n", **GREEDY, stream=True, stream_options=options
      )
    )
  assert all(chunk.usage is not None for chunk in chunks)
  final = chunks[-1].usage  # the usage-only chunk
  assert not chunks[-1].choices and final.completion_tokens == 6  # the script's 5 + eos
  counts = [chunk.usage.completion_tokens for chunk in chunks[:-1]]
  assert counts == sorted(counts) and counts[-1] == 6 and len(set(counts)) > 2
  assert {c.usage.prompt_tokens for c in chunks} == {final.prompt_tokens}
  assert all(
    c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks
  )
  # without continuous_usage_stats only the last chunk has usage
  plain = list(
    _chat(client, messages=MESSAGES, **GREEDY, stream=True, stream_options={"include_usage": True})
  )
  assert [c.usage is not None for c in plain] == [False] * (len(plain) - 1) + [True]


def test_tokenize_returns_token_strings(servers, hf_tokenizer):
  url = f"{servers['plain'].url}/tokenize"
  prompt = "Hi there! Let me think.\n"
  body = httpx.post(url, json={"prompt": prompt, "return_token_strs": True}).json()
  expected = hf_tokenizer(prompt)["input_ids"]
  assert body["tokens"] == expected
  assert body["token_strs"] == hf_tokenizer.convert_ids_to_tokens(expected)
  assert httpx.post(url, json={"prompt": prompt}).json()["token_strs"] is None
  chat = httpx.post(url, json={"messages": MESSAGES, "return_token_strs": True}).json()
  assert chat["token_strs"] == hf_tokenizer.convert_ids_to_tokens(chat["tokens"])
  assert json.loads(json.dumps(chat))["count"] == len(chat["tokens"])
