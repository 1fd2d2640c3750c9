"""LLM.chat gives the tokens the chat route gives for the same messages (greedy), and
LLM.get_tokenizer() is the engine's tokenizer; LLM's keyword arguments are vLLM's names."""

from __future__ import annotations

from openai import OpenAI

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.core.in_process import CoreThread
from jaxserve.entrypoints.llm import LLM
from tests.integration.engine_helpers import small_config
from tests.server.server_helpers import core_backend, start_server

CONVERSATIONS = [
  [{"role": "user", "content": "Hi!"}],
  [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Tell me a story"},
    {"role": "assistant", "content": "Once"},
    {"role": "user", "content": "Go on"},
  ],
]
MAX_TOKENS = 12


def test_llm_chat_matches_the_chat_endpoint():
  base = small_config(max_model_len=256, seq_buckets=(8,), token_buckets=(64,))
  llm = LLM(
    "tiny-random",
    config=base,
    show_progress=False,
    max_num_seqs=8,
    gpu_memory_utilization=0.5,
    max_model_len=256,
    block_size=16,
  )
  assert llm.config.cache.memory_fraction == 0.5 and llm.config.scheduler.max_num_seqs == 8
  assert llm.get_tokenizer() is llm.engine.tokenizer
  params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
  offline = llm.chat(CONVERSATIONS, params, use_tqdm=False)
  single = llm.chat(CONVERSATIONS[0], params, use_tqdm=False)
  assert single[0].outputs[0].token_ids == offline[0].outputs[0].token_ids
  for conversation, result in zip(CONVERSATIONS, offline, strict=True):
    assert list(result.prompt_token_ids) == llm.get_tokenizer().encode_chat(conversation)

  core = CoreThread(llm.engine).start()  # the same engine, now behind the server
  server = start_server(core_backend(core))  # as the one-process server runs it
  try:
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    for conversation, result in zip(CONVERSATIONS, offline, strict=True):
      chat = client.chat.completions.create(
        model="tiny-random",
        messages=conversation,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=True,
        extra_body={"ignore_eos": True},
      )
      completion = result.outputs[0]
      assert chat.usage.prompt_tokens == len(result.prompt_token_ids)
      assert chat.usage.completion_tokens == len(completion.token_ids) == MAX_TOKENS
      assert chat.choices[0].message.content == completion.text
      tokens = llm.get_tokenizer().convert_ids_to_tokens(completion.token_ids)
      served = chat.choices[0].logprobs.content
      assert [t.token for t in served] == tokens
      assert [t.logprob for t in served] == [e.logprob for e in completion.logprobs]
  finally:
    server.stop()
    core.stop()
