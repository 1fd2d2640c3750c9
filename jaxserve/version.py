"""jaxserve's version (what `GET /version` answers): pure Python, importable from the host side."""

VERSION = "0.1.0"
