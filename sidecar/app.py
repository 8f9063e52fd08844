"""``create_app(settings)``: wires the relay, pools, exporters and control routes.

The relayed routes go straight to the relay (a plain ASGI callable: no
framework routing or middleware on the token path); everything else goes to
a small FastAPI app (``/health``, ``/v1/models``, ``/metrics``) whose 404
handler answers OpenAI-style. vLLM's operational endpoints (profiling, sleep,
cache reset, ...) are simply not routed: they are never reachable through the
sidecar.
"""

from __future__ import annotations

import asyncio
import gzip
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from obs import conventions as c
from obs.exporters.base import Exporter, Fanout
from obs.exporters.clickhouse import start_exporter
from obs.exporters.jsonl import JsonlExporter
from obs.exporters.otel import OtlpSettings, SpanExporter
from obs.exporters.prom import Metrics, PoolStateCollector
from obs.lanes import Classifier
from obs.record import Finished
from obs.sidecar.engine_join import EngineJoin
from obs.sidecar.errors import error_body
from obs.sidecar.looplag import LoopLagMonitor
from obs.sidecar.otlp import decode_traces
from obs.sidecar.payloads import GENERATE_ROUTES, PASSTHROUGH_ROUTES
from obs.sidecar.pools import PoolSet
from obs.sidecar.relay import SHUTDOWN_FLUSH_S, Relay
from obs.sidecar.settings import Settings
from obs.sidecar.types import Receive, Scope, Send
from obs.sidecar.upstream import Upstream
from obs.sidecar.workers import merged_registry

log = structlog.get_logger("vllm_obs.sidecar")


class SidecarApp:
    """The ASGI application: relay routes to the relay, the rest to FastAPI."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(settings.config, self.registry)
        self.pools = PoolSet(settings.config, settings.pool_poll_interval_s)
        self.registry.register(PoolStateCollector(self.pools.snapshot))
        # What /metrics shows: this process's registry, or every worker's merged.
        self.exposition = (
            self.registry
            if settings.worker is None
            else merged_registry(self.registry, settings.worker)
        )
        exporters: list[Exporter] = []
        self.jsonl: JsonlExporter | None = None
        if settings.events_path is not None:
            self.jsonl = JsonlExporter(
                settings.events_path,
                counters=self.metrics,
                max_bytes=settings.events_max_bytes,
                backups=settings.events_backups,
            )
            exporters.append(self.jsonl)
        # Where spans go: ours, and vLLM's that the sidecar receives and forwards.
        self.otlp = OtlpSettings.from_env(settings.otlp_endpoint)
        if self.otlp is not None:
            exporters.append(SpanExporter(self.otlp, counters=self.metrics))
        if settings.clickhouse is not None:
            exporters.append(
                start_exporter(
                    settings.clickhouse,
                    settings.events_path,
                    settings.worker.index if settings.worker else 0,
                    self.metrics,
                )
            )
        exporters.append(self.metrics)
        self.exporters = Fanout(exporters, failures=self.metrics)
        self._session: aiohttp.ClientSession | None = None  # polling, /v1/models, forwarding
        self.upstream = Upstream()  # the relay's pool connections
        pool_keys = {
            p.name: os.environ.get(p.api_key_env, "")
            for p in settings.config.pools
            if p.api_key_env
        }
        self.loop_lag = LoopLagMonitor(self.metrics.loop_lag, c.EVENT_LOOP_LAG_PERIOD_S)
        self.join = EngineJoin(
            self.exporters.export,
            settings.engine_join_wait_s,
            on_late=lambda: self.metrics.engine_span("late"),
            on_joined=lambda: self.metrics.engine_span("joined"),
        )
        self.traced_pools = {p.name for p in settings.config.pools if p.engine_traces}
        self._forwards: set[asyncio.Task[None]] = set()
        self.relay = Relay(
            Classifier(settings.config),
            self.pools,
            self._submit,
            self.upstream,
            max_body_bytes=settings.max_body_bytes,
            pool_keys=pool_keys,
            capture=settings.capture,
            workers=settings.workers,
        )
        self.metrics.watch_lanes(self.relay.gates)
        self.routes = set(GENERATE_ROUTES) | set(PASSTHROUGH_ROUTES) | set(settings.extra_routes)
        self.api = self._build_api()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )
        return self._session

    def _submit(self, finished: Finished) -> None:
        self.join.submit(finished, finished.event.pool in self.traced_pools)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.routes:
            await self.relay(scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == "/v1/traces":
            await self._receive_traces(scope, receive, send)
        else:
            await self.api(scope, receive, send)

    async def _receive_traces(self, scope: Scope, receive: Receive, send: Send) -> None:
        """OTLP/HTTP (protobuf) receiver: join llm_request spans, forward everything unchanged."""
        status, body = 200, b""
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        chunks = []
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        raw = b"".join(chunks)
        ctype = headers.get("content-type", b"").decode("latin-1")
        if scope["method"] != "POST":
            status, body = (
                405,
                error_body("POST OTLP/HTTP protobuf here", "MethodNotAllowedError", 405),
            )
        elif not ctype.startswith("application/x-protobuf"):
            status, body = (
                415,
                error_body(
                    "only OTLP/HTTP protobuf is accepted (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="
                    "http/protobuf)",
                    "UnsupportedMediaTypeError",
                    415,
                ),
            )
        else:
            try:
                payload = (
                    gzip.decompress(raw) if headers.get("content-encoding") == b"gzip" else raw
                )
                spans = decode_traces(payload)
            except Exception:
                status, body = 400, error_body("not an OTLP trace export", "BadRequestError", 400)
            else:
                for span in spans:
                    if span.name == "llm_request":
                        self.join.on_span(span.trace_id, span.attributes)
                if self.otlp is not None:
                    self._forward(self.otlp, raw, headers)
        out = [
            (b"content-type", b"application/x-protobuf" if status == 200 else b"application/json")
        ]
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": body})

    def _forward(self, otlp: OtlpSettings, raw: bytes, headers: dict[str, bytes]) -> None:
        fwd = dict(otlp.headers)  # OTEL_EXPORTER_OTLP_HEADERS (auth)
        fwd["content-type"] = "application/x-protobuf"
        if "content-encoding" in headers:
            fwd["content-encoding"] = headers["content-encoding"].decode("latin-1")

        async def post() -> None:
            try:
                async with self.session().post(
                    otlp.endpoint,
                    data=raw,
                    headers=fwd,
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as resp:
                    if resp.status >= 300:
                        raise aiohttp.ClientError(f"status {resp.status}")
            except (aiohttp.ClientError, TimeoutError) as e:
                log.warning("trace_forward_failed", endpoint=otlp.endpoint, error=str(e))
                self.metrics.exporter_failed("otlp_forward")

        task = asyncio.get_running_loop().create_task(post())
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)

    @asynccontextmanager
    async def lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        self.pools.start(self.session())
        self.loop_lag.start()
        log.info(
            "sidecar_started",
            pools={p.name: p.replicas for p in self.settings.config.pools},
            events=str(self.settings.events_path),
            capture_text=self.settings.capture.describe() if self.settings.capture else "off",
        )
        try:
            yield
        finally:
            if self.relay.running:  # requests cut at the end of the grace: their last words
                await asyncio.wait(self.relay.running, timeout=SHUTDOWN_FLUSH_S + 1)
            self.join.flush()
            if self._forwards:
                await asyncio.wait(self._forwards, timeout=5)
            await self.pools.stop()
            await self.loop_lag.stop()
            self.upstream.close()
            if self._session is not None:
                await self._session.close()
            await asyncio.to_thread(self.exporters.shutdown, self.settings.shutdown_grace_s)
            log.info("sidecar_stopped")

    def _build_api(self) -> FastAPI:
        api = FastAPI(
            title="vllm-obs sidecar",
            lifespan=self.lifespan,
            docs_url=None,
            redoc_url=None,
            openapi_url=None,
        )

        @api.exception_handler(StarletteHTTPException)
        async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
            if exc.status_code == 404:
                msg = "route not served by the vllm-obs sidecar"
                return _json_error(msg, "NotFoundError", 404)
            if exc.status_code == 405:
                return _json_error("method not allowed", "MethodNotAllowedError", 405)
            return _json_error(str(exc.detail), "Error", exc.status_code)

        @api.get("/health")
        async def health() -> Response:
            pools = self.pools.health()
            up = all(any(reps.values()) for reps in pools.values())
            body = {"status": "ok" if up else "degraded", "pools": pools}
            return JSONResponse(body)

        @api.get("/metrics")
        async def metrics() -> Response:
            if self.settings.metrics_address is not None:
                host, port = self.settings.metrics_address
                return _json_error(f"metrics are served on {host}:{port}", "NotFoundError", 404)
            data = await asyncio.to_thread(generate_latest, self.exposition)
            return Response(data, media_type=CONTENT_TYPE_LATEST)

        @api.get("/v1/models")
        async def models(request: Request) -> Response:
            return await self._models(request)

        return api

    async def _models(self, request: Request) -> Response:
        """The union of the pools' model lists (first replica that answers, per pool)."""
        seen: dict[str, Any] = {}
        headers = {}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        timeout = aiohttp.ClientTimeout(total=5)
        for pool, _healthy in self.pools.health().items():
            for replica in self.pools.candidates(pool):
                try:
                    async with self.session().get(
                        f"{replica.url}/v1/models", headers=headers, timeout=timeout
                    ) as resp:
                        if resp.status != 200:
                            continue
                        data = orjson.loads(await resp.read())
                except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
                    continue
                for m in data.get("data", []):
                    seen.setdefault(m.get("id"), m)
                break
        if not seen:
            return _json_error("no pool answered /v1/models", "ServiceUnavailableError", 503)
        return Response(
            orjson.dumps({"object": "list", "data": list(seen.values())}),
            media_type="application/json",
        )


def _json_error(message: str, type_: str, code: int) -> Response:
    return Response(
        error_body(message, type_, code), status_code=code, media_type="application/json"
    )


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
) -> SidecarApp:
    """Build the sidecar. Tests inject their own registry."""
    return SidecarApp(settings, registry=registry)
