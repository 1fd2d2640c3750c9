"""jaxserve: an LLM serving runtime on JAX/XLA."""

from jaxserve.api.sampling_params import SamplingParams
from jaxserve.version import VERSION

__all__ = ["LLM", "SamplingParams"]
__version__ = VERSION


def __getattr__(name: str):
  if name == "LLM":  # imported lazily: it pulls in jax, the host-side modules don't need it
    from jaxserve.entrypoints.llm import LLM

    return LLM
  raise AttributeError(f"module 'jaxserve' has no attribute {name!r}")
