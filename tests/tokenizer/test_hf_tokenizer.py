"""Tokenizers loaded from checkpoint files against transformers loading the same files."""

from __future__ import annotations

import json
import os

import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxserve.tokenizer import load_tokenizer
from tests.tokenizer import tokenizer_checkpoints as ckpt

TEXTS = [
  "Hello world",
  " the quick  brown fox\n\njumps",
  "日本語のテキスト 🤖🚀",
  "naïve café — “x”",
  "<|im_start|>user\nhi<|im_end|>",
  "<s>a</s>",
  "",
  "   ",
  "Numbers 3.14159 and 1000",
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  root = tmp_path_factory.mktemp("tokenizers")
  return {
    "llama3": ckpt.llama3_checkpoint(str(root / "llama3")),
    "qwen": ckpt.qwen_checkpoint(str(root / "qwen")),
    "sentencepiece": ckpt.sentencepiece_checkpoint(str(root / "sentencepiece")),
  }


def _reference(directory: str) -> transformers.PreTrainedTokenizerFast:
  """transformers' tokenizer for the checkpoint. add_bos_token is passed explicitly: from_pretrained
  ignores tokenizer_config.json's add_bos_token when tokenizer.json exists."""
  with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
    config = json.load(f)
  if config.get("add_bos_token"):
    bos = (
      config["bos_token"]["content"]
      if isinstance(config["bos_token"], dict)
      else config["bos_token"]
    )
    return transformers.PreTrainedTokenizerFast(
      tokenizer_file=os.path.join(directory, "tokenizer.json"),
      bos_token=bos,
      eos_token=config["eos_token"],
      unk_token=config.get("unk_token"),
      add_bos_token=True,
    )
  return transformers.AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def pairs(checkpoints):
  return {name: (load_tokenizer(d), _reference(d)) for name, d in checkpoints.items()}


NAMES = ["llama3", "qwen", "sentencepiece"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(pairs, name, text):
  ours, ref = pairs[name]
  for add_special_tokens in (True, False):
    ids = ours.encode(text, add_special_tokens=add_special_tokens)
    assert ids == ref.encode(text, add_special_tokens=add_special_tokens)
    for skip in (True, False):
      assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("name", ["llama3", "qwen"])
def test_random_text_matches_transformers(pairs, name):
  ours, ref = pairs[name]

  specials = ref.all_special_tokens

  @settings(max_examples=60, deadline=None)
  @given(st.text(max_size=60))
  def check(text):
    ids = ours.encode(text)
    assert ids == ref.encode(text)
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    if not any(special in text for special in specials):  # those are skipped on the way back
      assert ours.decode(ids) == text

  check()


@pytest.mark.parametrize("name", NAMES)
def test_special_ids_match_transformers(pairs, name):
  ours, ref = pairs[name]
  assert ours.vocab_size == len(ref)
  assert ours.bos_token_id == ref.bos_token_id
  assert ours.eos_token_ids[0] == ref.eos_token_id
  assert set(ref.all_special_ids) <= set(ours.all_special_ids)
  ids = list(range(ours.vocab_size))
  assert ours.convert_ids_to_tokens(ids) == [ref.decode([i]) for i in ids]
  assert [ours.id_to_token(i) for i in ids] == ref.convert_ids_to_tokens(ids)


def test_eos_ids_include_generation_config(pairs):
  llama3, _ = pairs["llama3"]
  eot, end_of_text = (
    llama3.backend.token_to_id("<|eot_id|>"),
    llama3.backend.token_to_id("<|end_of_text|>"),
  )
  assert llama3.eos_token_ids == (eot, end_of_text)
  qwen, _ = pairs["qwen"]
  assert qwen.eos_token_ids == (
    qwen.backend.token_to_id("<|im_end|>"),
    qwen.backend.token_to_id("<|endoftext|>"),
  )
  assert qwen.bos_token_id is None


def test_add_bos_token_without_post_processor(pairs):
  ours, _ = pairs["sentencepiece"]
  assert ours.encode("hi")[0] == ours.bos_token_id == 1
  assert ours.encode("hi", add_special_tokens=False)[0] != 1


CONVERSATIONS = [
  [{"role": "user", "content": "Hi there "}],
  [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": " Hello 🤖"},
    {"role": "assistant", "content": "Hi!"},
    {"role": "user", "content": "Bye"},
  ],
]


@pytest.mark.parametrize("name", ["llama3", "qwen"])
@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(pairs, name, messages, add_generation_prompt):
  ours, ref = pairs[name]
  text = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
  assert text == ref.apply_chat_template(
    messages, tokenize=False, add_generation_prompt=add_generation_prompt
  )
  ids = ours.encode_chat(messages, add_generation_prompt=add_generation_prompt)
  assert ids == ref.apply_chat_template(
    messages, tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt
  )


@pytest.mark.parametrize("name", ["llama3", "qwen"])
@pytest.mark.parametrize("final", ["The answer is", "Once upon  ", "  spaced out\n"])
def test_continue_final_message_matches_transformers(pairs, name, final):
  """The prompt ends inside the last message: what transformers' continue_final_message cuts."""
  ours, ref = pairs[name]
  messages = [{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": final}]
  text = ours.apply_chat_template(
    messages, add_generation_prompt=False, continue_final_message=True
  )
  assert text == ref.apply_chat_template(
    messages, tokenize=False, add_generation_prompt=False, continue_final_message=True
  )
  assert text.rstrip().endswith(final.strip())
  with pytest.raises(ValueError, match="continue_final_message"):
    ours.apply_chat_template(messages, add_generation_prompt=True, continue_final_message=True)


def test_chat_template_with_tools_matches_transformers(pairs):
  ours, ref = pairs["qwen"]
  tools = [
    {
      "type": "function",
      "function": {
        "name": "get_weather",
        "description": "Weather <now> & here",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
      },
    }
  ]
  messages = [
    {"role": "user", "content": "Weather in Zürich?"},
    {
      "role": "assistant",
      "content": None,
      "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
      ],
    },
    {"role": "tool", "content": "21°C"},
  ]
  text = ours.apply_chat_template(messages, tools=tools)
  assert text == ref.apply_chat_template(
    messages, tools=tools, tokenize=False, add_generation_prompt=True
  )
  assert '"description": "Weather <now> & here"' in text and "Zürich" in text


def test_chat_template_files(checkpoints, tmp_path):
  ckpt.write_checkpoint(
    str(tmp_path / "jinja"),
    ckpt.byte_level_bpe(ckpt.CHATML_SPECIALS, None),
    {"eos_token": "<|im_end|>", "chat_template": "ignored"},
    extra_files={"chat_template.jinja": "{{ messages[0]['content'] }}!"},
  )
  assert (
    load_tokenizer(str(tmp_path / "jinja")).apply_chat_template([{"role": "user", "content": "a"}])
    == "a!"
  )
  ckpt.write_checkpoint(
    str(tmp_path / "json"),
    ckpt.byte_level_bpe(ckpt.CHATML_SPECIALS, None),
    {"eos_token": "<|im_end|>"},
    extra_files={"chat_template.json": json.dumps({"chat_template": "{{ eos_token }}"})},
  )
  assert load_tokenizer(str(tmp_path / "json")).apply_chat_template([]) == "<|im_end|>"
  named = [
    {"name": "default", "template": "plain"},
    {"name": "tool_use", "template": "{{ tools[0] }}"},
  ]
  ckpt.write_checkpoint(
    str(tmp_path / "named"),
    ckpt.byte_level_bpe(ckpt.CHATML_SPECIALS, None),
    {"chat_template": named},
  )
  named_tokenizer = load_tokenizer(str(tmp_path / "named"))
  assert named_tokenizer.apply_chat_template([]) == "plain"
  assert named_tokenizer.apply_chat_template([], tools=["t"]) == "t"


def test_missing_files_and_bad_configs(checkpoints, tmp_path):
  with pytest.raises(ValueError, match="tokenizer.json"):
    load_tokenizer(str(tmp_path))
  with pytest.raises(ValueError, match="model"):
    load_tokenizer(str(tmp_path / "does-not-exist"))
  ckpt.write_checkpoint(
    str(tmp_path / "bad"),
    ckpt.byte_level_bpe(ckpt.CHATML_SPECIALS, None),
    None,
    extra_files={"tokenizer_config.json": "{not json"},
  )
  with pytest.raises(ValueError, match="tokenizer_config.json"):
    load_tokenizer(str(tmp_path / "bad"))
  ckpt.write_checkpoint(
    str(tmp_path / "gen"),
    ckpt.byte_level_bpe(ckpt.CHATML_SPECIALS, None),
    {},
    generation_config={"eos_token_id": "x"},
  )
  with pytest.raises(ValueError, match="generation_config.json.*eos_token_id"):
    load_tokenizer(str(tmp_path / "gen"))
  no_template = load_tokenizer(checkpoints["sentencepiece"])
  with pytest.raises(ValueError, match="chat_template"):
    no_template.apply_chat_template([{"role": "user", "content": "hi"}])


WHITESPACE_TEMPLATE = """{% set ns = namespace(system='', count=0) %}
{% for message in messages %}
    {% if message['role'] == 'system' %}
        {% set ns.system = message['content'] %}
        {% continue %}
    {% endif %}
    {% if ns.count >= 2 %}{% break %}{% endif %}
    {% set ns.count = ns.count + 1 %}
[{{ message['role'] | upper }}] {{ message['content'] }}
{% endfor %}
{% if ns.system %}
  (system: {{ ns.system }})
{% endif %}
{{ messages | length }} {{ tools | tojson }} {{ documents is none }} {{ bos_token }}{{ eos_token }}
{% if add_generation_prompt %}[ASSISTANT]{% endif %}
"""


def test_whitespace_loopcontrols_namespace_match_transformers(tmp_path):
  """trim_blocks / lstrip_blocks, {% break %} / {% continue %} and namespace() as transformers
  has them."""
  directory = ckpt.write_checkpoint(
    str(tmp_path),
    ckpt.byte_level_bpe(ckpt.LLAMA3_SPECIALS, "<|begin_of_text|>"),
    {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    extra_files={"chat_template.jinja": WHITESPACE_TEMPLATE},
  )
  ours, ref = load_tokenizer(directory), transformers.AutoTokenizer.from_pretrained(directory)
  messages = CONVERSATIONS[1] + [{"role": "assistant", "content": "Later"}]
  tools = [{"name": "f", "description": "ü <b>"}]
  for add_generation_prompt in (True, False):
    text = ours.apply_chat_template(
      messages, add_generation_prompt=add_generation_prompt, tools=tools
    )
    assert text == ref.apply_chat_template(
      messages, tokenize=False, tools=tools, add_generation_prompt=add_generation_prompt
    )
  assert "Later" not in text and "(system: Be brief.)" in text
