"""Server-sent events from a vLLM pool: framing, classification and the usage rewrite.

vLLM writes ``data: {json}\\n\\n`` frames (no ``event:``/``id:`` lines) and ends
with ``data: [DONE]``. The relay forwards frames byte for byte; it parses each
frame once (orjson, ~1 us) only to learn whether it carries output, its finish
reason and the usage.

When the client did not ask for ``stream_options.include_usage`` the sidecar
asks for it anyway (it needs the token counts) and removes the usage frame
again. vLLM then also moves ``system_fingerprint`` from the last content frame
to the usage frame, so ``UsageStripper`` holds the frame that finished the
choice until the usage frame arrives and puts the fingerprint back where vLLM
would have written it: as the frame's last key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

DONE = b"data: [DONE]"
SEP = b"\n\n"


class FrameSplitter:
    """Splits a byte stream into complete SSE frames (each ending in a blank line)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Complete frames in ``data`` (separator included); keeps the remainder."""
        buf = self._buf + data if self._buf else data
        if SEP not in buf:
            self._buf = buf
            return []
        parts = buf.split(SEP)
        self._buf = parts.pop()
        return [p + SEP for p in parts]

    @property
    def pending(self) -> bytes:
        return self._buf


@dataclass(slots=True)
class StreamState:
    """What the relay learned from the frames so far."""

    output_frames: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    done: bool = False
    fingerprint: str | None = None
    malformed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _has_output(choices: list[dict[str, Any]]) -> bool:
    for c in choices:
        if c.get("finish_reason") is not None:
            return True
        delta = c.get("delta")
        if delta is not None:
            if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
                return True
            if delta.get("reasoning") or delta.get("function_call"):
                return True
        elif c.get("text"):
            return True
    return False


def classify(frame: bytes, state: StreamState) -> tuple[bool, bool]:
    """Update ``state`` from one frame; returns (carries_output, is_usage_frame)."""
    if not frame.startswith(b"data: "):
        return False, False
    payload = frame[6:].rstrip()
    if payload == b"[DONE]":
        state.done = True
        return False, False
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        state.malformed += 1
        return False, False
    if not isinstance(obj, dict):
        state.malformed += 1
        return False, False
    if "error" in obj:
        err = obj["error"]
        state.error = err if isinstance(err, dict) else {"message": str(err)}
        return False, False
    choices = obj.get("choices") or []
    usage = obj.get("usage")
    if usage:
        state.usage = usage
    fp = obj.get("system_fingerprint")
    if fp:
        state.fingerprint = fp
    is_usage = not choices and usage is not None
    if not choices:
        return False, is_usage
    for c in choices:
        fr = c.get("finish_reason")
        if fr is not None and state.finish_reason is None:
            state.finish_reason = fr
    out = _has_output(choices)
    if out:
        state.output_frames += 1
    return out, is_usage


def _finishes(frame: bytes) -> bool:
    return b'"finish_reason":"' in frame


def add_fingerprint(frame: bytes, fingerprint: str) -> bytes:
    """Append ``system_fingerprint`` as the last key of a frame's JSON object."""
    body = frame.rstrip()
    if not body.endswith(b"}") or b'"system_fingerprint"' in body:
        return frame
    return body[:-1] + b',"system_fingerprint":' + orjson.dumps(fingerprint) + b"}" + SEP


class UsageStripper:
    """Removes the usage frame the sidecar asked for and restores vLLM's framing.

    ``process`` takes one frame and returns the frames to send now (possibly
    none, while a finishing frame waits for the usage frame that follows it).
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[bytes] = []

    def process(self, frame: bytes, is_usage: bool, fingerprint: str | None) -> list[bytes]:
        if is_usage:
            held, self._held = self._held, []
            if held and fingerprint:
                held[-1] = add_fingerprint(held[-1], fingerprint)
            return held
        if _finishes(frame):
            self._held.append(frame)
            return []
        if self._held:
            held, self._held = self._held, []
            return [*held, frame]
        return [frame]

    def flush(self) -> list[bytes]:
        held, self._held = self._held, []
        return held
