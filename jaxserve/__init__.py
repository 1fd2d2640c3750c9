"""jaxserve: an LLM serving runtime on JAX/XLA."""
from jaxserve.sampling_params import SamplingParams

__all__ = ["SamplingParams"]
__version__ = "0.1.0"
