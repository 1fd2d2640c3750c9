"""The server examples of README.md run as written against the server (localhost:8000 replaced by
the test server's address)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import httpx

DOC = Path(__file__).resolve().parents[2] / "README.md"
DOC_URL = "http://localhost:8000"
CURL = re.compile(r"curl (?:-N )?http://localhost:8000(\S+) .*-d '(.*)'$")


def _blocks(language: str) -> list[str]:
  return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _curl_commands() -> list[tuple[str, dict]]:
  commands = []
  for block in _blocks("bash"):
    for command in block.replace("\\\n", " ").splitlines():
      match = CURL.search(command.strip())
      if match:
        commands.append((match.group(1), json.loads(match.group(2))))
  return commands


def test_curl_examples(served):
  commands = _curl_commands()
  assert len(commands) == 5
  for path, body in commands:
    response = httpx.post(f"{served.url}{path}", json=body, timeout=30)
    assert response.status_code == 200, (path, response.text)
    if body.get("stream"):
      lines = [line for line in response.text.splitlines() if line]
      assert lines[-1] == "data: [DONE]"
      assert 1 <= json.loads(lines[-2][6:])["usage"]["completion_tokens"] <= body["max_tokens"]
    elif body.get("echo"):
      logprobs = response.json()["choices"][0]["logprobs"]
      assert logprobs["token_logprobs"][0] is None
      assert all(v <= 0 for v in logprobs["token_logprobs"][1:])
      assert response.json()["choices"][0]["text"] == body["prompt"]


def test_openai_client_example(served):
  (source,) = [block for block in _blocks("python") if "OpenAI(" in block]
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(source.replace(DOC_URL, served.url), str(DOC), "exec"), {})
  lines = out.getvalue().splitlines()
  scored = next(line for line in lines if line.startswith("[None, "))
  assert len(eval(scored)) > 1


def test_structured_outputs_example(served):
  """The structured-outputs block runs after the client block, in its namespace."""
  (setup,) = [block for block in _blocks("python") if "OpenAI(" in block]
  (source,) = [block for block in _blocks("python") if "completions.parse(" in block]
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    namespace: dict = {}
    exec(compile(setup.replace(DOC_URL, served.url), str(DOC), "exec"), namespace)
    exec(compile(source, str(DOC), "exec", dont_inherit=True), namespace)
  lines = out.getvalue().splitlines()
  assert lines[-3].startswith("name=") and re.fullmatch(r"[0-9]{3}-[0-9]{4}", lines[-2])
  name, arguments = lines[-1].split(" ", 1)
  assert name == "get_weather" and isinstance(json.loads(arguments)["city"], str)


def _jaxserve_commands() -> list[str]:
  """Every `jaxserve ...` command line of README.md (continuations joined, comments dropped)."""
  text = DOC.read_text().replace("\\\n", " ")
  commands = []
  for line in text.splitlines():
    line = line.strip()
    if line.startswith("jaxserve ") and "`" not in line:
      commands.append(line.split("  #", 1)[0].split(" # ", 1)[0].strip())
  return commands


def test_readme_jaxserve_commands_parse():
  import shlex

  from jaxserve.cli import build_parser

  commands = _jaxserve_commands()
  assert any("--goodput" in c for c in commands) and any(" serve /path" in c for c in commands)
  for command in commands:
    argv = shlex.split(command.replace('"$KEY"', "key"))[1:]
    if "&&" in argv:
      argv = argv[: argv.index("&&")]
    args, unknown = build_parser().parse_known_args(argv)
    assert unknown == [], (command, unknown)
