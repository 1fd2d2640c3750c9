"""The model's recommended sampling defaults (vLLM's --generation-config): the one owner of how
a checkpoint's generation_config.json changes the sampling of requests that leave a field unset.

Where they come from (EngineConfig.generation_config; models/registry.generation_defaults reads
it): "auto" the model's checkpoint directory (a built-in model has none), "vllm" nowhere (the
neutral defaults of SamplingParams), or a directory's generation_config.json (which must exist).

What is taken, as vLLM's ModelConfig.get_diff_sampling_param takes it: temperature, top_p,
top_k, min_p and repetition_penalty, and max_new_tokens as max_tokens; other keys (do_sample,
eos_token_id, ...) change no sampling default (eos_token_id adds stop tokens:
tokenizer/tokenizer.py). A key set in the file counts whatever its value, as with transformers
>= 5, whose GenerationConfig.to_diff_dict keeps every explicit value (older transformers dropped
values equal to its own defaults, e.g. top_k 50). A value SamplingParams refuses is a ValueError
naming the file and the key.

How they apply (`fill`, `sampling_params`, `max_tokens_within`):
* HTTP (server/protocol.py): a field the body leaves out or sets to null takes the default;
  max_tokens: on chat, max_new_tokens is the default instead of the rest of the context (and is
  capped by it, as vLLM's get_max_tokens does); /v1/completions keeps its default of 16 (the
  field default of OpenAI's API and vLLM's).
* LLM.generate / LLM.chat without sampling params: LLM.get_default_sampling_params() (vLLM's),
  SamplingParams with the defaults, max_tokens max_new_tokens if given.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields

from jaxserve.api.sampling_params import SamplingParams

GENERATION_CONFIG_FILE = "generation_config.json"
AUTO, VLLM = "auto", "vllm"
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class GenerationDefaults:
  """The defaults a generation_config.json sets (None: not set there); `source` names where
  they come from ("model", a directory, or "vllm" for none)."""

  temperature: float | None = None
  top_p: float | None = None
  top_k: int | None = None
  min_p: float | None = None
  repetition_penalty: float | None = None
  max_tokens: int | None = None
  source: str = VLLM

  def as_dict(self) -> dict[str, float | int]:
    """The defaults that are set, by SamplingParams field name (what the start-up log shows)."""
    return {
      f.name: getattr(self, f.name)
      for f in fields(self)
      if f.name != "source" and getattr(self, f.name) is not None
    }

  def fill(self, given: dict[str, object]) -> dict[str, object]:
    """`given` (SamplingParams keyword arguments a request set) plus the sampling defaults for
    the keys it lacks; max_tokens is left to `max_tokens_within`."""
    filled = dict(given)
    for name in SAMPLING_KEYS:
      value = getattr(self, name)
      if value is not None and filled.get(name) is None:
        filled[name] = value
    return filled

  def max_tokens_within(self, room: int) -> int:
    """The max_tokens of a request that gives none and may use `room` more tokens of context:
    max_new_tokens capped by the room, else the room."""
    return room if self.max_tokens is None else min(self.max_tokens, room)

  def sampling_params(self, **given: object) -> SamplingParams:
    """SamplingParams with these defaults under `given` (LLM.get_default_sampling_params)."""
    if self.max_tokens is not None and given.get("max_tokens") is None:
      given["max_tokens"] = self.max_tokens
    return SamplingParams(**self.fill(given))


def read_generation_defaults(directory: str, source: str, required: bool) -> GenerationDefaults:
  """The defaults of `directory`/generation_config.json (none if it has no such file, unless
  `required`: then a ValueError naming generation_config)."""
  path = os.path.join(directory, GENERATION_CONFIG_FILE)
  if not os.path.isfile(path):
    if required:
      raise ValueError(f"generation_config: {directory!r} holds no {GENERATION_CONFIG_FILE}")
    return GenerationDefaults(source=source)
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
    raise ValueError(f"{path}: cannot read JSON: {err}") from err
  if not isinstance(data, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
  values = {name: data[name] for name in SAMPLING_KEYS if data.get(name) is not None}
  max_new_tokens = data.get("max_new_tokens")
  if max_new_tokens is not None and not (
    isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) and max_new_tokens >= 1
  ):
    raise ValueError(f"{path}: max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
  try:
    SamplingParams(**values)  # the same checks as a request's values
  except (ValueError, TypeError) as err:
    raise ValueError(f"{path}: {err}") from err
  return GenerationDefaults(**values, max_tokens=max_new_tokens, source=source)
