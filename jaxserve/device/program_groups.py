"""The step programs and the order they are worth compiling in (device/program_compiler.py
compiles them).

A step's programs are the forward of its (sequences, tokens) bucket, the sampler of its sequence
count in every SamplerMode, prompt logprobs of its token count and, with decode bursts, the burst
program of a decode bucket in the greedy and random modes (device/step_fns.py). program_groups
lists them bucket by bucket, in the order they are worth compiling:

1. the largest bucket, which every step fits (padded to it), with the bursts of the largest
   decode bucket: once these are compiled the engine can serve every request;
2. the decode buckets (as many tokens as sequences), smallest first: most steps of a serving
   engine are decodes, and a small decode step padded to the largest bucket is the costliest
   padding there is;
3. every other bucket, by tokens then sequences (a step's cost follows its tokens).

A program shared with an earlier group (a sampler, prompt logprobs) is listed once, in the first.
Plain data, no jax.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxserve.device.sampler import SamplerMode
from jaxserve.messages.buckets import Bucket, BucketSet

BURST_MODES = (SamplerMode(), SamplerMode(random=True))


@dataclass(frozen=True)
class Program:
  """One compiled program: kind "forward" (per bucket), "sample" (per sequence count and mode),
  "prompt" (per token count) or "burst" (per decode bucket and mode); `bucket` is the one it is
  lowered on."""

  kind: str
  bucket: Bucket
  mode: SamplerMode = SamplerMode()

  @property
  def key(self) -> tuple:
    """What the compiled program depends on (the sampler: sequences; prompt logprobs: tokens)."""
    if self.kind == "sample":
      return (self.kind, self.bucket.num_seqs, self.mode)
    if self.kind == "prompt":
      return (self.kind, self.bucket.num_tokens)
    return (self.kind, self.bucket, self.mode)

  def describe(self) -> str:
    """e.g. "forward program of bucket (8 sequences, 64 tokens)"."""
    where = f"bucket ({self.bucket.num_seqs} sequences, {self.bucket.num_tokens} tokens)"
    mode = "" if self.kind in ("forward", "prompt") else f", {self.mode}"
    return f"{self.kind} program of {where}{mode}"


@dataclass(frozen=True)
class ProgramGroup:
  """Programs that, compiled, make `steps` ready for single steps and `bursts` for bursts."""

  programs: tuple[Program, ...]
  steps: frozenset[Bucket]
  bursts: frozenset[Bucket] = frozenset()


def step_programs(bucket: Bucket) -> list[Program]:
  return (
    [Program("forward", bucket)]
    + [Program("sample", bucket, m) for m in SamplerMode.all()]
    + [Program("prompt", bucket)]
  )


def burst_programs(bucket: Bucket) -> list[Program]:
  return [Program("burst", bucket, mode) for mode in BURST_MODES]


def program_groups(buckets: BucketSet, bursts: bool) -> list[ProgramGroup]:
  """Every bucket's programs, in compile order (module docstring); a program shared with an
  earlier group (a sampler, prompt logprobs) is listed once, in the first."""
  largest, decodes = buckets.largest(), buckets.decode_buckets()
  first_bursts = [decodes[-1]] if bursts else []
  groups = [
    ProgramGroup(
      tuple(step_programs(largest) + (burst_programs(decodes[-1]) if bursts else [])),
      frozenset({largest}),
      frozenset(first_bursts),
    )
  ]
  rest = sorted(set(buckets.all()) - {largest}, key=lambda b: (b.num_tokens, b.num_seqs))
  for bucket in [b for b in decodes if b != largest] + [b for b in rest if b not in decodes]:
    burst = bursts and bucket in decodes
    groups.append(
      ProgramGroup(
        tuple(step_programs(bucket) + (burst_programs(bucket) if burst else [])),
        frozenset({bucket}),
        frozenset({bucket} if burst else ()),
      )
    )
  if bursts and largest in decodes and largest != decodes[-1]:
    groups.append(ProgramGroup(tuple(burst_programs(largest)), frozenset(), frozenset({largest})))
  seen: set[tuple] = set()
  unique = []
  for group in groups:
    programs = tuple(p for p in group.programs if p.key not in seen)
    seen.update(p.key for p in programs)
    unique.append(ProgramGroup(programs, group.steps, group.bursts))
  return unique
