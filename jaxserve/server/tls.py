"""HTTPS: `jaxserve serve --ssl-certfile CERT [--ssl-keyfile KEY]` (server.ssl_certfile,
server.ssl_keyfile; vLLM's flags) serves TLS through uvicorn, each API server loading the files
when it starts (server/uvicorn_runner.py). check_tls_files loads them once before the engine is
built, so a wrong path or a key that does not match the certificate is a bad flag reported at
once (status 2), not an API server that dies minutes later after the model has loaded.
"""

from __future__ import annotations

import ssl

from jaxserve.config import ServerConfig


def check_tls_files(config: ServerConfig) -> None:
  """ValueError naming the setting if the certificate and key do not load as a TLS server's."""
  if config.ssl_certfile is None:
    return
  context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  try:
    context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
  except (OSError, ssl.SSLError) as err:
    files = config.ssl_certfile + (f" and {config.ssl_keyfile}" if config.ssl_keyfile else "")
    raise ValueError(
      f"server.ssl_certfile: cannot serve TLS with {files} (--ssl-certfile, --ssl-keyfile): {err}"
    ) from err
