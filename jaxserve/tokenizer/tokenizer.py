"""The tokenizer: a `tokenizers.Tokenizer` plus what Hugging Face keeps beside tokenizer.json.

A checkpoint directory holds
* tokenizer.json (required): the model, normalizer, pre-tokenizer, post-processor, decoder,
  added tokens;
* tokenizer_config.json: bos/eos/unk/pad tokens, `add_bos_token` / `add_eos_token`, extra added
  tokens (`added_tokens_decoder`) and usually `chat_template` (a string, or a list of named
  templates);
* chat_template.jinja or chat_template.json: the chat template in its own file (takes precedence);
* generation_config.json: `eos_token_id` (an int or a list), which adds stop tokens such as
  Llama-3's <|eot_id|>.

tokenizer.json's post-processor adds bos (Llama-3 adds <|begin_of_text|> there); when
tokenizer_config.json says `add_bos_token: true` and the post-processor adds none, a bos step is
appended to it, as transformers' `add_bos_token=True` does (`add_eos_token` is not honoured: prompts
never end in eos). Decoding is lossless: `clean_up_tokenization_spaces` is not applied, so streamed
text and a one-shot decode agree.

The GIL: the tokenizers library holds it through `encode` and `decode` but lets it go through
their batch forms, so encode (always) and decode (of more than DECODE_BATCH_MIN_IDS ids) use those:
encoding a 3 MB prompt in the API server's thread pool (seconds) leaves its event loop free to
answer /health and the other requests. `min_num_tokens` is the token count a text's byte length
alone proves (tokenizer/token_bound.py), known before encoding it.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import jinja2
import tokenizers
from tokenizers import AddedToken, processors

from jaxserve.tokenizer.chat_template import compile_chat_template, render_chat_template
from jaxserve.tokenizer.token_bound import max_bytes_per_token

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
CHAT_TEMPLATE_JINJA_FILE = "chat_template.jinja"
CHAT_TEMPLATE_JSON_FILE = "chat_template.json"
DEFAULT_TEMPLATE_NAME = "default"
TOOL_USE_TEMPLATE_NAME = "tool_use"
DECODE_BATCH_MIN_IDS = 4096  # longer decodes go through decode_batch, without the GIL


@dataclass(frozen=True)
class SpecialTokens:
  """The named special tokens of tokenizer_config.json (None where the checkpoint has none)."""

  bos_token: str | None = None
  eos_token: str | None = None
  unk_token: str | None = None
  pad_token: str | None = None

  def as_template_variables(self) -> dict[str, str]:
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


class Tokenizer:
  """Encode, decode and chat-template rendering for one model.

  `backend` is used as given (the loader has already fixed its post-processor and added tokens).
  `vocab_size` overrides the backend's count where the model's embedding is larger than the
  tokenizer (ids past the tokenizer's decode to ""). `chat_templates` maps a template name to its
  source; "default" is used unless tools are given and a "tool_use" template exists.
  `tokenizer_class` is tokenizer_config.json's (what /tokenizer_info reports).
  """

  def __init__(
    self,
    backend: tokenizers.Tokenizer,
    *,
    special_tokens: SpecialTokens = SpecialTokens(),
    extra_eos_token_ids: Sequence[int] = (),
    chat_templates: Mapping[str, str] | None = None,
    vocab_size: int | None = None,
    tokenizer_class: str = "PreTrainedTokenizerFast",
  ) -> None:
    self.backend = backend
    self.tokenizer_class = tokenizer_class  # transformers' class for this tokenizer (reported only)
    self.special_tokens = special_tokens
    self._vocab_size = (
      backend.get_vocab_size(with_added_tokens=True) if vocab_size is None else vocab_size
    )
    self._bos_token_id = self._named_token_id("bos_token", special_tokens.bos_token)
    eos_token_id = self._named_token_id("eos_token", special_tokens.eos_token)
    eos_ids = ([] if eos_token_id is None else [eos_token_id]) + [
      int(i) for i in extra_eos_token_ids
    ]
    self._eos_token_ids = tuple(dict.fromkeys(eos_ids))
    self._chat_templates = dict(chat_templates or {})
    self._compiled_templates: dict[str, jinja2.Template] = {}
    special_ids = {i for i, token in backend.get_added_tokens_decoder().items() if token.special}
    named = (
      self._named_token_id(name, token)
      for name, token in special_tokens.as_template_variables().items()
    )
    self._all_special_ids = tuple(sorted(special_ids | {i for i in named if i is not None}))

  def _named_token_id(self, name: str, token: str | None) -> int | None:
    if token is None:
      return None
    token_id = self.backend.token_to_id(token)
    if token_id is None:
      raise ValueError(f"{name}: {token!r} is not in the tokenizer's vocabulary")
    return token_id

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  @property
  def bos_token_id(self) -> int | None:
    return self._bos_token_id

  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    return self._eos_token_ids

  @property
  def all_special_ids(self) -> tuple[int, ...]:
    return self._all_special_ids

  @property
  def chat_template(self) -> str | None:
    return self._chat_templates.get(DEFAULT_TEMPLATE_NAME)

  def encode(
    self,
    text: str,
    add_special_tokens: bool = True,
    check_count: Callable[[int], None] | None = None,
  ) -> list[int]:
    """The token ids of `text` (without holding the GIL while it is encoded). check_count, if
    given, sees the number of tokens before their ids are built (it raises to refuse them)."""
    if not isinstance(text, str):
      raise ValueError(f"text: must be a string, got {type(text).__name__}")
    (encoding,) = self.backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)
    if check_count is not None:
      check_count(len(encoding))
    return encoding.ids

  @functools.cached_property
  def max_bytes_per_token(self) -> int | None:
    """The most UTF-8 bytes of text one token stands for; None where no bound is proven
    (tokenizer/token_bound.py)."""
    return max_bytes_per_token(self.backend)

  def min_num_tokens(self, text: str, add_special_tokens: bool = True) -> int | None:
    """A number of tokens `text` is proven to encode to at least, from its byte length (and the
    special tokens encode adds); None where the tokenizer proves no bound."""
    bound = self.max_bytes_per_token
    if bound is None:
      return None
    num_bytes = len(text.encode("utf-8", "surrogatepass"))
    added = self.backend.num_special_tokens_to_add(False) if add_special_tokens else 0
    return math.ceil(num_bytes / bound) + added

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
    ids = list(ids)
    if len(ids) < DECODE_BATCH_MIN_IDS:
      return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return self.backend.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]

  def id_to_token(self, token_id: int) -> str:
    """The vocabulary string of `token_id` (e.g. "Ġthe"); "" for ids the tokenizer lacks."""
    token = self.backend.id_to_token(token_id)
    return "" if token is None else token

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    """Each id decoded on its own (e.g. " the"), as OpenAI logprobs report tokens.

    A token holding part of a multi-byte character decodes to U+FFFD.
    """
    return [self.backend.decode([i], skip_special_tokens=False) for i in ids]

  def apply_chat_template(
    self,
    messages: Sequence[Mapping[str, object]],
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    continue_final_message: bool = False,
    **extra: object,
  ) -> str:
    """The prompt text for `messages`; encode it with add_special_tokens=False (see encode_chat).
    continue_final_message: the prompt ends inside the last message (tokenizer/chat_template.py)."""
    template = self._compiled_template(tools)
    variables = {**self.special_tokens.as_template_variables(), **extra}
    bos_token = variables.pop("bos_token", None)
    eos_token = variables.pop("eos_token", None)
    return render_chat_template(
      template,
      messages,
      add_generation_prompt=add_generation_prompt,
      bos_token=bos_token,
      eos_token=eos_token,
      tools=tools,
      continue_final_message=continue_final_message,
      **variables,
    )

  def encode_chat(
    self,
    messages: Sequence[Mapping[str, object]],
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    continue_final_message: bool = False,
    **extra: object,
  ) -> list[int]:
    """Prompt token ids for `messages`: the template writes bos itself, so none is added here."""
    text = self.apply_chat_template(
      messages, add_generation_prompt, tools, continue_final_message, **extra
    )
    return self.encode(text, add_special_tokens=False)

  def _compiled_template(self, tools: list[dict] | None) -> jinja2.Template:
    name = DEFAULT_TEMPLATE_NAME
    if tools and TOOL_USE_TEMPLATE_NAME in self._chat_templates:
      name = TOOL_USE_TEMPLATE_NAME
    if name not in self._chat_templates:
      raise ValueError(
        "chat_template: this tokenizer has no chat template (none in "
        f"{TOKENIZER_CONFIG_FILE}, {CHAT_TEMPLATE_JINJA_FILE} or {CHAT_TEMPLATE_JSON_FILE})"
      )
    if name not in self._compiled_templates:
      self._compiled_templates[name] = compile_chat_template(self._chat_templates[name])
    return self._compiled_templates[name]


def _read_json(path: str, required: bool = False) -> dict | None:
  if not os.path.isfile(path):
    if required:
      raise ValueError(f"{path}: file not found")
    return None
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: cannot read JSON: {e}") from e
  if not isinstance(data, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
  return data


def _token_content(config: Mapping[str, object], name: str, path: str) -> str | None:
  """A named token in tokenizer_config.json: a string, an AddedToken dict {"content": ...} or
  null."""
  value = config.get(name)
  if isinstance(value, Mapping):
    value = value.get("content")
  if value is not None and not isinstance(value, str):
    raise ValueError(f"{path}: {name} must be a string or an AddedToken object, got {value!r}")
  return value


def _chat_templates(directory: str, config: Mapping[str, object]) -> dict[str, str]:
  config_path = os.path.join(directory, TOKENIZER_CONFIG_FILE)
  jinja_path = os.path.join(directory, CHAT_TEMPLATE_JINJA_FILE)
  json_path = os.path.join(directory, CHAT_TEMPLATE_JSON_FILE)
  source: object = config.get("chat_template")
  where = config_path
  if os.path.isfile(jinja_path):
    with open(jinja_path, encoding="utf-8") as f:
      return {DEFAULT_TEMPLATE_NAME: f.read()}
  if (json_config := _read_json(json_path)) is not None:
    source, where = json_config.get("chat_template"), json_path
  if source is None:
    return {}
  if isinstance(source, str):
    return {DEFAULT_TEMPLATE_NAME: source}
  if isinstance(source, list) and all(
    isinstance(t, Mapping) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
    for t in source
  ):
    return {t["name"]: t["template"] for t in source}
  raise ValueError(
    f"{where}: chat_template must be a string or a list of {{name, template}} objects"
  )


def _add_missing_tokens(
  backend: tokenizers.Tokenizer, config: Mapping[str, object], special_tokens: SpecialTokens
) -> None:
  """Adds tokens that tokenizer_config.json declares but tokenizer.json lacks, as transformers
  does."""
  declared = config.get("added_tokens_decoder") or {}
  entries = (
    sorted(declared.items(), key=lambda item: int(item[0])) if isinstance(declared, Mapping) else []
  )
  for _, entry in entries:
    if isinstance(entry, Mapping) and isinstance(entry.get("content"), str):
      if backend.token_to_id(entry["content"]) is None:
        backend.add_tokens(
          [
            AddedToken(
              entry["content"],
              special=bool(entry.get("special", False)),
              lstrip=bool(entry.get("lstrip", False)),
              rstrip=bool(entry.get("rstrip", False)),
              normalized=bool(entry.get("normalized", False)),
              single_word=bool(entry.get("single_word", False)),
            )
          ]
        )
  for token in special_tokens.as_template_variables().values():
    if backend.token_to_id(token) is None:
      backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])


def _ensure_bos(
  backend: tokenizers.Tokenizer, config: Mapping[str, object], special_tokens: SpecialTokens
) -> None:
  """Appends a bos step to the post-processor if add_bos_token is set and it adds no bos yet."""
  bos = special_tokens.bos_token
  if config.get("add_bos_token") is not True or bos is None:
    return
  bos_id = backend.token_to_id(bos)
  probe_ids = backend.encode("a", add_special_tokens=True).ids
  if probe_ids and probe_ids[0] == bos_id:
    return
  add_bos = processors.TemplateProcessing(
    single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
  )
  existing = backend.post_processor
  backend.post_processor = add_bos if existing is None else processors.Sequence([existing, add_bos])


def _generation_eos_ids(directory: str) -> list[int]:
  path = os.path.join(directory, GENERATION_CONFIG_FILE)
  config = _read_json(path) or {}
  value = config.get("eos_token_id")
  ids = [] if value is None else value if isinstance(value, list) else [value]
  if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
    raise ValueError(f"{path}: eos_token_id must be an int or a list of ints, got {value!r}")
  return ids


def load_tokenizer_dir(directory: str) -> Tokenizer:
  tokenizer_path = os.path.join(directory, TOKENIZER_FILE)
  if not os.path.isfile(tokenizer_path):
    raise ValueError(
      f"{tokenizer_path}: file not found (jaxserve needs a fast tokenizer, {TOKENIZER_FILE})"
    )
  try:
    backend = tokenizers.Tokenizer.from_file(tokenizer_path)
  except Exception as e:  # the tokenizers library raises its own exception types
    raise ValueError(f"{tokenizer_path}: cannot load: {e}") from e
  config_path = os.path.join(directory, TOKENIZER_CONFIG_FILE)
  config = _read_json(config_path) or {}
  special_tokens = SpecialTokens(
    **{
      name: _token_content(config, name, config_path)
      for name in ("bos_token", "eos_token", "unk_token", "pad_token")
    }
  )
  _add_missing_tokens(backend, config, special_tokens)
  _ensure_bos(backend, config, special_tokens)
  return Tokenizer(
    backend,
    special_tokens=special_tokens,
    extra_eos_token_ids=_generation_eos_ids(directory),
    chat_templates=_chat_templates(directory, config),
    tokenizer_class=_tokenizer_class(config, config_path),
  )


def _tokenizer_class(config: Mapping[str, object], path: str) -> str:
  value = config.get("tokenizer_class", "PreTrainedTokenizerFast")
  if not isinstance(value, str):
    raise ValueError(f"{path}: tokenizer_class must be a string, got {value!r}")
  return value


def load_tokenizer(directory: str) -> Tokenizer:
  """The tokenizer of a checkpoint directory (a built-in model's comes from
  models/registry.load_model_tokenizer)."""
  if not os.path.isdir(directory):
    raise ValueError(f"model: {directory!r} is not a checkpoint directory")
  return load_tokenizer_dir(directory)
