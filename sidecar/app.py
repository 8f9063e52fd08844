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
from obs.sidecar.errors import (
    MethodNotAllowed,
    NotFound,
    RelayError,
    UpstreamUnavailable,
    for_status,
)
from obs.sidecar.looplag import LoopLagMonitor
from obs.sidecar.payloads import GENERATE_ROUTES, PASSTHROUGH_ROUTES, request_headers
from obs.sidecar.pools import PoolSet
from obs.sidecar.record_rate import RefusedRecord
from obs.sidecar.relay import SHUTDOWN_FLUSH_S, Relay
from obs.sidecar.settings import Settings
from obs.sidecar.traces import TraceReceiver, refusal_counter
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
        self.pools.on_models = self.metrics.model_label.allow
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
        self.metrics_only = Fanout([self.metrics], failures=self.metrics)
        self.refused_record = RefusedRecord(settings.rejected_events_per_s, self.registry)
        self._session: aiohttp.ClientSession | None = None  # polling, /v1/models, forwarding
        self.upstream = Upstream()  # the relay's pool connections
        pool_keys = {
            p.name: os.environ.get(p.api_key_env, "")
            for p in settings.config.pools
            if p.api_key_env
        }
        self.loop_lag = LoopLagMonitor(self.metrics.loop_lag, c.EVENT_LOOP_LAG_PERIOD_S)
        self.join = EngineJoin(
            self.exporters.export, settings.engine_join_wait_s, self.metrics.engine_span
        )
        self.traced_pools = {p.name for p in settings.config.pools if p.engine_traces}
        otlp = self.otlp
        self.traces = TraceReceiver(
            self.join,
            replicas=tuple(r for p in settings.config.pools if p.engine_traces for r in p.replicas)
            if self.traced_pools
            else None,
            token=os.environ.get(settings.traces_token_env or "") or None,
            forward=None if otlp is None else lambda payload: self._forward(otlp, payload),
            refused=refusal_counter(self.registry),
        )
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
            on_dispatch=self._dispatched,
            max_json_elements=settings.max_json_elements,
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
        if not self.refused_record.keep(finished.event):
            self.metrics_only.export(finished)
            return
        self.join.submit(finished, finished.event.pool in self.traced_pools)

    def _dispatched(self, pool: str, trace_id: str, span_id: str) -> None:
        if pool in self.traced_pools:  # the engine's span may name these ids
            self.join.issue(trace_id, span_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.routes:
            await self.relay(scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == "/v1/traces":
            await self.traces(scope, receive, send)
        else:
            await self.api(scope, receive, send)

    def _forward(self, otlp: OtlpSettings, payload: bytes) -> None:
        """Send our traces' spans of a pool's export on to the collector, in the background."""
        fwd = dict(otlp.headers)  # OTEL_EXPORTER_OTLP_HEADERS (auth)
        fwd["content-type"] = "application/x-protobuf"

        async def post() -> None:
            try:
                async with self.session().post(
                    otlp.endpoint,
                    data=payload,
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
                return _error(NotFound("route not served by the vllm-obs sidecar"))
            if exc.status_code == 405:
                return _error(MethodNotAllowed("method not allowed"))
            return _error(for_status(exc.status_code, str(exc.detail)))

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
                return _error(NotFound(f"metrics are served on {host}:{port}"))
            data = await asyncio.to_thread(generate_latest, self.exposition)
            return Response(data, media_type=CONTENT_TYPE_LATEST)

        @api.get("/v1/models")
        async def models(request: Request) -> Response:
            return await self._models(request)

        return api

    async def _models(self, request: Request) -> Response:
        """The union of the pools' model lists (first replica that answers, per pool).

        Client auth applies as on the relayed routes. A pool with its own key gets that
        key; the client's ``Authorization`` goes only to a pool without one, and only when
        the sidecar does not check client keys itself.
        """
        try:
            headers = request_headers(request.scope)
            self.relay.tenants.resolve(headers)
        except RelayError as err:
            return _error(err)
        seen: dict[str, Any] = {}
        timeout = aiohttp.ClientTimeout(total=5)
        for pool in self.pools.health():
            up: dict[str, str] = {}
            if self.relay.pool_keys.get(pool):
                up["authorization"] = f"Bearer {self.relay.pool_keys[pool]}"
            elif "authorization" in headers and not self.relay.tenants.checks_keys:
                up["authorization"] = headers["authorization"]
            for replica in self.pools.candidates(pool):
                try:
                    async with self.session().get(
                        f"{replica.url}/v1/models", headers=up, timeout=timeout
                    ) as resp:
                        if resp.status != 200:
                            continue
                        data = orjson.loads(await resp.read())
                except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
                    continue
                for m in data.get("data", []) if isinstance(data, dict) else []:
                    if isinstance(m, dict) and isinstance(m.get("id"), str):
                        seen.setdefault(m["id"], m)
                break
        if not seen:
            return _error(UpstreamUnavailable("no pool answered /v1/models"))
        return Response(
            orjson.dumps({"object": "list", "data": list(seen.values())}),
            media_type="application/json",
        )


def _error(err: RelayError) -> Response:
    """The sidecar's own error as a response: status, body and headers from obs.sidecar.errors."""
    headers = {k.decode(): v.decode() for k, v in err.headers()}
    return Response(err.body(), status_code=err.status, headers=headers)


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
) -> SidecarApp:
    """Build the sidecar. Tests inject their own registry."""
    return SidecarApp(settings, registry=registry)
