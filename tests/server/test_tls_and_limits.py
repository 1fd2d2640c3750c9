"""HTTPS and the connection cap on a real `jaxserve serve` (an engine core process, one API server
process): with a self-signed certificate made here (`cryptography`) and --ssl-certfile /
--ssl-keyfile, the official `openai` client completes and streams over https, trusting that
certificate; with --limit-concurrency 2, a request that arrives while two streams hold their
connections gets 503 with OpenAI's error body (and /health still answers); a certificate that
does not load is refused before the engine starts (status 2, naming the setting)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.server.server_helpers import free_port
from tests.server.test_drain import _write_config

LIMIT = 2


def _self_signed(directory) -> tuple[str, str]:
  """A certificate for 127.0.0.1 and its key, as PEM files; their paths."""
  key = ec.generate_private_key(ec.SECP256R1())
  name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jaxserve test")])
  now = datetime.datetime.now(datetime.timezone.utc)
  cert = (
    x509.CertificateBuilder()
    .subject_name(name)
    .issuer_name(name)
    .public_key(key.public_key())
    .serial_number(x509.random_serial_number())
    .not_valid_before(now - datetime.timedelta(minutes=5))
    .not_valid_after(now + datetime.timedelta(days=1))
    .add_extension(
      x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
      critical=False,
    )
    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    .sign(key, hashes.SHA256())
  )
  cert_path, key_path = directory / "cert.pem", directory / "key.pem"
  cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
  key_path.write_bytes(
    key.private_bytes(
      serialization.Encoding.PEM,
      serialization.PrivateFormat.PKCS8,
      serialization.NoEncryption(),
    )
  )
  return str(cert_path), str(key_path)


def _serve(config_path: str, port: int, *flags: str, log) -> subprocess.Popen:
  argv = [sys.executable, "-m", "jaxserve.cli", "serve", "--config", config_path]
  argv += ["--port", str(port), "--api-server-count", "1", "--log-level", "INFO", *flags]
  return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
  """(https URL, an SSLContext trusting its certificate)."""
  tmp = tmp_path_factory.mktemp("tls")
  cert, key = _self_signed(tmp)
  config = str(tmp / "server.yaml")
  _write_config(config, warmup="lazy")
  port = free_port()
  flags = ("--ssl-certfile", cert, "--ssl-keyfile", key, "--limit-concurrency", str(LIMIT))
  with open(tmp / "server.log", "w") as log:
    process = _serve(config, port, *flags, log=log)
  url, trust = f"https://127.0.0.1:{port}", ssl.create_default_context(cafile=cert)
  try:
    deadline = time.monotonic() + 150
    while True:
      assert process.poll() is None, (tmp / "server.log").read_text()
      try:
        if httpx.get(f"{url}/health", verify=trust, timeout=5).status_code == 200:
          break
      except httpx.TransportError:
        assert time.monotonic() < deadline, "the server did not become healthy"
        time.sleep(0.2)
    yield url, trust
  finally:
    process.terminate()
    process.wait(60)


def _client(url: str, trust: ssl.SSLContext) -> openai.OpenAI:
  return openai.OpenAI(
    base_url=f"{url}/v1",
    api_key="unused",
    max_retries=0,
    http_client=httpx.Client(verify=trust, timeout=60),
  )


def test_the_openai_client_talks_https(tls_server):
  url, trust = tls_server
  with _client(url, trust) as client:
    completion = client.completions.create(model="tiny-random", prompt="tls", max_tokens=5)
    assert completion.usage.completion_tokens == 5
    chunks = list(
      client.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": "over https"}],
        max_tokens=6,
        stream=True,
      )
    )
  assert chunks[-1].choices[0].finish_reason == "length"
  with pytest.raises(httpx.ConnectError):  # the certificate is not trusted by default
    httpx.get(f"{url}/health", timeout=5)
  with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP on the TLS port
    httpx.get(url.replace("https", "http") + "/health", timeout=5)


def test_past_the_connection_cap_a_request_gets_503_with_an_openai_body(tls_server):
  url, trust = tls_server
  started = [threading.Event() for _ in range(LIMIT)]
  finished: list[str | None] = []

  def hold(event: threading.Event) -> None:
    with _client(url, trust) as client:
      stream = client.completions.create(
        model="tiny-random",
        prompt="hold",
        max_tokens=200,
        stream=True,
        extra_body={"ignore_eos": True},
      )
      finish = None
      for chunk in stream:
        event.set()
        finish = chunk.choices[0].finish_reason or finish
      finished.append(finish)

  holders = [threading.Thread(target=hold, args=(event,)) for event in started]
  for holder in holders:
    holder.start()
  assert all(event.wait(60) for event in started)
  with _client(url, trust) as client, pytest.raises(openai.APIStatusError) as refused:
    client.completions.create(model="tiny-random", prompt="one too many", max_tokens=2)
  assert httpx.get(f"{url}/health", verify=trust, timeout=5).status_code == 200  # exempt
  for holder in holders:
    holder.join(120)
  assert finished == ["length", "length"]
  assert refused.value.status_code == 503
  error = refused.value.response.json()["error"]
  assert error["code"] == "service_unavailable" and "server.limit_concurrency" in error["message"]
  assert refused.value.response.headers["connection"] == "close"
  with _client(url, trust) as client:  # below the cap again
    assert client.completions.create(model="tiny-random", prompt="ok", max_tokens=2).choices


def test_a_certificate_that_does_not_load_is_a_bad_flag(tmp_path):
  config = str(tmp_path / "server.yaml")
  _write_config(config, warmup="lazy")
  missing = str(tmp_path / "missing.pem")
  with open(tmp_path / "out.log", "w") as log:
    process = _serve(config, free_port(), "--ssl-certfile", missing, log=log)
    code = process.wait(60)
  output = (tmp_path / "out.log").read_text()
  assert code == 2, output
  assert "server.ssl_certfile: cannot serve TLS with" in output and missing in output
  assert "KV cache" not in output  # refused before the engine was built
