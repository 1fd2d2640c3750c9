"""GET /tokenizer_info: what a client needs to tokenize like the server (vLLM's route).

lm-evaluation-harness's `local-completions` with `tokenizer_backend=remote` (lm_eval.utils.
RemoteTokenizer) reads the special tokens and the chat template here and encodes / decodes through
/tokenize and /detokenize, so loglikelihood tasks run without downloading a Hugging Face tokenizer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from jaxserve.server.state import ServingState
from jaxserve.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class TokenizerInfo:
  """The body of /tokenizer_info (token strings and their ids; None where the model has none)."""

  tokenizer_class: str
  model_max_length: int
  vocab_size: int
  bos_token: str | None
  bos_token_id: int | None
  eos_token: str | None
  eos_token_id: int | None
  eos_token_ids: list[int]
  pad_token: str | None
  pad_token_id: int | None
  unk_token: str | None
  unk_token_id: int | None
  chat_template: str | None


def tokenizer_info_of(tokenizer: Tokenizer, max_model_len: int) -> TokenizerInfo:
  special = tokenizer.special_tokens
  token_id = lambda token: None if token is None else tokenizer.backend.token_to_id(token)
  eos_ids = list(tokenizer.eos_token_ids)
  return TokenizerInfo(
    tokenizer_class=tokenizer.tokenizer_class,
    model_max_length=max_model_len,
    vocab_size=tokenizer.vocab_size,
    bos_token=special.bos_token,
    bos_token_id=tokenizer.bos_token_id,
    eos_token=special.eos_token,
    eos_token_id=eos_ids[0] if eos_ids else None,
    eos_token_ids=eos_ids,
    pad_token=special.pad_token,
    pad_token_id=token_id(special.pad_token),
    unk_token=special.unk_token,
    unk_token_id=token_id(special.unk_token),
    chat_template=tokenizer.chat_template,
  )


async def tokenizer_info(request: Request) -> Response:
  state: ServingState = request.app.state.serving
  return JSONResponse(asdict(tokenizer_info_of(state.tokenizer, state.max_model_len)))
