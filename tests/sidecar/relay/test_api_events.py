"""The Responses API's and the Messages API's streams (``/v1/responses``, ``/v1/messages``):
``event:`` lines, no ``[DONE]``, usage in the last events. Frames written as vLLM 0.32 writes
them (``vllm/entrypoints/openai/responses/api_router.py``: ``event: TYPE\ndata: JSON\n\n``)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from obs.events import Event
from obs.openai_api import sse_data
from obs.sidecar.relay.api_events import message_finish, response_finish
from obs.sidecar.relay.payloads import apply_usage, read_completion
from obs.sidecar.relay.sse import (
    FrameSplitter,
    StreamState,
    classify,
    classify_parsed,
)


def _event(kind: str, **fields: object) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (kind.encode(), orjson.dumps({"type": kind, **fields}))


def _response(status: str, **extra: object) -> dict[str, object]:
    usage = {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3}
    return {"id": "resp_1", "object": "response", "status": status, "usage": usage, **extra}


STREAM = [
    _event("response.created", sequence_number=0, response=_response("in_progress")),
    _event("response.output_item.added", sequence_number=1, output_index=0, item={}),
    _event("response.output_text.delta", sequence_number=2, delta="Hel"),
    _event("response.output_text.delta", sequence_number=3, delta="lo"),
    _event("response.output_text.delta", sequence_number=4, delta=""),
    _event("response.reasoning_text.delta", sequence_number=5, delta="hm"),
    _event("response.output_text.done", sequence_number=6, text="Hello"),
    _event(
        "response.completed",
        sequence_number=7,
        response=_response("incomplete", incomplete_details={"reason": "max_output_tokens"}),
    ),
]


def _classified(frames: list[bytes]) -> tuple[StreamState, list[int]]:
    state = StreamState()
    return state, [classify(f, state)[0] for f in frames]


def test_a_responses_stream_ends_at_its_last_event_with_its_usage() -> None:
    """Each non-empty delta is a token frame; the last event ends the stream (no [DONE]) and
    its usage and status are the event's token counts and finish reason."""
    state, tokens = _classified(STREAM)
    assert tokens == [0, 0, 1, 1, 0, 1, 0, 0]
    assert state.done and state.error is None and state.malformed == 0
    ev = Event(request_id="r", stream=True)
    apply_usage(ev, state)
    assert (ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens) == (9, 3, 4)
    assert ev.finish_reason == "length" and ev.output_chunks == 3


def test_a_cut_responses_stream_is_not_done_and_counts_its_deltas() -> None:
    """A stream cut before its last event is not done (the relay reports a protocol error);
    its output is counted from the deltas relayed."""
    state, _ = _classified(STREAM[:-1])
    assert not state.done
    ev = Event(request_id="r", stream=True)
    apply_usage(ev, state)
    assert ev.completion_tokens == 3 and ev.finish_reason is None


def test_the_error_event_is_the_pools_error() -> None:
    """The Responses API's ``error`` event (code and message at the top level) is read as an
    error frame is."""
    state = StreamState()
    classify(_event("error", code="invalid_prompt", message="bad"), state)
    assert state.error == {"code": "invalid_prompt", "message": "bad", "type": "error"}


def test_failed_and_incomplete_end_the_stream_too() -> None:
    """``response.failed`` and ``response.incomplete`` are last events as well."""
    for kind, finish in (("response.failed", None), ("response.incomplete", None)):
        state = StreamState()
        classify(_event(kind, response={"status": kind.split(".")[1]}), state)
        assert state.done and state.finish_reason is finish


def test_response_finish_maps_status_and_reason() -> None:
    """completed: stop; incomplete for length or the content filter: those; else unknown."""
    assert response_finish({"status": "completed"}) == "stop"
    length = {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    assert response_finish(length) == "length"
    cut = {"status": "incomplete", "incomplete_details": {"reason": "content_filter"}}
    assert response_finish(cut) == "content_filter"
    assert response_finish({"status": "failed"}) is None
    assert response_finish({"status": "incomplete", "incomplete_details": None}) is None


def test_a_whole_response_gives_its_usage_and_finish() -> None:
    """A non-streamed response: the same token counts and finish reason as its stream's."""
    ev = Event(request_id="r")
    read_completion(ev, orjson.dumps(_response("completed", output=[])))
    assert (ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens) == (9, 3, 4)
    assert ev.finish_reason == "stop"


def test_sse_data_joins_data_lines_and_skips_other_fields() -> None:
    """As an EventSource reads a frame: ``data`` lines joined by newlines, with or without
    the space after the colon; ``event:``, ``id:`` and comments left out; None without data."""
    assert sse_data(b'event: x\nid: 7\n: note\ndata: {"a":\ndata:1}\n\n') == b'{"a":\n1}'
    assert sse_data(b"event: ping\r\n\r\n") is None
    state = StreamState()
    assert classify_parsed(b'event: x\ndata: {"a":\ndata:1}\n\n', state) == (0, False)
    assert state.malformed == 0


def test_a_done_frame_after_an_event_line_ends_the_stream() -> None:
    """``[DONE]`` ends a stream whether or not the frame has other fields."""
    state = StreamState()
    classify(b"event: end\ndata: [DONE]\n\n", state)
    assert state.done


@given(st.lists(st.integers(1, 40), max_size=6))
def test_responses_stream_classifies_alike_however_it_is_read(cuts: list[int]) -> None:
    """Split into reads anywhere, the stream gives the same frames, tokens and end."""
    whole = b"".join(STREAM)
    reads, at = [], 0
    for n in cuts:
        reads.append(whole[at : at + n])
        at += n
    reads.append(whole[at:])
    splitter, state = FrameSplitter(), StreamState()
    frames = [f for r in reads for f in splitter.feed(r)]
    tokens = [classify(f, state)[0] for f in frames]
    assert frames == STREAM and sum(tokens) == 3 and state.done


# Anthropic's Messages API (``/v1/messages``), as vLLM 0.32 streams it.
MESSAGE = [
    _event(
        "message_start",
        message={"type": "message", "usage": {"input_tokens": 29, "output_tokens": 0}},
    ),
    _event("content_block_start", content_block={"type": "text", "text": ""}, index=0),
    _event("content_block_delta", delta={"type": "text_delta", "text": " --"}, index=0),
    _event("content_block_delta", delta={"type": "thinking_delta", "thinking": "hm"}, index=0),
    _event("content_block_delta", delta={"type": "text_delta", "text": ""}, index=0),
    _event("content_block_stop", index=0),
    _event(
        "message_delta",
        delta={"stop_reason": "max_tokens", "stop_sequence": None},
        usage={"output_tokens": 5, "cache_read_input_tokens": 16},
    ),
    _event("message_stop"),
]


def test_a_messages_stream_ends_at_message_stop_with_both_usages() -> None:
    """Text and thinking deltas are token frames; message_start's input count and
    message_delta's output count and stop reason are the event's; message_stop ends it."""
    state, tokens = _classified(MESSAGE)
    assert tokens == [0, 0, 1, 1, 0, 0, 0, 0]
    assert state.done and state.error is None
    ev = Event(request_id="r", stream=True)
    apply_usage(ev, state)
    assert (ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens) == (29, 5, 16)
    assert ev.finish_reason == "length"
    cut, _ = _classified(MESSAGE[:-1])
    assert not cut.done


def test_a_messages_error_event_is_the_pools_error() -> None:
    """The Messages API's error event (``{"type": "error", "error": {...}}``)."""
    state = StreamState()
    classify(_event("error", error={"type": "overloaded_error", "message": "busy"}), state)
    assert state.error == {"type": "overloaded_error", "message": "busy"} and not state.done


def test_message_stop_reasons_are_finish_reasons() -> None:
    """end_turn and stop_sequence: stop; max_tokens: length; tool_use: tool_calls."""
    got = {r: message_finish({"stop_reason": r}) for r in ("end_turn", "stop_sequence")}
    assert got == {"end_turn": "stop", "stop_sequence": "stop"}
    assert message_finish({"stop_reason": "max_tokens"}) == "length"
    assert message_finish({"stop_reason": "tool_use"}) == "tool_calls"
    assert message_finish({"stop_reason": None}) is None


def test_a_whole_message_gives_its_usage_and_finish() -> None:
    """A non-streamed message: its usage (the cache read too) and stop reason."""
    usage = {"input_tokens": 29, "output_tokens": 5, "cache_read_input_tokens": 8}
    body = {"type": "message", "stop_reason": "end_turn", "usage": usage, "content": []}
    ev = Event(request_id="r")
    read_completion(ev, orjson.dumps(body))
    assert (ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens) == (29, 5, 8)
    assert ev.finish_reason == "stop"
