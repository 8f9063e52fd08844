"""What asks for JSON and how its answer is judged, frame by frame (pure: no server)."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs.sidecar.relay.json_answers import MAX_TOOL_CALLS, JsonAnswer, json_mode


def _frame(delta: dict[str, object]) -> bytes:
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


@pytest.mark.parametrize(
    ("body", "mode"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "json_schema"),
        ({"response_format": {"type": "text"}}, None),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": [{"type": "function"}], "tool_choice": "none"}, None),
        ({"messages": []}, None),
    ],
)
def test_which_requests_ask_for_json(body: dict[str, object], mode: str | None) -> None:
    """json_object, json_schema and tools (unless tool_choice none) ask for JSON."""
    assert json_mode(body) == mode


@given(st.dictionaries(st.text(), st.integers()), st.lists(st.integers(1, 50), max_size=6))
def test_streamed_content_is_judged_however_split(value: dict[str, int], cuts: list[int]) -> None:
    """A JSON answer split over any number of content deltas is valid; cut short, invalid."""
    text = json.dumps(value)
    answer, rest, frames = JsonAnswer("json_object"), text, []
    for n in cuts:
        frames.append(_frame({"content": rest[:n]}))
        rest = rest[n:]
    frames.append(_frame({"content": rest}))
    for f in [_frame({"role": "assistant", "content": ""}), *frames, b"data: [DONE]\n\n"]:
        answer.feed_frame(f)
    assert answer.verdict() is True
    cut = JsonAnswer("json_object")
    cut.feed_frame(_frame({"content": text[:-1]}))
    assert cut.verdict() is False


def test_garbage_from_a_model_is_invalid() -> None:
    """What the tiny random model writes (tests/data capture: 'sses') is not JSON."""
    answer = JsonAnswer("json_object")
    for _ in range(3):
        answer.feed_frame(_frame({"content": "sses"}))
    assert answer.verdict() is False


def test_tool_call_arguments_are_judged_per_call() -> None:
    """Each tool call's arguments, split over deltas by index, must parse; prose is no call."""
    answer = JsonAnswer("tools")
    answer.feed_frame(_frame({"content": "Let me look."}))
    assert answer.verdict() is None  # no call yet: nothing to judge
    calls = [
        {"index": 0, "function": {"name": "f", "arguments": '{"city": '}},
        {"index": 1, "function": {"name": "g", "arguments": "[1, "}},
    ]
    answer.feed_frame(_frame({"tool_calls": calls}))
    answer.feed_frame(_frame({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}))
    assert answer.verdict() is False  # call 1 never closed its array
    answer.feed_frame(_frame({"tool_calls": [{"index": 1, "function": {"arguments": "2]"}}]}))
    assert answer.verdict() is True


def test_tool_calls_checked_are_bounded() -> None:
    """Past MAX_TOOL_CALLS calls, further ones are not judged (memory stays bounded)."""
    answer = JsonAnswer("tools")
    calls = [{"index": i, "function": {"arguments": "{}"}} for i in range(MAX_TOOL_CALLS + 5)]
    answer.feed_frame(_frame({"tool_calls": calls}))
    assert len(answer.tools) == MAX_TOOL_CALLS and answer.verdict() is True


def test_a_whole_answer_and_a_completion_are_read() -> None:
    """Non-streamed chat (message.content) and completions (text) answers are judged."""
    chat = JsonAnswer("json_object")
    chat.feed_body(orjson.dumps({"choices": [{"message": {"content": '{"a": [1]}'}}]}))
    assert chat.verdict() is True
    completion = JsonAnswer("json_schema")
    completion.feed_body(orjson.dumps({"choices": [{"text": "{'a': 1}"}]}))
    assert completion.verdict() is False


def test_frames_that_are_not_chunks_are_skipped() -> None:
    """Comments, unparsable data and usage-only chunks neither crash nor count."""
    answer = JsonAnswer("json_object")
    for f in [b": ping\n\n", b"data: {not json\n\n", b'data: {"choices": []}\n\n']:
        answer.feed_frame(f)
    answer.feed_frame(_frame({"content": "{}"}))
    assert answer.verdict() is True
