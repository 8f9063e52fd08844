"""One event budget for every client-caused event, and summary records that keep counts exact.

A request the sidecar ends before any pool sees it, for the client's reason (a missing key:
401, bad JSON: 400, too large: 413, an admission rejection: 429, a client that sends headers
and closes: ``client_disconnect``; one that leaves once its request was sent to a pool,
before any output reached it, counts too), costs a client almost nothing to send, and its
event about a kilobyte: unlimited, a flood of them would rotate the record of real requests
away. Up to ``per_s`` such events a second (bursts of as many) are written one by one. The
others still reach the metrics (``vllm_obs_requests_total``,
``vllm_obs_admission_rejections_total``), are counted in
``vllm_obs_rejected_events_skipped_total``, and are written as **summary records**: once a
second, one record per (lane, route, outcome, reason, HTTP status) with ``summarized`` = how
many it stands for, so the record's counts equal the counters (``query summary``, the sweep
and ClickHouse count a record as ``summarized`` requests).

At most ``per_s`` events a second (plus a burst of as many) and, while over it, one summary
record a second per lane and outcome: the events file's growth is bounded whatever the flood.
Summary records carry no tenant or model (a flood could name unboundedly many).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter as Tally
from collections.abc import Callable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter

from obs import conventions as c
from obs.events import Event

_CLIENT_CAUSED = (c.REJECTED, c.CLIENT_ERROR, c.DISCONNECTED)
SUMMARY_PREFIX = "summary-"
# The fields a summary record keeps of the events it stands for (each a bounded set).
_KEY = (
    "lane",
    "pool",
    "class_source",
    "route",
    "stream",
    "status",
    "http_status",
    "error_class",
    "error_phase",
    "rejection_reason",
    "config_fingerprint",
)
Key = tuple[object, ...]


def client_caused(ev: Event) -> bool:
    """Ended for the client's reason before any pool saw it, or a client that left before any
    output reached it (dispatched, then gone: as cheap to send): under the event budget."""
    if ev.status not in _CLIENT_CAUSED:
        return False
    return ev.replica is None or (ev.status == c.DISCONNECTED and not ev.output_chunks)


class RefusedRecord:
    """``keep(event)``: whether the event is written one by one; ``flush()``: summaries."""

    def __init__(
        self,
        per_s: float,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.per_s = per_s
        self._clock, self._wall = clock, wall
        self._tokens = per_s
        self._at = clock()
        self._pending: Tally[Key] = Tally()
        self._since: float | None = None  # wall time of the first event pending
        m = c.REJECTED_EVENTS_SKIPPED
        self.skipped = Counter(m.name, m.help, m.labels, registry=registry)
        m = c.REFUSED_SUMMARIES
        self.summaries = Counter(m.name, m.help, m.labels, registry=registry)

    def keep(self, ev: Event) -> bool:
        if not client_caused(ev):
            return True  # reached a pool (or failed there): always recorded
        now = self._clock()
        self._tokens = min(self.per_s, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.skipped.inc()
        if self._since is None:
            self._since = self._wall()
        self._pending[tuple(getattr(ev, k) for k in _KEY)] += 1
        return False

    def due(self) -> bool:
        """A second has passed since the first event still pending."""
        return self._since is not None and self._wall() - self._since >= 1.0

    def flush(self) -> list[Event]:
        """Summary records of the events not written since the last flush (and forget them)."""
        if not self._pending or self._since is None:
            return []
        ts = datetime.fromtimestamp(self._since, UTC).isoformat(timespec="milliseconds")
        out = []
        for key, n in self._pending.items():
            ev = Event(ts=ts, request_id=SUMMARY_PREFIX + uuid.uuid4().hex[:16], summarized=n)
            for name, value in zip(_KEY, key, strict=True):
                setattr(ev, name, value)
            out.append(ev)
        self.summaries.inc(len(out))
        self._pending.clear()
        self._since = None
        return out
