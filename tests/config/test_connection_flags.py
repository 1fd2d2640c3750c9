"""The connection flags of `jaxserve serve` map onto their server.* keys (config/serve_flags.py,
config/vllm_flags.py), a bad value is refused naming the key, and --help states each default."""

from __future__ import annotations

import pytest

from jaxserve.cli import build_parser
from jaxserve.config.cli_help import use_defaults_help
from jaxserve.config.serve_flags import serve_engine_config


def _server(words: list[str]):
  args, unknown = build_parser().parse_known_args(["serve", *words])
  assert unknown == []
  return serve_engine_config(args).server


def test_the_flags_set_their_keys():
  server = _server(
    [
      "--stream-stall-timeout", "5", "--header-timeout", "7", "--timeout-keep-alive", "3",
      "--limit-concurrency", "64", "--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem",
      "--h11-max-incomplete-event-size", "65536",
    ]
  )  # fmt: skip
  assert (server.stream_stall_timeout_s, server.header_timeout_s) == (5, 7)
  assert (server.timeout_keep_alive_s, server.limit_concurrency) == (3, 64)
  assert (server.ssl_certfile, server.ssl_keyfile) == ("c.pem", "k.pem")
  assert server.h11_max_incomplete_event_size == 65536


def test_the_defaults():
  server = _server([])
  assert (server.stream_stall_timeout_s, server.header_timeout_s) == (30.0, 30.0)
  assert (server.timeout_keep_alive_s, server.limit_concurrency) == (5.0, None)
  assert (server.ssl_certfile, server.ssl_keyfile) == (None, None)
  assert server.h11_max_incomplete_event_size == 16384


@pytest.mark.parametrize(
  "words, message",
  [
    (["--stream-stall-timeout", "-1"], "server.stream_stall_timeout_s: must be a number"),
    (["--header-timeout", "-2"], "server.header_timeout_s: must be a number"),
    (["--timeout-keep-alive", "0"], "server.timeout_keep_alive_s: must be a number of seconds > 0"),
    (["--limit-concurrency", "0"], "server.limit_concurrency: must be null"),
    (["--h11-max-incomplete-event-size", "100"], "server.h11_max_incomplete_event_size"),
    (["--ssl-keyfile", "k.pem"], "server.ssl_keyfile: needs server.ssl_certfile"),
  ],
)
def test_a_bad_value_is_refused_naming_its_key(words, message):
  with pytest.raises(ValueError, match=f"^{message}"):
    _server(words)


def test_help_states_every_default(capsys):
  parser = build_parser()
  use_defaults_help(parser)
  with pytest.raises(SystemExit):
    parser.parse_args(["serve", "--help"])
  text = " ".join(capsys.readouterr().out.split())
  for flag, default in (
    ("--stream-stall-timeout", "default: 30"),
    ("--header-timeout", "default: 30"),
    ("--timeout-keep-alive", "default: 5"),
    ("--limit-concurrency", "default: no cap"),
    ("--h11-max-incomplete-event-size", "default: 16384"),
    ("--ssl-certfile", "default: unset"),
  ):
    assert default in text[text.rindex(flag + " ") :][:400], flag  # its help, after the usage
