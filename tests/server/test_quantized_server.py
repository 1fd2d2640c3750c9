"""`jaxserve serve tiny-random --quantization fp8 --kv-cache-dtype fp8`: a real server process on
127.0.0.1 (one process: the engine core on a thread beside uvicorn), driven by the official
openai client. The engine reports the fp8 projections it loaded; completions return text and
usage that counts the tokenizer's tokens; a JSON-schema response validates (jsonschema, not the
grammar engine that produced it)."""

from __future__ import annotations

import json

import openai
import pytest

from jaxserve.models.registry import load_model_tokenizer
from tests.integration.structured_helpers import SCHEMAS, assert_valid_json
from tests.server.server_helpers import free_port, serve_process
from tests.tools.tool_helpers import SMALL_ENGINE_ARGS

MODEL = "tiny-random"
FLAGS = ["--quantization", "fp8", "--kv-cache-dtype", "fp8", "--warmup", "lazy"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  """The server's URL and its log file (read after the tests: the process writes it)."""
  log_path = tmp_path_factory.mktemp("quantized_server") / "serve.log"
  port = free_port()
  argv = ["serve", MODEL, "--port", str(port), "--api-server-count", "0", *FLAGS]
  argv += [arg for arg in SMALL_ENGINE_ARGS if arg not in ("--log-level", "WARNING")]
  with serve_process(argv, log_path) as url:
    yield url, log_path


@pytest.fixture(scope="module")
def client(server):
  with openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0) as c:
    yield c


def test_the_engine_runs_fp8_projections_over_fp8_pages(server, client):
  client.completions.create(model=MODEL, prompt="warm", max_tokens=1)  # the engine is up
  log = server[1].read_text()
  assert "fp8 projections" in log, log[-2000:]
  # 256 pages of 16 tokens, 2 layers x K and V x 2 kv heads x 64 dims, one byte each: 2 MiB
  # (float32 pages: 8 MiB)
  assert "KV cache: 256 pages of 16 tokens (4080 usable tokens, 2.0 MiB)" in log, log[-2000:]


def test_completion_returns_text_and_usage(client):
  prompt = "The quick brown fox"
  result = client.completions.create(
    model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
  )
  choice = result.choices[0]
  assert choice.finish_reason == "length" and choice.text
  assert result.usage.prompt_tokens == len(load_model_tokenizer(MODEL).encode(prompt))
  assert result.usage.completion_tokens == 12
  assert result.usage.total_tokens == result.usage.prompt_tokens + 12


def test_chat_with_a_json_schema_validates(client):
  schema = SCHEMAS["points"]
  result = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Two points."}],
    max_tokens=120,
    temperature=0,
    response_format={
      "type": "json_schema",
      "json_schema": {"name": "points", "schema": schema, "strict": True},
    },
  )
  choice = result.choices[0]
  assert choice.finish_reason == "stop"
  assert_valid_json(choice.message.content, schema)
  assert 1 <= len(json.loads(choice.message.content)) <= 2
  assert result.usage.completion_tokens >= len('[{"x":0,"y":0}]')  # one token a byte
