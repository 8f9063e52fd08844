"""Server-sent events as vLLM's OpenAI API streams them, parsed incrementally. Pure.

vLLM sends ``data: {json}\\n\\n`` per chunk (no ``event:`` or ``id:`` fields) and
ends with ``data: [DONE]``. A chunk's tokens are its choices' by
``obs.openai_api.choice_tokens`` (every token chunk, whatever its text; the role chunk
none): the reading the sidecar uses for its first-token boundary and its token count,
so the client's and the sidecar's TTFT end at the same chunk and count the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from obs.openai_api import choice_has_text, choice_tokens

DONE = b"[DONE]"


class SSEParser:
    """Feed bytes as they arrive; get the ``data`` payload of each complete event."""

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []

    def feed(self, data: bytes) -> list[bytes]:
        *lines, self._tail = (self._tail + data).split(b"\n")
        out: list[bytes] = []
        for raw in lines:
            line = raw.rstrip(b"\r")
            if not line:
                if self._data:
                    out.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # event:, id:, retry: and ": comment" lines carry nothing we need.
        return out

    def close(self) -> list[bytes]:
        """Payloads of an event the stream ended without terminating."""
        out = self.feed(b"\n\n") if self._tail or self._data else []
        self._tail = b""
        return out


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one streamed chunk told the client."""

    output: bool = False  # carries at least one generated token (its text may be empty)
    content: bool = False  # non-empty text, reasoning or a tool call (visible output)
    tokens: int = 0  # the generated tokens it carries (obs.openai_api.choice_tokens)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None


def parse_chunk(payload: bytes) -> Chunk | None:
    """The chunk in one ``data`` payload; ``None`` for ``[DONE]``. Raises ValueError if not JSON."""
    if payload.strip() == DONE:
        return None
    obj = orjson.loads(payload)
    if not isinstance(obj, dict):
        raise ValueError("chunk is not a JSON object")
    if isinstance(obj.get("error"), dict | str):
        return Chunk(error=error_message(obj))
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    choices = obj.get("choices")
    choices = [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []
    if not choices:
        return Chunk(usage=usage)
    finish = next((f for c in choices if isinstance(f := c.get("finish_reason"), str)), None)
    tokens = sum(choice_tokens(c) for c in choices)
    return Chunk(
        output=tokens > 0,
        content=any(choice_has_text(c) for c in choices),
        tokens=tokens,
        finish_reason=finish,
        usage=usage,
    )


def error_message(obj: object, limit: int = 300) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``), shortened."""
    msg: object = obj
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        msg = err.get("message", err) if isinstance(err, dict) else err
    text = msg if isinstance(msg, str) else orjson.dumps(msg).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."
