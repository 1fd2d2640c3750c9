"""The expected decode throughput of a compiled TPU server, from a roofline.

One decode step of `batch` sequences, each `context` tokens long, on one replica (a mesh of
tensor_parallel_size chips) costs per chip:

  bytes = the step's programs' bytes accessed (XLA's cost analysis of the compiled forward of
          the decode bucket and its greedy sampler: weights, activations, logits)
        + batch x context tokens of K and V read from the pages (this chip's kv heads, every
          layer), which the cost analysis does not see (cost.py: the attention is a Pallas
          kernel)
  flops = the programs' FLOPs + the attention's 4 x batch x context x (query heads per chip) x
          head_dim x layers (Q.K and P.V), likewise unseen

and takes max(bytes / HBM bandwidth, flops / bfloat16 peak) seconds (chips.py's published
figures): the step is memory bound or compute bound. A replica then decodes batch / step tokens
a second, and data_parallel_size replicas that many times as much (they share nothing).

XLA's bytes are not the step's HBM traffic on TPU: its cost model adds up the bytes every
instruction reads and writes in any memory, and the TPU compiler moves the weights into VMEM
ahead of their matmuls (copy-start / slice-start), so a weight is counted on its copy and again
where it is used: a decode forward of Llama 3.1 8B counts 2.4 to 4 times the chip's weights. So
each step is also priced at its floor, the weights read once plus the KV reads (`ideal_*`): the
HBM traffic a decode step cannot go below. The two bracket the roofline's throughput.

`batch` is scheduler.max_num_seqs, or fewer when the KV pool holds fewer sequences of `context`
tokens; the step runs in the smallest decode bucket holding it (padding rows cost their FLOPs and
activations, not their KV reads).

Not modelled (so the figures are upper bounds): the tensor-parallel collectives' time on the ICI
links (XLA counts their bytes, not the link's bandwidth), kernel launch and host overheads, the
sampler's sort in random modes (the greedy sampler is costed), and sliding windows (every layer
reads the whole context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jaxserve.config import EngineConfig
from jaxserve.messages.buckets import Bucket, BucketSet
from jaxserve.models.model_config import ModelConfig
from jaxserve.tpu_aot.chips import TpuChip
from jaxserve.tpu_aot.memory import ProgramResult, ServerMemory
from jaxserve.tpu_aot.step_programs import decode_program_ids


def decode_batch(config: EngineConfig, num_pages: int, context: int) -> tuple[int, Bucket | None]:
  """The sequences that decode at once with `context` tokens each (max_num_seqs, or as many as
  num_pages pages hold, each with a page for its next token) and the bucket of their step; 0 and
  None when the pool holds none."""
  if context < 1:
    raise ValueError(f"decode context: must be a positive number of tokens, got {context}")
  pages_per_seq = math.ceil((context + 1) / config.cache.page_size)
  batch = min(config.scheduler.max_num_seqs, (num_pages - 1) // pages_per_seq)
  if batch < 1:
    return 0, None
  return batch, BucketSet.from_config(config.scheduler).pick(batch, batch)


@dataclass(frozen=True)
class DecodeStep:
  """One decode step's work per chip."""

  batch: int
  bucket: Bucket
  context: int
  program_bytes: float  # XLA's count over the step's programs
  program_flops: float
  kv_bytes: float  # the attention's page reads
  attention_flops: float
  weight_bytes: float = 0.0  # the chip's weights, each read once

  @property
  def ideal_bytes(self) -> float:
    return self.weight_bytes + self.kv_bytes

  @property
  def bytes(self) -> float:
    return self.program_bytes + self.kv_bytes

  @property
  def flops(self) -> float:
    return self.program_flops + self.attention_flops


@dataclass(frozen=True)
class Roofline:
  chip: TpuChip
  step: DecodeStep
  replicas: int  # data_parallel_size

  @property
  def memory_seconds(self) -> float:
    return self.step.bytes / self.chip.hbm_bytes_per_s

  @property
  def compute_seconds(self) -> float:
    return self.step.flops / self.chip.peak_flops

  @property
  def step_seconds(self) -> float:
    return max(self.memory_seconds, self.compute_seconds)

  @property
  def bound(self) -> str:
    return "memory" if self.memory_seconds >= self.compute_seconds else "compute"

  @property
  def tokens_per_s_per_replica(self) -> float:
    return self.step.batch / self.step_seconds

  @property
  def tokens_per_s(self) -> float:
    return self.replicas * self.tokens_per_s_per_replica

  @property
  def ideal_step_seconds(self) -> float:
    """At the floor: the weights and KV pages read once (or the FLOPs, if slower)."""
    return max(self.step.ideal_bytes / self.chip.hbm_bytes_per_s, self.compute_seconds)

  @property
  def ideal_tokens_per_s(self) -> float:
    return self.replicas * self.step.batch / self.ideal_step_seconds


def decode_step(
  config: EngineConfig,
  model: ModelConfig,
  memory: ServerMemory,
  results: tuple[ProgramResult, ...],
  context: int,
) -> DecodeStep | None:
  """The decode step from the compiled programs (None if the pool holds no sequence of
  `context` tokens, or the step's programs were not compiled or failed)."""
  batch, bucket = decode_batch(config, memory.num_pages, context)
  if bucket is None:
    return None
  by_id = {r.id: r for r in results}
  found = [by_id.get(pid) for pid in decode_program_ids(bucket)]
  if any(r is None or r.cost is None for r in found):
    return None
  tokens = batch * context
  q_heads_per_chip = model.num_q_heads / config.tensor_parallel_size
  return DecodeStep(
    batch,
    bucket,
    context,
    sum(r.cost.bytes_accessed for r in found),
    sum(r.cost.flops for r in found),
    tokens * memory.page_bytes / memory.page_size,
    4.0 * tokens * q_heads_per_chip * model.head_dim * model.num_layers,
    memory.weights,
  )
