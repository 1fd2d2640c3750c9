"""The in-process entry points over the composition root: the offline LLM class (llm.py, behind
`from jaxserve import LLM`) and a multi-host follower's step loop (follower.py). The `jaxserve`
command is the cli package: it sits above server/, bench/ and tools/, which import llm.py, so it
cannot share this package without a cycle between packages."""
