"""Flow control's metrics (docs/flow.md): requests held by a pool's saturation, tenants'
charges and rate-limit refusals (counted from each finished record), and at scrape time
each saturated pool's queue by band, whether it is held, and the tenants' limits."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from obs import conventions as c
from obs.config import Config
from obs.events import Event


class FlowCounters:
    """The counters of flow control, every series from 0: refusals and charges per
    configured tenant, requests held per saturated pool and gate."""

    def __init__(self, config: Config, registry: CollectorRegistry) -> None:
        self.held, self.rate_limited, self.charged, self.store_errors = (
            Counter(m.name, m.help, m.labels, registry=registry)
            for m in (
                c.FLOW_HELD_REQUESTS,
                c.RATE_LIMITED,
                c.RATE_LIMIT_USED,
                c.RATE_LIMIT_STORE_ERRORS,
            )
        )
        self.limited_tenants = frozenset(config.tenants)
        for p in config.pools:
            if p.saturation is not None:
                for gate in c.SATURATION_GATES:
                    self.held.labels(p.name, gate)
        for tenant in config.tenants:
            for kind in c.RATE_LIMIT_KINDS:
                self.rate_limited.labels(tenant, kind)
                self.charged.labels(tenant, kind)

    def record(self, ev: Event) -> None:
        """Count a finished request's part in flow control: the gate that held it, and its
        tenant's charge or refusal."""
        gate = ev.admission_gate
        if gate is not None and gate.startswith("pool:") and ev.pool:
            self.held.labels(ev.pool, gate.removeprefix("pool:")).inc()
        if ev.tenant is None or ev.tenant not in self.limited_tenants:
            return
        reason = ev.rejection_reason
        if reason in (c.RATE_LIMIT_REQUESTS, c.RATE_LIMIT_TOKENS):
            self.rate_limited.labels(ev.tenant, reason.removeprefix("rate_limit_")).inc()
            return
        self.charged.labels(ev.tenant, "requests").inc()
        tokens = (ev.prompt_tokens or 0) + (ev.completion_tokens or 0)
        if tokens:
            self.charged.labels(ev.tenant, "tokens").inc(tokens)

    def rate_limit_store_failed(self) -> None:
        self.store_errors.inc()


class FlowLoad(Protocol):
    """What the flow collector reads of a saturated pool's gate."""

    @property
    def held(self) -> bool: ...
    def waiting_by_band(self) -> Mapping[str, int]: ...


class FlowCollector(Collector):
    """Scrape-time view of flow control: each saturated pool's queue by band and whether it
    is held, and each tenant's configured limits."""

    def __init__(self, config: Config, gates: Mapping[str, FlowLoad]) -> None:
        self.gates = gates
        self.limits = [
            (name, kind, value)
            for name, t in config.tenants.items()
            for kind, value in (
                ("requests", t.requests_per_minute),
                ("tokens", t.tokens_per_minute),
            )
            if value is not None
        ]

    def collect(self) -> Iterable[Metric]:
        queued = GaugeMetricFamily(c.FLOW_QUEUED.name, c.FLOW_QUEUED.help, labels=[c.POOL, c.BAND])
        held = GaugeMetricFamily(c.FLOW_HELD.name, c.FLOW_HELD.help, labels=[c.POOL])
        for pool, gate in self.gates.items():
            held.add_metric([pool], 1.0 if gate.held else 0.0)
            by_band = gate.waiting_by_band()
            for band in map(str, range(10)):
                queued.add_metric([pool, band], float(by_band.get(band, 0)))
        limit = GaugeMetricFamily(c.RATE_LIMIT.name, c.RATE_LIMIT.help, labels=[c.TENANT, c.KIND])
        for tenant, kind, value in self.limits:
            limit.add_metric([tenant, kind], float(value))
        return [queued, held, limit]
