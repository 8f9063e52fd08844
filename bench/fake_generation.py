"""One fake vLLM response: its frames, byte for byte as vLLM 0.32 writes them, and their pacing.

``Generation`` builds every frame from a per-request prefix (id, created, model)
and a token, and schedules itself on the event loop: the first token after the
TTFT, the others one inter-token delay apart (absolute times, so no drift), or
one per loop turn when there is no delay. It writes through a ``Sink`` (the
HTTP connection in ``bench/fake_vllm.py``) and stops while the sink is paused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson

VERSION = "0.32.0"
FINGERPRINT = f"vllm-{VERSION}-9814deb4"
DEFAULT_MAX_TOKENS = 16
# Token texts (as a BPE vocabulary over Python sources would produce); none needs JSON escapes.
TOKENS = tuple(
    orjson.dumps(t)
    for t in (
        "sses",
        " the",
        "redu",
        "SE",
        "umn",
        " coroutines",
        " aut",
        "hand",
        "binary",
        " G",
        "exception",
        "ream",
        " en",
        ".",
        " def",
        "_",
    )
)


class Pacing:
    """Time to first token and between tokens, in seconds."""

    __slots__ = ("itl_s", "ttft_s")

    def __init__(self, ttft_s: float, itl_s: float) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s


class Sink(Protocol):
    """Where a generation writes: an HTTP/1.1 connection."""

    paused: bool

    def write_chunk(self, frame: bytes) -> None: ...

    def end_chunked(self) -> None: ...

    def respond(self, status: bytes, body: bytes, ctype: bytes | None) -> None: ...


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A stand-in for the tokenizer: ~4 characters per token, plus the chat template's."""
    msgs = body.get("messages")
    if isinstance(msgs, list):
        chars = sum(len(str(m.get("content", ""))) for m in msgs if isinstance(m, dict))
        return max(1, chars // 4 + 4 * len(msgs) + 3)
    prompt = body.get("prompt")
    return max(1, len(prompt) // 4) if isinstance(prompt, str) else 1


def _max_tokens(body: dict[str, Any]) -> int:
    n = body.get("max_completion_tokens", body.get("max_tokens"))
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else DEFAULT_MAX_TOKENS


def _seconds(body: dict[str, Any], key: str, default: float) -> float:
    v = body.get(key)
    return v / 1000 if isinstance(v, int | float) and not isinstance(v, bool) else default


class Generation:
    """One response being produced: the frames, their schedule, flow control."""

    __slots__ = (
        "_chunked",
        "_conn",
        "_handle",
        "_head",
        "_n",
        "_sent",
        "_start",
        "_tail",
        "chat",
        "created",
        "id",
        "include_usage",
        "model",
        "pacing",
        "prompt_tokens",
        "stream",
    )

    def __init__(
        self, conn: Sink, chat: bool, body: dict[str, Any], rid: str, pacing: Pacing
    ) -> None:
        self._conn = conn
        self.chat = chat
        self.stream = body.get("stream") is True
        opts = body.get("stream_options")
        self.include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
        self.model = str(body.get("model"))
        self.id = ("chatcmpl-" if chat else "cmpl-") + rid
        self.created = int(time.time())
        self.prompt_tokens = _prompt_tokens(body)
        self.pacing = Pacing(
            _seconds(body, "fake_ttft_ms", pacing.ttft_s),
            _seconds(body, "fake_itl_ms", pacing.itl_s),
        )
        self._n = _max_tokens(body)
        self._sent = 0
        self._handle: asyncio.Handle | asyncio.TimerHandle | None = None
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        self._head = (
            b'data: {"id":"'
            + self.id.encode()
            + b'","object":"'
            + obj
            + b'","created":'
            + str(self.created).encode()
            + b',"model":'
            + orjson.dumps(self.model)
            + b',"choices":['
        )
        self._tail = (
            b',"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
            if chat
            else b',"logprobs":null,"finish_reason":null,"stop_reason":null,'
            b'"prompt_token_ids":null,"token_ids":null}]}\n\n'
        )
        self._start = time.perf_counter()

    # ---- scheduling -------------------------------------------------------------------

    def start(self) -> None:
        if self.stream:
            self._at(self.pacing.ttft_s, self._step)
        else:
            self._at(self.pacing.ttft_s + self.pacing.itl_s * (self._n - 1), self._whole)

    def _at(self, offset_s: float, step: Callable[[], None]) -> None:
        """Run ``step`` ``offset_s`` after the start, by the real clock: never early.

        The loop's own clock is cached per iteration (uvloop: in whole milliseconds), so
        its timers can fire a little before the real deadline; they are re-armed then.
        """
        left = self._start + offset_s - time.perf_counter()
        loop = asyncio.get_running_loop()
        if left <= 0:  # due (or late): next loop turn, as a past call_at would be
            self._handle = loop.call_soon(step)
        else:
            self._handle = loop.call_later(left, self._at, offset_s, step)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def resume(self) -> None:
        if self._handle is None and self._sent < self._n:
            self._handle = asyncio.get_running_loop().call_soon(self._step)

    def _step(self) -> None:
        self._handle = None
        conn = self._conn
        write = conn.write_chunk
        if self._sent == 0 and self.chat:
            write(self.role_frame())
        i = self._sent
        self._sent = i + 1
        if self._sent < self._n:
            write(self._head + b'{"index":0,' + self._delta(TOKENS[i % len(TOKENS)]) + self._tail)
        else:
            write(self.last_frame(TOKENS[i % len(TOKENS)]))
            if self.include_usage:
                write(self.usage_frame())
            write(b"data: [DONE]\n\n")
            conn.end_chunked()
            return
        if conn.paused:
            return
        if self.pacing.itl_s > 0:
            self._at(self.pacing.ttft_s + self.pacing.itl_s * self._sent, self._step)
        else:
            self._handle = asyncio.get_running_loop().call_soon(self._step)

    def _delta(self, tok: bytes) -> bytes:
        return b'"delta":{"content":' + tok + b"}" if self.chat else b'"text":' + tok

    # ---- frames -----------------------------------------------------------------------

    def role_frame(self) -> bytes:
        return (
            self._head + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
        )

    def last_frame(self, tok: bytes) -> bytes:
        fp = b"" if self.include_usage else b',"system_fingerprint":"' + FINGERPRINT.encode() + b'"'
        if self.chat:
            end = b',"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]'
        else:
            end = (
                b',"logprobs":null,"finish_reason":"length","stop_reason":null,'
                b'"prompt_token_ids":null,"token_ids":null}]'
            )
        return self._head + b'{"index":0,' + self._delta(tok) + end + fp + b"}\n\n"

    def _usage(self, details: dict[str, Any]) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self._n,
            "completion_tokens": self._n,
            "prompt_tokens_details": details,
        }

    def usage_frame(self) -> bytes:
        details: dict[str, Any] = {"cached_tokens": 0}
        if self.chat:
            details["created_cache_tokens"] = 0
        return (
            self._head
            + b'],"usage":'
            + orjson.dumps(self._usage(details))
            + b',"system_fingerprint":"'
            + FINGERPRINT.encode()
            + b'"}\n\n'
        )

    def _whole(self) -> None:
        self._handle = None
        self._sent = self._n
        text = "".join(orjson.loads(TOKENS[i % len(TOKENS)]) for i in range(self._n))
        details = {"cached_tokens": 0, "created_cache_tokens": 0, "multimodal_tokens": None}
        if not self.chat:
            details["created_cache_tokens"] = None
        usage = {**self._usage(details), "completion_tokens_details": None}
        if self.chat:
            message = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
            choice: dict[str, Any] = {"index": 0, "message": message}
            extra: dict[str, Any] = {
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
            }
        else:
            choice = {"index": 0, "text": text}
            extra = {}
        choice.update(logprobs=None, finish_reason="length", stop_reason=None, token_ids=None)
        if not self.chat:
            choice.update(prompt_logprobs=None, prompt_token_ids=None)
        choice["routed_experts"] = None
        obj = {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": usage,
            **extra,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
        self._conn.respond(b"200 OK", orjson.dumps(obj), b"application/json")
