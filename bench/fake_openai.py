"""A second fake pool, written apart from ``bench/fake_vllm.py``: aiohttp's web server, frames
written with the standard library's ``json.dumps``.

``bench/fake_vllm.py`` copies vLLM 0.32's bytes exactly, which is also the shape the sidecar's
per-token fast path recognises. This one is what an OpenAI-compatible server written
without looking at vLLM's bytes looks like: spaced JSON (``{"id": "...", "choices": [...]}``),
its own key order, the role in a frame of its own, aiohttp's chunked framing and headers.
So the relay benchmark can show that a relay's figures hold for a pool it was not tuned on
(``python -m bench.relay --pools fake_vllm,fake_openai``).

It answers ``POST /v1/chat/completions`` and ``/v1/completions`` (streamed or not), with
exactly ``max_completion_tokens`` (or ``max_tokens``; 16 when absent) tokens: the first after
the time to first token, the others one inter-token delay apart (``fake_ttft_ms`` and
``fake_itl_ms`` in the body override both), then a usage frame when
``stream_options.include_usage`` asks for one, then ``data: [DONE]``. Also ``/health``,
``/v1/models`` and a ``/metrics`` page with vLLM's engine-state gauges.

    .venv/bin/python -m bench.fake_openai --port 8002 --ttft-ms 20 --itl-ms 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from typing import Any

import uvloop
from aiohttp import web

WORDS = ("Hello", " world", ",", " this", " is", " a", " token", " stream", ".", " And")


class Pool:
    """The fake's state: model names, default pacing, what /metrics reports."""

    def __init__(self, model: str, ttft_s: float, itl_s: float) -> None:
        self.model = model
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.running = 0
        self.finished = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "me"}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        lab = f'{{model_name="{self.model}"}}'
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{lab} {self.running}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{lab} 0\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{lab} {min(1.0, self.running / 256)}\n"
            "# TYPE vllm:request_success_total counter\n"
            f"vllm:request_success_total{lab} {self.finished}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _error(400, "the body is not a JSON object")
        if body.get("model") != self.model:
            return _error(404, f"model {body.get('model')!r} not found")
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        ttft_s = float(body.get("fake_ttft_ms", self.ttft_s * 1000)) / 1000
        itl_s = float(body.get("fake_itl_ms", self.itl_s * 1000)) / 1000
        prompt_tokens = len(json.dumps(body.get("messages") or body.get("prompt") or "")) // 4
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        self.running += 1
        try:
            if not body.get("stream"):
                await _pace(ttft_s + itl_s * (n - 1))
                text = "".join(WORDS[i % len(WORDS)] for i in range(n))
                return web.json_response(
                    _whole(rid, created, self.model, chat, text, prompt_tokens, n)
                )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            obj = "chat.completion.chunk" if chat else "text_completion"
            start = time.monotonic()
            await _pace(ttft_s)
            if chat:
                role = {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}
                await _send(resp, _chunk(rid, obj, created, self.model, [role]))
            for i in range(n):
                if i:
                    await _pace(start + ttft_s + itl_s * i - time.monotonic())
                word = WORDS[i % len(WORDS)]
                finish = "length" if i == n - 1 else None
                choice: dict[str, Any] = {"index": 0}
                choice.update({"delta": {"content": word}} if chat else {"text": word})
                choice["finish_reason"] = finish
                await _send(resp, _chunk(rid, obj, created, self.model, [choice]))
            opts = body.get("stream_options") or {}
            if opts.get("include_usage"):
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": prompt_tokens + n,
                }
                await _send(resp, {**_chunk(rid, obj, created, self.model, []), "usage": usage})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.running -= 1
            self.finished += 1


def _chunk(rid: str, obj: str, created: int, model: str, choices: list[Any]) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}


async def _send(resp: web.StreamResponse, obj: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")


async def _pace(seconds: float) -> None:
    await asyncio.sleep(max(0.0, seconds))  # 0: one event-loop turn, as a busy server yields


def _whole(
    rid: str, created: int, model: str, chat: bool, text: str, prompt_tokens: int, n: int
) -> dict[str, Any]:
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n,
        "total_tokens": prompt_tokens + n,
    }
    if chat:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "length"}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
        obj = "text_completion"
    return {**_chunk(rid, obj, created, model, [choice]), "usage": usage}


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return web.json_response(body, status=status)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.fake_openai",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8002)
    ap.add_argument("--model", default="tiny", help="the served model's name")
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="time to first token")
    ap.add_argument("--itl-ms", type=float, default=5.0, help="time between tokens (0: none)")
    args = ap.parse_args(argv)
    if args.ttft_ms < 0 or args.itl_ms < 0:
        ap.error("--ttft-ms and --itl-ms must not be negative")
    pool = Pool(args.model, args.ttft_ms / 1000, args.itl_ms / 1000)
    print(f"fake openai pool on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    web.run_app(
        pool.app(),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        backlog=1024,
        loop=uvloop.new_event_loop(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
