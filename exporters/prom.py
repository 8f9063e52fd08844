"""Prometheus metrics: per lane/pool histograms and counters, engine state per pool.

Every name comes from ``obs.conventions``. Histograms get every SLO threshold
of the config as an exact bucket bound. The TTFT, TPOT and end-to-end histograms
and the SLO misses counter carry the request's trace id as an exemplar
(``{trace_id="..."}``, in the OpenMetrics exposition only) when its trace is
sampled, so a latency panel links to the one slow request's trace and the
error-budget row to the trace of a recent miss. Per-pool engine state is read at
scrape time from the last snapshot the pool monitor took (a custom
``Collector``), never fetched inside a scrape and never refilled by handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from obs import conventions as c
from obs.config import Config, Lane
from obs.engines.metrics import EngineState
from obs.exporters.counters import RequestCounter
from obs.exporters.flow import FlowCounters
from obs.exporters.histograms import BatchHistogram, RequestHistogram
from obs.record import Finished

NS = 1e9
# The request counts a lane starts at 0 per pool and model: answers that end by stop or length
# (the availability SLI's denominator) and errors (its numerator; an error has no finish).
PRIMED_REQUESTS: Final = ((c.OK, "stop"), (c.OK, "length"), (c.ERROR, "none"))


def _counter(m: c.Metric, reg: CollectorRegistry) -> Counter:
    """A counter other threads add to (the exporters' own, ``prometheus_client``'s lock)."""
    return Counter(m.name, m.help, m.labels, registry=reg)


def _hist(m: c.Metric, reg: CollectorRegistry, buckets: Iterable[float]) -> RequestHistogram:
    return RequestHistogram(m, reg, buckets)


class Metrics:
    """The sidecar's metrics in one registry; also the exporter that fills them."""

    name = "prometheus"

    def __init__(
        self, config: Config, registry: CollectorRegistry, *, exemplars: bool = True
    ) -> None:
        self.registry = registry
        self.exemplars = exemplars
        lat = c.merged_buckets(c.LATENCY_BUCKETS, config.slo_thresholds_s("ttft"))
        tok = c.merged_buckets(c.TOKEN_LATENCY_BUCKETS, config.slo_thresholds_s("tpot"))
        self.requests = RequestCounter(c.REQUESTS, registry)
        self.duration = _hist(c.REQUEST_DURATION, registry, lat)
        self.phase = _hist(c.PHASE_DURATION, registry, lat)
        self.ttft = _hist(c.TTFT, registry, lat)
        self.tpot = _hist(c.TPOT, registry, tok)
        self.itl = BatchHistogram(c.ITL, registry, tok, scale=NS)
        itl_p95 = c.merged_buckets(c.TOKEN_LATENCY_BUCKETS, config.slo_thresholds_s("itl"))
        self.itl_p95 = _hist(c.ITL_REQUEST_P95, registry, itl_p95)
        self.blocked = _hist(c.STREAM_BLOCKED, registry, lat)
        self.prompt_tokens = RequestCounter(c.PROMPT_TOKENS, registry)
        self.cached_tokens = RequestCounter(c.CACHED_TOKENS, registry)
        self.completion_tokens = RequestCounter(c.COMPLETION_TOKENS, registry)
        self.json_answers = RequestCounter(c.JSON_ANSWERS, registry)
        self.rejections = RequestCounter(c.ADMISSION_REJECTIONS, registry)
        self.upstream_errors = RequestCounter(c.UPSTREAM_ERRORS, registry)
        self.disconnects = RequestCounter(c.CLIENT_DISCONNECTS, registry)
        self.arm_requests = RequestCounter(c.LANE_ARM_REQUESTS, registry)
        self.fallbacks = RequestCounter(c.FALLBACKS, registry)
        self.in_flight = Gauge(
            c.IN_FLIGHT.name, c.IN_FLIGHT.help, c.IN_FLIGHT.labels, registry=registry
        )
        self.queued = Gauge(c.QUEUED.name, c.QUEUED.help, c.QUEUED.labels, registry=registry)
        lane_info = Gauge(c.LANE_INFO.name, c.LANE_INFO.help, c.LANE_INFO.labels, registry=registry)
        self.written = _counter(c.EVENTS_WRITTEN, registry)
        self.dropped = _counter(c.EVENTS_DROPPED, registry)
        self.failures = _counter(c.EXPORTER_FAILURES, registry)
        self.engine_spans = _counter(c.ENGINE_SPANS, registry)
        self.misses = RequestCounter(c.SLO_MISSES, registry)
        self._miss_children: dict[tuple[str, str, str, str], Any] = {}
        lag = c.EVENT_LOOP_LAG  # observed by the loop-lag monitor, not per request
        self.loop_lag = Histogram(
            lag.name, lag.help, lag.labels, registry=registry, buckets=c.EVENT_LOOP_LAG_BUCKETS
        )
        # Only models a pool serves (config, or its /metrics' model_name): a client's made-up
        # model is "other", never a new series.
        self.model_label = c.BoundedLabel(tuple(p.model for p in config.pools if p.model), cap=0)
        self.finish_label = c.BoundedLabel(c.FINISH_REASONS, cap=0)
        # Children looked up once per label set: ``labels()`` costs more than the observation.
        self._counts: dict[tuple[str, ...], Any] = {}
        self._series: dict[tuple[str, str], _Series] = {}
        # Every lane's series count from 0 on each pool it may use (arms, fallback): a series
        # born at its first value loses that value to rate(), so a quiet lane's first requests
        # (or all of them, when the scrapes around them fail) would never reach its SLO rules.
        self._lanes = config.lanes
        for lane in config.lanes:
            lane_info.labels(lane.name, lane.pool).set(1)
            for pool in lane.pools:
                self._series[(lane.name, pool)] = _Series(self, (lane.name, pool))
            self.in_flight.labels(lane.name)
            self.queued.labels(lane.name)
            # 0 before the first rejection: else a lane's first burst of rejections creates the
            # series at its burst value, and rate() (hence the rejection alert) never sees it.
            for reason in c.REJECTION_REASONS:
                self.rejections.labels(lane.name, reason)
            self._traffic_control(lane)
        for p in config.pools:
            if p.model:
                self.pool_models(p.name, (p.model,))
        self.flow = FlowCounters(config, registry)

    def pool_models(self, pool: str, models: tuple[str, ...]) -> None:
        """The models ``pool`` serves (config, or its replicas' /metrics): the model label
        takes them, and its lanes' request counts start from 0 for them (``PRIMED_REQUESTS``).
        """
        self.model_label.allow(models)
        for model in models:  # each poll: a few lookups once the series exist
            label = self.model_label(model)
            for lane in (ln.name for ln in self._lanes if pool in ln.pools):
                for outcome, finish in PRIMED_REQUESTS:
                    key = (lane, pool, label, outcome, finish)
                    if key not in self._counts:
                        self._counts[key] = self.requests.labels(*key)

    def _traffic_control(self, lane: Lane) -> None:
        """A split lane's arms and a lane's fallbacks count from 0 (rate() sees the first)."""
        if lane.split is not None:
            for arm, _ in lane.arms:
                for outcome in c.OUTCOMES:
                    self.arm_requests.labels(lane.name, arm, outcome)
        if lane.fallback is not None:
            for pool, _ in lane.arms:
                if pool != lane.fallback:
                    for reason in c.FALLBACK_REASONS:
                        self.fallbacks.labels(lane.name, pool, reason)

    # Exporter interface.
    def export(self, finished: Finished) -> None:
        ev = finished.event
        if ev.arm is not None:
            self.arm_requests.labels(ev.lane, ev.arm, ev.status).inc()
        if ev.fallback_from is not None and ev.fallback_reason is not None:
            self.fallbacks.labels(ev.lane, ev.fallback_from, ev.fallback_reason).inc()
        lp = (ev.lane, ev.pool)
        key = (
            *lp,
            self.model_label(ev.model),
            ev.status,
            self.finish_label(ev.finish_reason or "none"),
        )
        count = self._counts.get(key)
        if count is None:
            count = self._counts[key] = self.requests.labels(*key)
        count.inc()
        ids = finished.ids
        ex = {c.EXEMPLAR_TRACE_ID: ids.trace_id_hex} if self.exemplars and ids.sampled else None
        for slo, phase, cause in finished.misses:
            self._miss(ev.lane, slo, phase, cause, ex)
        s = self._series.get(lp)
        if s is None:
            s = self._series[lp] = _Series(self, lp)
        s.duration.observe(ev.e2e_ms / 1000, ex)
        if ev.admission_gate is not None or ev.tenant in self.flow.limited_tenants:
            self.flow.record(ev)
        if ev.rejection_reason:
            self.rejections.labels(ev.lane, ev.rejection_reason).inc()
        if ev.status == c.REJECTED:
            return
        queue, prefill, first_token, decode, stream = finished.phases()  # PHASES order
        s.queue.observe(queue / NS)
        s.prefill.observe(prefill / NS)
        s.first_token.observe(first_token / NS)
        s.decode.observe(decode / NS)
        s.stream.observe(stream / NS)
        if ev.ttft_ms is not None:
            s.ttft.observe(ev.ttft_ms / 1000, ex)
        if ev.tpot_ms is not None:
            s.tpot.observe(ev.tpot_ms / 1000, ex)
        if finished.itl_ns:
            self.itl.observe_many(lp, finished.itl_ns)
        if ev.itl_p95_ms is not None:
            s.itl_p95.observe(ev.itl_p95_ms / 1000)
        if ev.stream:
            s.blocked.observe(ev.stream_blocked_ms / 1000)
        if ev.prompt_tokens:
            s.prompt_tokens.inc(ev.prompt_tokens)
        if ev.cached_tokens:
            s.cached_tokens.inc(ev.cached_tokens)
        if ev.completion_tokens:
            s.completion_tokens.inc(ev.completion_tokens)
        if ev.json_valid is not None:
            result = c.JSON_VALID if ev.json_valid else c.JSON_INVALID
            self.json_answers.labels(*lp, self.model_label(ev.model), result).inc()
        if ev.status == c.DISCONNECTED:
            s.disconnects.inc()
        elif ev.status == c.ERROR and ev.error_class:
            self.upstream_errors.labels(*lp, ev.error_class).inc()

    def _miss(self, lane: str, slo: str, phase: str, cause: str, ex: dict[str, str] | None) -> None:
        """Count one missed gate, with the request's trace id as the exemplar (``ex``);
        labels outside the fixed enums count as ``other``."""
        key = (
            lane,
            slo if slo in c.SLO_KINDS else c.OVERFLOW_LABEL,
            phase if phase in c.PHASES else c.OVERFLOW_LABEL,
            cause if cause in c.MISS_CAUSES else c.OVERFLOW_LABEL,
        )
        child = self._miss_children.get(key)
        if child is None:
            child = self._miss_children[key] = self.misses.labels(*key)
        child.inc(1, ex)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        return None

    # State and counters other components report into.
    def watch_lanes(self, gates: Mapping[str, LaneLoad]) -> None:
        """The in-flight and queued gauges read each lane's admission state at scrape time."""
        for lane, gate in gates.items():
            self._watch_lane(lane, gate)

    def _watch_lane(self, lane: str, gate: LaneLoad) -> None:
        self.in_flight.labels(lane).set_function(lambda: gate.in_flight)
        self.queued.labels(lane).set_function(lambda: gate.queued)

    def event_written(self, exporter: str, n: int) -> None:
        self.written.labels(exporter).inc(n)

    def event_dropped(self, exporter: str, reason: str, n: int) -> None:
        self.dropped.labels(exporter, reason).inc(n)

    def exporter_failed(self, exporter: str) -> None:
        self.failures.labels(exporter).inc()

    def engine_span(self, result: str) -> None:
        self.engine_spans.labels(result).inc()


class _Series:
    """One lane/pool's children of the per-request histograms and counters."""

    __slots__ = (
        "blocked",
        "cached_tokens",
        "completion_tokens",
        "decode",
        "disconnects",
        "duration",
        "first_token",
        "itl_p95",
        "prefill",
        "prompt_tokens",
        "queue",
        "stream",
        "tpot",
        "ttft",
    )

    def __init__(self, m: Metrics, lp: tuple[str, str]) -> None:
        self.duration = m.duration.labels(*lp)
        self.queue, self.prefill, self.first_token, self.decode, self.stream = (
            m.phase.labels(*lp, phase) for phase in c.PHASES
        )
        self.ttft = m.ttft.labels(*lp)
        self.tpot = m.tpot.labels(*lp)
        self.itl_p95 = m.itl_p95.labels(*lp)
        self.blocked = m.blocked.labels(*lp)
        self.prompt_tokens = m.prompt_tokens.labels(*lp)
        self.cached_tokens = m.cached_tokens.labels(*lp)
        self.completion_tokens = m.completion_tokens.labels(*lp)
        self.disconnects = m.disconnects.labels(*lp)


class LaneLoad(Protocol):
    @property
    def in_flight(self) -> int: ...
    @property
    def queued(self) -> int: ...


# Each engine-neutral state field and the pool metric it is exported as.
_STATE_METRICS: Final = {
    "kv_cache_usage": c.POOL_KV_CACHE_USAGE,
    "running": c.POOL_RUNNING,
    "waiting": c.POOL_WAITING,
    "prefix_queries": c.POOL_PREFIX_QUERIES,
    "prefix_hits": c.POOL_PREFIX_HITS,
    "preemptions": c.POOL_PREEMPTIONS,
}


class PoolStateCollector(Collector):
    """Scrape-time view of each replica's engine state, from the monitor's snapshot."""

    def __init__(
        self, snapshot: Callable[[], Mapping[tuple[str, str], EngineState | None]]
    ) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        labels = [c.POOL, c.REPLICA]
        up = GaugeMetricFamily(c.POOL_UP.name, c.POOL_UP.help, labels=labels)
        info = GaugeMetricFamily(
            c.POOL_ENGINE_INFO.name, c.POOL_ENGINE_INFO.help, labels=[*labels, c.ENGINE]
        )
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            field: (CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily)(
                m.name, m.help, labels=labels
            )
            for field, m in _STATE_METRICS.items()
        }
        for (pool, replica), state in self._snapshot().items():
            lv = [pool, replica]
            up.add_metric(lv, 0.0 if state is None else 1.0)
            if state is None:
                continue
            info.add_metric([*lv, state.engine], 1.0)
            for field, family in families.items():
                value = getattr(state, field)
                if value is not None:  # not reported by this engine: no sample at all
                    family.add_metric(lv, value)
        return [up, info, *families.values()]


class ColdStartCollector(Collector):
    """Scrape-time cold starts of each replica that came back after being down: how many
    times, and its last cold start's seconds per stage (obs.sidecar.pools)."""

    def __init__(
        self, snapshot: Callable[[], Mapping[tuple[str, str], tuple[int, Mapping[str, float]]]]
    ) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        m, n = c.POOL_COLD_START, c.POOL_COLD_STARTS
        took = GaugeMetricFamily(m.name, m.help, labels=list(m.labels))
        times = CounterMetricFamily(n.name, n.help, labels=list(n.labels))
        for (pool, replica), (count, stages) in self._snapshot().items():
            times.add_metric([pool, replica], float(count))
            for stage, seconds in stages.items():
                took.add_metric([pool, replica, stage], seconds)
        return [took, times]
