"""The invalid-JSON indicator: does the answer of a request that asked for JSON parse?

A request asks for JSON with ``response_format`` ``json_object`` or ``json_schema`` (its
answer's text must be JSON) or with ``tools`` (each tool call's ``arguments`` must be).
Only such requests (one choice) get a :class:`JsonAnswer`; the relay feeds it every
frame of the stream (or the whole body of a non-streamed answer) and it feeds the pieces
of text to incremental checkers (``obs.json_check``): the text itself is never stored or
logged, and memory stays bounded whatever the answer's length. At the end ``verdict``
says valid, invalid, or nothing to judge (a tools request the model answered in prose); the
relay records it (event field ``json_valid``) only for an answer relayed whole: a stream that
reached ``[DONE]`` without an error, or a non-streamed 2xx body.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from obs.json_check import JsonCheck
from obs.sidecar.relay.payloads import single_choice

JSON_FORMATS: Final = frozenset({"json_object", "json_schema"})
TOOLS: Final = "tools"
MAX_TOOL_CALLS: Final = 16  # checkers per answer; more tool calls are not judged
_DATA: Final = b"data: "


def json_mode(body: dict[str, Any]) -> str | None:
    """``json_object``, ``json_schema`` or ``tools`` when the request asks for JSON."""
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in JSON_FORMATS:
        return str(kind)
    if body.get("tools") and body.get("tool_choice") != "none":
        return TOOLS
    return None


class JsonAnswer:
    """Checks one answer as it arrives: its text (JSON modes) or its tool calls' arguments."""

    __slots__ = ("content", "mode", "tools")

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.content = None if mode == TOOLS else JsonCheck()
        self.tools: dict[int, JsonCheck] = {}

    @classmethod
    def asked_by(cls, body: dict[str, Any]) -> JsonAnswer | None:
        """A checker for the answer to ``body`` if it asks for JSON (one choice), else None."""
        mode = json_mode(body) if single_choice(body) else None
        return None if mode is None else cls(mode)

    def feed_frame(self, frame: bytes) -> None:
        """One SSE frame of the stream (``data: {...}``); other frames are skipped."""
        if not frame.startswith(_DATA) or frame.startswith(b"data: [DONE]"):
            return
        try:
            obj = orjson.loads(frame[len(_DATA) :])
        except orjson.JSONDecodeError:
            return
        choice = _first_choice(obj)
        if choice is not None:
            self._feed(choice.get("delta"), choice.get("text"))

    def feed_body(self, data: bytes) -> None:
        """A whole, non-streamed answer."""
        try:
            choice = _first_choice(orjson.loads(data))
        except orjson.JSONDecodeError:
            return
        if choice is not None:
            self._feed(choice.get("message"), choice.get("text"))

    def _feed(self, part: Any, text: Any) -> None:
        if not isinstance(part, dict):
            part = {"content": text}
        content = part.get("content")
        if self.content is not None and isinstance(content, str):
            self.content.feed(content)
        calls = part.get("tool_calls")
        if self.mode == TOOLS and isinstance(calls, list):
            for i, call in enumerate(calls):
                if not isinstance(call, dict):
                    continue
                index = call.get("index", i)
                args = (call.get("function") or {}).get("arguments")
                if not isinstance(index, int) or not isinstance(args, str):
                    continue
                check = self.tools.get(index)
                if check is None and len(self.tools) < MAX_TOOL_CALLS:
                    check = self.tools[index] = JsonCheck()
                if check is not None:
                    check.feed(args)

    def verdict(self) -> bool | None:
        """True when the JSON asked for parses, False when not, None if there is none to judge."""
        if self.content is not None:
            return self.content.valid
        if not self.tools:
            return None
        return all(check.valid for check in self.tools.values())


def _first_choice(obj: Any) -> dict[str, Any] | None:
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None
