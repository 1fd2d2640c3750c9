"""The byte-level tokenizer of the built-in tiny-random model.

Ids 0..255 are the bytes themselves (id b is byte b), so any UTF-8 text round-trips and a multi-byte
character spans several tokens, which exercises incremental detokenization. It is a `tokenizers` BPE
model with no merges over the GPT-2 byte alphabet (the ByteLevel pre-tokenizer maps each byte to a
printable character, the ByteLevel decoder maps it back), followed by six special tokens:

  256 <s> (bos, added by encode)  257 </s> (eos)  258 <|system|>  259 <|user|>  260 <|assistant|>
  261 <|end|>

The model's embedding has 512 rows; ids 262..511 are unused and decode to "".

The chat template (`BYTE_CHAT_TEMPLATE`) writes each message as `<|role|>content<|end|>` and takes
what OpenAI tool calling sends: `tools` as one system turn naming them
(`<|system|>tools: f, g<|end|>`; bytes are tokens here, so whole schemas would fill a small
context), an assistant's `tool_calls` as the JSON array of `{"name", "arguments"}` objects after
its content (the shape tool_choice "required" makes the model write, structured/tools.py), and a
`tool` message as a user turn `<|user|>tool result <tool_call_id>: content<|end|>`. Other roles are
an error.
"""

from __future__ import annotations

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors

from jaxserve.tokenizer.tokenizer import SpecialTokens, Tokenizer

NUM_BYTES = 256
BYTE_VOCAB_SIZE = 512
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")

BYTE_CHAT_TEMPLATE = (
  "{{ bos_token }}"
  "{% if tools is defined and tools %}<|system|>tools: "
  "{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}<|end|>{% endif %}"
  "{% for message in messages %}"
  "{% if message['role'] == 'tool' %}"
  "{{ '<|user|>tool result' }}"
  "{% if message['tool_call_id'] is defined %}{{ ' ' + message['tool_call_id'] }}{% endif %}"
  "{{ ': ' + message['content'] | default('', true) + '<|end|>' }}"
  "{% elif message['role'] in ['system', 'user', 'assistant'] %}"
  "{{ '<|' + message['role'] + '|>' + message['content'] | default('', true) }}"
  "{% if message['tool_calls'] is defined %}"
  "{{ message['tool_calls'] | map(attribute='function') | list | tojson(separators=(',', ':')) }}"
  "{% endif %}"
  "{{ '<|end|>' }}"
  "{% else %}"
  "{{ raise_exception('unsupported role: ' + message['role']) }}"
  "{% endif %}"
  "{% endfor %}"
  "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def _byte_to_char() -> dict[int, str]:
  """GPT-2's reversible map from bytes to printable characters (what ByteLevel uses)."""
  printable = [
    *range(ord("!"), ord("~") + 1),
    *range(ord("¡"), ord("¬") + 1),
    *range(ord("®"), ord("ÿ") + 1),
  ]
  chars = {b: chr(b) for b in printable}
  shifted = (b for b in range(NUM_BYTES) if b not in chars)
  for n, b in enumerate(shifted):
    chars[b] = chr(NUM_BYTES + n)
  return chars


def _byte_backend() -> tokenizers.Tokenizer:
  vocab = {char: b for b, char in _byte_to_char().items()}
  backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  backend.decoder = decoders.ByteLevel()
  backend.add_special_tokens(
    [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
  )
  bos_id = backend.token_to_id(BOS_TOKEN)
  backend.post_processor = processors.TemplateProcessing(
    single=f"{BOS_TOKEN} $A",
    pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
    special_tokens=[(BOS_TOKEN, bos_id)],
  )
  return backend


def byte_level_tokenizer() -> Tokenizer:
  """The tiny-random tokenizer: 256 byte tokens, 6 special tokens, a 512-row vocabulary."""
  backend = _byte_backend()
  assert [backend.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(NUM_BYTES, NUM_BYTES + 6))
  return Tokenizer(
    backend,
    special_tokens=SpecialTokens(bos_token=BOS_TOKEN, eos_token=EOS_TOKEN),
    chat_templates={"default": BYTE_CHAT_TEMPLATE},
    vocab_size=BYTE_VOCAB_SIZE,
  )
