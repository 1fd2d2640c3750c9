"""Attention over the paged KV cache: metadata and the backend interface."""
from jaxserve.attention.metadata import AttentionMetadata
from jaxserve.attention.backends import AttentionBackend, get_attention_backend

__all__ = ["AttentionMetadata", "AttentionBackend", "get_attention_backend"]
