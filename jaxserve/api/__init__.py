"""The records of the Python API: SamplingParams in (sampling_params.py), RequestOutput out
(outputs.py), vLLM's `vllm.sampling_params` and `vllm.outputs`. Host data (no jax): the engine,
the device side and the configuration read them; `from jaxserve import SamplingParams` re-exports
the first, and the LLM class that takes and returns them is entrypoints/llm.py."""
