"""The relay's connection limits and their counters: ``Guard`` and ``GuardCollector``.

``Guard`` holds the limits of ``Limits`` (docs/security.md) and the budgets every
connection of one server shares (connections, request bodies); the server's
connections (obs.sidecar.server.connection) enforce them where the bytes arrive and call
``hit`` for each one a client runs into. Every limit hit is counted
(``vllm_obs_connection_limits_total{limit}``) and logged at most once a minute per
limit, with the count since the last line.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Protocol

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from obs import conventions as c
from obs.sidecar.server.budgets import Budgets
from obs.sidecar.server.limits import Limits

log = structlog.get_logger("vllm_obs.guard")

LIMITS = (
    "request_line", "header_bytes", "header_count", "header_timeout", "body_timeout",
    "idle_timeout", "max_connections", "client_connections", "body_memory", "upgrade",
    "evicted", "request_target",
)  # fmt: skip
LOG_EVERY_S = 60.0


class Evictable(Protocol):
    addr: str

    def evictable(self) -> int:
        """2: idle (waits for a request), 1: a request's head or body trickles in, 0: serving."""
        ...

    def evicted(self) -> None:
        """Close it and stop counting it."""
        ...

    def body_rate(self, now: float) -> float | None:
        """Bytes a second of the body it is reading and holds (None: it holds none)."""
        ...

    def shed_body(self) -> int:
        """Refuse the body it is reading (503 ``body_memory``); the bytes it freed."""
        ...


class Guard:
    """The limits and their counters, shared by every connection of one server."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.budgets = Budgets(
            limits.max_connections,
            limits.client_connections,
            limits.max_body_memory,
            limits.client_body_memory,
        )
        self.hits = dict.fromkeys(LIMITS, 0)
        self._logged = dict.fromkeys(LIMITS, (-LOG_EVERY_S, 0))
        self._full_since: float | None = None  # refusing at the cap, none accepted since

    def accepted(self) -> None:
        """A connection was taken: the relay serves."""
        self._full_since = None

    def full_for(self) -> float:
        """Seconds the relay has refused every new connection at its cap (0: it takes them,
        or has room now: slots freed since its last refusal)."""
        since, b = self._full_since, self.budgets
        if since is None or b.connections < b.max_connections:
            return 0.0
        return time.monotonic() - since

    @property
    def open(self) -> int:
        """Client connections open now."""
        return self.budgets.connections

    def evict(self, connections: Iterable[Evictable]) -> bool:
        """At the connection cap, close one connection that serves no request to make room:
        an idle one before a slow head or a stalled body (``BodyClock.stalled``), from the address
        holding the most. False when none can go (every slot serves a request: the newcomer
        is refused)."""
        best: Evictable | None = None
        best_rank = (0, 0)
        for conn in connections:
            kind = conn.evictable()
            if kind:
                rank = (kind, self.budgets.client_connections(conn.addr))
                if rank > best_rank:
                    best, best_rank = conn, rank
        if best is None:
            return False
        self.hit("evicted")
        best.evicted()
        return True

    def shed_bodies(
        self, connections: Iterable[Evictable], need: int, keep: Evictable, now: float
    ) -> bool:
        """Body memory is full: refuse the bodies being read at the lowest rates, slowest
        first, until ``need`` more bytes fit; False when they cannot (``keep``, the one that
        needs them, is never shed)."""
        b = self.budgets
        holders = [(r, id(c), c) for c in connections
                   if c is not keep and (r := c.body_rate(now)) is not None]  # fmt: skip
        for _, _, conn in sorted(holders, key=lambda h: h[:2]):
            if b.body_bytes + need <= b.max_body_bytes:
                break
            conn.shed_body()
        return b.body_bytes + need <= b.max_body_bytes

    def hit(self, limit: str) -> None:
        self.hits[limit] += 1
        now = time.monotonic()
        if limit == "max_connections" and self._full_since is None:
            self._full_since = now
        at, count = self._logged[limit]
        if now - at >= LOG_EVERY_S:
            log.warning("connection_limit", limit=limit, since_last_log=self.hits[limit] - count)
            self._logged[limit] = (now, self.hits[limit])


class GuardCollector(Collector):
    """Exposes a guard's counters at scrape time (nothing is counted on the hot path)."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        m = c.CONNECTION_LIMITS
        hits = CounterMetricFamily(m.name, m.help, labels=m.labels)
        for limit, n in self.guard.hits.items():
            hits.add_metric([limit], n)
        yield hits
        g = c.CLIENT_CONNECTIONS
        yield GaugeMetricFamily(g.name, g.help, value=self.guard.open)


def content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body length (0 when there is none); None for a chunked body."""
    if any(k == b"transfer-encoding" for k, _ in headers):
        return None
    for k, v in headers:
        if k == b"content-length":
            return int(v) if v.strip().isdigit() else 0  # the parser refuses a bad one
    return 0


def plain_get(method: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    """A GET or HEAD without a body: its ``Upgrade`` is ignored (served as HTTP/1.1)."""
    if method not in (b"GET", b"HEAD"):
        return False
    return not any(
        k == b"transfer-encoding" or (k == b"content-length" and v.strip() != b"0")
        for k, v in headers
    )
