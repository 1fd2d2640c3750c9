"""Random-weight checkpoints stream like real ones: their word-level tokenizer covers the whole
vocabulary, and `jaxserve bench serve` against a real server on such a checkpoint sees one chunk
per generated token (an inter-token latency for every token after the first)."""

from __future__ import annotations

import json
import random
import time

import pytest

from jaxserve.bench.random_checkpoint import build_random_checkpoint
from jaxserve.bench.vocab_tokenizer import build_vocab_tokenizer
from jaxserve.cli import main as jaxserve_main
from jaxserve.models.model_config import ModelConfig
from jaxserve.models.named_shapes import named_model_config
from jaxserve.tokenizer.tokenizer import load_tokenizer
from tests.integration.engine_helpers import small_config
from tests.server.server_helpers import core_backend, start_core, start_server

LLAMA3_VOCAB = 128256


def test_full_llama3_vocabulary_builds_fast_and_every_id_is_a_visible_word():
  config = named_model_config("llama-3.1-8b")
  start = time.perf_counter()
  backend = build_vocab_tokenizer(config.vocab_size, config.bos_token_id, config.eos_token_ids)
  assert time.perf_counter() - start < 5.0
  assert backend.get_vocab_size() == config.vocab_size == LLAMA3_VOCAB
  special = {config.bos_token_id, *config.eos_token_ids}
  words = [backend.id_to_token(i) for i in range(LLAMA3_VOCAB)]
  assert len(set(words)) == LLAMA3_VOCAB
  ordinary = [i for i in range(LLAMA3_VOCAB) if i not in special]
  # decoding every id alone in one batch call: each a non-empty printable word without spaces
  decoded = backend.decode_batch([[i] for i in ordinary])
  assert all(text and text.isprintable() and " " not in text for text in decoded)
  assert decoded[:4] == ["<unk>", "system", "user", "assistant"]
  assert backend.decode([config.bos_token_id, *config.eos_token_ids]) == ""
  rng = random.Random(0)
  for _ in range(20):
    ids = rng.sample(ordinary, 50)
    text = backend.decode(ids)
    assert backend.encode(text).ids == [config.bos_token_id, *ids]
    assert backend.decode(backend.encode(text).ids) == text
  assert backend.encode("user hello zz").ids == [
    config.bos_token_id,
    2,
    0,
    backend.token_to_id("zz"),
  ]


TINY_SHAPE = ModelConfig(
  architecture="llama",
  vocab_size=512,
  hidden_size=64,
  intermediate_size=128,
  num_layers=2,
  num_q_heads=4,
  num_kv_heads=2,
  head_dim=16,
  rms_norm_eps=1e-5,
  rope_theta=10000.0,
  max_position_embeddings=512,
  tie_word_embeddings=False,
  bos_token_id=256,
  eos_token_ids=(257,),
  dtype="float32",
)


@pytest.fixture(scope="module")
def random_checkpoint_server(tmp_path_factory):
  checkpoint = build_random_checkpoint(TINY_SHAPE, tmp_path_factory.mktemp("ckpt"), seed=2)
  core = start_core(
    small_config(
      str(checkpoint),
      max_model_len=256,
      max_num_seqs=16,
      max_tokens_per_step=64,
      seq_buckets=(16,),
      token_buckets=(64,),
    )
  )
  server = start_server(core_backend(core))  # the multi-process server's API side
  yield server, checkpoint
  server.stop()
  core.stop()


def test_random_checkpoint_tokenizer_loads_and_round_trips(random_checkpoint_server):
  _, checkpoint = random_checkpoint_server
  tokenizer = load_tokenizer(str(checkpoint))
  assert tokenizer.bos_token_id == 256 and 257 in tokenizer.eos_token_ids
  ids = list(range(300, 340))
  assert tokenizer.encode(tokenizer.decode(ids)) == [256, *ids]
  assert all(tokenizer.decode([i]) for i in range(TINY_SHAPE.vocab_size) if i not in (256, 257))
  prompt = tokenizer.encode_chat([{"role": "user", "content": "ab cd"}])
  assert tokenizer.decode(prompt) == "user ab cd assistant"


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_bench_serve_sees_a_chunk_per_token(random_checkpoint_server, endpoint, tmp_path):
  server, _ = random_checkpoint_server
  output_len = 12
  code = jaxserve_main(
    [
      "bench",
      "serve",
      "--base-url",
      server.url,
      "--endpoint",
      endpoint,
      "--num-prompts",
      "8",
      "--random-input-len",
      "16",
      "--random-output-len",
      str(output_len),
      "--ignore-eos",
      "--disable-tqdm",
      "--save-result",
      "--result-dir",
      str(tmp_path),
    ]
  )
  assert code == 0
  (run,) = json.loads((tmp_path / "bench_serve.json").read_text())["runs"]
  assert run["metrics"]["completed"] == 8
  for record in run["requests"]:
    assert record["usage_reported"] and record["output_tokens"] == output_len
    assert len(record["itls"]) == output_len - 1  # one chunk per token: ITL for every token
