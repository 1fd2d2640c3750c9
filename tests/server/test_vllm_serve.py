"""`jaxserve serve ORG/NAME` with vLLM's serve flags starts a real server process: the model id
resolves from a test-made Hugging Face cache under HF_HOME (tiny-random exported as a
transformers checkpoint) at the --revision given, and the official openai client lists,
retrieves and uses it under each of its two served names (responses carry the first, as vLLM's).
The flags issue 60 saw abort start-up are on the line too: the uvicorn ones take effect (no
uvicorn INFO lines, no access lines), those that change nothing say so once. GET /version
answers as vLLM's does. The checkpoint's generation_config.json sets the defaults of what
requests leave unset (logged at start), and --reasoning-parser deepseek_r1 reads a reply without
a closing tag as reasoning."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import openai
import pytest

import jaxserve
from jaxserve.tools.export_hf import export_tiny_random_hf
from tests.models.test_hf_cache import REVISION, make_hf_cache
from tests.server.server_helpers import free_port, serve_process
from tests.tools.tool_helpers import SMALL_ENGINE_ARGS

MODEL_ID = "jaxserve-test/tiny-random"
ALIAS = "tiny"
IGNORE_EOS = {"ignore_eos": True}
VLLM_FLAGS = [
  "--enable-auto-tool-choice",
  "--tool-call-parser",
  "llama3_json",
  "--max-logprobs",
  "5",
  "--disable-log-requests",
  "--disable-log-stats",
  "--trust-remote-code",
  "--dtype",
  "auto",
  "--warmup",
  "lazy",
  "--served-model-name",
  MODEL_ID,
  ALIAS,
  "--revision",
  REVISION,
  "-tp",
  "1",
  "--enforce-eager",
  "--tokenizer-mode",
  "auto",
  "--generation-config",
  "auto",
  "--reasoning-parser",
  "deepseek_r1",
  "--uvicorn-log-level",
  "warning",
  "--disable-uvicorn-access-log",
  "--default-chat-template-kwargs",
  '{"enable_thinking": false}',
]
# the checkpoint's sampling defaults (--generation-config auto, vLLM's default)
GENERATION_CONFIG = {"temperature": 0.8, "top_k": 1, "max_new_tokens": 3}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  """The server's URL and its log file."""
  root = tmp_path_factory.mktemp("vllm_serve")
  export = export_tiny_random_hf(root / "export")
  (export / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
  make_hf_cache(root / "hf_home" / "hub", MODEL_ID, export)
  log_path = root / "serve.log"
  port = free_port()
  argv = ["serve", MODEL_ID, "--port", str(port), "--api-server-count", "0", *VLLM_FLAGS]
  argv += [arg for arg in SMALL_ENGINE_ARGS if arg not in ("--log-level", "WARNING")]
  env = {
    **os.environ,
    "HF_HOME": str(root / "hf_home"),
    "PYTHONPATH": str(Path(jaxserve.__file__).parents[1]),
  }
  for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
    env.pop(variable, None)
  with serve_process(argv, log_path, env=env) as url:
    yield url, log_path


def test_a_cached_model_id_serves_under_its_id_with_vllm_flags(server):
  url, log_path = server
  with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
    assert [model.id for model in client.models.list()] == [MODEL_ID, ALIAS]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    assert client.models.retrieve(ALIAS).id == ALIAS
    completion = client.completions.create(model=ALIAS, prompt="hi", max_tokens=2)
    assert completion.model == MODEL_ID and completion.usage.completion_tokens == 2
    with pytest.raises(openai.NotFoundError) as err:
      client.models.retrieve("meta-llama/Llama-3.1-8B-Instruct")
    assert err.value.body["code"] == "model_not_found"
    chat = client.chat.completions.create(
      model=MODEL_ID,
      messages=[{"role": "user", "content": "hi"}],
      max_tokens=3,
      logprobs=True,
      top_logprobs=5,
    )
    assert len(chat.choices[0].logprobs.content[0].top_logprobs) == 5
    with pytest.raises(openai.BadRequestError) as err:  # --max-logprobs 5
      client.completions.create(model=MODEL_ID, prompt="hi", max_tokens=1, logprobs=6)
    assert err.value.body["param"] == "logprobs"
    # the generation config's defaults: top_k 1 (greedy: n choices agree), max_new_tokens 3
    defaults = client.chat.completions.create(
      model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], n=2, extra_body=IGNORE_EOS
    )
    assert defaults.usage.completion_tokens == 2 * 3
    messages = [choice.message.model_dump() for choice in defaults.choices]
    # deepseek_r1: no </think> in a reply of random bytes, so all of it is reasoning
    assert messages[0] == messages[1] and messages[0]["content"] is None
    assert messages[0]["reasoning_content"] == messages[0]["reasoning"] != ""
  assert httpx.get(f"{url}/version").json() == {"version": jaxserve.__version__}
  log = log_path.read_text()
  for once in ("trust_remote_code: accepted", "enforce_eager: accepted, changes nothing"):
    assert log.count(once) == 1, log[-3000:]
  snapshot = f"hub/models--jaxserve-test--tiny-random/snapshots/{REVISION}"
  assert f"model {MODEL_ID} at revision {REVISION}: " in log and snapshot in log, log[-3000:]
  assert f"serving '{MODEL_ID}', '{ALIAS}' on http://" in log, log[-3000:]
  # --uvicorn-log-level warning, --disable-uvicorn-access-log
  assert "Application startup complete" not in log and "HTTP/1.1" not in log, log[-3000:]
  assert (
    "default sampling params from model's generation_config.json: temperature=0.8, top_k=1, "
    "max_tokens=3" in log
  ), log[-3000:]
