"""The simulated replica's OpenAI surface, pure: reading a request, shaping each answer.

What vLLM's OpenAI server accepts and how it frames what it sends: chat and text
completions, whole or streamed (``chat.completion.chunk`` / ``text_completion``
frames, ``stream_options.include_usage`` adding a usage frame with no choices, then
``[DONE]``), ``n`` choices, and errors as ``{"error": {message, type, param, code}}``.
A request without ``max_tokens`` ends with ``stop`` after the replica's default
output length (the simulator has no end-of-sequence token to sample).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from obs.engines.sim.tokens import token_ids
from obs.openai_api import messages, prompt_text

CHAT = "chat"
COMPLETIONS = "completions"
TOKENS_PER_MESSAGE = 4  # what a Llama-3 chat template adds around each message
MAX_N = 16


class ApiError(Exception):
    """A request vLLM would refuse: its status, OpenAI error type and message."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.type_ = {404: "NotFoundError", 400: "BadRequestError"}.get(status, "InternalError")

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": str(self),
                    "type": self.type_,
                    "param": self.param,
                    "code": self.status,
                }
            }
        )


@dataclass(frozen=True, slots=True)
class Ask:
    """One parsed completion request."""

    kind: str
    model: str
    ids: list[int]
    n: int
    max_tokens: int
    explicit_max: bool  # False: the reply ends with ``stop`` at the default length
    stream: bool
    include_usage: bool
    top_p: float = 1.0


def _int(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ApiError(f"{key} must be an integer >= {low}, got {value!r}", param=key)
    if high is not None and value > high:
        raise ApiError(f"{key} must be at most {high}, got {value}", param=key)
    return value


def parse(raw: bytes, kind: str, model: str, max_model_len: int, default_output: int) -> Ask:
    """Read a request body as vLLM does; raises :class:`ApiError`."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(f"the request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    if body.get("model") not in (None, model):
        raise ApiError(f"The model `{body.get('model')}` does not exist.", 404, "model")
    if kind == CHAT:
        msgs = messages(body)
        if not msgs:
            raise ApiError("messages: a non-empty list of messages is required", param="messages")
        extra = TOKENS_PER_MESSAGE * len(msgs) + 1
    else:
        if not isinstance(body.get("prompt"), str | list) or not body.get("prompt"):
            raise ApiError("prompt: a non-empty prompt is required", param="prompt")
        extra = 1
    ids = token_ids(prompt_text(body))
    ids += [0] * extra  # the template's tokens, after the text: prefixes stay shared
    n = _int(body, "n", 1, MAX_N) or 1
    asked = _int(body, "max_completion_tokens", 1) or _int(body, "max_tokens", 1)
    room = max_model_len - len(ids)
    if (asked is not None and len(ids) + asked > max_model_len) or room < 1:
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {len(ids) + (asked or 1)} tokens ({len(ids)} in the messages, "
            f"{asked or 1} in the completion). Please reduce the length of the messages or "
            "completion."
        )
    top_p = body.get("top_p", 1.0)
    if top_p is None:
        top_p = 1.0
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        raise ApiError(f"top_p must be in (0, 1], got {top_p!r}", param="top_p")
    options = body.get("stream_options") or {}
    stream = bool(body.get("stream", False))
    if options and not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.")
    return Ask(
        kind=kind,
        model=model,
        ids=ids,
        n=n,
        max_tokens=asked if asked is not None else min(default_output, room),
        explicit_max=asked is not None,
        stream=stream,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        top_p=float(top_p),
    )


class Framer:
    """The ids, timestamps and JSON of one request's answer."""

    def __init__(self, ask: Ask) -> None:
        self.ask = ask
        chat = ask.kind == CHAT
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(16)
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def finish_reason(self) -> str:
        return "length" if self.ask.explicit_max else "stop"

    def usage(self, completion: int) -> dict[str, int]:
        p = len(self.ask.ids)
        return {"prompt_tokens": p, "total_tokens": p + completion, "completion_tokens": completion}

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.ask.model}

    def chunk(self, index: int, text: str | None, finish: bool, first: bool = False) -> bytes:
        """One SSE frame of one choice (``text`` None: the role frame of a chat stream)."""
        reason = self.finish_reason() if finish else None
        if self.ask.kind == CHAT:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": ""} if text is None else {"content": text}
            )
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": reason,
            }
            obj = "chat.completion.chunk"
        else:
            choice = {
                "index": index,
                "text": text or "",
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
            obj = "text_completion"
        return sse({**self._head(obj), "choices": [choice]})

    def usage_frame(self, completion: int) -> bytes:
        obj = "chat.completion.chunk" if self.ask.kind == CHAT else "text_completion"
        return sse({**self._head(obj), "choices": [], "usage": self.usage(completion)})

    def whole(self, texts: list[str], completion: int) -> bytes:
        choices: list[dict[str, Any]] = []
        for i, text in enumerate(texts):
            if self.ask.kind == CHAT:
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text, "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": self.finish_reason(),
                        "stop_reason": None,
                    }
                )
            else:
                choices.append(
                    {
                        "index": i,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": self.finish_reason(),
                        "stop_reason": None,
                    }
                )
        return orjson.dumps(
            {**self._head(self.object), "choices": choices, "usage": self.usage(completion)}
        )


def sse(data: object) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def error_frame(message: str) -> bytes:
    """An error after the stream started, as vLLM sends it, then ``[DONE]``."""
    return sse({"error": {"message": message, "type": "InternalServerError", "code": 500}}) + DONE
