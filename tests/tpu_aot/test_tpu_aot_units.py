"""The TPU build's bookkeeping without libtpu: program names, the largest-bucket selection, the
memory arithmetic and its messages, chips and topologies, and the CLI's registration."""

from __future__ import annotations

import re

import pytest

from jaxserve.cli import build_parser, main
from jaxserve.config.loader import load_config
from jaxserve.device.sampler import SamplerMode
from jaxserve.messages.buckets import Bucket
from jaxserve.models.named_shapes import named_model_config
from jaxserve.tpu_aot.build import choose, largest_of_each_kind
from jaxserve.tpu_aot.chips import GIB, chip_of_config_name, get_chip
from jaxserve.tpu_aot.layouts import parse_layouts
from jaxserve.tpu_aot.memory import (
  ProgramMemory,
  ProgramResult,
  largest_fitting_fraction,
  misfits,
  server_memory,
  weights_misfit,
)
from jaxserve.tpu_aot.roofline import DecodeStep, Roofline, decode_batch
from jaxserve.tpu_aot.step_programs import ProgramId, StepProgram, decode_program_ids

MIB = 2**20


def _program(kind, seqs, tokens, mode=None):
  return StepProgram(ProgramId(kind, seqs, tokens, mode), 0, lambda: None)


def test_program_names():
  assert ProgramId("forward", 128, 1024, None).name == "forward[128x1024]"
  assert ProgramId("sampler", 8, 0, SamplerMode()).name == "sampler[8] greedy"
  assert ProgramId("sampler", 8, 0, SamplerMode(True, False, True)).name == "sampler[8] random+top"
  assert ProgramId("prompt_logprobs", 0, 64, None).name == "prompt_logprobs[64]"


def test_largest_of_each_kind_keeps_the_largest_bucket_in_its_greedy_and_fullest_modes():
  programs = [_program("forward", s, t) for s, t in ((8, 16), (8, 32), (16, 32))]
  programs += [_program("sampler", s, 0, m) for s in (8, 16) for m in SamplerMode.all()]
  programs += [_program("prompt_logprobs", 0, t) for t in (16, 32)]
  bursts = (SamplerMode(), SamplerMode(random=True))  # decode bursts run greedy or random
  programs += [_program("burst", s, s, m) for s in (8, 16) for m in bursts]
  chosen = [p.id.name for p in largest_of_each_kind(programs)]
  assert chosen == [
    "forward[16x32]",
    "sampler[16] greedy",
    "sampler[16] random+penalties+top",
    "prompt_logprobs[32]",
    "burst[16x16] greedy",
    "burst[16x16] random",
  ]


def _result(kind, seqs, tokens, memory, resident=0, error=None):
  return ProgramResult(ProgramId(kind, seqs, tokens, None), 0.1, 1.0, resident, memory, error)


def test_memory_totals_and_the_misfit_message():
  chip = get_chip("v5e")
  weights, page, pages = 2 * GIB, 1 * MIB, 12 * 1024
  forward = ProgramMemory(
    arguments=weights + pages * page + 5 * MIB,
    outputs=pages * page + MIB,
    aliased=pages * page,
    temporaries=100 * MIB,
    code=150 * MIB,
  )
  results = [_result("forward", 8, 16, forward, resident=weights + pages * page)]
  all_ids = [ProgramId("forward", 8, 16, None), ProgramId("forward", 8, 32, None)]
  memory = server_memory(chip, weights, page, pages, 32, 4096, results, all_ids)
  assert memory.largest_transient == 100 * MIB + MIB + 5 * MIB
  assert memory.code == 2 * 150 * MIB and memory.code_estimated  # the uncompiled one estimated
  assert memory.total == weights + 12 * GIB + 106 * MIB + 300 * MIB
  assert memory.full_length_sequences == (pages - 1) // 128

  def pages_at(fraction):  # a pool of `fraction` of the chip less the weights, in 1 MiB pages
    return int(fraction * chip.usable_bytes - weights) // page

  assert misfits(memory, results, "v5e:2x4", pages_at) == []
  bigger = server_memory(chip, weights, page, 14 * 1024, 32, 4096, results, all_ids)
  (message,) = misfits(bigger, results, "v5e:2x4", pages_at)
  over = (bigger.total - chip.usable_bytes) / GIB
  assert message.startswith("memory: weights 2.00 GiB + KV pool 14.00 GiB")
  assert f"over the 15.75 GiB usable HBM of a v5e chip by {over:.2f} GiB" in message
  # The pool may take 15.75 - 2 - 0.1035 - 0.293 = 13.35 GiB: 0.97 x 15.75 - 2 = 13.28 GiB fits,
  # 0.98 x 15.75 - 2 = 13.44 GiB does not.
  assert "cache.memory_fraction <= 0.97 would fit" in message


def test_the_largest_fitting_fraction_takes_the_engines_pool_sizing():
  def pages_at(fraction):  # a sizing with a fixed 100 pages off the top, as a headroom would
    return max(int(fraction * 1000) - 100, 0)

  assert largest_fitting_fraction(500, 1, pages_at) == 0.6  # 600 - 100 = 500 pages
  assert largest_fitting_fraction(499, 1, pages_at) == 0.59
  assert largest_fitting_fraction(1, 1, pages_at) == 0.0  # under the 2 pages a pool needs


def test_a_program_that_does_not_compile_is_a_misfit():
  results = [_result("forward", 128, 1024, None, error="RESOURCE_EXHAUSTED: space=smem")]
  memory = server_memory(get_chip("v5e"), GIB, MIB, 100, 32, 131072, results, [results[0].id])
  (message,) = misfits(memory, results, "v5e:2x4", lambda fraction: 100)
  assert message.startswith("forward[128x1024]: does not compile for v5e:2x4: RESOURCE_EXHAUSTED")
  assert "128 sequences x 4096 pages" in message and "2.00 MiB" in message


def test_weights_over_hbm():
  assert weights_misfit(get_chip("v6e"), 20 * GIB, "m") is None
  message = weights_misfit(get_chip("v5e"), 16 * GIB, "m at tensor_parallel_size 8")
  assert message == (
    "weights: m at tensor_parallel_size 8 needs 16.00 GiB per chip, over the "
    "15.75 GiB usable HBM of a v5e chip by 0.25 GiB before any KV page"
  )


def test_chips_and_topologies():
  assert get_chip("v5e").topology(8) == "v5e:2x4" and get_chip("v6e").topology(4) == "v6e:2x2"
  assert chip_of_config_name("configs/v6e-8.yaml") is get_chip("v6e")
  assert chip_of_config_name("configs/h100.yaml") is None
  with pytest.raises(ValueError, match="tensor_parallel_size: no single-host v5e topology of 3"):
    get_chip("v5e").topology(3)
  with pytest.raises(ValueError, match="chip: unknown 'v4'"):
    get_chip("v4")


def test_named_shapes_have_the_published_parameter_counts():
  import math

  from jaxserve.models.weights import hf_tensor_specs

  for name, expected in (
    ("llama-3.2-1b", 1_235_814_400),
    ("llama-3.1-8b", 8_030_261_248),
    ("llama-3.1-70b", 70_553_706_496),
    ("qwen3-30b-a3b", 30_532_122_624),  # published: 30.5B
    ("mixtral-8x7b", 46_702_792_704),  # published: 46.7B
    ("gemma-3-12b", 11_766_034_176),  # the language model of the published 12B
    ("gemma-3-27b", 27_009_346_304),  # the language model of the published 27B
  ):
    config = named_model_config(name)
    assert sum(math.prod(s.hf_shape) for s in hf_tensor_specs(config)) == expected, name


def test_moe_and_gemma_shape_counts_by_hand():
  """The counts above, summed by hand from the published config values."""
  vocab, hidden, layers = 151936, 2048, 48  # Qwen3-30B-A3B
  attention = hidden * 32 * 128 * 2 + hidden * 4 * 128 * 2 + 2 * 128  # q, o, k, v, q/k norms
  experts = 128 * 3 * hidden * 768 + hidden * 128  # SwiGLU experts and the router
  layer = attention + experts + 2 * hidden  # two norms
  assert layers * layer + 2 * vocab * hidden + hidden == 30_532_122_624
  for layers, hidden, heads, kv_heads, head_dim, inter, expected in (
    (48, 3840, 16, 8, 256, 15360, 11_766_034_176),
    (62, 5376, 32, 16, 128, 21504, 27_009_346_304),
  ):
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 2 * head_dim
    layer = attention + 3 * hidden * inter + 4 * hidden  # four Gemma norms
    assert layers * layer + 262208 * hidden + hidden == expected  # tied embeddings


def test_compile_tpu_is_a_subcommand_with_defaults_in_its_help():
  parser = build_parser()
  args = parser.parse_args(
    ["compile-tpu", "--config", "configs/v5e-8.yaml", "--model-shape", "llama-3.1-8b"]
  )
  assert (args.programs, args.jobs, args.chip) == ("all", 1, None)
  compile_tpu = parser._subparsers._group_actions[0].choices["compile-tpu"]
  assert "(default: all)" in compile_tpu.format_help()


def test_compile_tpu_refuses_a_scheme_the_chip_cannot_run(capsys):
  """fp8 W8A8 for v5e (no fp8 MXU): exit code 2 and one line naming the alternative, before
  libtpu is loaded (quantization/capabilities.py decides)."""
  argv = ["compile-tpu", "--chip", "v5e", "--model-shape", "llama-3.1-8b", "--quantization"]
  assert main([*argv, "fp8"]) == 2
  assert capsys.readouterr().err.strip() == (
    "jaxserve compile-tpu: error: quantization: fp8 (fp8 e4m3 weights, W8A8) needs fp8 matrix "
    "units (TPU7x), which TPU v5 lite (v5e) lacks; use fp8_w8a16 (the same weights, "
    "activations unquantized)"
  )


def test_layouts_parse_and_refuse_with_the_flag_named(capsys):
  layouts = parse_layouts("dp8tp1, dp4tp2,dp1tp8")
  assert [(x.name, x.num_chips) for x in layouts] == [
    ("dp8tp1", 8),
    ("dp4tp2", 8),
    ("dp1tp8", 8),
  ]
  for bad, message in (
    ("dp8", "'dp8' is not dpNtpM"),
    ("dp0tp8", "'dp0tp8' is not dpNtpM"),
    ("dp8tp1,dp2tp1", "every layout must use the slice's chips, got [2, 8] chips"),
  ):
    with pytest.raises(ValueError, match=re.escape(message)):
      parse_layouts(bad)
  argv = ["compile-tpu", "--config", "configs/v5e-8.yaml", "--model-shape", "llama-3.1-8b"]
  assert main([*argv, "--layouts", "dp4tp2,tp8"]) == 2
  assert "error: --layouts: 'tp8' is not dpNtpM" in capsys.readouterr().err


def test_the_decode_batch_is_capped_by_the_pool():
  config = load_config("configs/v5e-8.yaml")  # 128 sequences, pages of 32 tokens
  assert decode_batch(config, 10_000, 1024) == (128, Bucket(128, 128))
  # 1024 tokens and the next one need 33 pages: 99 usable pages hold 3 sequences
  assert decode_batch(config, 100, 1024) == (3, Bucket(8, 8))
  assert decode_batch(config, 30, 1024) == (0, None)


def test_decode_selection_compiles_the_decode_step_alone():
  programs = [_program("forward", s, t) for s, t in ((8, 8), (16, 16), (16, 32))]
  programs += [_program("sampler", s, 0, m) for s in (8, 16) for m in SamplerMode.all()]
  decode = set(decode_program_ids(Bucket(8, 8)))
  assert [p.id.name for p in choose(programs, "decode", decode)] == [
    "forward[8x8]",
    "sampler[8] greedy",
  ]
  largest = [p.id.name for p in choose(programs, "largest", decode)]
  assert largest[:2] == ["forward[8x8]", "forward[16x32]"] and "sampler[8] greedy" in largest
  assert choose(programs, "all", decode) == programs


def test_the_roofline_takes_the_slower_ceiling():
  chip = get_chip("v6e")
  step = DecodeStep(64, Bucket(64, 64), 1024, 8e9, 1e12, 2e9, 2e11)
  roof = Roofline(chip, step, replicas=4)
  assert roof.memory_seconds == pytest.approx(10e9 / 1640e9)
  assert roof.compute_seconds == pytest.approx(1.2e12 / 918e12)
  assert roof.bound == "memory" and roof.step_seconds == roof.memory_seconds
  assert roof.tokens_per_s == pytest.approx(4 * 64 / roof.memory_seconds)
  compute = Roofline(chip, DecodeStep(64, Bucket(64, 64), 1024, 1e9, 1e14, 0, 0), 1)
  assert compute.bound == "compute" and compute.step_seconds == pytest.approx(1e14 / 918e12)
