"""An OutputStream's waiting outputs are bounded (core/streams.py): past MAX_PENDING_PER_REQUEST
outputs of a request waiting for the handler, the next ones merge into its latest waiting one,
so a handler that fell behind (its client reads slowly) gets every token, text and logprob in
fewer, bigger outputs, in order, and the other requests' outputs are untouched."""

from __future__ import annotations

import asyncio

from jaxserve.api.outputs import RequestOutput, TokenLogprob
from jaxserve.core.streams import MAX_PENDING_PER_REQUEST, OutputStream


def _output(request_id: str, step: int, finished: bool = False) -> RequestOutput:
  tokens = tuple(range(step + 1))
  return RequestOutput(
    request_id=request_id,
    prompt_token_ids=(1, 2),
    token_ids=tokens,
    text="".join(chr(97 + t % 26) for t in tokens),
    new_token_ids=(step,),
    new_text=chr(97 + step % 26),
    finished=finished,
    new_logprobs=(TokenLogprob(step, -float(step)),),
  )


async def _drain(stream: OutputStream) -> list[RequestOutput]:
  taken = []
  while not stream.finished:
    taken.append(await stream.get())
  return taken


def test_a_handler_that_fell_behind_gets_every_token_in_fewer_outputs():
  aborted: list[list[str]] = []
  stream = OutputStream(aborted.append, ["slow", "other"])
  steps = 40
  for step in range(steps):
    stream._put(_output("slow", step, finished=step == steps - 1))
  for step in range(3):
    stream._put(_output("other", step, finished=step == 2))
  taken = asyncio.run(_drain(stream))
  slow = [o for o in taken if o.request_id == "slow"]
  other = [o for o in taken if o.request_id == "other"]
  assert len(slow) == MAX_PENDING_PER_REQUEST and stream.num_merged == steps - len(slow)
  assert [t for o in slow for t in o.new_token_ids] == list(range(steps))
  assert "".join(o.new_text for o in slow) == "".join(chr(97 + s % 26) for s in range(steps))
  assert [lp.token_id for o in slow for lp in o.new_logprobs] == list(range(steps))
  assert slow[-1].finished and slow[-1].token_ids == tuple(range(steps))
  assert [o.new_token_ids for o in other] == [(0,), (1,), (2,)]
  assert aborted == []


def test_a_handler_that_keeps_up_gets_one_output_per_step():
  async def run() -> list[RequestOutput]:
    stream = OutputStream(lambda ids: None, ["r"])
    taken = []
    for step in range(3 * MAX_PENDING_PER_REQUEST):
      stream._put(_output("r", step, finished=step == 3 * MAX_PENDING_PER_REQUEST - 1))
      taken.append(await stream.get())
    return taken

  taken = asyncio.run(run())
  assert [o.new_token_ids for o in taken] == [(s,) for s in range(3 * MAX_PENDING_PER_REQUEST)]


def test_a_waiting_handler_wakes_for_the_next_output():
  async def run() -> RequestOutput:
    stream = OutputStream(lambda ids: None, ["r"])
    waiter = asyncio.ensure_future(stream.get())
    await asyncio.sleep(0)
    assert not waiter.done()
    stream._put(_output("r", 0, finished=True))
    return await asyncio.wait_for(waiter, 1)

  assert asyncio.run(run()).finished
