"""Small tokenizer checkpoints built in the test (no hub access): trained BPE tokenizers with the
file layout of real Llama-3-style, Qwen/ChatML-style and Llama-2/SentencePiece-style checkpoints."""

from __future__ import annotations

import json
import os

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = [
  "The quick brown fox jumps over the lazy dog.",
  "Hello, world! How are you doing today?",
  "JAX compiles numerical programs with XLA for GPUs and TPUs.",
  "Paged attention stores the key and value cache in fixed-size pages.",
  "Tokenizers split text into pieces; detokenizers glue them back together.",
  "   leading spaces, trailing spaces   and\ttabs\nand newlines\n\n",
  "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159",
  "Ünïcödé façade naïve café résumé — “quotes” and ‘apostrophes’",
  "日本語のテキスト、中文文本，한국어 텍스트 🤖🚀✨ emoji",
] * 3

LLAMA3_SPECIALS = [
  "<|begin_of_text|>",
  "<|end_of_text|>",
  "<|start_header_id|>",
  "<|end_header_id|>",
  "<|eot_id|>",
]
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SENTENCEPIECE_SPECIALS = ["<unk>", "<s>", "</s>"]

LLAMA3_TEMPLATE = (
  "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
  "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
  "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
  "{{ content }}{% endfor %}{% if add_generation_prompt %}"
  "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

QWEN_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def _train(
  backend: tokenizers.Tokenizer,
  special_tokens: list[str],
  vocab_size: int,
  initial_alphabet: list[str],
) -> tokenizers.Tokenizer:
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=special_tokens,
    initial_alphabet=initial_alphabet,
    show_progress=False,
  )
  backend.train_from_iterator(CORPUS, trainer)
  return backend


def byte_level_bpe(
  special_tokens: list[str], bos_token: str | None, vocab_size: int = 600
) -> tokenizers.Tokenizer:
  """GPT-2 / Llama-3 / Qwen style: ByteLevel pre-tokenizer and decoder, bos from the
  post-processor."""
  backend = tokenizers.Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  backend.decoder = decoders.ByteLevel()
  _train(backend, special_tokens, vocab_size, pre_tokenizers.ByteLevel.alphabet())
  byte_level = processors.ByteLevel(trim_offsets=False)
  if bos_token is None:
    backend.post_processor = byte_level
  else:
    template = processors.TemplateProcessing(
      single=f"{bos_token}:0 $A:0",
      pair=f"{bos_token}:0 $A:0 {bos_token}:1 $B:1",
      special_tokens=[(bos_token, backend.token_to_id(bos_token))],
    )
    backend.post_processor = processors.Sequence([byte_level, template])
  return backend


def sentencepiece_bpe() -> tokenizers.Tokenizer:
  """Llama-2 style: "▁" for spaces, a Metaspace-like decoder that strips the first space, no
  post-processor (tokenizer_config.json's add_bos_token decides)."""
  backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
  backend.normalizer = normalizers.Sequence(
    [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
  )
  backend.decoder = decoders.Sequence(
    [decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
  )
  alphabet = sorted(set("".join(CORPUS).replace(" ", "▁")) | {"▁"})
  return _train(backend, SENTENCEPIECE_SPECIALS, 400, alphabet)


def write_checkpoint(
  directory: str,
  backend: tokenizers.Tokenizer | None,
  config: dict | None,
  generation_config: dict | None = None,
  extra_files: dict[str, str] | None = None,
) -> str:
  os.makedirs(directory, exist_ok=True)
  if backend is not None:
    backend.save(os.path.join(directory, "tokenizer.json"))
  if config is not None:
    config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "clean_up_tokenization_spaces": False,
      **config,
    }
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
      json.dump(config, f, ensure_ascii=False, indent=2)
  if generation_config is not None:
    with open(os.path.join(directory, "generation_config.json"), "w", encoding="utf-8") as f:
      json.dump(generation_config, f)
  for name, text in (extra_files or {}).items():
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      f.write(text)
  return directory


def llama3_checkpoint(directory: str, vocab_size: int = 600) -> str:
  backend = byte_level_bpe(LLAMA3_SPECIALS, bos_token="<|begin_of_text|>", vocab_size=vocab_size)
  config = {
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|eot_id|>",
    "chat_template": LLAMA3_TEMPLATE,
  }
  eos_ids = [backend.token_to_id("<|end_of_text|>"), backend.token_to_id("<|eot_id|>")]
  return write_checkpoint(directory, backend, config, generation_config={"eos_token_id": eos_ids})


def qwen_checkpoint(directory: str) -> str:
  backend = byte_level_bpe(CHATML_SPECIALS, bos_token=None)
  config = {
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "chat_template": QWEN_TEMPLATE,
  }
  eos_id = backend.token_to_id("<|endoftext|>")
  return write_checkpoint(directory, backend, config, generation_config={"eos_token_id": eos_id})


def sentencepiece_checkpoint(directory: str) -> str:
  config = {
    "bos_token": {"content": "<s>", "__type": "AddedToken"},
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "add_bos_token": True,
    "add_eos_token": False,
  }
  return write_checkpoint(directory, sentencepiece_bpe(), config)
