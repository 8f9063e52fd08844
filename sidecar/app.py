"""``create_app(settings)``: wires the relay, pools, exporters and control routes.

The relayed routes go straight to the relay (a plain ASGI callable: no
framework routing or middleware on the token path); everything else goes to
the sidecar's own three GET routes (``/health``, ``/v1/models``, ``/metrics``:
``SidecarApp.api``, answers from ``obs.sidecar.server.answer``), with 404 and 405
answered OpenAI-style. vLLM's operational endpoints (profiling, sleep, cache reset, ...) are simply
not routed: they are never reachable through the sidecar.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import aiohttp
import orjson
import structlog
from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from obs import conventions as c
from obs.attribution import MissStamp
from obs.exporters.base import Exporter, Fanout
from obs.exporters.jsonl import JsonlExporter
from obs.exporters.otel import OtlpSettings, SpanExporter
from obs.exporters.otlp_http import default_resource
from obs.exporters.prom import ColdStartCollector, Metrics, PoolStateCollector
from obs.exporters.served import DriftCollector, ServedCollector
from obs.lanes import Classifier
from obs.served import config_fingerprint
from obs.sidecar import endings as end
from obs.sidecar.endings import Ending
from obs.sidecar.outcomes import Refusal, Refused, RelayError
from obs.sidecar.policy.admission import LaneGate
from obs.sidecar.policy.auth import Tenants
from obs.sidecar.policy.recognition import Recognizer
from obs.sidecar.pools.occupancy import OccupancyCollector
from obs.sidecar.pools.pools import PoolSet
from obs.sidecar.pools.upstream import Upstream
from obs.sidecar.record.engine_join import EngineJoin
from obs.sidecar.record.forward import TraceForwarder
from obs.sidecar.record.record_rate import RefusedRecord
from obs.sidecar.record.recorder import (
    JoinEngineSpan,
    Recorder,
    SampleRefusals,
    StampConfig,
    sidecar_pipeline,
)
from obs.sidecar.record.span_handoff import SpanHandoff
from obs.sidecar.relay.flow import FlowControl
from obs.sidecar.relay.models_route import cached_union, models_cache
from obs.sidecar.relay.payloads import GENERATE_ROUTES, PASSTHROUGH_ROUTES, request_headers
from obs.sidecar.relay.relay import SHUTDOWN_FLUSH_S, Relay
from obs.sidecar.relay.stored import is_stored
from obs.sidecar.relay.traces import TraceReceiver, refusal_counter
from obs.sidecar.server.answer import Answer, error_answer
from obs.sidecar.server.health_listener import HealthListener
from obs.sidecar.server.kept import Kept
from obs.sidecar.server.looplag import LoopLagMonitor
from obs.sidecar.server.worker_metrics import merged_registry
from obs.sidecar.settings import Settings
from obs.sidecar.types import Receive, Scope, Send

log = structlog.get_logger("vllm_obs.sidecar")
SUMMARY_PERIOD_S = 0.25  # how often pending summary records are checked (written each second)


class SidecarApp:
    """The ASGI application: relay routes to the relay, the rest to the sidecar's own."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        exporters: Sequence[Exporter] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(settings.config, self.registry)
        self.pools = PoolSet(settings.config, settings.pool_poll_interval_s)
        self.pools.on_models = self.metrics.pool_models
        self.registry.register(PoolStateCollector(self.pools.snapshot))
        self.registry.register(ColdStartCollector(self.pools.cold_starts))
        self.registry.register(OccupancyCollector(self.pools.occupancies))
        self.config_fingerprint = config_fingerprint(settings.config.model_dump_json())
        self.registry.register(
            ServedCollector(
                self.pools.served,
                lambda: self.pools.settings.tracker.changes,
                (self.config_fingerprint, str(settings.config.version)),
            )
        )
        self.registry.register(DriftCollector(lambda: self.pools.settings.drift))
        # The process's CPU, memory and descriptors, and the cycle collector's passes and
        # what they freed (docs/runbook.md: a sidecar near one core of CPU).
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        # What /metrics shows: this process's registry, or every worker's merged.
        self.exposition = (
            self.registry
            if settings.worker is None
            else merged_registry(self.registry, settings.worker)
        )
        # Where spans go: ours, and vLLM's that the sidecar receives and forwards.
        self.otlp = OtlpSettings.from_env(settings.otlp_endpoint)
        exporters_, self.jsonl = _exporters(settings, self.metrics, self.otlp)
        exporters_[-1:-1] = exporters  # the caller's own, before the metrics (always last)
        self.exporters = Fanout(exporters_, failures=self.metrics)
        self._summaries: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None  # polling, /v1/models, forwarding
        self.upstream = Upstream()  # the relay's pool connections
        pools = settings.config.pools
        pool_keys = {p.name: os.environ.get(p.api_key_env, "") for p in pools if p.api_key_env}
        self.loop_lag = LoopLagMonitor(self.metrics.loop_lag, c.EVENT_LOOP_LAG_PERIOD_S)
        self.join = EngineJoin(
            self.exporters.export, settings.engine_join_wait_s, self.metrics.engine_span
        )
        self.traced_pools = {p.name for p in settings.config.pools if p.engine_traces}
        checked = bool(settings.config.auth.api_keys)  # every tenant from a key it checks
        self.recognizer = Recognizer(settings.config.recognition, self.registry, checked)
        self.recorder = self._recorder(exporters_)
        self.forwarder = (
            None
            if self.otlp is None
            else TraceForwarder(self.otlp, self.session, self.metrics.exporter_failed)
        )
        self.traces = self._trace_receiver()
        self.pool_keys = pool_keys
        self.gates = {lane.name: LaneGate(lane, settings.workers) for lane in settings.config.lanes}
        self.flow = FlowControl.build(
            settings.config, self.pools, self.registry, self.metrics.flow.rate_limit_store_failed
        )
        self.tenants = Tenants(settings.config.auth, settings.max_tenants_per_client)
        self.routes = set(GENERATE_ROUTES) | set(PASSTHROUGH_ROUTES) | set(settings.extra_routes)
        self.relay = self._relay()
        self.metrics.watch_lanes(self.gates)
        self.own_routes = self._own_routes()
        self.health_listener = (
            None
            if settings.health_address is None
            else HealthListener(*settings.health_address, self.health)
        )

    def _relay(self) -> Relay:
        """The relay of the generating routes, with everything it is handed."""
        settings = self.settings
        return Relay(
            Classifier(settings.config),
            self.pools,
            self.recorder,
            self.upstream,
            gates=self.gates,
            tenants=self.tenants,
            max_body_bytes=settings.max_body_bytes,
            pool_keys=self.pool_keys,
            capture=settings.capture,
            max_json_elements=settings.max_json_elements,
            recognizer=self.recognizer,
            split_salt=settings.split_salt,
            flow=self.flow,
            worker=settings.worker.ids if settings.worker else None,
            routes=frozenset(self.routes),
        )

    def _trace_receiver(self) -> TraceReceiver:
        """``POST /v1/traces``: the engine spans the traced pools' replicas send; under
        ``--workers``, each span goes on to the worker that relayed its request."""
        config = self.settings.config
        worker = self.settings.worker
        self.span_handoff = (
            None
            if worker is None or not self.traced_pools
            else SpanHandoff(
                worker.index,
                worker.metric_ports,
                self.session,
                self.join.on_span,
                worker.handoff_headers(),
            )
        )
        return TraceReceiver(
            self.join,
            replicas=tuple(r for p in config.pools if p.engine_traces for r in p.replicas)
            if self.traced_pools
            else None,
            token=os.environ.get(self.settings.traces_token_env or "") or None,
            forward=None if self.forwarder is None else self.forwarder.forward,
            refused=refusal_counter(self.registry),
            hand_off=self.span_handoff,
        )

    def health(self) -> dict[str, object]:
        """``/health``'s answer: every pool's replicas, and ok when each pool has one up."""
        pools = self.pools.health()
        up = all(any(reps.values()) for reps in pools.values())
        return {"status": "ok" if up else "degraded", "pools": pools}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )
        return self._session

    def _recorder(self, exporters: list[Exporter]) -> Recorder:
        """Each finished request's way to the exporters (``obs.sidecar.record.recorder``)."""
        metrics_only = Fanout([self.metrics], failures=self.metrics)
        record_only = Fanout(_record_sinks(exporters), failures=self.metrics)
        stamp = StampConfig(self.config_fingerprint)
        rate = RefusedRecord(self.settings.rejected_events_per_s, self.registry, clock=self.clock)
        self.refusals = SampleRefusals(
            rate, metrics_only.export, Recorder([stamp], record_only.export).end
        )
        self.engine_spans = JoinEngineSpan(self.join, self.traced_pools, self.pools.engine)
        processors = sidecar_pipeline(
            self.recognizer.slow,
            self.config_fingerprint,
            self.settings.capture,
            self.refusals,
            self.engine_spans,
            MissStamp(self.settings.config),  # each record's SLO misses, before any exporter
        )
        return Recorder(processors, self.exporters.export)

    async def _summarize(self) -> None:
        """Write the pending summary records each second, so a flood's end is counted too."""
        while True:
            await asyncio.sleep(SUMMARY_PERIOD_S)
            self.refusals.write_due()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"] in self.routes or is_stored(scope["path"])):
            await self.relay(scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == "/v1/traces":
            await self.traces(scope, receive, send)
        else:
            await self.api(scope, receive, send)

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        self.pools.start(self.session())
        if self.span_handoff is not None:
            self.span_handoff.bind(asyncio.get_running_loop())
        self.loop_lag.start()
        self._summaries = asyncio.create_task(self._summarize())
        if self.health_listener is not None:
            self.health_listener.start()
        log.info(
            "sidecar_started",
            pools={p.name: p.replicas for p in self.settings.config.pools},
            events=str(self.settings.events_path),
            capture_text=self.settings.capture.describe() if self.settings.capture else "off",
        )
        try:
            yield
        finally:
            # Requests cut at the end of the grace: their last words and their events.
            await self.relay.wait_running(SHUTDOWN_FLUSH_S + 1)
            self.join.flush()
            if self._summaries is not None:
                self._summaries.cancel()
            self.refusals.write()
            if self.forwarder is not None:
                await self.forwarder.drain(5)
            await self.pools.stop()
            await self.flow.close()
            await self.loop_lag.stop()
            if self.health_listener is not None:
                await self.health_listener.stop()
            self.upstream.close()
            if self._session is not None:
                await self._session.close()
            await asyncio.to_thread(self.exporters.shutdown, self.settings.shutdown_grace_s)
            log.info("sidecar_stopped")

    def _own_routes(self) -> dict[str, Callable[[Scope], Awaitable[Answer]]]:
        """The sidecar's own GET routes (not relayed), by exact path."""
        rendered = Kept[bytes](0.0, rest=4.0, clock=self.clock)  # /metrics
        self.models_cache = models_cache(self.clock)

        async def health(_: Scope) -> Answer:
            return Answer(orjson.dumps(self.health()))

        async def metrics(scope: Scope) -> Answer:
            if self.settings.metrics_address is not None:
                host, port = self.settings.metrics_address
                return error_answer(Refusal(404, f"metrics are served on {host}:{port}"))
            # OpenMetrics (with the latency exemplars) when the scraper asks for it, as
            # Prometheus does; the text format otherwise.
            accept = request_headers(scope).get("accept", "")
            encode, content_type = choose_encoder(accept)
            data = await rendered.get(
                content_type, lambda: asyncio.to_thread(encode, self.exposition)
            )
            return Answer(data, content_type=content_type.encode("latin-1"))

        return {"/health": health, "/metrics": metrics, "/v1/models": self._models}

    async def api(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request for none of the relayed routes: one of the sidecar's own (GET only, else
        405), or 404. A path is matched exactly: a trailing slash is another path, never a
        redirect (which would name the client's ``Host``)."""
        route = self.own_routes.get(scope["path"])
        if route is None:
            answer = error_answer(Refusal(404, "route not served by the vllm-obs sidecar"))
        elif scope["method"] != "GET":
            answer = error_answer(Refusal(405, "method not allowed"))
        else:
            try:
                answer = await route(scope)
            except Refused as refused:  # headers the sidecar refuses, an unknown key, ...
                answer = error_answer(refused.refusal)
            except RelayError as err:
                answer = error_answer(err)
        await answer.send(send)

    async def _models(self, scope: Scope) -> Answer:
        """The union of the pools' model lists (``obs.sidecar.relay.models_route``)."""
        headers = request_headers(scope)
        tenant = self.tenants.resolve(headers)
        if isinstance(tenant, Refusal):  # a key it refuses
            return error_answer(tenant)
        models = await cached_union(
            self.models_cache, self.session(), self.pools, headers, self.pool_keys, self.tenants
        )
        if not models:
            return error_answer(Ending(end.UNAVAILABLE, "no pool answered /v1/models"))
        return Answer(orjson.dumps({"object": "list", "data": models}))


def _exporters(
    settings: Settings, metrics: Metrics, otlp: OtlpSettings | None
) -> tuple[list[Exporter], JsonlExporter | None]:
    """The exporters the settings ask for, the metrics last; and the JSONL one, if any."""
    exporters: list[Exporter] = []
    jsonl = None
    if settings.events_path is not None:
        jsonl = JsonlExporter(
            settings.events_path,
            counters=metrics,
            max_bytes=settings.events_max_bytes,
            backups=settings.events_backups,
            flush_interval_s=settings.events_flush_interval_s,
        )
        exporters.append(jsonl)
    if otlp is not None:
        exporters.append(SpanExporter(otlp, counters=metrics))
    exporters += _otlp_metrics_and_logs(settings, metrics)
    if settings.clickhouse is not None:
        from obs.exporters.clickhouse import start_exporter  # its client: only when asked for

        worker = settings.worker.index if settings.worker else 0
        exporters.append(start_exporter(settings.clickhouse, settings.events_path, worker, metrics))
    exporters.append(metrics)
    return exporters, jsonl


def _otlp_metrics_and_logs(settings: Settings, metrics: Metrics) -> list[Exporter]:
    """The GenAI metrics and the events as log records over OTLP, where an endpoint is set
    (a flag, or the signal's own variable: the generic endpoint alone turns neither on)."""
    out: list[Exporter] = []
    resource = default_resource()
    m = OtlpSettings.from_env(settings.otlp_metrics_endpoint, "metrics", generic=False)
    if m is not None:
        from obs.exporters.otlp_metrics import GenAiMetricsExporter  # opt-in: imported if asked

        out.append(GenAiMetricsExporter(m, settings.config, resource=resource, counters=metrics))
    logs = OtlpSettings.from_env(settings.otlp_logs_endpoint, "logs", generic=False)
    if logs is not None:
        from obs.exporters.otlp_logs import LogRecordExporter  # opt-in: imported if asked

        out.append(LogRecordExporter(logs, resource=resource, counters=metrics))
    return out


def _record_sinks(exporters: list[Exporter]) -> list[Exporter]:
    """Where summary records go: the record (JSONL, ClickHouse). Their requests are counted in
    the metrics already, and they are no request's trace."""
    return [x for x in exporters if not isinstance(x, Metrics | SpanExporter)]


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    exporters: Sequence[Exporter] = (),
    clock: Callable[[], float] = time.monotonic,
) -> SidecarApp:
    """The sidecar, built from ``settings``: the one place its parts are composed. A caller
    (a test, an embedding program) may bring its own metrics ``registry``, more
    ``exporters`` (beside those the settings ask for: ``obs.exporters.memory`` to read each
    record directly) and the monotonic ``clock`` the event budget and the kept answers
    (``/v1/models``, ``/metrics``) run on."""
    return SidecarApp(settings, registry=registry, exporters=exporters, clock=clock)
