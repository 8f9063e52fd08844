"""The simulated replica's HTTP server (aiohttp): vLLM's routes over a :class:`SimEngine`.

``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health``,
``/tokenize``, ``/version`` and ``/metrics``. A client that leaves mid-answer aborts
its requests in the engine, as vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from obs.engines.sim.api import CHAT, COMPLETIONS, DONE, ApiError, Ask, Framer, error_frame, parse
from obs.engines.sim.engine import SimEngine, Ticket
from obs.engines.sim.scheduler import SimRequest
from obs.engines.sim.spans import (
    SpanContext,
    SpanExporter,
    now_ns,
    request_ids,
    request_span,
    span_attributes,
)
from obs.engines.sim.tokens import block_hashes, output_text, token_ids
from obs.openai_api import prompt_text

VERSION_PREFIX = "sim"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    gpu: str
    model: str
    default_output_tokens: int = 128
    otlp_traces_endpoint: str | None = None  # send each request's llm_request span here


def create_app(engine: SimEngine, config: ServerConfig) -> web.Application:
    """The replica's routes; the engine's step loop runs while the app does."""
    app = web.Application(client_max_size=64 << 20)
    exporter = SpanExporter(config.otlp_traces_endpoint) if config.otlp_traces_endpoint else None
    routes = _Routes(engine, config, exporter)
    app.router.add_get("/health", routes.health)
    app.router.add_get("/version", routes.version)
    app.router.add_get("/metrics", routes.metrics)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_post("/tokenize", routes.tokenize)
    app.router.add_post("/v1/chat/completions", routes.chat)
    app.router.add_post("/v1/completions", routes.completions)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        engine.start()
        if exporter is not None:
            exporter.start()
        yield
        await engine.stop()
        if exporter is not None:
            await exporter.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(e: ApiError) -> web.Response:
    return web.Response(body=e.body(), status=e.status, content_type="application/json")


class _Routes:
    def __init__(
        self, engine: SimEngine, config: ServerConfig, exporter: SpanExporter | None = None
    ) -> None:
        self.engine = engine
        self.config = config
        self.exporter = exporter
        self.name = engine.config.model_name

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": f"{VERSION_PREFIX}-{self.config.gpu}-{self.config.model}"})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.engine.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.name,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.engine.config.max_model_len,
        }
        return _json({"object": "list", "data": [card]})

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(ApiError("the request body is not valid JSON"))
        if not isinstance(body, dict) or not (body.get("prompt") or body.get("messages")):
            return _error(ApiError("give a prompt or messages", param="prompt"))
        ids = token_ids(prompt_text(body))
        return _json(
            {"count": len(ids), "max_model_len": self.engine.config.max_model_len, "tokens": ids}
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, CHAT)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, COMPLETIONS)

    async def _complete(self, request: web.Request, kind: str) -> web.StreamResponse:
        cfg = self.engine.config
        try:
            ask = parse(
                await request.read(),
                kind,
                self.name,
                min(cfg.max_model_len, self.engine.capacity_tokens),
                self.config.default_output_tokens,
            )
        except ApiError as e:
            return _error(e)
        hashes = block_hashes(ask.ids, cfg.block_size)
        changed = asyncio.Event()
        start_ns = now_ns()
        reason = "length" if ask.explicit_max else "stop"
        tickets = []
        for i in range(ask.n):
            req = SimRequest(f"r{i}", len(ask.ids), ask.max_tokens, hashes)
            req.finish_reason, req.n = reason, ask.n
            tickets.append(self.engine.submit(req, changed))
        try:
            if ask.stream:
                return await self._stream(request, ask, tickets, changed)
            return await self._whole(ask, tickets, changed)
        finally:
            if self.exporter is not None:
                self._spans(request, ask, tickets, start_ns)
            for t in tickets:
                self.engine.abort(t)

    def _spans(self, request: web.Request, ask: Ask, tickets: list[Ticket], start_ns: int) -> None:
        """Each finished choice's ``llm_request`` span (none for one aborted or refused)."""
        assert self.exporter is not None
        ctx = SpanContext.from_headers(request.headers)
        ids = request_ids(ask.kind == CHAT, request.headers.get("X-Request-Id"), ask.n)
        speed = self.engine.config.speed
        for rid, t in zip(ids, tickets, strict=True):
            req = t.req
            if t.failed or req.finished_s is None:
                continue
            attrs = span_attributes(req, rid, ask.top_p, ask.n, speed)
            end_ns = start_ns + round(attrs["gen_ai.latency.e2e"] * 1e9)
            self.exporter.add(request_span(ctx, attrs, start_ns, end_ns))

    async def _whole(self, ask: Ask, tickets: list[Ticket], changed: asyncio.Event) -> web.Response:
        while not all(t.req.done or t.failed for t in tickets):
            changed.clear()
            await changed.wait()
        failed = next((t.failed for t in tickets if t.failed), None)
        if failed:
            return _error(ApiError(failed))
        framer = Framer(ask)
        texts = [output_text(0, t.req.output) for t in tickets]
        body = framer.whole(texts, sum(t.req.output for t in tickets))
        return web.Response(body=body, content_type="application/json")

    async def _stream(
        self, request: web.Request, ask: Ask, tickets: list[Ticket], changed: asyncio.Event
    ) -> web.StreamResponse:
        interval = self.engine.config.stream_interval
        framer = Framer(ask)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent = [0] * len(tickets)
        closed = [False] * len(tickets)
        while not all(closed):
            changed.clear()
            for i, t in enumerate(tickets):
                if closed[i]:
                    continue
                if t.failed:
                    await resp.write(error_frame(t.failed))
                    return resp
                out, done = t.req.output, t.req.done
                first = sent[i] == 0 and out > 0
                if out > sent[i] and (first or done or out - sent[i] >= interval):
                    if first and ask.kind == CHAT:  # vLLM sends the role with the first token
                        await resp.write(framer.chunk(i, None, False))
                    await resp.write(framer.chunk(i, output_text(sent[i], out), done))
                    sent[i] = out
                    closed[i] = done
            if not all(closed):
                await changed.wait()
        if ask.include_usage:
            await resp.write(framer.usage_frame(sum(sent)))
        await resp.write(DONE)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp
