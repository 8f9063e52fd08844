"""``--capture-text`` on the Responses API: the prompt from ``instructions`` and ``input``,
the output from a stream's ``response.output_text.delta`` events or a whole answer's message
items. Frames and bodies written as vLLM 0.32 writes them."""

from __future__ import annotations

import orjson

from obs.events import Event
from obs.openai_api import prompt_text
from obs.sidecar.record.capture import TextCapture


def _frame(kind: str, **fields: object) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (kind.encode(), orjson.dumps({"type": kind, **fields}))


def _keep(text: str) -> str:
    return text


CAPTURE = TextCapture(prompt=True, output=True, redactor=_keep)


def test_the_prompt_of_a_responses_request_is_its_instructions_and_input() -> None:
    """A string input is the user's; message items give ``role: text`` lines (text parts
    of any kind); items without content (a function call's output) give none."""
    assert prompt_text({"input": "hi", "instructions": "be brief"}) == "system: be brief\nuser: hi"
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "function_call_output", "call_id": "c", "output": "42"},
    ]
    assert prompt_text({"input": items}) == "developer: rules\nuser: q"


def test_a_streamed_responses_output_is_its_text_deltas() -> None:
    """The output text is the ``response.output_text.delta`` deltas in order; other events
    (the reasoning, the done event that repeats the text) are not output text."""
    frames = [
        _frame("response.created", response={}),
        _frame("response.reasoning_text.delta", delta="think"),
        _frame("response.output_text.delta", delta="Hel"),
        _frame("response.output_text.delta", delta="lo"),
        _frame("response.output_text.done", text="Hello"),
        _frame("response.completed", response={"status": "completed"}),
    ]
    ev = Event(request_id="r")
    CAPTURE.fill(ev, {"input": "hi"}, frames, None)
    assert (ev.prompt_text, ev.output_text) == ("user: hi", "Hello")


def test_a_whole_responses_output_is_its_message_items_text() -> None:
    """A whole answer's text is its message items' text parts (reasoning items left out)."""
    answer = {
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}]},
            {"type": "message", "content": [{"type": "output_text", "text": "Hello"}]},
        ],
    }
    ev = Event(request_id="r")
    CAPTURE.fill(ev, None, None, orjson.dumps(answer))
    assert ev.output_text == "Hello"


def test_a_messages_prompt_output_and_whole_answer() -> None:
    """The Messages API: ``system`` then the messages; the output is the ``text_delta``
    blocks of a stream, or a whole message's text blocks (thinking and tool use left out)."""
    body = {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    frames = [
        _frame("message_start", message={}),
        _frame("content_block_delta", delta={"type": "thinking_delta", "thinking": "x"}),
        _frame("content_block_delta", delta={"type": "text_delta", "text": "Hel"}),
        _frame("content_block_delta", delta={"type": "text_delta", "text": "lo"}),
        _frame("message_stop"),
    ]
    ev = Event(request_id="r")
    CAPTURE.fill(ev, body, frames, None)
    assert (ev.prompt_text, ev.output_text) == ("system: be brief\nuser: hi", "Hello")
    whole = {
        "type": "message",
        "content": [
            {"type": "thinking", "thinking": "x"},
            {"type": "text", "text": "Hello"},
            {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        ],
    }
    ev = Event(request_id="r")
    CAPTURE.fill(ev, None, None, orjson.dumps(whole))
    assert ev.output_text == "Hello"
