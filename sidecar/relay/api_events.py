"""The streamed events of the two APIs vLLM serves beside OpenAI's completions: its
Responses API (``/v1/responses``) and Anthropic's Messages API (``/v1/messages``).

Both write ``event: TYPE`` and ``data: {"type": TYPE, ...}`` frames and never ``[DONE]``
(vLLM 0.32: ``vllm/entrypoints/openai/responses/api_router.py``, and its ``/v1/messages``
route). What the relay needs from them is what it needs from a completion's frames
(``obs.sidecar.relay.sse.StreamState``): which frames carry a generated token, the usage,
how the answer ended, an error, and the last event, after which the stream is whole:

- Responses: a non-empty ``*.delta`` (text, reasoning, a tool call's arguments) is a token;
  ``response.completed`` / ``response.incomplete`` / ``response.failed`` end the stream and
  carry the response's usage (``input_tokens``, ``output_tokens``) and status; an ``error``
  event has its code and message at the top level.
- Messages: a ``content_block_delta`` with text (``text_delta``, ``thinking_delta``,
  ``input_json_delta``) is a token; ``message_start`` carries the input's usage,
  ``message_delta`` the output's and the ``stop_reason``; ``message_stop`` ends the stream;
  its error event (``{"type": "error", "error": {...}}``) is read as any error frame.

vLLM sends one delta per generated token; the usage, when it comes, replaces that count.
How an answer ended is written as a completion's ``finish_reason`` (``stop``, ``length``,
``tool_calls``, ``content_filter``), the vocabulary of the events and metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from obs.sidecar.relay.sse import StreamState

RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
MESSAGE_EVENTS = frozenset(
    {"message_start", "content_block_delta", "message_delta", "message_stop"}
)
_INCOMPLETE_FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}
_STOP_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# A Messages delta's text, by the delta's type.
_DELTA_TEXT = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}


def is_api_event(kind: str) -> bool:
    """A frame of the Responses or the Messages API (by its JSON ``type``)."""
    return kind.startswith("response.") or kind in MESSAGE_EVENTS or kind == "error"


def api_event(obj: dict[str, Any], kind: str, state: StreamState) -> int:
    """Update ``state`` from one event; returns the tokens it carries (0 or 1)."""
    if kind.startswith("response."):
        return _response_event(obj, kind, state)
    if kind == "error":  # the Responses API's error event: its code and message at the top
        state.error = {k: obj[k] for k in ("message", "code", "type") if k in obj}
        return 0
    if kind == "content_block_delta":
        delta = obj.get("delta")
        if type(delta) is not dict:
            return 0
        delta_type = delta.get("type")
        key = _DELTA_TEXT.get(delta_type) if type(delta_type) is str else None
        return _token(state) if key is not None and _text(delta, key) else 0
    if kind == "message_stop":
        state.done = True
        return 0
    part = obj.get("message") if kind == "message_start" else obj
    usage = part.get("usage") if type(part) is dict else None
    if type(usage) is dict:  # message_start's input counts, then message_delta's output
        state.usage = {**(state.usage or {}), **usage}
    delta = obj.get("delta")
    if kind == "message_delta" and type(delta) is dict and state.finish_reason is None:
        state.finish_reason = message_finish(delta)
    return 0


def _response_event(obj: dict[str, Any], kind: str, state: StreamState) -> int:
    if kind.endswith(".delta"):
        return _token(state) if _text(obj, "delta") else 0
    if kind == "response.created":  # its first event names it (where it is stored)
        response = obj.get("response")
        rid = response.get("id") if type(response) is dict else None
        state.response_id = rid if type(rid) is str else None
        return 0
    if kind in RESPONSE_ENDS:
        state.done = True
        response = obj.get("response")
        if type(response) is dict:
            usage = response.get("usage")
            if type(usage) is dict:
                state.usage = usage
            if state.finish_reason is None:
                state.finish_reason = response_finish(response)
    return 0


def _text(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key)
    return type(value) is str and value != ""


def _token(state: StreamState) -> int:
    state.output_frames += 1
    state.tokens += 1
    return 1


def response_finish(response: dict[str, Any]) -> str | None:
    """A response's end: ``stop`` when it completed, ``length`` or ``content_filter`` when it
    stopped short for that; else None."""
    status = response.get("status")
    if status == "completed":
        return "stop"
    details = response.get("incomplete_details")
    reason = details.get("reason") if type(details) is dict else None
    if status == "incomplete" and type(reason) is str:
        return _INCOMPLETE_FINISH.get(reason)
    return None


def message_finish(message: dict[str, Any]) -> str | None:
    """A message's (or a ``message_delta``'s) ``stop_reason`` as a finish reason."""
    reason = message.get("stop_reason")
    return _STOP_FINISH.get(reason) if type(reason) is str else None
