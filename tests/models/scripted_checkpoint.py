"""A tiny Llama checkpoint whose greedy reply is scripted: a reasoning model in miniature.

Its one layer adds nothing to the residual stream (o_proj and down_proj are zero), so the logits
depend on the last token alone: the output projection maps each token of SCRIPT to the next
(logit 4 against noise of standard deviation 0.5), so greedy decoding after a prompt that ends
in one of them follows SCRIPT to eos. Sampled at temperature 1 the next token is the scripted
one about one time in seven, so sampling and greedy decoding are told apart at once.

Every scripted piece is one added token of a trained byte-level BPE; the chat template is
Qwen3's in small: `enable_thinking: false` writes an empty think block into the generation
prompt (the reply then starts after it, "Hello there!"), and `think_prefilled: true` opens the
think tag there, as DeepSeek-R1's template does (the reply then has no opening tag).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS = "<|im_start|>", "<|im_end|>"
REASONING, ANSWER = "Let me think.", "Hello there!"
# the generation prompt ends in "\n"; each piece's successor is the next, eos last
SCRIPT = ("\n", "<think>", REASONING, "</think>", "\n\n", ANSWER, EOS)
CHAT_TEMPLATE = (
  "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
  "{{ message['content'] }}<|im_end|>\n{% endfor %}"
  "{% if add_generation_prompt %}<|im_start|>assistant\n"
  "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
  "{% elif think_prefilled is defined and think_prefilled %}<think>{% endif %}{% endif %}"
)
HIDDEN = 64
LOGIT = 4.0
_CORPUS = ["user assistant system Hi there! What is it? Think about it, then answer."] * 4


def _tokenizer() -> Tokenizer:
  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=300,
    special_tokens=[BOS, EOS],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
  tokenizer.add_tokens([AddedToken(piece, normalized=False) for piece in SCRIPT[:-1]])
  return tokenizer


def _scripted_weights(model: torch.nn.Module, ids: list[int], seed: int) -> None:
  generator = torch.Generator().manual_seed(seed)
  vocab = model.config.vocab_size
  unit = lambda rows: rows / rows.norm(dim=-1, keepdim=True)  # noqa: E731
  embed = unit(torch.randn(vocab, HIDDEN, generator=generator))
  scale = LOGIT / HIDDEN**0.5  # a normed row of the residual has length sqrt(HIDDEN)
  head = scale * unit(torch.randn(vocab, HIDDEN, generator=generator))
  for token, following in itertools.pairwise(ids):
    head[following] = scale * embed[token]
  with torch.no_grad():
    model.model.embed_tokens.weight.copy_(embed)
    model.lm_head.weight.copy_(head)
    for layer in model.model.layers:
      layer.self_attn.o_proj.weight.zero_()
      layer.mlp.down_proj.weight.zero_()


def build_scripted_checkpoint(out_dir: Path, generation_config: dict | None = None) -> Path:
  """Writes the checkpoint (and generation_config.json when given) into out_dir."""
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  tokenizer = _tokenizer()
  tokenizer.save(str(out_dir / "tokenizer.json"))
  eos_id = tokenizer.token_to_id(EOS)
  (out_dir / "tokenizer_config.json").write_text(
    json.dumps(
      {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "chat_template": CHAT_TEMPLATE,
      }
    )
  )
  config = transformers.LlamaConfig(
    vocab_size=tokenizer.get_vocab_size(),
    hidden_size=HIDDEN,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    eos_token_id=eos_id,
    bos_token_id=tokenizer.token_to_id(BOS),
  )
  model = transformers.LlamaForCausalLM(config)
  _scripted_weights(model, [tokenizer.token_to_id(piece) for piece in SCRIPT], seed=0)
  model.save_pretrained(out_dir, safe_serialization=True)
  (out_dir / "generation_config.json").unlink(missing_ok=True)  # save_pretrained's own
  if generation_config is not None:
    (out_dir / "generation_config.json").write_text(json.dumps(generation_config))
  return out_dir
