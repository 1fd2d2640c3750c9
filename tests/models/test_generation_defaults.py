"""generation_config (vLLM's --generation-config): what a generation_config.json sets, read as
transformers reads the file (GenerationConfig.to_diff_dict, the dict vLLM takes its defaults
from), where it is read from (auto, vllm, a directory) and how the defaults apply. End to end
(log line, LLM, HTTP) in tests/server/test_model_defaults.py."""

from __future__ import annotations

import json

import pytest
import transformers

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.config import EngineConfig
from jaxserve.config.generation_config import GenerationDefaults, read_generation_defaults
from jaxserve.models.registry import generation_defaults

# vLLM's ModelConfig.get_diff_sampling_param: these keys, max_new_tokens as max_tokens
VLLM_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
FILES = [
  {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "do_sample": True},
  {"temperature": 0.7, "repetition_penalty": 1.05, "max_new_tokens": 512, "eos_token_id": [1, 2]},
  {"top_k": 50, "temperature": 1.0, "bos_token_id": 1},  # transformers' old defaults: kept
  {"do_sample": False, "eos_token_id": 2},  # nothing for sampling
]


def _write(directory, data: dict):
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "generation_config.json").write_text(json.dumps(data))
  return directory


@pytest.mark.parametrize("data", FILES)
def test_the_defaults_are_what_vllm_takes_from_transformers(tmp_path, data):
  _write(tmp_path, data)
  diff = transformers.GenerationConfig.from_pretrained(tmp_path).to_diff_dict()
  expected = {k: diff[k] for k in VLLM_KEYS if diff.get(k) is not None}
  if "max_new_tokens" in expected:
    expected["max_tokens"] = expected.pop("max_new_tokens")
  defaults = read_generation_defaults(str(tmp_path), "model", required=False)
  assert defaults.as_dict() == expected


def test_where_they_are_read_from(tmp_path):
  model = _write(tmp_path / "model", {"temperature": 0.5})
  (model / "config.json").write_text("{}")
  other = _write(tmp_path / "other", {"top_k": 3})
  auto = EngineConfig(model=str(model))
  assert generation_defaults(auto) == GenerationDefaults(temperature=0.5, source="model")
  assert generation_defaults(auto.replace(generation_config="vllm")) == GenerationDefaults()
  assert generation_defaults(auto.replace(generation_config=str(other))).as_dict() == {"top_k": 3}
  assert generation_defaults(EngineConfig()).as_dict() == {}  # tiny-random has none
  (tmp_path / "empty").mkdir()
  for setting, message in [
    (str(tmp_path / "empty"), "holds no generation_config.json"),
    (str(tmp_path / "missing"), "neither auto, vllm nor a directory"),
  ]:
    with pytest.raises(ValueError, match=f"generation_config: .*{message}"):
      generation_defaults(auto.replace(generation_config=setting))


@pytest.mark.parametrize(
  "data, message",
  [
    ({"temperature": -1}, "temperature: must be >= 0"),
    ({"top_p": 0}, "top_p: must be in"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
  ],
)
def test_a_bad_value_names_the_file_and_the_key(tmp_path, data, message):
  _write(tmp_path, data)
  with pytest.raises(ValueError, match=message) as err:
    read_generation_defaults(str(tmp_path), "model", required=False)
  assert "generation_config.json" in str(err.value)


def test_how_they_apply():
  defaults = GenerationDefaults(temperature=0.6, top_k=20, max_tokens=100, source="model")
  assert defaults.fill({"temperature": 0.0}) == {"temperature": 0.0, "top_k": 20}
  assert defaults.max_tokens_within(40) == 40 and defaults.max_tokens_within(400) == 100
  assert GenerationDefaults().max_tokens_within(40) == 40
  assert defaults.sampling_params() == SamplingParams(temperature=0.6, top_k=20, max_tokens=100)
  assert defaults.sampling_params(max_tokens=5).max_tokens == 5
  assert GenerationDefaults().sampling_params() == SamplingParams()
