"""The output processor on hand-made engine-core outputs (what the core process sends): stop
strings end a request mid-burst and name it for the core, a stop token is not text, unknown
requests' outputs are dropped, and a request that neither streams nor has stop strings is
detokenized once at the end. Expected text comes from the tokenizer's own decode. Finish
reasons are FinishReason members that travel and print as their strings."""

from __future__ import annotations

import json

import msgspec
import pytest

from jaxserve.api.outputs import FinishReason
from jaxserve.api.sampling_params import SamplingParams
from jaxserve.engine.core_io import EngineCoreOutput, new_core_requests
from jaxserve.engine.output_processor import OutputProcessor
from jaxserve.engine.request import RequestStatus
from jaxserve.models.registry import load_model_tokenizer

PROMPT = [1, 2, 3]


def _add(processor: OutputProcessor, request_id: str, params: SamplingParams, stream=True):
  (record,) = new_core_requests(
    [request_id], PROMPT, [params], processor.tokenizer.vocab_size, arrival_time=0.0, stream=stream
  )
  processor.add_request(record)
  return record


@pytest.fixture(scope="module")
def tokenizer():
  return load_model_tokenizer("tiny-random")


def _out(
  request_id: str, ids: list[int], finish: str | None = None, stop_token: int | None = None
) -> EngineCoreOutput:
  return EngineCoreOutput(
    request_id,
    ids,
    None,
    FinishReason(finish) if finish else None,
    stop_token,
    None,
    1.0,
    2.0,
    3.0,
    4.0 if finish else None,
    0,
  )


def test_finish_reasons_travel_and_print_as_their_strings():
  out = _out("a", [5], "length")
  wire = msgspec.msgpack.encode(out)
  assert b"length" in wire
  assert msgspec.msgpack.decode(wire, type=EngineCoreOutput).finish_reason is FinishReason.LENGTH
  assert (
    msgspec.msgpack.decode(
      msgspec.msgpack.encode(_out("a", [5])), type=EngineCoreOutput
    ).finish_reason
    is None
  )
  with pytest.raises(msgspec.ValidationError):
    msgspec.msgpack.decode(wire.replace(b"length", b"lenght"), type=EngineCoreOutput)
  reason = FinishReason.TOOL_CALLS
  assert reason == "tool_calls" and json.dumps({"r": reason}) == '{"r": "tool_calls"}'
  # printf-style formatting is one of the renderings under test
  assert f"{reason}" == str(reason) == "%s" % reason == "tool_calls"  # noqa: UP031
  finished = [s for s in RequestStatus if s.finished]
  assert {s.value for s in finished} == set(FinishReason) - {FinishReason.TOOL_CALLS}


def test_a_stop_string_inside_a_burst_ends_the_request_there(tokenizer):
  ids = tokenizer.encode("hello world and more", add_special_tokens=False)
  completes = next(k for k in range(1, len(ids) + 1) if "world" in tokenizer.decode(ids[:k]))
  processor = OutputProcessor(tokenizer)
  record = _add(processor, "a", SamplingParams(stop=("world",), max_tokens=50))
  outputs, stopped = processor.process([_out("a", ids[:2]), _out("unknown", [5])])
  assert stopped == [] and [o.request_id for o in outputs] == ["a"]
  outputs, stopped = processor.process([_out("a", ids[2:])])  # a burst past the stop string
  assert stopped == ["a"]
  (final,) = outputs
  assert final.finished and final.finish_reason == "stop" and final.stop_reason == "world"
  assert final.finish_reason is FinishReason.STOP
  assert final.token_ids == tuple(ids[:completes])
  assert final.text == tokenizer.decode(ids[:completes]).split("world")[0]
  assert final.prompt_token_ids is record.prompt_token_ids  # the record's ids, not a copy
  assert processor.process([_out("a", [7], "abort")]) == ([], [])  # the core's late outputs


def test_a_stop_token_is_not_text_and_the_core_needs_no_stop(tokenizer):
  ids = tokenizer.encode("one two", add_special_tokens=False)
  eos = tokenizer.eos_token_ids[0]
  processor = OutputProcessor(tokenizer)
  _add(processor, "b", SamplingParams(max_tokens=50))
  outputs, stopped = processor.process([_out("b", [*ids, eos], "stop")])
  assert stopped == []
  (final,) = outputs
  assert final.token_ids == (*ids, eos) and final.text == tokenizer.decode(ids)
  assert final.finish_reason == "stop" and final.stop_reason is None


def test_without_streaming_or_stop_strings_only_the_final_output(tokenizer):
  ids = tokenizer.encode("some words here", add_special_tokens=False)
  processor = OutputProcessor(tokenizer)
  _add(processor, "c", SamplingParams(max_tokens=len(ids)), stream=False)
  (final,), _ = processor.process([_out("c", ids, "length")])
  assert final.text == final.new_text == tokenizer.decode(ids)
  assert final.metrics.first_token_time == 2.0 and processor.num_requests == 0
