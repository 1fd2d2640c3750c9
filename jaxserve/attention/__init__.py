"""Attention over the paged KV cache: metadata, the backend interface and its capabilities."""

from jaxserve.attention.backends import AttentionBackend, get_attention_backend
from jaxserve.attention.capabilities import BackendCapabilities, BackendKind
from jaxserve.attention.metadata import AttentionMetadata

__all__ = [
  "AttentionMetadata",
  "AttentionBackend",
  "BackendCapabilities",
  "BackendKind",
  "get_attention_backend",
]
