"""Per-request sampling parameters, validated on construction.

Every check raises ValueError naming the offending field, so the engine, the CLI and the HTTP
server report bad input the same way.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jaxserve.structured.spec import StructuredOutputSpec, coerce_spec

MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # entries per request (OpenAI's limit): the device's fixed bias width
LOGIT_BIAS_RANGE = 100.0  # each bias lies in [-100, 100], as OpenAI's


def _check(condition: bool, field_name: str, message: str) -> None:
  if not condition:
    raise ValueError(f"{field_name}: {message}")


@dataclass(frozen=True)
class SamplingParams:
  """How to sample one request. Defaults follow the OpenAI API (temperature 1, top_p 1).

  temperature == 0 means greedy. top_k <= 0 disables top-k. seed=None draws a fresh seed per
  request; a fixed seed gives the same tokens whatever the batch mates are.
  structured_outputs constrains the output to a JSON schema, regex, choice or grammar: a
  StructuredOutputSpec or vLLM's mapping ({"json": schema} / {"regex": ...} / {"choice": [...]} /
  {"grammar": ...} / {"json_object": True}); the engine validates it against its tokenizer.
  logit_bias maps token ids to a bias in [-100, 100] added to their logits before sampling (at
  most MAX_LOGIT_BIAS entries; -100 in effect bans a token, +100 forces it): a mapping or
  (id, bias) pairs, stored as pairs sorted by id. Logprobs stay those of the model's raw
  distribution (vLLM's default), as with penalties. The engine checks the ids against its
  vocabulary.
  """

  n: int = 1
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  min_p: float = 0.0
  seed: int | None = None
  repetition_penalty: float = 1.0
  presence_penalty: float = 0.0
  frequency_penalty: float = 0.0
  stop: tuple[str, ...] = ()
  stop_token_ids: tuple[int, ...] = ()
  include_stop_str_in_output: bool = False
  max_tokens: int = 16
  min_tokens: int = 0
  ignore_eos: bool = False
  logprobs: int | None = None
  prompt_logprobs: int | None = None
  skip_special_tokens: bool = True
  structured_outputs: StructuredOutputSpec | None = None
  logit_bias: tuple[tuple[int, float], ...] = ()

  def __post_init__(self) -> None:
    object.__setattr__(self, "structured_outputs", coerce_spec(self.structured_outputs))
    object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
    if isinstance(self.stop, str):
      object.__setattr__(self, "stop", (self.stop,))
    object.__setattr__(self, "stop", tuple(self.stop))
    object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
    self._validate()

  def _validate(self) -> None:
    _check(isinstance(self.n, int) and self.n >= 1, "n", f"must be an integer >= 1, got {self.n!r}")
    _check(
      _is_number(self.temperature) and self.temperature >= 0.0,
      "temperature",
      f"must be >= 0, got {self.temperature!r}",
    )
    _check(
      _is_number(self.top_p) and 0.0 < self.top_p <= 1.0,
      "top_p",
      f"must be in (0, 1], got {self.top_p!r}",
    )
    _check(
      isinstance(self.top_k, int) and self.top_k >= -1,
      "top_k",
      f"must be an integer >= -1 (0 or -1 disables it), got {self.top_k!r}",
    )
    _check(
      _is_number(self.min_p) and 0.0 <= self.min_p <= 1.0,
      "min_p",
      f"must be in [0, 1], got {self.min_p!r}",
    )
    _check(
      self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63),
      "seed",
      f"must be a non-negative integer, got {self.seed!r}",
    )
    _check(
      _is_number(self.repetition_penalty) and self.repetition_penalty > 0.0,
      "repetition_penalty",
      f"must be > 0, got {self.repetition_penalty!r}",
    )
    _check(
      _is_number(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
      "presence_penalty",
      f"must be in [-2, 2], got {self.presence_penalty!r}",
    )
    _check(
      _is_number(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
      "frequency_penalty",
      f"must be in [-2, 2], got {self.frequency_penalty!r}",
    )
    _check(
      all(isinstance(s, str) and s for s in self.stop),
      "stop",
      "must be a list of non-empty strings",
    )
    _check(
      all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
      "stop_token_ids",
      "must be a list of non-negative integers",
    )
    _check(
      isinstance(self.max_tokens, int) and self.max_tokens >= 1,
      "max_tokens",
      f"must be an integer >= 1, got {self.max_tokens!r}",
    )
    _check(
      isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens,
      "min_tokens",
      f"must be an integer in [0, max_tokens], got {self.min_tokens!r}",
    )
    for name in ("logprobs", "prompt_logprobs"):
      value = getattr(self, name)
      _check(
        value is None or (isinstance(value, int) and 0 <= value <= MAX_LOGPROBS),
        name,
        f"must be an integer in [0, {MAX_LOGPROBS}], got {value!r}",
      )

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  @property
  def uses_penalties(self) -> bool:
    return (
      self.repetition_penalty != 1.0
      or self.presence_penalty != 0.0
      or self.frequency_penalty != 0.0
    )

  @property
  def logit_bias_ids(self) -> tuple[int, ...]:
    return tuple(token_id for token_id, _ in self.logit_bias)

  def expand_n(self) -> tuple[SamplingParams, ...]:
    """The n one-sample requests these params stand for (the one rule, used by the server and
    LLM): child k has n=1 and, with a seed, seed + k, so a fixed seed gives n different,
    reproducible samples."""
    return tuple(
      self.replace(n=1, seed=None if self.seed is None else self.seed + k) for k in range(self.n)
    )

  def replace(self, **changes) -> SamplingParams:
    return dataclasses.replace(self, **changes)


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
  """A mapping or (id, bias) pairs -> pairs sorted by id; ValueError naming logit_bias."""
  if value is None:
    return ()
  pairs = value.items() if isinstance(value, Mapping) else value
  if not isinstance(pairs, Iterable) or isinstance(pairs, (str, bytes)):
    raise ValueError("logit_bias: must map token ids to biases")
  out: dict[int, float] = {}
  for pair in pairs:
    if not (isinstance(pair, tuple) and len(pair) == 2):
      raise ValueError("logit_bias: must map token ids to biases")
    token_id, bias = pair
    _check(
      isinstance(token_id, numbers.Integral) and not isinstance(token_id, bool) and token_id >= 0,
      "logit_bias",
      f"token id must be a non-negative integer, got {token_id!r}",
    )
    _check(
      _is_number(bias) and -LOGIT_BIAS_RANGE <= bias <= LOGIT_BIAS_RANGE,
      "logit_bias",
      f"bias of token {token_id} must be in [-100, 100], got {bias!r}",
    )
    out[int(token_id)] = float(bias)
  _check(
    len(out) <= MAX_LOGIT_BIAS,
    "logit_bias",
    f"at most {MAX_LOGIT_BIAS} entries, got {len(out)}",
  )
  return tuple(sorted(out.items()))


def _is_number(value: object) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
